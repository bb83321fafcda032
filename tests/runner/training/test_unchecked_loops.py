"""Loops of many steps run unchecked once a checkpoint exists; a loop that is not finite reruns checked from it.

Each bad run is trained twice: with one step per call (a checked step, no loop) and with 4 steps per
loop (checked until the first checkpoint, then unchecked, rerun checked from the latest checkpoint):
the error, its message, the step reached and the state must be the same, and the latest checkpoint
must hold finite variables.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

import runner
import strategies
from testlib import trainer_testlib

STEPS_PER_LOOP = 4


@pytest.fixture(name="strategy")
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


def _failed_run(strategy, case, steps_per_loop, model_dir, checkpoint_every=STEPS_PER_LOOP, make_data=None):
  """Trains `case` (its data from `make_data`, if given) with `steps_per_loop`; returns (the error, the Trainer)."""
  default_data, error_type, message = CASES[case]
  data, options = (make_data or default_data)()
  trainer = trainer_testlib.make_trainer(
      strategy, model_dir=model_dir, steps_per_loop=steps_per_loop, checkpoint_every=checkpoint_every, **options
  )
  with pytest.raises(error_type, match=message) as raised:
    trainer.train(data, global_batch_size=8, steps=40)
  return raised.value, trainer


def _state(trainer):
  """The model's and optimizer's variables and the step, as numpy arrays."""
  variables = trainer.model.variables + trainer._parts.optimizer.variables + [trainer._parts.step]  # noqa: SLF001
  return [np.array(tf.convert_to_tensor(v)) for v in variables]


# Every case on one device; two of them (the data's check and the loss's) on two replicas too, where the sums per
# replica are summed when read.
@pytest.mark.parametrize(
    "strategy, case",
    [("one_device", case) for case in sorted(CASES)] + [("mirrored2", "nan_features"), ("mirrored2", "divergence")],
    indirect=["strategy"],
)
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


def test_a_bad_loop_reruns_checked_from_a_checkpoint_before_its_start(tmp_path):
  def nan_features_at_step_14():
    features, labels = trainer_testlib.classification_arrays(128)
    features[108] = np.nan  # In the batch of step 14: the fourth loop; the latest checkpoint is at step 8.
    return tf.data.Dataset.from_tensor_slices((features, labels)), {}

  strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
  runs = {}
  for name, steps_per_loop in (("checked", 1), ("unchecked", STEPS_PER_LOOP)):
    runs[name] = _failed_run(
        strategy, "nan_features", steps_per_loop, str(tmp_path / name), 8, make_data=nan_features_at_step_14
    )
  assert str(runs["unchecked"][0]) == str(runs["checked"][0])
  assert "in the batch of step 14;" in str(runs["unchecked"][0])
  assert runs["unchecked"][1].global_step == runs["checked"][1].global_step
  for unchecked_value, checked_value in zip(_state(runs["unchecked"][1]), _state(runs["checked"][1]), strict=True):
    np.testing.assert_allclose(unchecked_value, checked_value, rtol=1e-5)
  assert tf.train.latest_checkpoint(str(tmp_path / "unchecked" / "checkpoints")).endswith("ckpt-8")
  restored = trainer_testlib.make_trainer(strategy, model_dir=str(tmp_path / "unchecked"))
  assert restored.global_step == 8 and all(np.all(np.isfinite(value)) for value in _state(restored))


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
  # Without a model_dir there is no checkpoint to rerun from: every step is checked, and the fault stops training.
  without_dir = trainer_testlib.make_trainer(strategy, task=_NanOnceAtCall(bad_call=6), steps_per_loop=STEPS_PER_LOOP)
  with pytest.raises(FloatingPointError, match=r"^Training stopped at step 6: the loss became nan"):
    without_dir.train(data, global_batch_size=8, steps=12)
  flaky_task = _NanOnceAtCall(bad_call=6)
  options = dict(steps_per_loop=STEPS_PER_LOOP, checkpoint_every=STEPS_PER_LOOP)
  flaky = trainer_testlib.make_trainer(strategy, task=flaky_task, model_dir=str(tmp_path / "flaky"), **options)
  flaky_results = flaky.train(data, global_batch_size=8, steps=12)
  clean = trainer_testlib.make_trainer(strategy, model_dir=str(tmp_path / "clean"), **options)
  clean_results = clean.train(data, global_batch_size=8, steps=12)
  assert flaky_results == pytest.approx(clean_results, rel=1e-6)
  assert flaky.global_step == 12
  assert int(flaky_task.calls.numpy()) == 12 + STEPS_PER_LOOP  # The loop of steps 5 to 8 ran again from ckpt-4.
  for flaky_value, clean_value in zip(_state(flaky), _state(clean), strict=True):
    np.testing.assert_allclose(flaky_value, clean_value, rtol=1e-6)
  # A later train call continues the rewound input: again the clean run's batches.
  for trainer in (flaky, clean):
    trainer.train(data, global_batch_size=8, steps=16)
  for flaky_value, clean_value in zip(_state(flaky), _state(clean), strict=True):
    np.testing.assert_allclose(flaky_value, clean_value, rtol=1e-6)
