"""SIGTERM during training: note it, so the loop can save a checkpoint and exit at a step all workers agree on."""

import signal
import threading

EXIT_CODE = 128 + signal.SIGTERM  # What a shell reports for a process ended by SIGTERM.


class SigtermWatch:
  """Inside `with`, a SIGTERM sets `received` instead of ending the process.

  The previous handler is put back on exit. Outside the main thread (where
  Python cannot install signal handlers) the watch does nothing.
  """

  def __init__(self):
    self.received = False
    self._previous = None

  def __enter__(self):
    self.received = False
    if threading.current_thread() is threading.main_thread():
      self._previous = signal.signal(signal.SIGTERM, self._note)
    return self

  def __exit__(self, *exc_info):
    if self._previous is not None:
      signal.signal(signal.SIGTERM, self._previous)
      self._previous = None

  def _note(self, signum, frame):
    del signum, frame
    self.received = True
