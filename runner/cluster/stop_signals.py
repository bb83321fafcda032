"""SIGTERM and Ctrl-C during training: note them, so the loop saves and exits at a step all workers agree on.

A preempted VM gets SIGTERM; a user presses Ctrl-C (SIGINT). Either is noted
and training ends at the end of the current loop, after a checkpoint, with
the shell's exit status for that signal. A second Ctrl-C aborts at once,
without saving.

Outside training loops (start-up: imports, config, strategy, model,
restore; and after training) `handle_outside_training` decides: a process
alone raises `Stopped` at once, which leaves the workdir as it was (a run's
clean-up runs on its way out); a task that has joined a multi-worker cluster
cannot stop alone without its peers hanging or failing, so it notes the
signal, and its first training loop hands it to every worker with the
loop's reduction: all save at the end of that loop, at the same step.
"""

from collections.abc import Iterator
import contextlib
import os
import signal
import sys
import threading
from typing import Any

from absl import logging

from runner import exit_codes
from runner.cluster import process_exit

NAMES: dict[int, str] = {signal.SIGTERM: "SIGTERM", signal.SIGINT: "Ctrl-C (SIGINT)"}


class StopSignals:
  """Inside `with`, the first SIGTERM or SIGINT sets `received` instead of ending the process.

  The previous handlers are put back on exit. Outside the main thread (where
  Python cannot install signal handlers) it does nothing.

  Attributes:
    received: None, or the first stop signal (`signal.SIGTERM`, `signal.SIGINT`).
    aborted: a Ctrl-C came after a first stop signal (only `in_training=False`;
      in training it ends the process instead).
  """

  def __init__(self, *, in_training: bool = True) -> None:
    """Initializes the `StopSignals`.

    Args:
      in_training: True around training loops: the signal is said at once,
        a Ctrl-C after it ends the process at once with exit status 130 and
        one line on stderr, also while the main thread is inside a loop's call
        (see `_watch`), and a stop a cluster task noted before the loop
        (`handle_outside_training`) is taken as received. False (the
        launcher): the signals are only noted, and the caller acts on them.
    """
    self.in_training = in_training
    self.received: int | None = None
    self.aborted = False
    self._previous: dict[int, Any] = {}
    self._watch: tuple[int, int, int, threading.Thread] | None = None  # See `_watch`: its pipe, the old fd, its thread.

  def __enter__(self) -> "StopSignals":
    global _waiting_stop, _trained
    if self.in_training:
      self.received, _waiting_stop = _waiting_stop, None  # One a cluster task noted before: this loop ends training.
      _trained = True
    if threading.current_thread() is threading.main_thread():
      self._previous = {signum: signal.signal(signum, lambda signum, _: self.note(signum)) for signum in NAMES}
      if self.in_training:
        read, write = os.pipe()
        os.set_blocking(write, False)
        thread = threading.Thread(target=_watch, args=(read, self.received is not None), name="stop-signal-watch")
        self._watch = (read, write, signal.set_wakeup_fd(write, warn_on_full_buffer=False), thread)
        thread.start()
    return self

  def __exit__(self, *exc_info: object) -> None:
    if self._watch is not None:
      read, write, previous_fd, thread = self._watch
      signal.set_wakeup_fd(previous_fd)
      os.close(write)  # The thread reads the end of the pipe and returns.
      thread.join()
      os.close(read)
      self._watch = None
    for signum, handler in self._previous.items():
      signal.signal(signum, handler)
    self._previous = {}

  def note(self, signum: int) -> None:
    """Notes `signum` as its handler does (the first stop is `received`); from any thread.

    The handler of SIGTERM and SIGINT calls it, and so does the watch of GCE
    maintenance events and preemption notices, which notes one as SIGTERM
    (see `runner.cluster.maintenance_events`).

    Args:
      signum: `signal.SIGTERM` or `signal.SIGINT`.
    """
    global _first_stop
    if self.received is None:
      self.received = signum
    elif signum == signal.SIGINT:
      self.aborted = True
    if self.in_training and _first_stop is None:
      _first_stop = signum


def _watch(read: int, stopping: bool) -> None:
  """Says what a stop signal does when it arrives, and ends the process at a SIGINT that follows one.

  Python runs a signal's handler in the main thread between two bytecodes:
  while the main thread is inside a training loop's call (seconds to
  minutes), the handler waits, and two signals in that time run it once. So
  `StopSignals` in training has this thread read the signals from Python's
  wakeup file descriptor (the pipe `read`), which gets one byte per signal as
  it arrives. `stopping`: a stop signal came before (a SIGINT now aborts).
  """
  while data := os.read(read, 64):
    for signum in data:
      if signum not in NAMES:
        continue
      if stopping and signum == signal.SIGINT:
        _abort()
      if not stopping:
        again = " Press Ctrl-C again to abort without saving." if signum == signal.SIGINT else ""
        logging.warning(
            f"{NAMES[signum]} received: the run stops at the end of this loop (or of the final evaluation), with a "
            f"checkpoint saved.{again}"
        )
      stopping = True


class Stopped(BaseException):
  """A stop signal that ended a process alone outside a training loop (during start-up, or after training).

  A BaseException, as KeyboardInterrupt, so that `except Exception` lets it
  through and a run's clean-up (which leaves the workdir as it was) runs on
  its way out.

  Attributes:
    exit_code: the exit status: 143 for SIGTERM, 130 for Ctrl-C.
    line: what the process says as it ends.
  """

  def __init__(self, signum: int) -> None:
    """Initializes the `Stopped`.

    Args:
      signum: `signal.SIGTERM` or `signal.SIGINT`.
    """
    self.exit_code = exit_codes.STOPPED_BY[signum]
    name = "SIGTERM" if signum == signal.SIGTERM else "Ctrl-C"
    self.line = (
        f"Stopped by {name} after training; its last checkpoint is saved, where a rerun resumes."
        if _trained
        else f"Stopped by {name} during start-up; nothing was written."
    )
    super().__init__(self.line)


_first_stop = None  # The first stop signal this process received, in or outside training.
_waiting_stop = None  # One a cluster task noted outside training, for its next training loop to take.
_raising = False  # Inside `raising_stops`: a signal outside training raises Stopped, else it exits at once.
_trained = False  # A training loop ran in this process (StopSignals was entered).
_raised = None  # The `Stopped` that `raising_stops` raised, whatever a library turned it into on its way up.


def handle_outside_training() -> None:
  """Installs the handlers of SIGTERM and SIGINT for when no training loop runs; call it first thing in a process.

  `StopSignals` takes over inside training loops and puts these back after.
  A signal then ends the process with one line on stderr (`Stopped.line`)
  and 143 or 130: at once, or inside `raising_stops` by raising `Stopped`
  in the main thread. But a process that has joined a multi-worker cluster
  notes it for its next training loop instead (`StopSignals` starts with
  it), which every worker ends at the same step, saving (when no training
  loop follows, the run ends as it would have). Once a stop is under way,
  SIGTERM changes nothing and Ctrl-C exits at once with 130.
  """
  for signum in exit_codes.STOPPED_BY:
    signal.signal(signum, _outside_training)


@contextlib.contextmanager
def raising_stops() -> Iterator[None]:
  """Inside, a stop signal outside training raises `Stopped` (see `handle_outside_training`)."""
  global _raising
  _raising = True
  try:
    yield
  finally:
    _raising = False


def raised_stop() -> "Stopped | None":
  """Returns the `Stopped` a stop signal raised in this process (see `raising_stops`), or None.

  A library may turn it into another exception on its way up (a stop during
  TensorFlow's import surfaces as `ImportError: initialization failed`), so
  whatever ends a run after it is that stop, not an error of its own.
  """
  return _raised


def _outside_training(signum: int, frame: object) -> None:
  del frame
  global _first_stop, _waiting_stop, _raised
  if _first_stop is not None:
    if signum == signal.SIGINT:
      _abort()
    return
  _first_stop = signum
  if _joined_a_cluster():
    _waiting_stop = signum
    sys.stderr.write(
        f"{NAMES[signum]} received outside a training loop: the job stops at the end of its next one, "
        "every worker saving a checkpoint at the same step.\n"
    )
    return
  stopped = Stopped(signum)
  if _raising:
    _raised = stopped
    raise stopped
  sys.stderr.write(stopped.line + "\n")
  process_exit.exit_now(stopped.exit_code)


def _abort() -> None:
  sys.stderr.write("Second Ctrl-C: aborted without saving; a rerun resumes from the last checkpoint.\n")
  process_exit.exit_now(exit_codes.STOPPED_BY[signal.SIGINT])


def _joined_a_cluster() -> bool:
  """Whether this process's TensorFlow has joined a multi-worker cluster; imports nothing.

  A signal may come while TensorFlow is half imported, so this asks only a
  workarounds module already loaded: every strategy that joins a cluster loads
  it first (through `strategies.peers`). Not loaded, or still loading: not joined.
  """
  joined = getattr(sys.modules.get("strategies.tensorflow_workarounds"), "joined_a_cluster", None)
  return bool(joined and joined())
