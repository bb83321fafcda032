"""One training run per workdir: a lock file that names its holder, and that a killed holder does not keep.

The evaluator of a workdir (mode 'continuous_eval') takes a lock of its own,
`WORKDIR/.tf-runner-evaluator.lock`, the same way: one evaluator per workdir.

A run that trains takes `WORKDIR/.tf-runner.lock` before it writes anything
there and removes it at every way out (return, error, SIGTERM, Ctrl-C, and
`runner.cluster.process_exit.exit_now`). A second run on the same workdir stops at
once with `WorkdirInUseError`, naming the holder: its host, pid, mode, start
time and command, which the lock file holds as JSON (`Holder`).

On a local workdir (and NFS with its lock manager) the lock is `filelock`'s
`flock` on that file: the kernel releases it when its holder dies, however
it dies, so the next run takes it over at once (with a warning naming the
run that is gone).

A remote workdir (`gs://` and other `tf.io.gfile` filesystems,
`runner.workdir.remote`) has neither file locks nor an exclusive create.
There the lock is written whole if absent, and read back after
`REMOTE_SETTLE_SECONDS`: the run goes on only if the file still holds its
own text (of runs that wrote it at nearly the same time, the last write is
the one every run reads back). Its holder refreshes it every
`HEARTBEAT_SECONDS`; a lock of a gone process of this host, one not
refreshed for `STALE_AFTER_SECONDS` by another host, or one that names no
holder (damaged) is taken over. On a filesystem that keeps no modification
times (it reports 0, as `ram://` does), a holder on another host cannot be
judged stale by age: its lock is never taken over, and the error says to
remove it if that run is gone.
"""

import contextlib
import dataclasses
import json
import os
import socket
import sys
import threading
import time

from absl import logging
import filelock
import tensorflow as tf

from runner.cluster import process_exit
from runner.workdir import remote
from strategies.errors import ConfigError

FILE_NAME = ".tf-runner.lock"
EVALUATOR_FILE_NAME = ".tf-runner-evaluator.lock"  # The evaluator's (`continuous_eval`): one per workdir, too.
HEARTBEAT_SECONDS = 30
STALE_AFTER_SECONDS = 300
REMOTE_SETTLE_SECONDS = 2
_COMMAND_CHARACTERS = 300  # The command is kept short: the lock file stays one small write.


class WorkdirInUseError(ConfigError):
  """Another live run holds the workdir."""


@dataclasses.dataclass(frozen=True)
class Holder:
  """The run that holds a workdir, as its lock file says.

  Attributes:
    host: its host name.
    pid: its process id.
    process_start: '<boot id>:<start time in clock ticks>' of that process,
      '' where the host has no `/proc`.
    since: when it took the lock, seconds since the epoch.
    mode: its `config.mode`.
    command: its command line (shortened).
  """

  host: str
  pid: int
  process_start: str
  since: float
  mode: str
  command: str

  def describe(self) -> str:
    """Returns e.g. "pid 12 on host h, mode 'train', since YYYY-MM-DD HH:MM:SS UTC (python -m runner ...)"."""
    since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.since))
    return f"pid {self.pid} on host {self.host}, mode {self.mode!r}, since {since} ({self.command})"

  @classmethod
  def read(cls, data: bytes) -> "Holder | None":
    """The holder a lock file's bytes name; None for bytes that name none (empty, being written, damaged)."""
    try:
      holder = cls(**json.loads(data.decode("utf-8")))
    except (ValueError, TypeError):
      return None
    return holder if isinstance(holder.pid, int) and isinstance(holder.since, (int, float)) else None


class WorkdirLock:
  """A held workdir lock, removed by `release` (also at `exit_now`); a remote one is refreshed in a thread."""

  def __init__(self, *, path: str, text: str, file_lock: filelock.BaseFileLock | None = None) -> None:
    """Initializes the `WorkdirLock`.

    Args:
      path: the lock file, holding `text`, written by this process.
      text: its contents, which tell this lock from another run's.
      file_lock: the held `filelock` lock of a local `path`; None for a remote one.
    """
    self.path = path
    self._text = text
    self._file_lock = file_lock
    self._stop = threading.Event()
    self._heartbeat = threading.Thread(target=self._beat, name="workdir-lock-heartbeat", daemon=True)
    if file_lock is None:
      self._heartbeat.start()
    self._unregister = process_exit.on_exit_now(self.release)

  def release(self) -> None:
    """Removes the lock file if it is still this lock's; a second call does nothing."""
    if self._stop.is_set():
      return
    self._stop.set()
    self._unregister()
    if self._heartbeat.is_alive() and self._heartbeat is not threading.current_thread():
      self._heartbeat.join()  # Not while it writes the lock again.
    try:  # A local one while it is held: no run takes the file that is going.
      if self._file_lock is not None or _read(self.path) == self._text.encode():
        tf.io.gfile.remove(self.path)
    except (OSError, tf.errors.OpError) as e:
      if not isinstance(e, (FileNotFoundError, tf.errors.NotFoundError)):  # Else gone with a workdir the run removed.
        logging.warning("Could not remove the workdir lock %s (%s); the next run will find it stale.", self.path, e)
    finally:
      if self._file_lock is not None:
        self._file_lock.release()

  def _beat(self) -> None:
    while not self._stop.wait(HEARTBEAT_SECONDS):
      try:
        _write_remote(self.path, self._text)
      except tf.errors.OpError as e:
        logging.warning("Could not refresh the workdir lock %s (%s).", self.path, e)


def acquire(workdir: str, *, mode: str, evaluator: bool = False) -> WorkdirLock:
  """Takes the lock of `workdir` (which exists) for this process, taking over one whose holder is gone.

  Args:
    workdir: the run's directory.
    mode: the run's `config.mode`, recorded for whoever finds the lock held.
    evaluator: take the evaluator's lock (`EVALUATOR_FILE_NAME`) instead of
      the training run's: one evaluator per workdir, beside its trainer.

  Returns:
    The held `WorkdirLock`.

  Raises:
    WorkdirInUseError: another live run holds it (the message names it).
    OSError, tf.errors.OpError: the lock file cannot be written.
  """
  path = os.path.join(workdir, EVALUATOR_FILE_NAME if evaluator else FILE_NAME)
  me = Holder(
      host=socket.gethostname(),
      pid=os.getpid(),
      process_start=_process_start(os.getpid()) or "",
      since=time.time(),
      mode=mode,
      command=" ".join(sys.argv)[:_COMMAND_CHARACTERS],
  )
  text = json.dumps(dataclasses.asdict(me), sort_keys=True)
  if remote.is_remote(path):
    return _acquire_remote(workdir, path, text, evaluator)

  def write_holder(descriptor: int) -> None:  # Called with the file locked and open.
    with contextlib.suppress(FileNotFoundError):
      if os.path.samestat(os.fstat(descriptor), os.stat(path)):
        gone = os.pread(descriptor, 4096, 0)
        if gone.strip():
          _took_over(path, Holder.read(gone))
        os.ftruncate(descriptor, 0)
        os.pwrite(descriptor, text.encode(), 0)
        os.fsync(descriptor)
        return
    raise filelock.Timeout(path)  # A file its holder removed as this run opened it: try again.

  file_lock = filelock.FileLock(path, blocking=False, thread_local=False, on_acquired=write_holder)
  for _ in range(3):
    try:
      file_lock.acquire()
      return WorkdirLock(path=path, text=text, file_lock=file_lock)
    except filelock.Timeout:
      try:
        holder = Holder.read(_read(path))
      except tf.errors.NotFoundError:
        continue  # Released meanwhile.
    named = holder.describe() if holder else f"a run starting now (its lock {path} does not name it yet)"
    raise _in_use(workdir, path, named, evaluator)
  raise _in_use(workdir, path, "other runs taking it at once", evaluator)


def is_held(workdir: str) -> bool:
  """Whether a live run holds the training lock of `workdir` (a failed read of a remote one counts as held)."""
  path = os.path.join(workdir, FILE_NAME)
  if not remote.is_remote(path):
    if not os.path.exists(path):
      return False
    try:
      with filelock.FileLock(path, blocking=False, thread_local=False):
        return False
    except filelock.Timeout:
      return True
  try:
    holder, age = _read_remote(path)
  except (FileNotFoundError, tf.errors.NotFoundError):
    return False
  except (OSError, tf.errors.OpError):
    return True
  return holder is not None and not _is_gone(holder, age)


def _acquire_remote(workdir: str, path: str, text: str, evaluator: bool) -> WorkdirLock:
  """Writes the lock `path` if absent and reads it back after a pause; takes over one whose holder is gone."""
  for _ in range(3):  # A gone holder's lock taken over, then written, unless another run was quicker.
    if not tf.io.gfile.exists(path):
      _write_remote(path, text)
      time.sleep(REMOTE_SETTLE_SECONDS)
      if _read(path) == text.encode():
        return WorkdirLock(path=path, text=text)
    try:
      holder, age = _read_remote(path)
    except tf.errors.NotFoundError:
      continue  # Released meanwhile.
    if holder is not None and not _is_gone(holder, age):
      named = holder.describe()
      if holder.host != socket.gethostname() and age is None:
        named += (
            f"; the workdir's filesystem keeps no modification times, so a lock of another host is never taken "
            f"over: if that run is gone, remove {path}"
        )
      elif holder.host != socket.gethostname():
        named += (
            f"; it refreshed the lock {age:.0f} s ago, and one not refreshed for {STALE_AFTER_SECONDS} s is taken over"
        )
      raise _in_use(workdir, path, named, evaluator)
    _took_over(path, holder)
    tf.io.gfile.remove(path)
  raise _in_use(workdir, path, "other runs taking it at once", evaluator)


def _in_use(workdir: str, path: str, named: str, evaluator: bool) -> WorkdirInUseError:
  if evaluator:
    return WorkdirInUseError(
        f"The workdir {workdir} has an evaluator already: {named}. One evaluator evaluates each checkpoint once; "
        f"stop that one to start this one (a killed evaluator's lock {path} is taken over by the next)."
    )
  return WorkdirInUseError(
      f"The workdir {workdir} is in use by another run: {named}. Wait for it to end, or stop it, or use another "
      f"--workdir (a killed run's lock {path} is taken over by the next run)."
  )


def _took_over(path: str, holder: Holder | None) -> None:
  gone = holder.describe() if holder else "its lock file names no run (it is damaged)"
  logging.warning("Took over the workdir lock %s of a run that is gone: %s.", path, gone)


def _read_remote(path: str) -> tuple[Holder | None, float | None]:
  """The `Holder` the remote lock `path` names (None: damaged) and its age in seconds (None: no modification time)."""
  holder = Holder.read(_read(path))
  modified = tf.io.gfile.stat(path).mtime_nsec / 1e9
  return holder, (time.time() - modified if modified else None)


def _is_gone(holder: Holder, age: float | None) -> bool:
  """Whether the run `holder` of a remote lock `age` seconds old is gone (its process here, or its heartbeat)."""
  if holder.host == socket.gethostname():
    return _process_start(holder.pid) not in (holder.process_start, "")
  return age is not None and age > STALE_AFTER_SECONDS


def _process_start(pid: int) -> str | None:
  """'<boot id>:<start ticks>' of process `pid`; '' where there is no /proc; None if it is gone (or a zombie)."""
  try:
    with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
      fields = f.read().rpartition(")")[2].split()  # After the command name, which may hold spaces.
    with open("/proc/sys/kernel/random/boot_id", encoding="utf-8") as f:
      boot = f.read().strip()
  except FileNotFoundError:
    return None if os.path.isdir("/proc/self") else ""
  return None if fields[0] in ("Z", "X") else f"{boot}:{fields[19]}"


def _read(path: str) -> bytes:
  """The bytes of `path` (bytes: a damaged lock file need not be UTF-8)."""
  with tf.io.gfile.GFile(path, "rb") as f:
    return f.read()


def _write_remote(path: str, text: str) -> None:
  with tf.io.gfile.GFile(path, "w") as f:
    f.write(text)
