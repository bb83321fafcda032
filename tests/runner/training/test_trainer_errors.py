"""Bad input gets an early ConfigError naming what was wrong and what is valid; a diverging run stops; what
trains but not as meant (a global batch larger than the data, float16 on CPUs) gets one warning.
"""

import logging
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import runner
import strategies
from strategies import ConfigError
from testlib import paths
from testlib import trainer_testlib

SYNTHETIC = os.path.join(paths.REPO, "configs", "synthetic.py")


@pytest.fixture(name="one_device")
def fixture_one_device():
  return tf.distribute.OneDeviceStrategy("/cpu:0")


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(steps_per_loop=0), r"steps_per_loop must be a positive int or 'auto', got 0\."),
        (dict(steps_per_loop="fast"), r"steps_per_loop must be a positive int or 'auto', got 'fast'\."),
        (
            dict(precision="mixed_float32"),
            r"precision='mixed_float32' is not valid\. Did you mean 'mixed_float16'\? "
            r"Valid: float32, mixed_bfloat16, mixed_float16",
        ),
        (dict(checkpoint_every=10), r"checkpoint_every=10 needs a model_dir"),
        (dict(max_to_keep=0), r"max_to_keep must be a positive int, got 0"),
        (dict(profile_steps=(3, 5)), r"profile_steps=\(3, 5\) needs a model_dir to write the trace to\."),
        (
            dict(profile_steps=5, model_dir="/tmp/unused"),
            r"profile_steps must be None or a pair of steps \(first, last\) "
            r"with 1 <= first <= last, e.g. \(5, 10\), got 5\.",
        ),
        (dict(clipnorm=-1.0), r"clipnorm must be None or a positive number, got -1\.0"),
        (dict(seed=1.5), r"seed must be None or an int, got 1\.5"),
        (dict(jit_compile="yes"), r"jit_compile must be True or False, got 'yes'"),
        (dict(quiet=1), r"quiet must be True or False, got 1"),
        (dict(task="classification"), r"task must be a runner\.Task .*got 'classification'"),
        (
            dict(model_fn=keras.Sequential()),
            r"model_fn must be a function with no arguments that makes the object "
            r"inside strategy\.scope\(\), got Sequential",
        ),
        (dict(optimizer_fn=keras.optimizers.SGD()), r"optimizer_fn must be a function .*got SGD"),
        (
            dict(model_fn=lambda: "a model"),
            r"model_fn test_trainer_errors:<lambda> returned str; it must return a keras\.Model\.",
        ),
        (
            dict(optimizer_fn=lambda: "sgd"),
            r"optimizer_fn test_trainer_errors:<lambda> returned str; it must return "
            r"a keras\.optimizers\.Optimizer\.",
        ),
    ],
)
def test_bad_constructor_arguments(options, message, one_device):
  with pytest.raises(ConfigError, match=message):
    trainer_testlib.make_trainer(one_device, **options)


class _MetricNamedLoss(runner.tasks.Classification):

  def metrics(self):
    return [keras.metrics.SparseCategoricalAccuracy(name="loss")]


class _OneMetricNotAList(runner.tasks.Classification):

  def metrics(self):
    return keras.metrics.SparseCategoricalAccuracy(name="accuracy")


def test_bad_strategy_and_metric_names(one_device):
  with pytest.raises(ConfigError, match=r"strategy must be a tf\.distribute\.Strategy .*got str"):
    trainer_testlib.make_trainer("mirrored")
  with pytest.raises(ConfigError, match=r"Metric name 'loss' is reserved"):
    trainer_testlib.make_trainer(one_device, task=_MetricNamedLoss())
  with pytest.raises(ConfigError, match=r"Task\.metrics\(\) must return a list of Keras metrics, got <Sparse"):
    trainer_testlib.make_trainer(one_device, task=_OneMetricNotAList())


def test_a_global_batch_the_replicas_do_not_divide_fails_before_tracing(cpu_devices):
  trainer = trainer_testlib.make_trainer(strategies.MirroredStrategy(cpu_devices(4)))
  data = trainer_testlib.classification_data(32)
  message = r"global_batch_size=10 does not split over the 4 replicas .* multiple of 4, e\.g\. 8 or 12"
  with pytest.raises(ConfigError, match=message):
    trainer.train(data, global_batch_size=10, steps=1)
  with pytest.raises(ConfigError, match=message):
    trainer.evaluate(data, global_batch_size=10)
  assert not trainer._loops.train_loops and trainer._loops.eval_loop is None  # noqa: SLF001
  with pytest.raises(ConfigError, match=r"global_batch_size must be a positive int, got 0"):
    trainer.train(data, global_batch_size=0, steps=1)


def test_bad_train_and_evaluate_arguments(one_device):
  trainer = trainer_testlib.make_trainer(one_device)
  data = trainer_testlib.classification_data(32)
  with pytest.raises(ConfigError, match=r"steps \(the global step to train to\) must be an int >= 0, got -1"):
    trainer.train(data, global_batch_size=8, steps=-1)
  with pytest.raises(ConfigError, match=r"eval_every=2 needs eval_data"):
    trainer.train(data, global_batch_size=8, steps=4, eval_every=2)
  with pytest.raises(ConfigError, match=r"steps must be a positive int, got 0"):
    trainer.evaluate(data, global_batch_size=8, steps=0)
  with pytest.raises(ConfigError, match=r"data must be an unbatched tf\.data\.Dataset .* got ndarray"):
    trainer.train(np.zeros((4, 8)), global_batch_size=8, steps=1)


@pytest.mark.parametrize(
    "dataset, message",
    [
        (
            tf.data.Dataset.from_tensor_slices(np.zeros((8, 8), np.float32)),
            r"The training data must be an unbatched dataset of \(features, labels\) or \(features, labels, "
            r"sample_weight\); its elements are TensorSpec",
        ),
        (
            tf.data.Dataset.from_tensor_slices((np.zeros((8, 8), np.float32), np.zeros(8), np.ones((8, 2)))),
            r"The sample_weight of the training data must be one scalar per example",
        ),
    ],
)
def test_elements_not_of_the_contract(dataset, message, one_device):
  with pytest.raises(ConfigError, match=message):
    trainer_testlib.make_trainer(one_device).train(dataset, global_batch_size=8, steps=1)


def test_evaluating_infinite_data_needs_steps(one_device):
  with pytest.raises(ConfigError, match=r"The evaluation data is infinite .* evaluate\(\.\.\., steps=N\)"):
    trainer_testlib.make_trainer(one_device).evaluate(
        trainer_testlib.classification_data(8).repeat(), global_batch_size=8
    )


def test_non_finite_features_stop_training_naming_the_step_and_no_later_checkpoint_exists(tmp_path, one_device):
  features, labels = trainer_testlib.classification_arrays(64)
  features[20] = np.nan  # In the third global batch of 8.
  trainer = trainer_testlib.make_trainer(one_device, model_dir=str(tmp_path), steps_per_loop=2, checkpoint_every=2)
  with pytest.raises(
      runner.data.DataError,
      match=r"^The training data's features hold NaN or inf values in the "
      r"batch of step 3; training stopped there, and no checkpoint "
      r"holds weights from that step on\.",
  ):
    trainer.train(tf.data.Dataset.from_tensor_slices((features, labels)), global_batch_size=8, steps=6)
  assert trainer.global_step == 3
  latest = tf.train.latest_checkpoint(str(tmp_path / "checkpoints"))
  assert latest.endswith("ckpt-2")
  reader = tf.train.load_checkpoint(latest)
  for name in reader.get_variable_to_shape_map():
    value = reader.get_tensor(name)
    if np.issubdtype(np.asarray(value).dtype, np.floating):
      assert np.all(np.isfinite(value)), name


def test_non_finite_labels_are_named_as_the_cause(one_device):
  features, _ = trainer_testlib.classification_arrays(64)
  targets = features[:, :1].copy()
  targets[42] = np.inf  # In the sixth global batch of 8.
  trainer = trainer_testlib.make_trainer(
      one_device,
      task=runner.tasks.Regression(),
      steps_per_loop=4,
      model_fn=lambda: keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)]),
  )
  with pytest.raises(
      runner.data.DataError, match=r"^The training data's labels hold NaN or inf values in the batch of step 6;"
  ):
    trainer.train(tf.data.Dataset.from_tensor_slices((features, targets)), global_batch_size=8, steps=8)
  assert trainer.global_step == 6


def test_a_diverging_run_is_told_to_lower_the_learning_rate(one_device):
  features, _ = trainer_testlib.classification_arrays(64)
  trainer = trainer_testlib.make_trainer(
      one_device,
      task=runner.tasks.Regression(),
      steps_per_loop=50,
      model_fn=lambda: keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)]),
      optimizer_fn=lambda: keras.optimizers.SGD(learning_rate=100.0),
  )
  with pytest.raises(
      FloatingPointError,
      match=r"^Training stopped at step \d+: the (loss|gradients) became .*"
      r"the batch's features and labels are finite, so the training "
      r"diverged\. .* Lower the learning rate",
  ):
    trainer.train(tf.data.Dataset.from_tensor_slices((features, features[:, :1])), global_batch_size=8, steps=50)
  assert 1 < trainer.global_step < 50


def test_non_finite_gradients_stop_training_even_when_the_loss_is_finite(one_device):
  def sqrt_of_zero():  # d/dx sqrt(|x|) at x = 0 is not finite; the loss is.
    return keras.Sequential(
        [
            keras.Input((8,)),
            keras.layers.Dense(8, kernel_initializer="zeros"),
            keras.layers.Lambda(lambda x: tf.sqrt(tf.abs(x))),
            keras.layers.Dense(4),
        ]
    )

  trainer = trainer_testlib.make_trainer(one_device, model_fn=sqrt_of_zero, steps_per_loop=4)
  with pytest.raises(
      FloatingPointError,
      match=r"^Training stopped at step 1: the gradients became non-finite "
      r"\(the loss was \d\.\d+\); the batch's features and labels are "
      r"finite",
  ):
    trainer.train(trainer_testlib.classification_data(64), global_batch_size=8, steps=8)
  assert trainer.global_step == 1


def test_a_checkpoint_of_another_optimizer_is_refused(tmp_path, one_device):
  data = trainer_testlib.classification_data(16)
  trainer_testlib.make_trainer(one_device, model_dir=str(tmp_path)).train(data, global_batch_size=8, steps=1)
  with pytest.raises(
      ConfigError, match=r"The checkpoint .*ckpt-1 does not match this model and optimizer .*Use a new model_dir"
  ):
    trainer_testlib.make_trainer(one_device, model_dir=str(tmp_path), optimizer_fn=lambda: keras.optimizers.Adam())


def test_data_that_runs_out_is_one_message_with_the_steps_done_and_they_are_saved(tmp_path, one_device):
  features, labels = trainer_testlib.classification_arrays(44)
  passes = []

  def one_pass():  # A one-shot generator: the second pass (the Trainer's repeat) gives nothing.
    if not passes:
      passes.append(1)
      yield from zip(features, labels)

  data = tf.data.Dataset.from_generator(
      one_pass,
      output_signature=(tf.TensorSpec([trainer_testlib.NUM_FEATURES], tf.float32), tf.TensorSpec([], tf.int32)),
  )
  trainer = trainer_testlib.make_trainer(one_device, model_dir=str(tmp_path), steps_per_loop=4)
  with pytest.raises(
      ConfigError,
      match=r"^The training data ran out at step 5 of 20 \(5 step\(s\) in this call\): "
      r"it gave no further full batch of 8 examples although the Trainer repeats "
      r"it\. .* Those steps are saved in a checkpoint at step 5\.$",
  ):
    trainer.train(data, global_batch_size=8, steps=20)
  assert trainer.global_step == 5
  assert tf.train.latest_checkpoint(str(tmp_path / "checkpoints")).endswith("ckpt-5")


def test_empty_training_data_is_one_message(one_device):
  empty = trainer_testlib.classification_data(8).take(0)
  with pytest.raises(ConfigError, match=r"^The training data ran out at step 0 of 4 \(0 step\(s\) in this call\)"):
    trainer_testlib.make_trainer(one_device, steps_per_loop=2).train(empty, global_batch_size=8, steps=4)


def _warnings(caplog):
  """The warnings the runner logged (through absl), not TensorFlow's own (e.g. its retracing warning)."""
  return [
      record.getMessage() for record in caplog.records if record.levelno == logging.WARNING and record.name == "absl"
  ]


def test_a_global_batch_larger_than_the_training_data_is_one_warning_with_both_sizes(one_device, caplog):
  features, labels = trainer_testlib.classification_arrays(24)
  trainer = trainer_testlib.make_trainer(one_device)
  with caplog.at_level(logging.WARNING, logger="absl"):
    for data in (runner.data.InMemory(features, labels), tf.data.Dataset.from_tensor_slices((features, labels))):
      trainer.train(data, global_batch_size=32, steps=trainer.global_step + 1)
      trainer.train(data, global_batch_size=32, steps=trainer.global_step + 1)  # The same input: not said again.
    unknown = tf.data.Dataset.from_tensor_slices((features, labels)).filter(lambda x, y: True)  # Not counted.
    trainer.train(unknown, global_batch_size=32, steps=trainer.global_step + 1)
    trainer.train(runner.data.InMemory(features, labels), global_batch_size=24, steps=trainer.global_step + 1)
  assert (
      _warnings(caplog)
      == [
          "The global batch of 32 examples is larger than the whole training data (24 examples): every step repeats "
          "examples within its batch. Use a global batch of at most 24 (config.data.global_batch_size), or more data."
      ]
      * 2
  )


def test_mixed_float16_without_a_gpu_is_one_warning_and_mixed_bfloat16_none(cpu_devices, caplog):
  with caplog.at_level(logging.WARNING, logger="absl"):
    trainer_testlib.make_trainer(strategies.MirroredStrategy(cpu_devices(2)), precision="mixed_float16")
    trainer_testlib.make_trainer(tf.distribute.OneDeviceStrategy("/cpu:0"), precision="mixed_bfloat16")
  assert _warnings(caplog) == [
      "precision='mixed_float16' without a GPU: the replicas train on CPU, where float16 math is emulated on most "
      "CPUs (slower than float32) and adds loss scaling. Use precision='float32' on CPUs, or 'mixed_bfloat16' on a "
      "TPU or a CPU with AVX512_BF16 or AMX."
  ]


def test_runner_run_warns_of_a_global_batch_larger_than_the_builtin_dataset_also_when_quiet(tmp_path, caplog):
  config = runner.load_config(
      SYNTHETIC,
      [
          "data.num_examples=48",
          "mode=train",
          "trainer.train_steps=2",
          "trainer.steps_per_loop=2",
          "strategy.name=one_device",
      ],
  )
  with caplog.at_level(logging.WARNING, logger="absl"):
    runner.run(config, workdir=str(tmp_path / "run"), quiet=True)
  assert _warnings(caplog) == [
      "The global batch of 64 examples is larger than the whole training data (48 examples): every step repeats "
      "examples within its batch. Use a global batch of at most 48 (config.data.global_batch_size), or more data."
  ]
