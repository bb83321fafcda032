"""Loops of many steps run unchecked; a loop that is not finite runs again from its start with the checks.

Each bad run is trained twice: with one step per call (a checked step, no loop) and with 4 steps per
loop (unchecked, rerun checked): the error, its message and the step reached must be the same, and
the latest checkpoint must hold the finite variables of the loop's start.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import runner
import strategies
from testlib import trainer_testlib

STEPS_PER_LOOP = 4


@pytest.fixture(name="strategy", params=["one_device", "mirrored2"])
def fixture_strategy(request, cpu_devices):
  if request.param == "one_device":
    return tf.distribute.OneDeviceStrategy("/cpu:0")
  return strategies.MirroredStrategy(cpu_devices(2))


def _regression_model():
  return keras.Sequential([keras.Input((trainer_testlib.NUM_FEATURES,)), keras.layers.Dense(1)])


def _sqrt_of_zero_model():  # d/dx sqrt(|x|) at x = 0 is not finite; the loss is.
  return keras.Sequential(
      [
          keras.Input((trainer_testlib.NUM_FEATURES,)),
          keras.layers.Dense(8, kernel_initializer="zeros"),
          keras.layers.Lambda(lambda x: tf.sqrt(tf.abs(x))),
          keras.layers.Dense(trainer_testlib.NUM_CLASSES),
      ]
  )


def _nan_features():
  features, labels = trainer_testlib.classification_arrays(64)
  features[52] = np.nan  # In the batch of step 7 (global batch 8): the second loop.
  return tf.data.Dataset.from_tensor_slices((features, labels)), {}


def _inf_labels():
  features, _ = trainer_testlib.classification_arrays(64)
  targets = features[:, :1].copy()
  targets[42] = np.inf  # In the batch of step 6.
  options = dict(task=runner.tasks.Regression(), model_fn=_regression_model)
  return tf.data.Dataset.from_tensor_slices((features, targets)), options


def _divergence():
  features, _ = trainer_testlib.classification_arrays(64)
  options = dict(
      task=runner.tasks.Regression(),
      model_fn=_regression_model,
      optimizer_fn=lambda: keras.optimizers.SGD(learning_rate=3.0),
  )
  return tf.data.Dataset.from_tensor_slices((features, features[:, :1] * 10.0)), options


def _nan_gradients():
  return trainer_testlib.classification_data(64), dict(model_fn=_sqrt_of_zero_model)


CASES = {
    "nan_features": (_nan_features, runner.data.DataError, r"^The training data's features hold NaN or inf values"),
    "inf_labels": (_inf_labels, runner.data.DataError, r"^The training data's labels hold NaN or inf values"),
    "divergence": (_divergence, FloatingPointError, r"^Training stopped at step \d+: the (loss|gradients) became"),
    "nan_gradients": (
        _nan_gradients,
        FloatingPointError,
        r"^Training stopped at step 1: the gradients became non-finite \(the loss was \d\.\d+\)",
    ),
}


def _failed_run(strategy, case, steps_per_loop, model_dir):
  """Trains `case` with `steps_per_loop`; returns (the error, the Trainer)."""
  make_data, error_type, message = CASES[case]
  data, options = make_data()
  trainer = trainer_testlib.make_trainer(
      strategy, model_dir=model_dir, steps_per_loop=steps_per_loop, checkpoint_every=STEPS_PER_LOOP, **options
  )
  with pytest.raises(error_type, match=message) as raised:
    trainer.train(data, global_batch_size=8, steps=40)
  return raised.value, trainer


def _state(trainer):
  """The model's and optimizer's variables and the step, as numpy arrays."""
  variables = trainer.model.variables + trainer._parts.optimizer.variables + [trainer._parts.step]  # noqa: SLF001
  return [np.array(tf.convert_to_tensor(v)) for v in variables]


@pytest.mark.parametrize("case", sorted(CASES))
def test_an_unchecked_loop_stops_at_the_first_bad_step_with_the_checked_message(strategy, case, tmp_path):
  checked_error, checked = _failed_run(strategy, case, 1, str(tmp_path / "checked"))
  unchecked_error, unchecked = _failed_run(strategy, case, STEPS_PER_LOOP, str(tmp_path / "unchecked"))
  assert str(unchecked_error) == str(checked_error)
  stopped_at = int(unchecked._parts.step.numpy())  # noqa: SLF001
  assert stopped_at == int(checked._parts.step.numpy())  # noqa: SLF001
  assert f"at step {stopped_at}" in str(unchecked_error) or f"step {stopped_at};" in str(unchecked_error)
  # The steps before the bad one were rerun from the loop's start on the same batches: the same state.
  for unchecked_value, checked_value in zip(_state(unchecked), _state(checked), strict=True):
    np.testing.assert_allclose(unchecked_value, checked_value, rtol=1e-5, equal_nan=True)

  loop_start = (stopped_at - 1) // STEPS_PER_LOOP * STEPS_PER_LOOP
  latest = tf.train.latest_checkpoint(str(tmp_path / "unchecked" / "checkpoints"))
  if loop_start == 0:
    assert latest is None
    return
  assert latest.endswith(f"ckpt-{loop_start}")
  _, options = CASES[case][0]()
  restored = trainer_testlib.make_trainer(strategy, model_dir=str(tmp_path / "unchecked"), **options)
  assert restored.global_step == loop_start
  # The checked run saved at every loop of 4 steps too, and ran the same steps before the bad one.
  reference = trainer_testlib.make_trainer(strategy, model_dir=str(tmp_path / "checked"), **options)
  reference.restore(checkpoint=str(tmp_path / "checked" / "checkpoints" / f"ckpt-{loop_start}"))
  for restored_value, reference_value in zip(_state(restored), _state(reference), strict=True):
    assert np.all(np.isfinite(restored_value))
    np.testing.assert_allclose(restored_value, reference_value, rtol=1e-5)


class _NanOnceAtCall(runner.tasks.Classification):
  """Classification whose loss is NaN at its `bad_call`-th call only: a fault the checked rerun does not meet."""

  def __init__(self, bad_call):
    super().__init__()
    self._bad_call = bad_call
    self.calls = None

  def loss(self, labels, outputs):
    if self.calls is None:
      with tf.init_scope():
        self.calls = tf.Variable(0, trainable=False)
    calls = self.calls.assign_add(1)
    return super().loss(labels, outputs) + tf.where(calls == self._bad_call, np.nan, 0.0)


def test_a_loop_whose_rerun_is_finite_continues_on_the_same_batches(tmp_path):
  strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
  data = trainer_testlib.classification_data(64)
  flaky_task = _NanOnceAtCall(bad_call=6)
  flaky = trainer_testlib.make_trainer(strategy, task=flaky_task, steps_per_loop=STEPS_PER_LOOP)
  flaky_results = flaky.train(data, global_batch_size=8, steps=12)
  clean = trainer_testlib.make_trainer(strategy, steps_per_loop=STEPS_PER_LOOP)
  clean_results = clean.train(data, global_batch_size=8, steps=12)
  assert flaky_results == pytest.approx(clean_results, rel=1e-6)
  assert flaky.global_step == 12
  assert int(flaky_task.calls.numpy()) == 12 + STEPS_PER_LOOP  # The loop of steps 5 to 8 ran twice.
  for flaky_value, clean_value in zip(_state(flaky), _state(clean), strict=True):
    np.testing.assert_allclose(flaky_value, clean_value, rtol=1e-6)
  # A later train call continues the rewound input: again the clean run's batches.
  for trainer in (flaky, clean):
    trainer.train(data, global_batch_size=8, steps=16)
  for flaky_value, clean_value in zip(_state(flaky), _state(clean), strict=True):
    np.testing.assert_allclose(flaky_value, clean_value, rtol=1e-6)
