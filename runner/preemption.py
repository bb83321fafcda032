"""SIGTERM and Ctrl-C during training: note them, so the loop saves and exits at a step all workers agree on.

A preempted VM gets SIGTERM; a user presses Ctrl-C (SIGINT). Either is noted
and training ends at the end of the current loop, after a checkpoint, with
the shell's exit status for that signal. A second Ctrl-C aborts at once,
without saving.
"""

import os
import signal
import sys
import threading

from absl import logging

from runner import process_exit

EXIT_CODES = {signal.SIGTERM: 128 + signal.SIGTERM, signal.SIGINT: 128 + signal.SIGINT}  # 143, 130
NAMES = {signal.SIGTERM: "SIGTERM", signal.SIGINT: "Ctrl-C (SIGINT)"}


class StopSignals:
  """Inside `with`, the first SIGTERM or SIGINT sets `received` instead of ending the process.

  It says so at once, and a SIGINT after it ends the process at once with
  exit status 130 and one line on stderr, also while the main thread is
  inside a training loop's call (see `_SignalWatch`). The previous handlers
  are put back on exit. Outside the main thread (where Python cannot install
  signal handlers) it does nothing.
  """

  def __init__(self):
    self.received = None  # None, signal.SIGTERM or signal.SIGINT
    self._previous = {}
    self._watch = None

  def __enter__(self):
    self.received = None
    if threading.current_thread() is threading.main_thread():
      self._previous = {signum: signal.signal(signum, self._note) for signum in EXIT_CODES}
      self._watch = _SignalWatch()
    return self

  def __exit__(self, *exc_info):
    if self._watch is not None:
      self._watch.close()
      self._watch = None
    for signum, handler in self._previous.items():
      signal.signal(signum, handler)
    self._previous = {}

  def _note(self, signum, frame):
    del frame
    if self.received is None:
      self.received = signum


class _SignalWatch:
  """Says what a stop signal does when it arrives, and ends the process at a SIGINT that follows one.

  Python runs a signal's handler in the main thread between two bytecodes:
  while the main thread is inside a training loop's call (seconds to
  minutes), the handler waits, and two signals in that time run it once. So
  this watch reads the signals from Python's wakeup file descriptor, which
  gets one byte per signal as it arrives, in a thread of its own.
  """

  def __init__(self):
    self._read, self._write = os.pipe()
    os.set_blocking(self._write, False)
    self._previous_fd = signal.set_wakeup_fd(self._write, warn_on_full_buffer=False)
    self._thread = threading.Thread(target=self._watch, name="stop-signal-watch", daemon=True)
    self._thread.start()

  def close(self):
    """Gives the wakeup descriptor back and ends the thread."""
    signal.set_wakeup_fd(self._previous_fd)
    os.close(self._write)  # The thread reads the end of the pipe and returns.
    self._thread.join()
    os.close(self._read)

  def _watch(self):
    stops = 0
    while data := os.read(self._read, 64):
      for signum in data:
        if signum not in EXIT_CODES:
          continue
        if stops and signum == signal.SIGINT:
          sys.stderr.write("Second Ctrl-C: aborted without saving; a rerun resumes from the last checkpoint.\n")
          process_exit.exit_now(EXIT_CODES[signal.SIGINT])
        if not stops:
          logging.warning("%s received: training stops at the end of this loop, after saving a checkpoint.%s",
                          NAMES[signum],
                          " Press Ctrl-C again to abort without saving." if signum == signal.SIGINT else "")
        stops += 1
