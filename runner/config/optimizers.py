"""The optimizer and learning-rate schedule named in `config.optimizer`.

`check` imports no TensorFlow (`runner.config.run_config` checks the config with it). The optimizer's name and its
own arguments (the fields of `config.optimizer` that are not in the schema) are checked where the optimizer is made
(`create`), against the optimizers of the model's Keras, which that imports.
"""

from collections.abc import Callable
import functools
import inspect
from typing import Any

import ml_collections

from runner.config import registry
from strategies import checks
from strategies.errors import ConfigError

_OPTIONAL_NUMBER = functools.partial(checks.positive_number, optional=True)
# The schema of `config.optimizer` (`runner.config.run_config.SCHEMA`): field -> (default, check). Its other fields
# are the optimizer's own arguments. name, schedule, warmup_steps, ema_momentum and the schedules' fields are
# checked by `check`.
FIELDS: dict[str, tuple[Any, Callable[[Any, str], Any] | None]] = {
    "name": ("adam", None),  # Every optimizer of the model's Keras, by name, or 'module:function'.
    "learning_rate": (1e-3, checks.positive_number),
    "schedule": ("constant", None),
    "warmup_steps": (0, None),
    "weight_decay": (0.0, functools.partial(checks.positive_number, allow_zero=True)),
    "clipnorm": (float, _OPTIONAL_NUMBER),
    "ema_momentum": (float, None),  # None: no moving average of the weights.
    "gradient_accumulation_steps": (1, checks.positive_int),  # Micro-batches per step (a Trainer option).
    "end_learning_rate": (0.0, functools.partial(checks.positive_number, allow_zero=True)),  # 'linear'
    "decay_rate": (float, _OPTIONAL_NUMBER),  # 'exponential'
    "decay_steps": (int, functools.partial(checks.positive_int, optional=True)),  # 'exponential'
    "boundaries": (tuple, None),  # 'piecewise'
    "rates": (tuple, None),  # 'piecewise'
}
SCHEDULES = ("constant", "cosine", "warmup_cosine", "linear", "exponential", "piecewise", "rsqrt")
# Schedule -> the fields of config.optimizer that it needs and that only it takes.
SCHEDULE_FIELDS = {
    "linear": ("end_learning_rate",),
    "exponential": ("decay_rate", "decay_steps"),
    "piecewise": ("boundaries", "rates"),
}
# Arguments of a Keras optimizer that are not its own fields: the schema's fields set them, or the Trainer does
# their work (clipping after the cross-replica sum; not clipvalue nor global_clipnorm, which clip each replica's).
NOT_OWN = ("name", "use_ema", "clipvalue", "global_clipnorm", "gradient_accumulation_steps")


def check(config: ml_collections.ConfigDict, train_steps: int) -> None:
  """Checks the name, the schedule, its fields and `ema_momentum` of `config` (`config.optimizer`); no import.

  Raises:
    ConfigError: naming the field, its value and what is valid.
  """
  if not isinstance(config.name, str) or not config.name:
    raise ConfigError(f"config.optimizer.name must be a non-empty string, got {config.name!r}.")
  if ":" not in config.schedule:
    checks.one_of(config.schedule, SCHEDULES, "config.optimizer.schedule")
  if config.ema_momentum is not None and not 0 < config.ema_momentum < 1:
    raise ConfigError(
        f"config.optimizer.ema_momentum={config.ema_momentum} is not in (0, 1); give e.g. 0.999, or None for no "
        "moving average of the weights."
    )
  first = 1 if config.schedule == "warmup_cosine" else 0
  if not first <= config.warmup_steps < train_steps:
    raise ConfigError(
        f"Schedule {config.schedule!r} needs {first} <= config.optimizer.warmup_steps < config.trainer.train_steps="
        f"{train_steps}, got warmup_steps={config.warmup_steps}."
    )
  defaults = {"end_learning_rate": 0.0}
  for schedule, fields in SCHEDULE_FIELDS.items():
    for field in fields:
      if schedule == config.schedule and config[field] is None:
        raise ConfigError(f"Schedule {schedule!r} needs config.optimizer.{field}; it is None.")
      if schedule != config.schedule and config[field] != defaults.get(field):
        raise ConfigError(
            f"config.optimizer.{field}={config[field]!r} is taken only by schedule {schedule!r}, not by "
            f"{config.schedule!r}. Set schedule={schedule!r}, or leave {field} out."
        )
  if config.schedule == "piecewise" and (
      len(config.rates) != len(config.boundaries) + 1 or list(config.boundaries) != sorted(set(config.boundaries))
  ):
    raise ConfigError(
        f"Schedule 'piecewise' needs increasing config.optimizer.boundaries and one more rate than boundaries, "
        f"got boundaries={config.boundaries}, rates={config.rates}."
    )


def learning_rate(config: ml_collections.ConfigDict, train_steps: int, keras_module: Any = None) -> Any:
  """Returns the learning rate: a float for 'constant' without warmup, else a schedule of `keras_module`.

  With `warmup_steps` W, the rate rises linearly from 0 at step 0 to the
  schedule's first rate at step W; the schedule then runs from its own step
  0 at global step W, over `train_steps - W` steps (docs/config.md has each
  schedule's formula).

  Args:
    config: `config.optimizer`, checked by `runner.config.run_config.validate`.
    train_steps: the total number of training steps.
    keras_module: `keras` (Keras 3, the default) or `tf_keras` (Keras 2).
  """
  keras_module = keras_module or _keras_3()
  schedules, rate, warmup = keras_module.optimizers.schedules, config.learning_rate, config.warmup_steps
  decay_steps = train_steps - warmup
  if config.schedule in ("cosine", "warmup_cosine"):  # Keras's cosine decay has the linear warmup.
    return schedules.CosineDecay(
        0.0 if warmup else rate, decay_steps, warmup_target=rate if warmup else None, warmup_steps=warmup
    )
  if config.schedule == "constant" and not warmup:
    return rate
  import tensorflow as tf  # noqa: PLC0415  (only where a schedule is made: the model's Keras imported it)

  if config.schedule == "linear":
    after = schedules.PolynomialDecay(rate, decay_steps, end_learning_rate=config.end_learning_rate)
  elif config.schedule == "exponential":
    after = schedules.ExponentialDecay(rate, config.decay_steps, config.decay_rate)
  elif config.schedule == "piecewise":
    after = schedules.PiecewiseConstantDecay([float(b) for b in config.boundaries], list(config.rates))
  elif config.schedule == "rsqrt":
    after = lambda step: rate * tf.math.rsqrt(step / max(warmup, 1) + 1.0)  # noqa: E731
  elif config.schedule == "constant":
    after = lambda step: tf.constant(rate)  # noqa: E731
  else:
    after = registry.resolve("schedule", config.schedule)(rate, decay_steps)
  base: Any = schedules.LearningRateSchedule  # The model's Keras's: its optimizer takes no other.
  if not warmup and isinstance(after, base):
    return after

  class Schedule(base):
    """The linear warmup, then `after` from its step 0."""

    def __call__(self, step: Any) -> Any:
      step = tf.cast(step, tf.float32)
      return tf.where(step < warmup, after(0.0) * step / max(warmup, 1), after(tf.maximum(step - warmup, 0.0)))

    def get_config(self) -> dict[str, Any]:
      return {"schedule": config.schedule, "learning_rate": rate, "warmup_steps": warmup}

  return Schedule()


def keras_optimizers(keras_module: Any) -> dict[str, type]:
  """Returns every optimizer class of `keras_module.optimizers` that takes a learning rate, by lower-case name."""
  base = keras_module.optimizers.Optimizer
  return {
      name.lower(): value
      for name, value in vars(keras_module.optimizers).items()
      if isinstance(value, type) and issubclass(value, base) and "learning_rate" in inspect.signature(value).parameters
  }


def create(config: ml_collections.ConfigDict, train_steps: int, keras_module: Any = None) -> Any:
  """Returns a new optimizer of `keras_module` for `config.optimizer`; call it inside the strategy's scope.

  The optimizer is `keras_module`'s of that name (any case), or what the
  function 'package.module:function' returns, called with `learning_rate`
  (a float or a schedule), `weight_decay` (for a function, only when not
  0), `use_ema=True` and `ema_momentum` when that is set, and the fields of
  `config.optimizer` outside the schema as keyword arguments.
  `weight_decay` is Keras's decoupled weight decay. `clipnorm` is not applied
  here: the Trainer clips the gradients after their cross-replica reduction.

  Args:
    config: `config.optimizer`, checked by `runner.config.run_config.validate`.
    train_steps: the total number of training steps, the length of the schedule.
    keras_module: `keras` (Keras 3, the default) or `tf_keras` (Keras 2): the
      Keras of the model the optimizer trains.

  Raises:
    ConfigError: an unknown name (with a did-you-mean and the valid names), a
      name of Keras 3 that tf_keras does not have, a function that does not
      import, or an argument the optimizer does not take (with the ones it takes).
  """
  keras_module = keras_module or _keras_3()
  own = {field: config[field] for field in config if field not in FIELDS}
  arguments = {"learning_rate": learning_rate(config, train_steps, keras_module), "weight_decay": config.weight_decay}
  if config.ema_momentum is not None:
    arguments.update(use_ema=True, ema_momentum=config.ema_momentum)
  if ":" in config.name:
    make, what = registry.resolve("optimizer", config.name), f"the optimizer {config.name!r}"
    arguments = {k: v for k, v in arguments.items() if k != "weight_decay" or v}
  else:
    make = _keras_optimizer(config.name, keras_module)
    what = f"{keras_module.__name__}.optimizers.{make.__name__}"
  parameters = inspect.signature(make).parameters
  valid = [name for name, p in parameters.items() if name not in (*FIELDS, *NOT_OWN) and p.kind != p.VAR_KEYWORD]
  for field in own:
    if field not in valid:
      raise ConfigError(
          f"config.optimizer.{field} is not an argument of {what}.{checks.did_you_mean(field, [*valid, *FIELDS])} "
          f"Its arguments: {', '.join(valid) or 'none'}."
      )
  try:
    inspect.signature(make).bind(**arguments, **own)
  except TypeError as e:
    raise ConfigError(f"{what} cannot be called with {', '.join([*arguments, *own])} ({e}).") from None
  return make(**arguments, **own)


def _keras_optimizer(name: str, keras_module: Any) -> type:
  """Returns the optimizer class of `keras_module` named `name` (any case).

  Raises:
    ConfigError: no such optimizer, with the closest name and the valid ones.
  """
  found = keras_optimizers(keras_module)
  if name.lower() in found:
    return found[name.lower()]
  keras_3 = _keras_3()
  if keras_module is not keras_3 and name.lower() in keras_optimizers(keras_3):
    problem = f"tf_keras (Keras 2), the Keras of the model, has no optimizer {name!r}."
  else:
    problem = f"Unknown optimizer {name!r}.{checks.did_you_mean(name.lower(), found)}"
  raise ConfigError(
      f"{problem} Optimizers of {keras_module.__name__}: {', '.join(sorted(found))}; or give an import path "
      "'package.module:function'."
  )


def _keras_3() -> Any:
  import keras  # noqa: PLC0415

  return keras
