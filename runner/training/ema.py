"""The optimizer's moving average of the weights (`use_ema=True`), in the model while the Trainer evaluates or exports.

Keras (3 and tf_keras) keeps the averages of the trainable variables as
optimizer variables, updated by each step and saved in every checkpoint with
the optimizer; training goes on with the raw weights. Keras 3 starts the
average at the first step's weights, tf_keras at the initial ones:
`average = ema_momentum * average + (1 - ema_momentum) * weights` after every
later step.
"""

from collections.abc import Iterator
import contextlib
from typing import Any

import tensorflow as tf


@contextlib.contextmanager
def averaged_weights(strategy: tf.distribute.Strategy, parts: Any) -> Iterator[None]:
  """Holds the averaged weights in the model's trainable variables inside the block, the raw ones again after it.

  Nothing changes for an optimizer without `use_ema`, or before its first
  step (when Keras 3 has no average yet). The raw weights are copied aside
  (one copy of the trainable weights) and written back exactly, also when the
  block raises.

  Args:
    strategy: the strategy of the variables.
    parts: the Trainer's `model_parts.ModelParts`.
  """
  optimizer = getattr(parts.optimizer, "inner_optimizer", parts.optimizer)  # Under a LossScaleOptimizer.
  if not (parts.ready and getattr(optimizer, "use_ema", False) and int(optimizer.iterations.numpy())):
    yield
    return
  variables = parts.model.trainable_variables
  with strategy.scope():
    raw = [tf.identity(variable) for variable in variables]
    optimizer.finalize_variable_values(variables)
  try:
    yield
  finally:
    with strategy.scope():
      for variable, value in zip(variables, raw):
        variable.assign(value)
