"""The optimizer and learning-rate schedule named in `config.optimizer`.

Its names import no TensorFlow (`runner.config.run_config` checks the config with them); making the optimizer or
schedule imports Keras.
"""

from typing import Any

import ml_collections

# Name -> the class in keras.optimizers (and tf_keras.optimizers).
OPTIMIZERS = {"sgd": "SGD", "adam": "Adam", "adamw": "AdamW"}
SCHEDULES = ("constant", "cosine", "warmup_cosine")


def learning_rate(config: ml_collections.ConfigDict, train_steps: int, keras_module: Any = None) -> Any:
  """Returns the learning rate: a float for 'constant', else a schedule of `keras_module` (default Keras 3).

  'cosine' decays from `learning_rate` to 0 over `train_steps`;
  'warmup_cosine' rises linearly from 0 to `learning_rate` over
  `warmup_steps`, then decays to 0 at `train_steps`.

  Args:
    config: `config.optimizer`, checked by `runner.config.run_config.validate`.
    train_steps: the total number of training steps.
    keras_module: `keras` (Keras 3, the default) or `tf_keras` (Keras 2).
  """
  if config.schedule == "constant":
    return config.learning_rate
  schedules = (keras_module or _keras_3()).optimizers.schedules
  if config.schedule == "cosine":
    return schedules.CosineDecay(config.learning_rate, decay_steps=train_steps)
  return schedules.CosineDecay(
      0.0,
      decay_steps=train_steps - config.warmup_steps,
      warmup_target=config.learning_rate,
      warmup_steps=config.warmup_steps,
  )


def create(config: ml_collections.ConfigDict, train_steps: int, keras_module: Any = None) -> Any:
  """Returns a new optimizer of `keras_module` for `config.optimizer`; call it inside the strategy's scope.

  `weight_decay` is Keras's decoupled weight decay, for every optimizer.
  `clipnorm` is not applied here: the Trainer clips the gradients after their
  cross-replica reduction.

  Args:
    config: `config.optimizer`, checked by `runner.config.run_config.validate`.
    train_steps: the total number of training steps, the length of the schedule.
    keras_module: `keras` (Keras 3, the default) or `tf_keras` (Keras 2): the
      Keras of the model the optimizer trains.
  """
  keras_module = keras_module or _keras_3()
  return getattr(keras_module.optimizers, OPTIMIZERS[config.name])(
      learning_rate=learning_rate(config, train_steps, keras_module), weight_decay=config.weight_decay
  )


def _keras_3() -> Any:
  import keras  # noqa: PLC0415

  return keras
