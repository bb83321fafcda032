"""Keras 3 variables sharded over parameter servers: their updates, optimizer slots, gradients and checkpoints.

`ParameterServerStrategy` splits a large variable into a `ShardedVariable`
(one shard per ps task, by `MinSizePartitioner`). A Keras 3 variable made in
its scope wraps that `ShardedVariable`, which Keras 3 was not written for:
`tape.gradient` needs a single handle, the optimizer's update goes through
`strategy.extended.update` (which colocates with the variable), its slots are
made with `colocate_vars_with` (which places them on the coordinator), and a
checkpoint asks the variable for one tensor. This module makes each of these
work:

- `ShardedVariableExtended` (the strategy's `extended`): a `ShardedVariable`
  is updated by its shards; a variable colocated with one (an optimizer slot)
  is sharded the same way, on the ps tasks.
- `ShardedVariable`: checkpointed as one whole tensor, exactly as an
  unsharded variable is, so checkpoints restore under any strategy.
- `gradients(tape, target, variables)`: gradients for variables whose values
  may be sharded.
"""

from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf
from tensorflow.python.distribute import distribute_lib  # noqa: TID251
from tensorflow.python.distribute import parameter_server_strategy_v2  # noqa: TID251
from tensorflow.python.distribute import sharded_variable  # noqa: TID251


class ShardedVariable(sharded_variable.ShardedVariable):
  """A `ShardedVariable` saved and restored as one whole tensor.

  TensorFlow saves each shard as a slice of the whole; Keras 3 variables ask
  their value for its tensors (`_serialize_to_tensors`), which TensorFlow's
  class does not give. This one gives the concatenated value under the key an
  unsharded variable uses, so a checkpoint has the same names and shapes with
  or without sharding, and restores into any number of shards.
  """

  def _serialize_to_tensors(self) -> dict[str, tf.Tensor]:
    return {"VARIABLE_VALUE": tf.convert_to_tensor(self)}

  def _restore_from_tensors(self, restored_tensors: dict[str, tf.Tensor]) -> Any:
    return self.assign(restored_tensors["VARIABLE_VALUE"])


class ShardedVariableExtended(parameter_server_strategy_v2.ParameterServerStrategyV2Extended):
  """The `extended` of a ParameterServerStrategy whose sharded variables Keras 3 can train.

  It adds methods only, no state, so `enable` can give it to the object
  TensorFlow's constructor made.
  """

  def _create_variable(self, next_creator: Callable[..., tf.Variable], **kwargs: Any) -> tf.Variable:
    """Makes sharded variables this module's `ShardedVariable`; shards a variable colocated with one like it."""
    if isinstance(kwargs.get("colocate_with"), sharded_variable.ShardedVariable):
      del kwargs["colocate_with"]  # An optimizer slot: the same shape, so the same shards.
    variable = super()._create_variable(next_creator, **kwargs)
    if type(variable) is sharded_variable.ShardedVariable:
      variable = ShardedVariable(variable.variables, name=kwargs.get("name") or "ShardedVariable")
    return variable

  def _update(
      self, var: Any, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], group: bool
  ) -> Any:
    """Runs `fn(var, ...)` for a `ShardedVariable` without colocating (its assign ops update each shard)."""
    if isinstance(var, sharded_variable.ShardedVariable):
      with distribute_lib.UpdateContext(var.variables[0].device):
        return fn(var, *args, **kwargs)
    return super()._update(var, fn, args, kwargs, group)


def enable(strategy: tf.distribute.experimental.ParameterServerStrategy) -> None:
  """Gives a `tf.distribute.experimental.ParameterServerStrategy` the Keras 3 support of this module (once).

  TensorFlow makes the strategy's `extended` inside its constructor; this
  gives that object the class `ShardedVariableExtended`, which adds methods
  only, no state.
  """
  if not isinstance(strategy.extended, ShardedVariableExtended):
    strategy.extended.__class__ = ShardedVariableExtended


def describe(variables: Sequence[Any]) -> str:
  """One line on how `variables` (Keras or tf variables) are sharded, e.g. for a log.

  Example: '1 of 4 variables sharded: mlp/dense/kernel (1024, 64) in 2 shards
  on ps:0, ps:1'.
  """
  sharded = [v for v in variables if len(shards(v)) > 1]
  line = f"{len(sharded)} of {len(variables)} variables sharded"
  parts = []
  for variable in sharded:
    places = [_task(shard.device) for shard in shards(variable)]
    name = getattr(variable, "path", None) or variable.name
    parts.append(f"{name} {tuple(variable.shape)} in {len(places)} shards on {', '.join(places)}")
  return f"{line}: {'; '.join(parts)}" if parts else line


def _task(device: str) -> str:
  spec = tf.DeviceSpec.from_string(device)
  return f"{spec.job}:{spec.task}" if spec.job else device


def shards(variable: Any) -> list[tf.Variable]:
  """Returns the `tf.Variable`s that hold `variable` (a Keras or tf variable): its shards, or itself."""
  value = getattr(variable, "value", variable)
  if isinstance(value, sharded_variable.ShardedVariable):
    return list(value.variables)
  return [variable]


def gradients(tape: tf.GradientTape, target: tf.Tensor, variables: Sequence[Any]) -> list[Any]:
  """Returns `tape.gradient(target, variables)`, also for variables whose values are sharded.

  The gradient of a sharded variable is taken for each shard and joined
  along the first axis: dense gradients are concatenated, `tf.IndexedSlices`
  (from embedding lookups) stay sparse with their indices offset by shard.
  """
  sources = [shards(v) for v in variables]
  flat = tape.gradient(target, [shard for group in sources for shard in group])
  joined: list[Any] = []
  start = 0
  for group in sources:
    parts = flat[start : start + len(group)]
    start += len(group)
    joined.append(parts[0] if len(group) == 1 else _join(parts, group))
  return joined


def _join(parts: list[Any], group: list[tf.Variable]) -> tf.Tensor | tf.IndexedSlices | None:
  if any(part is None for part in parts):
    return None
  if not any(isinstance(part, tf.IndexedSlices) for part in parts):
    return tf.concat(parts, axis=0)
  offsets, indices, values = 0, [], []
  for part, shard in zip(parts, group):
    part = part if isinstance(part, tf.IndexedSlices) else _as_slices(part)
    indices.append(part.indices + offsets)
    values.append(part.values)
    offsets += shard.shape[0]
  dense_shape = tf.constant([offsets] + group[0].shape.as_list()[1:], tf.int64)
  return tf.IndexedSlices(tf.concat(values, 0), tf.concat([tf.cast(i, tf.int64) for i in indices], 0), dense_shape)


def _as_slices(dense: tf.Tensor) -> tf.IndexedSlices:
  rows = tf.shape(dense, out_type=tf.int64)[0]
  return tf.IndexedSlices(dense, tf.range(rows), tf.shape(dense, out_type=tf.int64))
