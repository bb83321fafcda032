"""SIGTERM and Ctrl-C during training: note them, so the loop saves and exits at a step all workers agree on.

A preempted VM gets SIGTERM; a user presses Ctrl-C (SIGINT). Either is noted
and training ends at the end of the current loop, after a checkpoint, with
the shell's exit status for that signal. A second Ctrl-C aborts at once,
without saving.
"""

import signal
import sys
import threading

from absl import logging

from runner import process_exit

EXIT_CODES = {signal.SIGTERM: 128 + signal.SIGTERM, signal.SIGINT: 128 + signal.SIGINT}  # 143, 130
NAMES = {signal.SIGTERM: "SIGTERM", signal.SIGINT: "Ctrl-C (SIGINT)"}


class StopSignals:
  """Inside `with`, the first SIGTERM or SIGINT sets `received` instead of ending the process.

  A second SIGINT ends the process at once with exit status 130 and one line
  on stderr. The previous handlers are put back on exit. Outside the main
  thread (where Python cannot install signal handlers) it does nothing.
  """

  def __init__(self):
    self.received = None  # None, signal.SIGTERM or signal.SIGINT
    self._previous = {}

  def __enter__(self):
    self.received = None
    if threading.current_thread() is threading.main_thread():
      self._previous = {signum: signal.signal(signum, self._note) for signum in EXIT_CODES}
    return self

  def __exit__(self, *exc_info):
    for signum, handler in self._previous.items():
      signal.signal(signum, handler)
    self._previous = {}

  def _note(self, signum, frame):
    del frame
    if self.received is None:
      self.received = signum
      logging.warning("%s received: training stops at the end of this loop, after saving a checkpoint.%s",
                      NAMES[signum], " Press Ctrl-C again to abort without saving." if signum == signal.SIGINT else "")
    elif signum == signal.SIGINT:
      sys.stderr.write("Second Ctrl-C: aborted without saving; a rerun resumes from the last checkpoint.\n")
      process_exit.exit_now(EXIT_CODES[signal.SIGINT])
