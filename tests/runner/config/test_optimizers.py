"""`config.optimizer`: every optimizer of the installed Keras by name, its own arguments, and the schedules."""

import os

import keras
import ml_collections
import numpy as np
import pytest
import tensorflow as tf
import tf_keras

import runner
from runner.config import optimizers
from runner.config import run_config as config_lib
from strategies import ConfigError
from testlib import paths


def _optimizer_config(train_steps=10, **fields):
  """`config.optimizer` of a validated config with `fields` (an optimizer's own arguments among them)."""
  config = ml_collections.ConfigDict({"optimizer": fields, "trainer": {"train_steps": train_steps}})
  return config_lib.validate(config).optimizer


@pytest.mark.parametrize("keras_module", [keras, tf_keras])
def test_every_optimizer_of_the_installed_keras_builds_from_its_name_and_takes_a_step(keras_module):
  found = optimizers.keras_optimizers(keras_module)
  named = {"sgd", "rmsprop", "adagrad", "adadelta", "adam", "adamw", "adamax", "nadam", "ftrl", "adafactor", "lion"}
  assert named | ({"lamb", "muon"} if keras_module is keras else set()) <= set(found)
  for name, cls in found.items():
    optimizer = optimizers.create(_optimizer_config(name=name.upper(), learning_rate=0.1), 10, keras_module)
    assert type(optimizer) is cls
    variable = (keras.Variable if keras_module is keras else tf.Variable)(np.ones((2, 2), np.float32))
    optimizer.apply_gradients([(np.full((2, 2), 0.5, np.float32), variable)])
    assert float(optimizer.iterations.numpy()) == 1 and np.all(variable.numpy() < 1), name


def test_own_arguments_from_the_command_line_reach_the_optimizer():
  config = runner.load_config(
      os.path.join(paths.REPO, "configs", "synthetic.py"),
      ["optimizer.name=SGD", "optimizer.momentum=0.5", "optimizer.nesterov", "optimizer.ema_momentum=0.9"],
  )
  optimizer = optimizers.create(config.optimizer, 10)
  assert type(optimizer) is keras.optimizers.SGD
  assert (optimizer.momentum, optimizer.nesterov, optimizer.use_ema, optimizer.ema_momentum) == (0.5, True, True, 0.9)
  by_path = optimizers.create(_optimizer_config(name="keras.optimizers:Lion", beta_1=0.5), 10)  # An import path.
  assert type(by_path) is keras.optimizers.Lion and by_path.beta_1 == 0.5 and by_path.weight_decay is None


@pytest.mark.parametrize(
    "fields, train_steps, rates",
    [
        ({"schedule": "cosine"}, 100, {0: 1.0, 50: 0.5, 100: 0.0}),
        ({"schedule": "warmup_cosine", "warmup_steps": 10}, 110, {0: 0.0, 5: 0.5, 10: 1.0, 60: 0.5, 110: 0.0}),
        ({"schedule": "cosine", "warmup_steps": 10}, 110, {5: 0.5, 60: 0.5}),
        ({"schedule": "constant", "warmup_steps": 4}, 10, {0: 0.0, 1: 0.25, 4: 1.0, 9: 1.0}),
        ({"schedule": "linear", "end_learning_rate": 0.1, "warmup_steps": 1}, 11, {1: 1.0, 6: 0.55, 11: 0.1}),
        ({"schedule": "exponential", "decay_rate": 0.5, "decay_steps": 10}, 50, {0: 1.0, 5: 0.5**0.5, 20: 0.25}),
        ({"schedule": "piecewise", "boundaries": (10, 20), "rates": (1.0, 0.5, 0.1)}, 30, {10: 1.0, 11: 0.5, 21: 0.1}),
        ({"schedule": "rsqrt", "warmup_steps": 4}, 100, {2: 0.5, 4: 1.0, 16: 0.5, 64: 0.25}),
        ({"schedule": "rsqrt"}, 100, {0: 1.0, 3: 0.5}),
        (  # An import path, called as fn(learning_rate, decay_steps): Keras's linear decay to 1e-4.
            {"schedule": "keras.optimizers.schedules:PolynomialDecay", "warmup_steps": 2},
            12,
            {1: 0.5, 2: 1.0, 7: 1.0 - (1.0 - 1e-4) / 2},
        ),
    ],
    ids=lambda value: value.get("schedule") if isinstance(value, dict) and "schedule" in value else None,
)
def test_schedules_follow_their_formulas(fields, train_steps, rates):
  config = _optimizer_config(train_steps, learning_rate=1.0, **fields)
  schedule = optimizers.learning_rate(config, train_steps)
  got = {step: float(schedule(step)) if callable(schedule) else schedule for step in rates}
  assert got == pytest.approx(rates, abs=1e-6)
  if fields.get("warmup_steps") and ":" not in fields["schedule"]:  # tf_keras's optimizer takes its own schedules.
    schedule = optimizers.learning_rate(config, train_steps, tf_keras)
    assert isinstance(schedule, tf_keras.optimizers.schedules.LearningRateSchedule)
    assert {step: float(schedule(step)) for step in rates} == pytest.approx(rates, abs=1e-6)


def test_constant_without_warmup_is_a_float():
  assert optimizers.learning_rate(_optimizer_config(learning_rate=0.5), 10) == 0.5


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"ema_momentum": 0.0}, r"config.optimizer.ema_momentum=0.0 is not in \(0, 1\); give e.g. 0.999, or None"),
        ({"ema_momentum": 1.0}, r"config.optimizer.ema_momentum=1.0 is not in \(0, 1\)"),
        ({"ema_momentum": 1.5}, r"config.optimizer.ema_momentum=1.5 is not in \(0, 1\)"),
        ({"schedule": "cosin"}, r"config.optimizer.schedule='cosin' is not valid. Did you mean 'cosine'\?"),
        ({"schedule": "warmup_cosine"}, r"needs 1 <= config.optimizer.warmup_steps < config.trainer.train_steps=10"),
        (
            {"warmup_steps": 10},
            r"Schedule 'constant' needs 0 <= config.optimizer.warmup_steps < .*=10, got warmup_steps=10",
        ),
        ({"schedule": "exponential", "decay_steps": 5}, r"Schedule 'exponential' needs config.optimizer.decay_rate"),
        (
            {"schedule": "cosine", "boundaries": (5,)},
            r"config.optimizer.boundaries=\(5,\) is taken only by schedule 'piecewise', not by 'cosine'",
        ),
        (
            {"schedule": "piecewise", "boundaries": (5, 3), "rates": (1.0, 0.5, 0.1)},
            r"needs increasing config.optimizer.boundaries and one more rate than boundaries",
        ),
        ({"name": ""}, r"config.optimizer.name must be a non-empty string"),
    ],
)
def test_bad_schedule_or_ema_momentum_is_one_config_error_before_tensorflow_work(fields, message):
  with pytest.raises(ConfigError, match=message):
    _optimizer_config(**fields)


@pytest.mark.parametrize(
    "fields, keras_module, message",
    [
        (
            {"name": "adamm"},
            keras,
            r"^Unknown optimizer 'adamm'. Did you mean 'adam'\? Optimizers of keras: adadelta, .*, sgd; or give an "
            r"import path 'package.module:function'.$",
        ),
        (
            {"name": "sgd", "momentm": 0.9},
            keras,
            r"^config.optimizer.momentm is not an argument of keras.optimizers.SGD. Did you mean 'momentum'\? "
            r"Its arguments: momentum, nesterov, ",
        ),
        ({"name": "lamb"}, tf_keras, r"^tf_keras \(Keras 2\), the Keras of the model, has no optimizer 'lamb'. "),
        ({"name": "sgd", "clipvalue": 1.0}, keras, r"config.optimizer.clipvalue is not an argument of "),
        ({"name": "no_such_package_xyz:opt"}, keras, r"The optimizer 'no_such_package_xyz:opt' does not import"),
    ],
)
def test_an_unknown_optimizer_or_argument_is_one_config_error(fields, keras_module, message):
  with pytest.raises(ConfigError, match=message):
    optimizers.create(_optimizer_config(**fields), 10, keras_module)
