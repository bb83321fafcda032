"""Keras 3 variables sharded over parameter servers: their updates, optimizer slots, gradients and checkpoints.

`ParameterServerStrategy` splits a large variable into a `ShardedVariable`
(one shard per ps task, by `MinSizePartitioner`). A Keras 3 variable made in
its scope wraps that `ShardedVariable`, which Keras 3 was not written for:
`tape.gradient` needs a single handle, the optimizer's update goes through
`strategy.extended.update` (which colocates with the variable), its slots are
made with `colocate_vars_with` (which places them on the coordinator), and a
checkpoint asks the variable for one tensor. `enable` makes each of these work,
on public API but one class (`tensorflow_workarounds.WholeShardedVariable`):

- the strategy's `scope()` adds a variable creator: a sharded variable is made a
  `WholeShardedVariable`, checkpointed as one whole tensor exactly as an
  unsharded variable is (so checkpoints restore under any strategy), and a
  variable colocated with one (an optimizer slot) is sharded the same way;
- `strategy.extended.update` of a sharded variable runs the update as it is: its
  assign ops update each shard on its ps task;
- `gradients(tape, target, variables)`: gradients for variables whose values
  may be sharded.
"""

from collections.abc import Callable, Iterator, Sequence
import contextlib
import functools
from typing import Any

import tensorflow as tf

from strategies import tensorflow_workarounds

# TensorFlow's class, exported for Keras; a strategy's `partitioners` make them.
ShardedVariable = tf.__internal__.distribute.ShardedVariable


class KerasShardedVariables(tf.distribute.experimental.ParameterServerStrategy):
  """A `tf.distribute.experimental.ParameterServerStrategy` whose sharded variables Keras 3 can train.

  It adds methods only, no state, so `enable` can give this class to a
  strategy made with TensorFlow's.
  """

  @contextlib.contextmanager
  def scope(self) -> Iterator["KerasShardedVariables"]:
    """TensorFlow's `scope()`, with the variable creator of this module."""
    with super().scope(), tf.variable_creator_scope(_create_variable):
      yield self


def enable(strategy: tf.distribute.experimental.ParameterServerStrategy) -> None:
  """Gives a `tf.distribute.experimental.ParameterServerStrategy` the Keras 3 support of this module (once)."""
  if type(strategy) is tf.distribute.experimental.ParameterServerStrategy:
    strategy.__class__ = KerasShardedVariables
  if not isinstance(strategy.extended.update, functools.partial):
    strategy.extended.update = functools.partial(_update, strategy.extended.update)


def _create_variable(next_creator: Callable[..., Any], **kwargs: Any) -> Any:
  """Makes sharded variables `WholeShardedVariable`s; shards a variable colocated with one (a slot) like it."""
  if isinstance(kwargs.get("colocate_with"), ShardedVariable):
    del kwargs["colocate_with"]  # An optimizer slot: the same shape, so the same shards.
  variable = next_creator(**kwargs)
  if type(variable) is ShardedVariable:
    return tensorflow_workarounds.WholeShardedVariable(variable.variables, name=kwargs.get("name") or "ShardedVariable")
  return variable


def _update(
    update: Callable[..., Any],
    var: Any,
    fn: Callable[..., Any],
    args: Sequence[Any] = (),
    kwargs: dict[str, Any] | None = None,
    group: bool = True,
) -> Any:
  """`strategy.extended.update` that runs `fn(var, ...)` for a sharded `var` as it is (its shards are apart)."""
  if isinstance(var, ShardedVariable):
    return fn(var, *args, **(kwargs or {}))
  return update(var, fn, args, kwargs, group)


def describe(variables: Sequence[Any]) -> str:
  """One line on how `variables` (Keras or tf variables) are sharded, e.g. for a log.

  Example: '1 of 4 variables sharded: mlp/dense/kernel (1024, 64) in 2 shards
  on ps:0, ps:1'.
  """
  sharded = [v for v in variables if len(shards(v)) > 1]
  parts = []
  for variable in sharded:
    places = [_task(shard.device) for shard in shards(variable)]
    name = getattr(variable, "path", None) or variable.name
    parts.append(f"{name} {tuple(variable.shape)} in {len(places)} shards on {', '.join(places)}")
  return f"{len(sharded)} of {len(variables)} variables sharded" + (f": {'; '.join(parts)}" if parts else "")


def _task(device: str) -> str:
  spec = tf.DeviceSpec.from_string(device)
  return f"{spec.job}:{spec.task}" if spec.job else device


def shards(variable: Any) -> list[tf.Variable]:
  """Returns the `tf.Variable`s that hold `variable` (a Keras or tf variable): its shards, or itself."""
  value = getattr(variable, "value", variable)
  return list(value.variables) if isinstance(value, ShardedVariable) else [variable]


def gradients(tape: tf.GradientTape, target: tf.Tensor, variables: Sequence[Any]) -> list[Any]:
  """Returns `tape.gradient(target, variables)`, also for variables whose values are sharded.

  The gradient of a sharded variable is taken for each shard and joined
  along the first axis: dense gradients are concatenated, `tf.IndexedSlices`
  (from embedding lookups) stay sparse with their indices offset by shard.
  """
  sources = [shards(v) for v in variables]
  flat = iter(tape.gradient(target, [shard for group in sources for shard in group]))
  joined = []
  for group in sources:
    parts = [next(flat) for _ in group]
    joined.append(parts[0] if len(group) == 1 else _join(parts, group))
  return joined


def _join(parts: list[Any], group: list[tf.Variable]) -> tf.Tensor | tf.IndexedSlices | None:
  if any(part is None for part in parts):
    return None
  if not any(isinstance(part, tf.IndexedSlices) for part in parts):
    return tf.concat(parts, axis=0)
  offset, indices, values = 0, [], []
  for part, shard in zip(parts, group):
    if not isinstance(part, tf.IndexedSlices):
      shape = tf.shape(part, out_type=tf.int64)
      part = tf.IndexedSlices(part, tf.range(shape[0]), shape)
    indices.append(tf.cast(part.indices, tf.int64) + offset)
    values.append(part.values)
    offset += shard.shape[0]
  dense_shape = tf.constant([offset] + group[0].shape.as_list()[1:], tf.int64)
  return tf.IndexedSlices(tf.concat(values, 0), tf.concat(indices, 0), dense_shape)
