"""Releasing what a Trainer's traced steps left in TensorFlow's process-wide gradient registry.

Keras 3's optimizer sums the gradients over replicas with `ReplicaContext.all_reduce` under every strategy (one
replica included), and `all_reduce` is a `tf.custom_gradient`: traced into a graph, it registers its gradient
function under a new name (`CustomGradient-N`) in the registry of TensorFlow's module `ops`, and nothing ever
removes it. That function holds the traced graph's tensors and the replica context, so through it the registry keeps
the strategy and every graph traced for the step alive until the process ends: 3.4 MB per `runner.run` of a small
config under one_device, 7 MB under mirrored (docs/benchmarks.md#sweeps-in-one-process).

The registry is read only to differentiate such a graph once more, which nothing does after its Trainer is gone (the
Trainer takes the gradients inside the trace; its loop functions are its own). So `release_when_collected` removes,
when the Trainer is garbage-collected, the custom gradients registered since it was made whose function refers to
its strategy (a replica context of it). A user function traced under that strategy that calls `all_reduce`, e.g. in
an action, loses its registration then too: differentiating its graph after the Trainer is gone fails with
TensorFlow's `LookupError`.
"""

from typing import Any
import weakref

import tensorflow as tf
from tensorflow.python.framework import ops  # noqa: TID251

_CUSTOM_GRADIENT = "CustomGradient-"  # The prefix of the names `tf.custom_gradient` registers, with `ops.uid()`.
_CLOSURE_DEPTH = 3  # The registered function -> the tape's gradient function -> all_reduce's gradient -> its context.


def release_when_collected(owner: object, strategy: tf.distribute.Strategy) -> None:
  """When `owner` is garbage-collected, removes the custom gradients registered from now on that refer to `strategy`.

  Where this TensorFlow's gradient registry is not the dict of names this
  module knows, nothing is removed (the memory stays, as before).

  Args:
    owner: the object whose life the registrations share (a Trainer).
    strategy: the strategy whose replica contexts the registered functions
      refer to.
  """
  finalizer = weakref.finalize(owner, _release, strategy, after=ops.uid())
  finalizer.atexit = False  # At exit, the registry goes with the process.


def _release(strategy: tf.distribute.Strategy, *, after: int) -> None:
  """Removes the custom gradients registered after the uid `after` whose function refers to `strategy`."""
  entries = getattr(getattr(ops, "_gradient_registry", None), "_registry", None)
  if not isinstance(entries, dict):
    return
  for name, entry in list(entries.items()):
    if not name.startswith(_CUSTOM_GRADIENT):
      continue
    number = name[len(_CUSTOM_GRADIENT) :]
    if number.isdigit() and int(number) > after and _refers_to(entry.get("type"), strategy, _CLOSURE_DEPTH):
      entries.pop(name, None)


def _refers_to(function: Any, strategy: tf.distribute.Strategy, depth: int) -> bool:
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
