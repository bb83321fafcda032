"""A real one-node SLURM cluster on 127.0.0.1 for tests: munged, slurmctld and slurmd with their own files.

Everything lives in one directory: a MUNGE key and socket, a slurm.conf
(ports on free loopback ports, state, spool, logs and pid files), and the
daemons' PIDs in `pids.json`. No systemd, no cgroups, nothing under /etc:
clients find the cluster through `SLURM_CONF` (see `Cluster.env`), and
SLURM finds its MUNGE socket through the conf's `AuthInfo`.

    python tests/testlib/slurm_cluster.py up DIR     # prints `export SLURM_CONF=DIR/slurm.conf`
    python tests/testlib/slurm_cluster.py down DIR   # cancels the jobs, stops the daemons by their PIDs

In tests: `fixture(directory)`, a generator for a session-scoped pytest
fixture, skips where the Debian packages (slurm-wlm, munge) are missing.
"""

import contextlib
import getpass
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sinfo", "srun", "sbatch", "scancel", "squeue", "scontrol")
NODE = "localhost"
PARTITION = "debug"
MPI_PORTS = 100  # MpiParams=ports: the ports `srun --resv-ports` reserves from.
CRED_EXPIRE_SECONDS = 5  # SLURM's least.
UP_TIMEOUT_SECONDS = 60
STOP_TIMEOUT_SECONDS = 10


def missing_programs():
  """The SLURM and MUNGE programs this machine lacks (empty where `apt-get install slurm-wlm munge` was done)."""
  return [name for name in DAEMONS + CLIENTS if shutil.which(name) is None]


class Cluster:
  """The cluster whose files are in `directory`: `up()` starts it, `down()` stops it; see the module docstring."""

  def __init__(self, directory):
    self.directory = os.path.abspath(str(directory))
    self.conf = os.path.join(self.directory, "slurm.conf")
    self._pids_file = os.path.join(self.directory, "pids.json")

  @property
  def env(self):
    """The environment for SLURM's clients (srun, sbatch, ...): this process's, with SLURM_CONF set."""
    return {**os.environ, "SLURM_CONF": self.conf}

  def path(self, name):
    return os.path.join(self.directory, name)

  def up(self, timeout=UP_TIMEOUT_SECONDS):
    """Writes the files, starts the three daemons and waits until the node is idle.

    Raises:
      RuntimeError: a daemon exited or the node was not idle within `timeout`
        seconds (the daemons started are stopped first; their logs are named).
    """
    for name in ("state", "spool"):
      os.makedirs(self.path(name), exist_ok=True)
    os.chmod(self.directory, 0o700)  # munged refuses a socket directory others can write.
    with open(os.open(self.path("munge.key"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as f:
      f.write(os.urandom(1024))
    with open(self.conf, "w", encoding="utf-8") as f:
      f.write(self._conf_text())
    pids = {}
    try:
      pids["munged"] = self._start(
          "munged",
          [
              "munged", "-F", "--force", f"--socket={self.path('munge.socket')}",
              f"--key-file={self.path('munge.key')}", f"--pid-file={self.path('munged.pid')}",
              f"--log-file={self.path('munged.log')}", f"--seed-file={self.path('munged.seed')}",
          ],
      )  # fmt: skip
      self._wait(lambda: os.path.exists(self.path("munge.socket")), "munged's socket", pids, timeout)
      pids["slurmctld"] = self._start("slurmctld", ["slurmctld", "-D", "-i", "-f", self.conf])
      pids["slurmd"] = self._start("slurmd", ["slurmd", "-D", "-N", NODE, "-f", self.conf])
      self._wait(self._node_is_idle, f"node {NODE} idle in sinfo", pids, timeout)
    except BaseException:
      self._stop(pids)
      raise
    return self

  def down(self):
    """Cancels every job, waits for them to end, then stops the daemons by their PIDs (SIGTERM, then SIGKILL)."""
    if not os.path.exists(self._pids_file):
      return
    with open(self._pids_file, encoding="utf-8") as f:
      pids = json.load(f)
    if pids.get("slurmctld"):
      subprocess.run(
          ["scancel", "--full", f"--user={getpass.getuser()}"],
          env=self.env,
          capture_output=True,
          timeout=30,
          check=False,
      )
      deadline = time.monotonic() + STOP_TIMEOUT_SECONDS
      while self.jobs() and time.monotonic() < deadline:
        time.sleep(0.2)
    self._stop(pids)

  def leftovers(self):
    """The command lines of this cluster's daemons still running (none after `down`)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
      with contextlib.suppress(OSError), open(f"/proc/{pid}/cmdline", "rb") as f:
        command = f.read().replace(b"\0", b" ").decode(errors="replace")
        if command.split(" ", 1)[0] in DAEMONS and self.directory in command and _alive(int(pid)):
          found.append(f"{pid}: {command}")
    return found

  def jobs(self):
    """The ids of the jobs still in the queue (any state)."""
    result = subprocess.run(
        ["squeue", "-h", "-o", "%i"], env=self.env, capture_output=True, text=True, timeout=30, check=False
    )
    return result.stdout.split()

  def _conf_text(self):
    ctld_port, slurmd_port = _free_ports(2)
    mpi_low = _free_port_block(MPI_PORTS)
    user = getpass.getuser()
    lines = {
        "ClusterName": "tfrunner",
        "SlurmctldHost": f"{NODE}(127.0.0.1)",
        "SlurmctldPort": ctld_port,
        "SlurmdPort": slurmd_port,
        "SlurmUser": user,
        "SlurmdUser": user,
        "AuthType": "auth/munge",
        "CredType": "cred/munge",
        # cred_expire: a requeued job waits this long before it starts again (SLURM's default: 120 s).
        "AuthInfo": f"socket={self.path('munge.socket')},cred_expire={CRED_EXPIRE_SECONDS}",
        "StateSaveLocation": self.path("state"),
        "SlurmdSpoolDir": self.path("spool"),
        "SlurmctldPidFile": self.path("slurmctld.pid"),
        "SlurmdPidFile": self.path("slurmd.pid"),
        "SlurmctldLogFile": self.path("slurmctld.log"),
        "SlurmdLogFile": self.path("slurmd.log"),
        "ProctrackType": "proctrack/linuxproc",
        "TaskPlugin": "task/none",
        "JobAcctGatherType": "jobacct_gather/none",
        "AccountingStorageType": "accounting_storage/none",
        "JobCompType": "jobcomp/none",
        "SelectType": "select/cons_tres",
        "SelectTypeParameters": "CR_CPU",
        "SchedulerType": "sched/builtin",
        "SchedulerParameters": "sched_interval=1",  # A requeued job starts within a second of its eligible time.
        "MpiDefault": "none",
        "MpiParams": f"ports={mpi_low}-{mpi_low + MPI_PORTS - 1}",
        "ReturnToService": 2,
        "JobRequeue": 1,
        "KillWait": 5,
        "MinJobAge": 30,
        "InactiveLimit": 0,
        # Job ids (and the ports strategies.slurm derives from them) differ between clusters brought up at once.
        "FirstJobId": random.randrange(1, 1_000_000),
    }
    text = "".join(f"{key}={value}\n" for key, value in lines.items())
    return text + (
        f"NodeName={NODE} NodeAddr=127.0.0.1 CPUs={os.cpu_count()} State=UNKNOWN\n"
        f"PartitionName={PARTITION} Nodes={NODE} Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES\n"
    )

  def _start(self, name, command):
    log = open(self.path(f"{name}.out"), "w", encoding="utf-8")  # noqa: SIM115  # Kept open by the daemon.
    process = subprocess.Popen(
        command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=self.env, start_new_session=True
    )
    log.close()
    self._record(name, process.pid)
    return process.pid

  def _record(self, name, pid):
    pids = {}
    if os.path.exists(self._pids_file):
      with open(self._pids_file, encoding="utf-8") as f:
        pids = json.load(f)
    pids[name] = pid
    with open(self._pids_file, "w", encoding="utf-8") as f:
      json.dump(pids, f)

  def _node_is_idle(self):
    result = subprocess.run(
        ["sinfo", "-h", "-n", NODE, "-o", "%t"], env=self.env, capture_output=True, text=True, timeout=30, check=False
    )
    return result.stdout.strip() == "idle"

  def _wait(self, condition, what, pids, timeout):
    deadline = time.monotonic() + timeout
    while not condition():
      for name, pid in pids.items():
        if not _alive(pid):
          raise RuntimeError(f"{name} exited before {what}; see {self.path(name + '.out')} and {name}.log")
      if time.monotonic() > deadline:
        raise RuntimeError(f"no {what} within {timeout} s; see the logs in {self.directory}")
      time.sleep(0.1)

  def _stop(self, pids):
    for name in reversed(DAEMONS):  # slurmd, slurmctld, then munged, which both use.
      pid = pids.get(name)
      if pid and _alive(pid):
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_SECONDS
        while _alive(pid) and time.monotonic() < deadline:
          time.sleep(0.05)
        if _alive(pid):
          os.kill(pid, signal.SIGKILL)
          _reap(pid)
    with contextlib.suppress(FileNotFoundError):
      os.remove(self._pids_file)


def _alive(pid):
  """Whether `pid` runs (a zombie child of this process is reaped and counts as ended)."""
  _reap(pid)
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  with contextlib.suppress(OSError), open(f"/proc/{pid}/stat", encoding="utf-8") as f:
    return f.read().rsplit(")", 1)[1].split()[0] != "Z"
  return True


def _reap(pid):
  with contextlib.suppress(ChildProcessError):
    os.waitpid(pid, os.WNOHANG)


def _free_ports(count):
  """`count` distinct loopback ports free at this moment."""
  sockets = [socket.socket() for _ in range(count)]
  try:
    for s in sockets:
      s.bind(("127.0.0.1", 0))
    return [s.getsockname()[1] for s in sockets]
  finally:
    for s in sockets:
      s.close()


def _free_port_block(size, low=10000, high=16000):
  """The first port of `size` consecutive loopback ports, all free now, below the derived ports of strategies.slurm."""
  for _ in range(100):
    first = random.randrange(low, high - size)
    with contextlib.ExitStack() as stack:
      try:
        for port in range(first, first + size):
          s = stack.enter_context(socket.socket())
          s.bind(("127.0.0.1", port))
      except OSError:
        continue
      return first
  raise RuntimeError(f"no {size} free consecutive ports in {low}-{high}")


def fixture(directory):
  """Yields a running `Cluster` in `directory` and stops it after; skips (pytest) where SLURM is not installed."""
  import pytest  # noqa: PLC0415  # The command line needs no pytest.

  missing = missing_programs()
  if missing:
    pytest.skip(f"SLURM is not installed ({', '.join(missing)} missing): apt-get install slurm-wlm munge")
  cluster = Cluster(directory)
  try:
    yield cluster.up()
  finally:
    cluster.down()
  assert not cluster.leftovers(), f"processes left running: {cluster.leftovers()}"


def main(argv):
  if len(argv) != 3 or argv[1] not in ("up", "down"):
    sys.exit(f"usage: {argv[0]} up|down DIR")
  cluster = Cluster(argv[2])
  if argv[1] == "up":
    os.makedirs(cluster.directory, exist_ok=True)
    start = time.monotonic()
    cluster.up()
    print(f"# up in {time.monotonic() - start:.2f} s; stop with: {argv[0]} down {cluster.directory}", file=sys.stderr)
    print(f"export SLURM_CONF={cluster.conf}")
  else:
    cluster.down()
    for leftover in cluster.leftovers():
      print(f"still running: {leftover}", file=sys.stderr)


if __name__ == "__main__":
  main(sys.argv)
