"""A tf_keras (Keras 2) model and optimizer in the Trainer train as a hand-written tf_keras loop does.

Each run is compared with `tf_keras_testlib.hand_written_training` on the same
data from the same initial weights. The multi-worker and parameter-server runs
are in test_trainer_multi_worker.py and test_trainer_parameter_server.py.
"""

import os

import keras
import numpy as np
import pytest
from tensorboard.backend.event_processing import event_accumulator
import tensorflow as tf
import tf_keras

import runner
from runner import from_config
from runner.outputs import reports
import strategies
from testlib import paths
from testlib import tf_keras_testlib
from testlib import trainer_testlib

GLOBAL_BATCH = 16
STEPS = 6
SYNTHETIC = os.path.join(paths.REPO, "configs", "synthetic.py")


def _data():
  features, labels = trainer_testlib.classification_arrays()
  return features, labels, tf.data.Dataset.from_tensor_slices((features, labels))


def _train_against_the_hand_written_loop(strategy, results_tolerance=1e-5, **options):
  """Trains STEPS steps in loops of 3; returns (trainer, its weights, the hand-written loop's weights).

  The last loop's results (mean loss and accuracy of its 3 steps) are
  checked against the hand-written loop's, as closely as `results_tolerance`.
  """
  features, labels, dataset = _data()
  trainer = tf_keras_testlib.make_trainer(strategy, steps_per_loop=3, **options)
  initial = trainer.model.get_weights()
  results = trainer.train(dataset, global_batch_size=GLOBAL_BATCH, steps=STEPS)
  assert trainer.global_step == STEPS
  reference, step_results = tf_keras_testlib.hand_written_training(
      initial, features, labels, global_batch_size=GLOBAL_BATCH, steps=STEPS, clipnorm=options.get("clipnorm")
  )
  assert not np.allclose(reference[0], initial[0], atol=1e-2)  # It trained.
  last_loop = step_results[STEPS - 3 :]
  assert results["loss"] == pytest.approx(np.mean([r["loss"] for r in last_loop]), rel=results_tolerance)
  assert results["accuracy"] == pytest.approx(np.mean([r["accuracy"] for r in last_loop]), abs=1e-6)
  return trainer, trainer.model.get_weights(), reference


@pytest.mark.parametrize(
    "replicas, options",
    [(1, {}), (2, {}), (2, dict(clipnorm=0.5)), (1, dict(jit_compile=True)), (2, dict(jit_compile=True))],
    ids=["one_device", "mirrored2", "mirrored2_clipnorm", "one_device_jit", "mirrored2_jit"],
)
def test_weights_equal_a_hand_written_tf_keras_loop(replicas, options, cpu_devices):
  strategy = (
      tf.distribute.OneDeviceStrategy("/cpu:0") if replicas == 1 else strategies.MirroredStrategy(cpu_devices(replicas))
  )
  trainer, weights, reference = _train_against_the_hand_written_loop(strategy, **options)
  assert isinstance(trainer.model, tf_keras.Model)
  tf_keras_testlib.assert_weights_close(weights, reference)


def test_clipnorm_changes_these_weights_so_the_clipped_comparison_can_fail():
  """A bound of 0.5 clips these gradients: the clipped and unclipped loops end far apart."""
  features, labels, _ = _data()
  initial = tf_keras_testlib.model_fn().get_weights()
  runs = [
      tf_keras_testlib.hand_written_training(
          initial, features, labels, global_batch_size=GLOBAL_BATCH, steps=STEPS, clipnorm=clipnorm
      )[0]
      for clipnorm in (0.5, None)
  ]
  assert max(np.max(np.abs(clipped - unclipped)) for clipped, unclipped in zip(*runs)) > 1e-2


# Measured (2-core CPU VM): the largest weight difference to the float32 loop after 6 steps was 1.3e-4 under
# mixed_float16 and 2.2e-3 under mixed_bfloat16 (8 significant bits); the steps moved the weights by up to 0.49.
@pytest.mark.parametrize(
    "precision, compute_dtype, tolerance", [("mixed_float16", "float16", 1e-3), ("mixed_bfloat16", "bfloat16", 1e-2)]
)
def test_mixed_precision_computes_in_the_low_precision_and_ends_near_the_float32_loop(
    precision, compute_dtype, tolerance, cpu_devices
):
  trainer, weights, reference = _train_against_the_hand_written_loop(
      strategies.MirroredStrategy(cpu_devices(2)), results_tolerance=tolerance, precision=precision
  )
  dense = trainer.model.layers[0]
  assert dense.dtype_policy.name == precision
  assert (dense.compute_dtype, dense.variable_dtype) == (compute_dtype, "float32")
  assert trainer.model(tf.zeros([1, trainer_testlib.NUM_FEATURES])).dtype == compute_dtype
  optimizer = trainer._parts.optimizer  # noqa: SLF001
  if precision == "mixed_float16":
    assert isinstance(optimizer, tf_keras.mixed_precision.LossScaleOptimizer)
    assert isinstance(optimizer.inner_optimizer, tf_keras.optimizers.SGD)
    assert float(optimizer.loss_scale) == 2.0**15  # Its initial scale: no step had non-finite gradients.
  else:
    assert isinstance(optimizer, tf_keras.optimizers.SGD)
  assert tf_keras.mixed_precision.global_policy().name == "float32"  # Restored after the model was made.
  tf_keras_testlib.assert_weights_close(weights, reference, rtol=0, atol=tolerance)


def _train_with_checkpoints(model_dir, data, steps):
  trainer = tf_keras_testlib.make_trainer(
      tf.distribute.OneDeviceStrategy("/cpu:0"), model_dir=model_dir, steps_per_loop=3, checkpoint_every=4
  )
  trainer.train(data, global_batch_size=8, steps=steps)
  return trainer


def test_a_resumed_run_ends_bit_for_bit_where_an_uninterrupted_one_does(tmp_path):
  features, labels = trainer_testlib.classification_arrays(64)
  data = runner.data.InMemory(features, labels, shuffle=True, seed=3)  # 10 steps of 8: a resume mid-epoch.
  whole = _train_with_checkpoints(str(tmp_path / "whole"), data, 20)
  _train_with_checkpoints(str(tmp_path / "resumed"), data, 10)
  resumed = _train_with_checkpoints(str(tmp_path / "resumed"), data, 20)
  assert resumed.global_step == 20
  for got, want in zip(resumed.model.get_weights(), whole.model.get_weights()):
    np.testing.assert_array_equal(got, want)
  got, want = trainer_testlib.optimizer_variables(resumed), trainer_testlib.optimizer_variables(whole)
  assert len(got) == len(want) == 3  # iterations and one momentum per weight
  assert int(got[0]) == 20
  for got_variable, want_variable in zip(got, want):
    np.testing.assert_array_equal(got_variable, want_variable)


def test_the_exported_saved_model_serves_the_models_outputs(tmp_path, cpu_devices):
  trainer = tf_keras_testlib.make_trainer(strategies.MirroredStrategy(cpu_devices(2)))
  trainer.train(_data()[2], global_batch_size=GLOBAL_BATCH, steps=2)
  path = trainer.export(str(tmp_path / "saved_model"))
  features, _ = trainer_testlib.classification_arrays(5, seed=8)
  served = tf.saved_model.load(path).signatures["serving_default"](features=tf.constant(features))
  assert set(served) == {"outputs"}
  kernel, bias = trainer.model.get_weights()
  np.testing.assert_allclose(served["outputs"].numpy(), features @ kernel + bias, rtol=1e-5, atol=1e-6)


class _SeenLoops(runner.actions.Action):

  def __init__(self):
    self.seen = []

  def __call__(self, loop):
    self.seen.append((loop.step, loop.train_results["loss"]))


def _scalars(model_dir, split, tag):
  accumulator = event_accumulator.EventAccumulator(
      reports.summary_dir(model_dir, split), size_guidance={event_accumulator.TENSORS: 0}
  )
  accumulator.Reload()
  return [(event.step, float(tf.make_ndarray(event.tensor_proto))) for event in accumulator.Tensors(tag)]


def _train_with_a_decaying_learning_rate(model_dir, actions=()):
  """4 steps in loops of 2 of SGD whose tf_keras schedule halves the learning rate (0.1) at every step."""
  schedule = tf_keras.optimizers.schedules.ExponentialDecay(0.1, decay_steps=1, decay_rate=0.5)
  trainer = tf_keras_testlib.make_trainer(
      tf.distribute.OneDeviceStrategy("/cpu:0"),
      model_dir=model_dir,
      steps_per_loop=2,
      actions=actions,
      optimizer_fn=lambda: tf_keras.optimizers.SGD(schedule),
  )
  return trainer.train(_data()[2], global_batch_size=GLOBAL_BATCH, steps=4)


@pytest.fixture(scope="module")
def decaying_run(tmp_path_factory):
  """(model_dir, the loops an action saw, the results) of `_train_with_a_decaying_learning_rate`, run once."""
  model_dir = str(tmp_path_factory.mktemp("decaying"))
  seen = _SeenLoops()
  results = _train_with_a_decaying_learning_rate(model_dir, actions=[seen])
  return model_dir, seen.seen, results


def test_actions_and_tensorboard_scalars_see_each_loop(decaying_run):
  model_dir, seen, results = decaying_run
  assert [step for step, _ in seen] == [2, 4]
  assert seen[-1][1] == results["loss"]
  losses = _scalars(model_dir, "train", "loss")
  assert [step for step, _ in losses] == [2, 4]
  assert [loss for _, loss in losses] == pytest.approx([loss for _, loss in seen], rel=1e-6)


def test_the_reported_learning_rate_is_the_schedule_at_the_step_as_for_keras_3(decaying_run):
  """As test_trainer_outputs.py asserts for the same Keras 3 schedule: the rate the next step will use.

  tf_keras's `optimizer.learning_rate` is the rate its last step used (the
  schedule at one step less): 0.05 and 0.0125 here.
  """
  model_dir, _, _ = decaying_run
  assert _scalars(model_dir, "train", "learning_rate") == [
      (2, pytest.approx(0.1 * 0.5**2)),
      (4, pytest.approx(0.1 * 0.5**4)),
  ]


def test_a_label_outside_the_classes_is_named_as_for_a_keras_3_model(cpu_devices):
  features, labels = trainer_testlib.classification_arrays(64)
  labels[37] = 2 * trainer_testlib.NUM_CLASSES + 1  # In the batch of step 3 (global batch 16).
  trainer = tf_keras_testlib.make_trainer(strategies.MirroredStrategy(cpu_devices(2)), steps_per_loop=4)
  with pytest.raises(runner.data.DataError) as raised:
    trainer.train(tf.data.Dataset.from_tensor_slices((features, labels)), global_batch_size=16, steps=4)
  assert str(raised.value) == (
      "The training data's batch of step 3 holds a label outside the task's range: example 37 of the data "
      "(counting from 0) has label 9, but labels must be integers in [0, 4) (class ids of a model with 4 outputs "
      "(classes))."
  )
  assert trainer.global_step == 0


def test_non_finite_features_stop_training_at_their_step(tmp_path):
  features, labels = trainer_testlib.classification_arrays(64)
  features[20] = np.nan  # In the third global batch of 8.
  trainer = tf_keras_testlib.make_trainer(
      tf.distribute.OneDeviceStrategy("/cpu:0"), model_dir=str(tmp_path), steps_per_loop=2, checkpoint_every=2
  )
  with pytest.raises(
      runner.data.DataError,
      match=r"^The training data's features hold NaN or inf values in the batch of step 3; training stopped there, "
      r"and no checkpoint holds weights from that step on\.",
  ):
    trainer.train(tf.data.Dataset.from_tensor_slices((features, labels)), global_batch_size=8, steps=6)
  assert trainer.global_step == 3
  assert tf.train.latest_checkpoint(str(tmp_path / "checkpoints")).endswith("ckpt-2")


def test_features_of_another_shape_than_the_tf_keras_input_are_refused_before_any_step():
  trainer = tf_keras_testlib.make_trainer(tf.distribute.OneDeviceStrategy("/cpu:0"))
  features, labels = trainer_testlib.classification_arrays(32)
  with pytest.raises(runner.data.DataError) as raised:
    trainer.train(tf.data.Dataset.from_tensor_slices((features[:, :5], labels)), global_batch_size=8, steps=1)
  assert str(raised.value) == (
      "The training data's features have shape (5,) per example (element spec (TensorSpec(shape=(5,), "
      "dtype=tf.float32, name=None), TensorSpec(shape=(), dtype=tf.int32, name=None))), but the model's input "
      "takes (8,)."
  )
  assert trainer.global_step == 0


@pytest.mark.parametrize(
    "model_fn, optimizer_fn, message",
    [
        (
            tf_keras_testlib.model_fn,
            lambda: keras.optimizers.SGD(0.1),
            "model_fn made a tf_keras (Keras 2) model but optimizer_fn made a Keras 3 optimizer (SGD); both must be "
            "of one Keras. Make the optimizer with the model's Keras, e.g. tf_keras.optimizers.SGD.",
        ),
        (
            trainer_testlib.model_fn,
            lambda: tf_keras.optimizers.Adam(0.1),
            "model_fn made a Keras 3 model but optimizer_fn made a tf_keras (Keras 2) optimizer (Adam); both must be "
            "of one Keras. Make the optimizer with the model's Keras, e.g. keras.optimizers.Adam.",
        ),
        (
            tf_keras_testlib.model_fn,
            lambda: tf_keras.optimizers.legacy.Adam(0.1),
            f"optimizer_fn {__name__}:<lambda> returned Adam; it must return a current optimizer, not the legacy "
            "tf_keras.optimizers.legacy.Adam: use tf_keras.optimizers.Adam (it takes the same arguments).",
        ),
    ],
    ids=["tf_keras_model_keras_3_optimizer", "keras_3_model_tf_keras_optimizer", "tf_keras_legacy_optimizer"],
)
def test_an_optimizer_of_another_keras_or_a_legacy_one_is_one_error(model_fn, optimizer_fn, message):
  with pytest.raises(strategies.ConfigError) as raised:
    runner.Trainer(
        tf.distribute.OneDeviceStrategy("/cpu:0"),
        model_fn=model_fn,
        optimizer_fn=optimizer_fn,
        task=runner.tasks.Classification(),
    )
  assert str(raised.value) == message


def test_a_config_whose_model_is_a_tf_keras_function_trains_with_a_tf_keras_optimizer(tmp_path):
  config = runner.load_config(
      SYNTHETIC,
      [
          "model.name=testlib.tf_keras_testlib:mlp",
          "optimizer.schedule=cosine",
          "trainer.train_steps=100",
          "strategy.name=mirrored",  # Over the 4 logical CPUs of tests/conftest.py.
      ],
  )
  result = runner.run(config, str(tmp_path / "run"), quiet=True)
  assert isinstance(result.model, tf_keras.Model) and result.model.name == "tf_keras_mlp"
  assert result.num_replicas == 4 and result.global_step == 100
  # Measured (2-core CPU VM): eval accuracy 0.598, loss 1.31 after 100 steps (chance: 0.1, ln 10 = 2.30).
  assert result.eval_metrics["num_examples"] == 512
  assert result.eval_metrics["accuracy"] > 0.5 and result.eval_metrics["loss"] < 1.5
  trainer = from_config.create_trainer(result.config, result.strategy, None)
  optimizer = trainer._parts.optimizer  # noqa: SLF001
  assert isinstance(optimizer, tf_keras.optimizers.Adam)
  schedule = optimizer._learning_rate  # noqa: SLF001
  assert isinstance(schedule, tf_keras.optimizers.schedules.CosineDecay)
  assert (schedule.initial_learning_rate, schedule.decay_steps) == (3e-3, 100)


def test_the_tpu_check_traces_a_tf_keras_model_and_names_its_layer_a_tpu_cannot_run():
  """Cheap: the check stops at the traced step (2.4 s on a 2-core VM; a passing one also runs with XLA: 9 to 10 s).

  The jit_compile cases above compile tf_keras steps with XLA.
  """
  config = {
      "data": {"name": "synthetic", "num_features": trainer_testlib.NUM_FEATURES, "global_batch_size": 32},
      "model": {"name": "testlib.tf_keras_testlib:py_function_model", "num_outputs": 10},
      "trainer": {"train_steps": 10},
  }
  result = runner.check_tpu(config)
  assert not result.passed and result.train_steps == 0
  assert result.problem == (
      "the train step runs op EagerPyFunc (tf.py_function) in layer 'doubled_in_python' (PyFunctionLayer) of the "
      "model: it calls Python, which a TPU program cannot. Write it with TensorFlow ops, or do the Python work in "
      "the input pipeline."
  )
