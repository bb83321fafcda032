"""Ending the process at once, as the CLI and the signal handlers do, without leaving files behind.

`os._exit` skips the interpreter's teardown, where TensorFlow 2.21 can
deadlock deleting a live tf.data iterator, and with it every `atexit`
handler, among them AutoGraph's removal of the modules it generates in the
temporary folder (a `__autograph_generated_file*.py` per converted function;
a training run makes about 20). `exit_now` deletes those first, after what
was registered with `on_exit_now` (the workdir lock's release).
"""

from collections.abc import Callable
import contextlib
import os
import sys
from typing import NoReturn

AUTOGRAPH_MODULE_PREFIX = "__autograph_generated_file"
_before_exit: list[Callable[[], object]] = []  # What `exit_now` calls first, e.g. releasing a workdir lock.


def on_exit_now(callback: Callable[[], object]) -> Callable[[], None]:
  """Has `exit_now` call `callback()` before the process ends; returns a function that takes it back.

  An exception from `callback` is ignored: the process ends anyway.
  """
  _before_exit.append(callback)

  def take_back() -> None:
    if callback in _before_exit:
      _before_exit.remove(callback)

  return take_back


def exit_now(status: int) -> NoReturn:
  """Calls what `on_exit_now` registered, flushes stdout and stderr, deletes AutoGraph's files, and ends the process.

  The process ends with `status`, skipping teardown. A stream that cannot be
  flushed (its reader is gone, e.g. a launcher that was killed) does not keep
  the process from ending with `status`. AutoGraph's modules stay loaded:
  only their source files go, which nothing reads once a module has run.
  """
  for callback in list(_before_exit):
    with contextlib.suppress(Exception):
      callback()
  for stream in (sys.stdout, sys.stderr):
    with contextlib.suppress(OSError, ValueError):
      stream.flush()
  for name, module in list(sys.modules.items()):
    path = getattr(module, "__file__", None)
    if name.startswith(AUTOGRAPH_MODULE_PREFIX) and path:
      with contextlib.suppress(FileNotFoundError):
        os.remove(path)
  os._exit(status)
