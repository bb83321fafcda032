"""One training run per workdir: a lock file that names its holder, and that a killed holder does not keep.

The evaluator of a workdir (mode 'continuous_eval') takes a lock of its own,
`WORKDIR/.tf-runner-evaluator.lock`, the same way: one evaluator per workdir.

A run that trains takes `WORKDIR/.tf-runner.lock` before it writes anything
there and removes it at every way out (return, error, SIGTERM, Ctrl-C, and
`runner.cluster.process_exit.exit_now`). A second run on the same workdir stops at
once with `WorkdirInUseError`, naming the holder: its host, pid, mode, start
time and command.

The lock file is JSON: `{"host", "pid", "process_start", "since", "mode",
"command"}`. A holder that died without removing it (SIGKILL, a power cut)
is recognised and its lock taken over:
- on the same host, when its pid is gone (or a zombie), or now belongs to
  another process: `process_start` (the boot id and the process's start time
  from `/proc/PID/stat`) no longer matches;
- on another host (a shared file system, `gs://`), when the holder has not
  refreshed the file's modification time (every `HEARTBEAT_SECONDS`) for
  `STALE_AFTER_SECONDS`; the hosts' clocks must agree to within a minute.
A lock file that is empty or cannot be read (not UTF-8, not a holder's JSON)
is a run starting now (its holder writes it right after creating it) for
`UNREADABLE_GRACE_SECONDS` after it was last written; older, it is damaged
and taken over like a stale one, with a warning that says so.

Creation is atomic on local file systems and NFS (`O_CREAT | O_EXCL`); a
stale lock is taken over by renaming it aside and checking that it was the
one judged stale. No `fcntl` lock is held: the lock file itself is the lock.

A remote workdir (`gs://` and other `tf.io.gfile` filesystems,
`runner.workdir.remote`) has neither an exclusive create nor file locks.
There the lock is written whole if absent, and read back after
`REMOTE_SETTLE_SECONDS`: the run goes on only if the file still holds its
own text (of runs that wrote it at nearly the same time, the last write is
the one every run reads back). The guarantee is weaker than a local one in
two ways. Two runs both go on only if one's write of the lock landed more
than `REMOTE_SETTLE_SECONDS` after it found no lock (a slow or retried
upload, a paused VM); and a stale lock is removed, not renamed aside, so a
run taking over a stale lock at the very moment another does may remove the
other's fresh lock, the read-back then deciding between them as above. On a
filesystem that keeps no modification times (it reports 0, as `ram://`
does), a holder on another host cannot be judged stale by age: its lock is
never taken over, and the error says to remove it if that run is gone.
"""

import dataclasses
import json
import os
import socket
import sys
import threading
import time
from typing import Any

from absl import logging
import tensorflow as tf

from runner.cluster import process_exit
from runner.workdir import remote
from strategies.errors import ConfigError
from strategies.errors import first_line

FILE_NAME = ".tf-runner.lock"
EVALUATOR_FILE_NAME = ".tf-runner-evaluator.lock"  # The evaluator's (`continuous_eval`): one per workdir, too.
HEARTBEAT_SECONDS = 30
STALE_AFTER_SECONDS = 300
REMOTE_SETTLE_SECONDS = 2
# How long a lock file that is empty or cannot be read counts as a run starting now (its holder creates it, then
# writes its few bytes at once); older, it is damaged. Far longer than that write, far shorter than a user's wait.
UNREADABLE_GRACE_SECONDS = 10
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


class WorkdirLock:
  """A held workdir lock: refreshed in a thread while held, removed by `release` (also at `exit_now`)."""

  def __init__(self, *, path: str, text: str) -> None:
    """Initializes the `WorkdirLock`.

    Args:
      path: the lock file, already created with `text` by this process.
      text: its contents, which tell this lock from another run's.
    """
    self.path = path
    self._text = text
    self._stop = threading.Event()
    self._heartbeat = threading.Thread(target=self._beat, name="workdir-lock-heartbeat", daemon=True)
    self._heartbeat.start()
    self._unregister = process_exit.on_exit_now(self.release)

  def release(self) -> None:
    """Removes the lock file if it is still this lock's; stops the heartbeat. A second call does nothing."""
    if self._stop.is_set():
      return
    self._stop.set()
    self._unregister()
    if self._heartbeat is not threading.current_thread():
      self._heartbeat.join()
    try:
      if _read(self.path) == self._text.encode():
        _remove(self.path)
    except (FileNotFoundError, tf.errors.NotFoundError):
      pass  # Gone with a workdir the run created and removed.
    except (OSError, tf.errors.OpError) as e:
      logging.warning("Could not remove the workdir lock %s (%s); the next run will find it stale.", self.path, e)

  def _beat(self) -> None:
    while not self._stop.wait(HEARTBEAT_SECONDS):
      try:
        if remote.is_remote(self.path):
          _write_remote(self.path, self._text)
        else:
          os.utime(self.path)
      except (OSError, tf.errors.OpError) as e:
        logging.warning("Could not refresh the workdir lock %s (%s).", self.path, e)


def acquire(workdir: str, *, mode: str, evaluator: bool = False) -> WorkdirLock:
  """Takes the lock of `workdir` (which exists) for this process, taking over a stale one.

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
  text = json.dumps(
      dataclasses.asdict(
          Holder(
              host=socket.gethostname(),
              pid=os.getpid(),
              process_start=_process_start(os.getpid()) or "",
              since=time.time(),
              mode=mode,
              command=" ".join(sys.argv)[:_COMMAND_CHARACTERS],
          )
      ),
      sort_keys=True,
  )
  create = _create_remote if remote.is_remote(path) else _create_local
  for _ in range(3):  # A stale lock taken over, then created, unless another run was quicker.
    if create(path, text):
      return WorkdirLock(path=path, text=text)
    found = _read_complete(path)
    if found is None:
      continue  # Released meanwhile.
    age = None if found.modified is None else time.time() - found.modified
    if not _is_stale(found):
      if found.holder is None:  # Only where the filesystem keeps modification times: else it is stale at once.
        named = (
            f"a run starting now (the lock {path}, written {age or 0:.0f} s ago, {found.unreadable}; one that still "
            f"{found.unreadable} {UNREADABLE_GRACE_SECONDS} s after it was written is damaged and taken over)"
        )
      else:
        named = found.holder.describe()
        if found.holder.host != socket.gethostname() and age is None:
          named += (
              f"; the workdir's filesystem keeps no modification times, so a lock of another host is never taken "
              f"over: if that run is gone, remove {path}"
          )
        elif found.holder.host != socket.gethostname():
          named += (
              f"; it refreshed the lock {age:.0f} s ago, and one not refreshed for {STALE_AFTER_SECONDS} s is "
              "taken over"
          )
      if evaluator:
        raise WorkdirInUseError(
            f"The workdir {workdir} has an evaluator already: {named}. One evaluator evaluates each checkpoint once; "
            f"stop that one to start this one (a killed evaluator's lock {path} is taken over by the next)."
        )
      raise WorkdirInUseError(
          f"The workdir {workdir} is in use by another run: {named}. Wait for it to end, or stop it, or use another "
          f"--workdir (a killed run's lock {path} is taken over by the next run)."
      )
    if found.holder is None:
      logging.warning(
          "Took over the workdir lock %s, which is damaged: it %s, %s after it was last written (no run holds it).",
          path,
          found.unreadable,
          "at an unknown time" if age is None else f"{age:.0f} s",
      )
    else:
      logging.warning("Took over the workdir lock %s of a run that is gone: %s.", path, found.holder.describe())
    _remove_stale(path, found)
  raise WorkdirInUseError(
      f"The workdir {workdir} is being taken by other runs at once; run again, or use another --workdir."
  )


def is_held(workdir: str) -> bool:
  """Whether a live run holds the lock of `workdir` (a stale or damaged one does not; a failed read counts as held)."""
  try:
    found = _read_or_none(os.path.join(workdir, FILE_NAME))
  except (OSError, tf.errors.OpError):
    return True
  return found is not None and not _is_stale(found)


def _create_local(path: str, text: str) -> bool:
  """Creates `path` holding `text` if it does not exist; returns whether it did."""
  try:
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
  except FileExistsError:
    return False
  try:
    os.write(descriptor, text.encode())
    os.fsync(descriptor)
  except OSError:
    os.close(descriptor)
    os.remove(path)
    raise
  os.close(descriptor)
  return True


def _create_remote(path: str, text: str) -> bool:
  """Writes `path` if absent, then reads it back after a pause; returns whether it is this run's."""
  if tf.io.gfile.exists(path):
    return False
  _write_remote(path, text)
  time.sleep(REMOTE_SETTLE_SECONDS)
  return _read(path) == text.encode()


def _write_remote(path: str, text: str) -> None:
  with tf.io.gfile.GFile(path, "w") as f:
    f.write(text)


@dataclasses.dataclass(frozen=True)
class _Found:
  """A lock file as read.

  Attributes:
    holder: the run it names; None if it cannot be read.
    modified: when it was last written, seconds since the epoch; None on a
      filesystem that keeps no modification times (it gives 0, as `ram://`).
    unreadable: None if it names a holder; else why not, a phrase after
      "it" ("is empty", "cannot be read (UnicodeDecodeError: ...)").
  """

  holder: Holder | None
  modified: float | None
  unreadable: str | None


def _read_or_none(path: str) -> "_Found | None":
  """Returns the `_Found` lock file at `path`, or None if there is none.

  Raises:
    OSError, tf.errors.OpError: it exists but cannot be opened (a directory, an I/O error).
  """
  try:
    data = _read(path)
    modified = tf.io.gfile.stat(path).mtime_nsec / 1e9 or None
  except (FileNotFoundError, tf.errors.NotFoundError):
    return None
  if not data.strip():
    return _Found(holder=None, modified=modified, unreadable="is empty")
  try:
    return _Found(holder=_holder(json.loads(data.decode("utf-8"))), modified=modified, unreadable=None)
  except (ValueError, TypeError) as error:  # Being written, or its writer died while writing, or damaged.
    return _Found(
        holder=None,
        modified=modified,
        unreadable=f"cannot be read ({type(error).__name__}: {first_line(error, limit=120)})",
    )


def _holder(fields: Any) -> Holder:
  """The `Holder` of a lock file's JSON `fields`.

  Raises:
    TypeError: they are not a holder's fields, of its types.
  """
  holder = Holder(**fields)
  texts = (holder.host, holder.process_start, holder.mode, holder.command)
  if not (
      isinstance(holder.pid, int)
      and isinstance(holder.since, (int, float))
      and all(isinstance(text, str) for text in texts)
  ):
    raise TypeError(f"not a holder's fields: {fields!r}")
  return holder


def _read_complete(path: str) -> "_Found | None":
  """`_read_or_none`, waiting up to a second for a lock file just created to hold its holder."""
  for _ in range(10):
    found = _read_or_none(path)
    if found is None or found.holder is not None or _is_stale(found):  # Stale: damaged, no holder is writing it.
      return found
    time.sleep(0.1)
  return found


def _is_stale(found: "_Found") -> bool:
  """Whether the `_Found` lock belongs to no live run (a damaged one included)."""
  if found.holder is None:  # A remote lock is written whole: one without a holder is damaged, whatever its age.
    return found.modified is None or time.time() - found.modified > UNREADABLE_GRACE_SECONDS
  if found.holder.host == socket.gethostname():
    return _process_start(found.holder.pid) not in (found.holder.process_start, "")
  return found.modified is not None and time.time() - found.modified > STALE_AFTER_SECONDS


def _remove_stale(path: str, found: "_Found") -> None:
  """Removes the stale lock `found` at `path`, unless another run replaced it meanwhile."""
  if remote.is_remote(path):
    _remove(path)
    return
  aside = f"{path}.stale-{os.getpid()}"
  try:
    os.rename(path, aside)  # Atomic: of two runs taking over, one gets the stale file.
  except FileNotFoundError:
    return
  if _read_or_none(aside) != found:  # Another run's new lock, taken between our read and the rename: put it back.
    try:
      os.link(aside, path)
    except FileExistsError:
      pass
  os.remove(aside)


def _process_start(pid: int) -> str | None:
  """'<boot id>:<start ticks>' of process `pid`; '' where there is no /proc but it runs; None if it is gone."""
  try:
    with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
      fields = f.read().rpartition(")")[2].split()  # After the command name, which may hold spaces.
    with open("/proc/sys/kernel/random/boot_id", encoding="utf-8") as f:
      boot = f.read().strip()
  except FileNotFoundError:
    if os.path.isdir("/proc/self"):
      return None
    try:
      os.kill(pid, 0)
    except ProcessLookupError:
      return None
    except PermissionError:
      pass
    return ""
  state, start = fields[0], fields[19]
  return None if state in ("Z", "X") else f"{boot}:{start}"


def _read(path: str) -> bytes:
  """The bytes of `path` (bytes: a damaged lock file need not be UTF-8)."""
  with tf.io.gfile.GFile(path, "rb") as f:
    return f.read()


def _remove(path: str) -> None:
  tf.io.gfile.remove(path)
