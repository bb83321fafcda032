"""`python -m runner.launch --workers=N [--ps=M] [--max_restarts=K] [--grace_seconds=S] [--data_workers=D] -- ARGS`.

Runs a multi-worker job on this machine: one process per task, each
`python -m runner RUNNER_ARGUMENTS` with its own `TF_CONFIG`, on free
localhost ports. Without --ps the job is N `worker` tasks trained with
`multi_worker_mirrored` (worker 0 is the chief); with --ps=M it is one
`chief`, N `worker` and M `ps` tasks for `parameter_server` (the chief
coordinates, the others serve). The launcher adds
`--config.strategy.name=<that strategy>` unless the arguments name it.

With --data_workers=D (>= 1) it also starts a tf.data service beside the job
(`python -m runner.data_service`: a dispatcher `data_dispatcher` and D workers
`data_worker:i`, on free 127.0.0.1 ports chosen once per launch, before the job's tasks)
and adds `--config.data.service=grpc://127.0.0.1:PORT` (the dispatcher) to the
arguments, which must not name one. A data worker that dies is no failure while
another is left: the job reads from the others (docs/clusters.md#the-tfdata-service
says what is lost); the dispatcher's death, or the last data worker's, fails the job as a
task's does (a restart starts the service again, on the same ports). The servers are
stopped last, once the job's tasks have exited, so a stopping job still reads its input.

Every line a task prints is printed here as it comes, prefixed with the task's
name (`[worker:0] ...`, `[chief] ...`, `[ps:1] ...`): its stdout on stdout,
its stderr on stderr. The launcher's own lines start with `[launch]` and go to
stderr, starting with one per task: `[launch] worker:1 pid 1234 on
localhost:5678`.

The job succeeds when every worker (with --ps: the chief) exits 0; tasks still
running then (ps and worker servers) are stopped. When a task fails (a
non-zero exit or a signal) the launcher prints one line naming it, stops the
others (SIGTERM, so each saves a checkpoint; SIGKILL after --grace_seconds)
and, with --max_restarts=K, starts the whole job again, at most K times: every
task resumes from the last checkpoint in the shared --workdir. Only transient
failures are restarted (`exit_codes.is_transient`: a signal, or a status
128-255 such as a lost peer); a permanent one (1-127: a bug, a user error, a
non-finite step) is not: a restart would fail the same way. Under parameter servers a worker that dies is not a
failure (the chief's ClusterCoordinator runs its steps on the others): the
launcher says so and the job goes on, the worker not started again; only the
last worker's death fails the job.

Stopping: SIGTERM or a first Ctrl-C to the launcher stops the job; a second
Ctrl-C kills every task at once. Each task runs in a session of its own, so
a Ctrl-C at the terminal reaches the launcher alone, which stops the tasks in
order. Workers of multi_worker_mirrored all get SIGTERM at once (they agree
on the step to save at, see `runner.cluster.stop_signals`); under parameter servers the
chief gets it first, and the workers and ps tasks serve until it has saved
and exited, then get theirs. SIGTERM is repeated every second until a task
exits (TensorFlow's multi-worker start-up swallows one; a task ignores
those after the first). The launcher's last line then says whether the job
saved, read from the workdir's checkpoint files: `[launch] stopped by
SIGTERM: saved ckpt-40 at step 40; rerun the same command to resume from
there.`, or that no checkpoint was written. On Linux every task gets SIGTERM
when the launcher dies, even by SIGKILL (`prctl(PR_SET_PDEATHSIG)`), so no
task outlives it and each stops as after a stop to the launcher (the
parameter-server tasks serve on until their chief is gone).

Exit status: 0 the job succeeded; the failed task's status when it is 1..255,
128 + N when the task was killed by signal N; 143 after SIGTERM and 130 after
Ctrl-C; 2 for bad launcher input (one line `error: ...` on stderr). Which a
restart repeats: `runner.exit_codes`, docs/clusters.md#exit-statuses.

This module imports no TensorFlow: it only supervises processes.
"""

from collections.abc import Callable, Iterable, Sequence
import contextlib
import ctypes
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from typing import Any, IO

from absl import flags
import portpicker

from runner import exit_codes
from runner.cluster import stop_signals
from runner.workdir import remote

POLL_SECONDS = 0.1
# TensorFlow's multi-worker start-up swallows a SIGTERM (its preemption notifier holds the signal for a moment), so
# SIGTERM is sent again at this interval until the task exits; a task that noted one ignores the others.
SIGTERM_REPEAT_SECONDS = 1.0
PR_SET_PDEATHSIG = 1  # prctl(2): the signal a process gets when its parent dies (Linux)
SERVERS_END_SECONDS = 10  # A ps or worker server notices the chief is gone within about 4 s.
THREAD_JOIN_SECONDS = 5  # for the last lines of the tasks' output once they exited
HOST = "localhost"
EXAMPLE = "python -m runner.launch --workers=2 -- --config=configs/synthetic.py --workdir=/tmp/job"

_WORKERS = flags.DEFINE_integer("workers", None, "How many worker tasks (>= 1); required.", lower_bound=1)
_PS = flags.DEFINE_integer(
    "ps", 0, "How many parameter-server tasks (>= 0); 1 or more makes a parameter_server job.", lower_bound=0
)
_MAX_RESTARTS = flags.DEFINE_integer(
    "max_restarts", 0, "Restarts (>= 0) of the job from its last checkpoint after a transient failure.", lower_bound=0
)
_DATA_WORKERS = flags.DEFINE_integer(
    "data_workers", 0, "tf.data service workers (>= 0) to start, with their dispatcher, beside the job.", lower_bound=0
)
_GRACE_SECONDS = flags.DEFINE_float(
    "grace_seconds",
    30.0,
    "Seconds (>= 0) a task may take to save and exit after SIGTERM before SIGKILL.",
    lower_bound=0,
)

_HELP = ("--help", "-help", "-h", "--helpshort", "--helpfull")
_WORKDIR = re.compile(r"^--?workdir(=(.*))?$")
_STRATEGY_NAME = re.compile(r"^--?config\.strategy\.name=(.*)$")
_DATA_SERVICE = re.compile(r"^--?config\.data\.service=")
DATA_DISPATCHER = "data_dispatcher"
_CLUSTER_FIELD = re.compile(r"^--?(no)?config\.strategy\.(worker_hosts|task_index)(=|$)")
_CHECKPOINT_INDEX = re.compile(r"^ckpt-(\d+)\.index$")


def cluster_spec(*, workers: int, ps: int) -> dict[str, list[str]]:
  """Returns the job's cluster, as in TF_CONFIG, on free localhost ports (`portpicker`).

  `{"worker": [...]}`, or with `ps` >= 1 `{"chief": [...], "worker": [...], "ps": [...]}`; each address is
  `localhost:PORT`.
  """
  sizes = {"chief": 1, "worker": workers, "ps": ps} if ps else {"worker": workers}
  return {job: [f"{HOST}:{portpicker.pick_unused_port()}" for _ in range(size)] for job, size in sizes.items()}


def data_service_servers(data_workers: int) -> dict[str, tuple[str, list[str]]]:
  """The tf.data service to start beside the job, on free 127.0.0.1 ports (`portpicker`); {} for no data workers.

  Returns:
    {name: (its address, its `python -m runner.data_service` arguments)}:
    `data_dispatcher` first, then `data_worker:0` ... `data_worker:{data_workers - 1}`.
  """
  if not data_workers:
    return {}
  dispatcher = f"127.0.0.1:{portpicker.pick_unused_port()}"
  servers = {DATA_DISPATCHER: (dispatcher, [f"--dispatcher={dispatcher}"])}
  for index in range(data_workers):
    address = f"127.0.0.1:{portpicker.pick_unused_port()}"
    servers[f"data_worker:{index}"] = (
        address,
        [f"--worker={dispatcher}", f"--port={address[10:]}", "--host=127.0.0.1"],
    )
  return servers


def task_name(task_type: str, index: int) -> str:
  """`chief`, or `type:index` such as `worker:1`: the prefix of a task's output lines."""
  return task_type if task_type == "chief" else f"{task_type}:{index}"


def runner_arguments(arguments: Sequence[str], *, ps: int) -> list[str]:
  """Returns the arguments every task passes to `python -m runner`.

  They are `arguments` plus `--config.strategy.name=<the job's strategy>`
  (multi_worker_mirrored, or parameter_server when `ps` >= 1) unless they
  name that strategy already.

  Raises:
    ValueError: no arguments, no --workdir (every task and every restart
      must share one), another strategy, or a cluster given by
      `config.strategy.worker_hosts`/`task_index` (the launcher gives it in
      TF_CONFIG).
  """
  arguments = list(arguments)
  if not arguments:
    raise ValueError(f"Give the runner's arguments after --, e.g. {EXAMPLE}")
  if workdir_of(arguments) is None:
    raise ValueError(
        "The runner arguments have no --workdir=DIR: every task and every restart must use the same workdir "
        "(all tasks restore from the chief's checkpoints there), and without one each task would make its own "
        "temporary directory."
    )
  strategy = "parameter_server" if ps else "multi_worker_mirrored"
  for argument in arguments:
    if _CLUSTER_FIELD.match(argument):
      raise ValueError(f"Remove {argument}: the launcher gives every task its place in the cluster in TF_CONFIG.")
    named = _STRATEGY_NAME.match(argument)
    if named and named.group(1) != strategy:
      raise ValueError(
          f"{argument} does not fit this job: a job {'with' if ps else 'without'} --ps runs "
          f"--config.strategy.name={strategy} (the launcher adds it when the arguments do not name it)."
      )
  if not any(_STRATEGY_NAME.match(argument) for argument in arguments):
    arguments.append(f"--config.strategy.name={strategy}")
  return arguments


def workdir_of(arguments: Sequence[str]) -> str | None:
  """The runner arguments' `--workdir=DIR` (or `--workdir DIR`), `~` expanded as the runner does; None without one."""
  for position, argument in enumerate(arguments):
    match = _WORKDIR.match(argument)
    if match and match.group(1):
      return remote.user_path(match.group(2) or None)
    if match and position + 1 < len(arguments):
      return remote.user_path(arguments[position + 1])
  return None


def latest_checkpoint(workdir: str) -> tuple[str, int] | None:
  """`(name, step)` of the newest checkpoint in the local `workdir`, e.g. `('ckpt-40', 40)`, or None.

  Found from the `ckpt-N.index` files without TensorFlow, as a rerun finds
  them whatever happened to the checkpoint list (`runner.outputs.checkpoint_list`).
  """
  try:
    names = os.listdir(os.path.join(workdir, "checkpoints"))
  except OSError:
    return None
  steps = [int(match.group(1)) for match in map(_CHECKPOINT_INDEX.match, names) if match]
  return (f"ckpt-{max(steps)}", max(steps)) if steps else None


def stop_outcome(workdir: str, before: tuple[str, int] | None) -> str:
  """The launcher's last words after a stop: whether the job saved a checkpoint in `workdir`.

  Args:
    workdir: the job's workdir (local, or a URL such as `gs://...`).
    before: `latest_checkpoint(workdir)` when the job started.
  """
  if remote.is_remote(workdir):
    return "the chief's last lines say whether it saved a checkpoint (the workdir is not local)"
  after = latest_checkpoint(workdir)
  if after is not None and after != before:
    return f"saved {after[0]} at step {after[1]}; rerun the same command to resume from there"
  if after is not None:
    return (
        f"no checkpoint was written by this stop; the latest is {after[0]} (step {after[1]}), where a rerun "
        "of the same command resumes"
    )
  return "no checkpoint was written; a rerun of the same command starts from step 0"


def describe_exit(returncode: int) -> str:
  """`exited with status N`, or `was killed by SIGNAME` for a negative (signal) returncode."""
  if returncode >= 0:
    return f"exited with status {returncode}"
  try:
    return f"was killed by {signal.Signals(-returncode).name}"
  except ValueError:
    return f"was killed by signal {-returncode}"


def exit_status(returncode: int) -> int:
  """The launcher's exit status for a failed task's `returncode`: it in 1..255; 128 + N for signal N, as a shell."""
  return 128 - returncode if returncode < 0 else returncode if 1 <= returncode <= 255 else 1


_PRINTING = threading.Lock()  # Whole lines, from the threads that relay the tasks' output and from the launcher.


def _print(stream: IO[str], text: str) -> None:
  with _PRINTING:
    stream.write(text + "\n")
    stream.flush()


def _say(text: str) -> None:
  """Prints the launcher's own line `[launch] text` on stderr."""
  _print(sys.stderr, f"[launch] {text}")


def _relay(pipe: IO[bytes], stream: IO[str], prefix: str) -> None:
  """Prints every line read from `pipe` (bytes) on `stream` with `prefix`, until the pipe closes."""
  with pipe:
    for raw in pipe:
      text = raw.decode("utf-8", "replace").rstrip("\r\n")
      _print(stream, f"{prefix} {text}")


class _Job:
  """One start of the job: a process per task, its output relayed, its exit put on `exits` as (task name, returncode).

  Every task runs in a session of its own, so a Ctrl-C at the terminal
  reaches the launcher alone, which stops the tasks in order, and on Linux
  it gets SIGTERM when the launcher dies (`_ends_with_the_launcher`).
  """

  def __init__(
      self, *, workers: int, ps: int, arguments: Sequence[str], servers: dict[str, tuple[str, list[str]]]
  ) -> None:
    self.cluster = cluster_spec(workers=workers, ps=ps)
    self.servers = servers  # The tf.data service's (`data_service_servers`): started first, stopped last.
    # {task name: (type, index)}, in the cluster's order (chief, workers, ps).
    self.places = {
        task_name(job, i): (job, i) for job, addresses in self.cluster.items() for i in range(len(addresses))
    }
    self.coordinators = {name for name, (job, _) in self.places.items() if job == ("chief" if ps else "worker")}
    # Under parameter servers the ClusterCoordinator runs a lost worker's functions on the others: not a failure.
    self.dispensable = {name for name, (job, _) in self.places.items() if ps and job == "worker"}
    self.exits: queue.Queue[tuple[str, int]] = queue.Queue()  # (task name, exit status) as each one ends
    self._arguments = arguments
    self._processes: dict[str, subprocess.Popen] = {}
    self._threads: list[threading.Thread] = []

  def start(self) -> None:
    preexec = _ends_with_the_launcher(os.getpid())
    for server, (address, arguments) in self.servers.items():
      self._start(server, ["runner.data_service", *arguments], address, {}, preexec)
    for task, (job, index) in self.places.items():
      config = json.dumps({"cluster": self.cluster, "task": {"type": job, "index": index}})
      self._start(task, ["runner", *self._arguments], self.cluster[job][index], {"TF_CONFIG": config}, preexec)

  def _start(
      self, task: str, module_arguments: list[str], address: str, env: dict[str, str], preexec: Callable[[], None]
  ) -> None:
    """Starts `python -m MODULE_ARGUMENTS` as `task`, with `env` added to the environment, relaying its output."""
    process = subprocess.Popen(
        [sys.executable, "-m", *module_arguments],
        env={"PYTHONUNBUFFERED": "1", **os.environ, **env},  # Lines as printed, not as a buffer fills.
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        preexec_fn=preexec,  # noqa: PLW1509
    )
    self._processes[task] = process
    _say(f"{task} pid {process.pid} on {address}")
    prefix = f"[{task}]"
    self._threads += [
        threading.Thread(target=_relay, args=(process.stdout, sys.stdout, prefix), daemon=True),
        threading.Thread(target=_relay, args=(process.stderr, sys.stderr, prefix), daemon=True),
        threading.Thread(target=lambda: self.exits.put((task, process.wait())), daemon=True),
    ]
    for thread in self._threads[-3:]:
      thread.start()

  def stop(self, *, grace_seconds: float, abort: Callable[[], object]) -> list[str]:
    """Stops the tasks still running: SIGTERM, then SIGKILL to those left.

    SIGTERM goes again every `SIGTERM_REPEAT_SECONDS`; SIGKILL goes to the
    tasks left after `grace_seconds`, or once `abort()`.

    Under parameter servers the chief goes first: the workers and ps tasks
    keep serving until it has saved and exited (or been killed), then they
    get SIGTERM. Workers of `multi_worker_mirrored` all get SIGTERM at once:
    they agree on the step to save at (see `runner.cluster.stop_signals`).
    The tf.data service's servers go last.

    Returns:
      The names of the tasks that got SIGKILL.
    """
    first = [task for task in self.places if task in self.coordinators or not self.dispensable]
    killed = []
    for stage in (first, [task for task in self.places if task not in first], list(self.servers)):
      deadline = time.monotonic() + grace_seconds
      while any(task in stage for task in self._running()) and time.monotonic() < deadline and not abort():
        self._signal([task for task in self._running() if task in stage], signal.SIGTERM)
        self.wait(stage, min(deadline, time.monotonic() + SIGTERM_REPEAT_SECONDS), stop=abort)
      left = [task for task in self._running() if task in stage or abort()]
      self._signal(left, signal.SIGKILL)
      killed += left
    for process in self._processes.values():
      process.wait()
    deadline = time.monotonic() + THREAD_JOIN_SECONDS  # A task's own child may hold its pipes open: do not wait.
    for thread in self._threads:
      thread.join(timeout=max(0, deadline - time.monotonic()))
    return killed

  def wait(self, tasks: Iterable[str], deadline: float, *, stop: Callable[[], object]) -> None:
    """Waits until none of `tasks` runs, or the `time.monotonic()` `deadline`, or `stop()`."""
    while set(tasks) & set(self._running()) and time.monotonic() < deadline and not stop():
      time.sleep(POLL_SECONDS)

  def _running(self) -> list[str]:
    return [task for task, process in self._processes.items() if process.poll() is None]

  def _signal(self, running: Iterable[str], signum: int) -> None:
    for task in running:
      with contextlib.suppress(ProcessLookupError):  # It exited meanwhile.
        self._processes[task].send_signal(signum)


def _ends_with_the_launcher(launcher_pid: int) -> Callable[[], None]:
  """Returns the `preexec_fn` that gives a task SIGTERM when the launcher dies (Linux; elsewhere nothing).

  The task asks the kernel for SIGTERM at its parent's death
  (`prctl(PR_SET_PDEATHSIG)`), so a launcher killed by SIGKILL leaves no task
  behind, and each stops as after a SIGTERM to it: workers save at an agreed
  step, a parameter-server chief saves while its servers serve on until it
  is gone. A launcher that died before the call leaves the task orphaned
  already: it then exits at once, before running anything.
  """
  try:
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # Looked up here: between fork and exec only the call runs.
  except (OSError, AttributeError):
    prctl = None  # Not Linux.

  def preexec() -> None:
    if prctl is not None:
      prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != launcher_pid:
      os._exit(exit_codes.STOPPED_BY[signal.SIGTERM])

  return preexec


def _run_once(job: _Job, *, signals: stop_signals.StopSignals, grace_seconds: float) -> tuple[str, int] | None:
  """Runs `job` until it succeeds, a task fails or a stop signal comes; then stops it.

  Returns:
    `(task, returncode)` of the first task that failed, or None.
  """
  try:
    job.start()
    pending = set(job.coordinators)
    lost: set[str] = set()
    data_workers = set(job.servers) - {DATA_DISPATCHER}
    while pending and not signals.received:
      try:
        task, returncode = job.exits.get(timeout=POLL_SECONDS)
      except queue.Empty:
        continue
      if task in data_workers and data_workers - lost - {task}:
        lost.add(task)
        _say(
            f"{task} {describe_exit(returncode)}; the job reads its input from the other tf.data service "
            "workers (it is not started again)."
        )
        continue
      if task in job.servers:
        last = ", and no data worker is left" if task in data_workers else ""
        _say(
            f"{task} {describe_exit(returncode)}{last}; stopping the job (SIGTERM, SIGKILL after {grace_seconds:g} s)."
        )
        return task, returncode
      if returncode != 0 and task in job.dispensable:
        lost.add(task)
        if job.dispensable - lost:
          _say(
              f"{task} {describe_exit(returncode)}; not an error under parameter servers: the "
              "chief trains on with the other workers (it is not started again)."
          )
          continue
      if returncode != 0:
        last = ", and no worker is left" if task in job.dispensable else ""
        _say(
            f"{task} {describe_exit(returncode)}{last}; stopping the other tasks (SIGTERM, SIGKILL "
            f"after {grace_seconds:g} s)."
        )
        return task, returncode
      pending.discard(task)
    if signals.received:
      order = (
          "the chief first; the workers and ps tasks serve until it has saved and exited"
          if job.dispensable
          else "every task at once; the workers agree on the step to save at"
      )
      again = " again" if signals.received == signal.SIGINT else ""
      _say(
          f"{stop_signals.NAMES[signals.received]} received: passing SIGTERM to {order}. Press Ctrl-C{again} "
          "to kill every task at once."
      )
    else:  # Parameter-server tasks end by themselves once they see the chief gone; give them the time.
      job.wait(job.places, time.monotonic() + SERVERS_END_SECONDS, stop=lambda: signals.received)
    return None
  finally:
    killed = job.stop(grace_seconds=grace_seconds, abort=lambda: signals.aborted)
    if killed:
      why = "a second Ctrl-C" if signals.aborted else f"still running {grace_seconds:g} s after SIGTERM"
      _say(f"killed {', '.join(killed)} with SIGKILL: {why}.")


def launch(
    *, workers: int, ps: int, arguments: Sequence[str], max_restarts: int, grace_seconds: float, data_workers: int = 0
) -> int:
  """Runs the job, restarting it up to `max_restarts` times; returns the launcher's exit status.

  `arguments` are the runner's, checked by `runner_arguments`; with
  `data_workers` a tf.data service (`data_service_servers`) runs beside the job, which gets its address.
  """
  workdir = workdir_of(arguments)
  assert workdir is not None  # `runner_arguments` made sure the arguments name one.
  servers = data_service_servers(data_workers)
  if servers:
    arguments = [*arguments, f"--config.data.service=grpc://{servers[DATA_DISPATCHER][0]}"]
  with stop_signals.StopSignals(in_training=False) as signals:
    restarts = 0
    while True:
      before = latest_checkpoint(workdir)
      job = _Job(workers=workers, ps=ps, arguments=arguments, servers=servers)
      failure = _run_once(job, signals=signals, grace_seconds=grace_seconds)
      if signals.received:
        _say(f"stopped by {stop_signals.NAMES[signals.received]}: {stop_outcome(workdir, before)}.")
        return exit_codes.STOPPED_BY[signals.received]
      if failure is None:
        return 0
      task, returncode = failure
      transient = exit_codes.is_transient(returncode)
      if transient and restarts < max_restarts:
        restarts += 1
        _say(
            f"restart {restarts} of {max_restarts}: {task} {describe_exit(returncode)}; "
            "the job resumes from the last checkpoint in its workdir."
        )
        continue
      why = exit_codes.PERMANENT.get(returncode, "a permanent failure: 1-127")
      why = (
          f"and no restart is left (--max_restarts={max_restarts})"
          if transient
          else f"({why}), which a restart would repeat"
      )
      _say(f"the job failed: {task} {describe_exit(returncode)} {why}; exit status {exit_status(returncode)}.")
      return exit_status(returncode)


def _parse(argv: Sequence[str]) -> dict[str, Any]:
  """Returns launch()'s keyword arguments from the command line `argv`.

  Raises:
    ValueError: bad launcher input, with a message for one `error:` line.
  """
  position = argv.index("--") if "--" in argv else len(argv)
  try:
    extra = flags.FLAGS([argv[0], *argv[1:position]])[1:]
  except flags.UnrecognizedFlagError as e:
    raise ValueError(f"{e}; the runner's arguments go after --, e.g. {EXAMPLE}") from None
  except flags.Error as e:
    raise ValueError(str(e)) from None
  if extra:
    raise ValueError(f"Unexpected arguments {extra} before --; the runner's arguments go after --, e.g. {EXAMPLE}")
  if _WORKERS.value is None:
    raise ValueError(f"--workers is required, e.g. {EXAMPLE}")
  arguments = runner_arguments(argv[position + 1 :], ps=_PS.value)  # Without --: none, which it refuses.
  given = [argument for argument in arguments if _DATA_SERVICE.match(argument)]
  if _DATA_WORKERS.value and given:
    raise ValueError(
        f"--data_workers={_DATA_WORKERS.value} starts a tf.data service and gives the job its dispatcher: remove "
        f"{given[0]}, or drop --data_workers to read from that dispatcher."
    )
  if os.environ.get("TF_CONFIG"):
    raise ValueError(
        "TF_CONFIG is set in this environment, and the launcher gives every task its own: unset it. "
        "(On a real cluster, set TF_CONFIG on each host and run python -m runner there.)"
    )
  return dict(
      workers=_WORKERS.value,
      ps=_PS.value,
      max_restarts=_MAX_RESTARTS.value,
      grace_seconds=_GRACE_SECONDS.value,
      arguments=arguments,
      data_workers=_DATA_WORKERS.value,
  )


def main(argv: Sequence[str]) -> int:
  """Runs the command line `argv`; returns the exit status."""
  if any(argument in _HELP for argument in argv[1 : argv.index("--") if "--" in argv else None]):
    print(__doc__)
    # The flags without their module's name, which is __main__ under `python -m` and runner.launch in the script.
    print(flags.FLAGS.module_help(sys.modules[__name__]).strip().partition("\n")[2])
    return 0
  try:
    options = _parse(argv)
  except ValueError as e:
    print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
    return exit_codes.USER_ERROR
  return launch(**options)


def run_main() -> None:
  """The `tf-runner-launch` console script and `python -m runner.launch`."""
  sys.exit(main(sys.argv))


if __name__ == "__main__":
  run_main()
