"""Every use of TensorFlow's private API in the project, each with what it works around.

The only module of `strategies/` and `runner/` that reads `tensorflow.python` or a private attribute
(`obj._name`) of a TensorFlow object (Keras's are in `runner/keras_workarounds.py`). Each function says which
TensorFlow behaviour it works around and the version it was checked against (`CHECKED_WITH`);
`tests/project/test_workarounds.py` runs each one against the installed TensorFlow and fails loudly when
that behaviour changes.
"""

from typing import Any
import weakref

import tensorflow as tf
from tensorflow.python.framework import ops  # noqa: TID251

CHECKED_WITH = "tensorflow 2.21.0"


# --- loops ---

# The prefix of the names `tf.custom_gradient` registers its gradient functions under (with `ops.uid()`).
_CUSTOM_GRADIENT = "CustomGradient-"


def release_gradients_when_collected(owner: object, strategy: Any) -> None:
  """When `owner` is garbage-collected, removes the custom gradients registered from now on that refer to `strategy`.

  Works around TensorFlow's process-wide gradient registry keeping every
  traced step alive: Keras 3's optimizer sums the gradients over replicas
  with `ReplicaContext.all_reduce` under every strategy, a
  `tf.custom_gradient`, which, traced into a graph, registers its gradient
  function as `CustomGradient-N` in `ops._gradient_registry` and never
  removes it. That function holds the traced graph and a replica context, so
  the strategy and every graph traced for a Trainer's steps would stay until
  the process ends (3.4 MB per `runner.run` of a small config under
  one_device, 7 MB under mirrored). The registry is read only to
  differentiate such a graph again, which nothing does once its Trainer is
  gone; a user function traced under that strategy that calls `all_reduce`
  loses its registration then too. Where the registry is not the dict of
  names checked with `CHECKED_WITH`, nothing is removed.

  Args:
    owner: the object whose life the registrations share (a Trainer).
    strategy: the strategy whose replica contexts the registered functions refer to.
  """
  finalizer = weakref.finalize(owner, _release_gradients, strategy, after=ops.uid())
  finalizer.atexit = False  # At exit, the registry goes with the process.


def _release_gradients(strategy: Any, *, after: int) -> None:
  entries = getattr(getattr(ops, "_gradient_registry", None), "_registry", None)
  if not isinstance(entries, dict):
    return
  for name, entry in list(entries.items()):
    number = name[len(_CUSTOM_GRADIENT) :]
    if name.startswith(_CUSTOM_GRADIENT) and number.isdigit() and int(number) > after:
      if _refers_to(entry.get("type"), strategy, depth=3):  # The function -> the tape's -> all_reduce's -> context.
        entries.pop(name, None)


def _refers_to(function: Any, strategy: Any, depth: int) -> bool:
  """Whether `function`'s closure, or a function's in it (to `depth` levels), holds a replica context of `strategy`."""
  for cell in getattr(function, "__closure__", None) or ():
    try:
      value = cell.cell_contents
    except ValueError:  # An empty cell.
      continue
    if isinstance(value, tf.distribute.ReplicaContext) and value.strategy is strategy:
      return True
    if depth > 1 and _refers_to(value, strategy, depth - 1):
      return True
  return False
