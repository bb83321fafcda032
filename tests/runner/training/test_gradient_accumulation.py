"""Gradient accumulation: k micro-batches per step train as one step of the whole global batch."""

import os

import keras
import numpy as np
import pytest
import tensorflow as tf
import tf_keras

import runner
from runner import from_config
import strategies
from testlib import paths
from testlib import tf_keras_testlib
from testlib import trainer_testlib

GLOBAL_BATCH = 16
STEPS = 4


class _Rows(runner.actions.Action):
  """Every loop's train results (what metrics.jsonl's train rows hold)."""

  def __init__(self):
    self.rows = []

  def __call__(self, loop):
    self.rows.append({"step": loop.step, **loop.train_results})


def _model():
  """The tiny model with a weight and an activity regularizer: each counts once per step."""
  inputs = keras.Input((trainer_testlib.NUM_FEATURES,))
  hidden = keras.layers.Dense(6, activation="relu", kernel_regularizer="l2", activity_regularizer="l2")(inputs)
  return keras.Model(inputs, keras.layers.Dense(trainer_testlib.NUM_CLASSES)(hidden))


def _data():
  features, labels = trainer_testlib.classification_arrays(128)
  weights = np.random.default_rng(1).uniform(0.5, 2.0, len(labels)).astype(np.float32)
  return tf.data.Dataset.from_tensor_slices((features, labels, weights))


def _train(strategy, **options):
  """Trains STEPS steps in loops of 2; returns (weights, every loop's results)."""
  rows = _Rows()
  trainer = trainer_testlib.make_trainer(strategy, model_fn=_model, steps_per_loop=2, actions=[rows], **options)
  trainer.train(_data(), global_batch_size=GLOBAL_BATCH, steps=STEPS)
  return trainer.model.get_weights(), rows.rows


def test_k_micro_batches_end_at_the_weights_and_metrics_of_one_step_of_the_global_batch(cpu_devices, tmp_path):
  one_device, mirrored = tf.distribute.OneDeviceStrategy("/cpu:0"), strategies.MirroredStrategy(cpu_devices(2))
  clipnorm = 0.01  # Below every step's gradient norm: clipping is active in every step.
  references = {None: _train(one_device), clipnorm: _train(one_device, clipnorm=clipnorm)}
  runs = {  # Each behaviour once: one device, 2 replicas, clipping, XLA, unchecked loops (after a checkpoint).
      "2 mirrored, k=4, model_dir": (
          None,
          _train(mirrored, gradient_accumulation_steps=4, model_dir=str(tmp_path), checkpoint_every=2),
      ),
      "one_device, k=2, clipnorm, XLA": (
          clipnorm,
          _train(one_device, gradient_accumulation_steps=2, clipnorm=clipnorm, jit_compile=True),
      ),
  }
  assert not np.allclose(references[None][0][0], references[clipnorm][0][0], atol=1e-4)  # Clipping changed them.
  for name, (bound, (weights, rows)) in runs.items():
    want_weights, want_rows = references[bound]
    for got, want in zip(weights, want_weights, strict=True):
      np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=name)
    assert [row["step"] for row in rows] == [2, 4]
    for got, want in zip(rows, want_rows, strict=True):
      assert got["loss"] == pytest.approx(want["loss"], rel=1e-5), name
      assert got["accuracy"] == pytest.approx(want["accuracy"], abs=1e-6), name


def test_a_global_batch_that_k_and_the_replicas_do_not_divide_is_one_error(cpu_devices):
  mirrored = strategies.MirroredStrategy(cpu_devices(2))
  trainer = trainer_testlib.make_trainer(mirrored, gradient_accumulation_steps=3)
  with pytest.raises(strategies.ConfigError) as raised:
    trainer.train(_data(), global_batch_size=GLOBAL_BATCH, steps=1)
  assert str(raised.value) == (
      "global_batch_size=16 does not split over the 2 replicas of the strategy times gradient_accumulation_steps=3 "
      "micro-batches each; it must be a multiple of 6, e.g. 12 or 18."
  )
  assert trainer.global_step == 0
  config = runner.load_config(
      os.path.join(paths.REPO, "configs", "synthetic.py"),
      ["strategy.name=one_device", "data.global_batch_size=10", "optimizer.gradient_accumulation_steps=4"],
  )
  with pytest.raises(
      strategies.ConfigError,
      match=r"^config.data.global_batch_size: global_batch_size=10 does not split over the 1 replicas of the strategy times gradient_accumulation_steps=4 micro-batches each; it must be a multiple of 4, e.g. 8 or 12.$",
  ):
    from_config.create_strategy(config)
  with pytest.raises(strategies.ConfigError, match=r"^gradient_accumulation_steps must be a positive int, got 0.$"):
    trainer_testlib.make_trainer(mirrored, gradient_accumulation_steps=0)


def test_features_that_cannot_be_sliced_into_micro_batches_are_one_error():
  def sparse_model():  # A tf_keras model may declare a composite input.
    inputs = tf_keras.Input(type_spec=tf.SparseTensorSpec([None, trainer_testlib.NUM_FEATURES], tf.float32))
    return tf_keras.Model(inputs, tf_keras.layers.Dense(trainer_testlib.NUM_CLASSES)(inputs))

  features, labels = trainer_testlib.classification_arrays(32)
  data = tf.data.Dataset.from_tensor_slices((tf.sparse.from_dense(features), labels))
  trainer = tf_keras_testlib.make_trainer(
      tf.distribute.OneDeviceStrategy("/cpu:0"), model_fn=sparse_model, gradient_accumulation_steps=2
  )
  with pytest.raises(strategies.ConfigError) as raised:
    trainer.train(data, global_batch_size=GLOBAL_BATCH, steps=1)
  assert str(raised.value) == (
      "gradient_accumulation_steps=2 slices each batch into micro-batches, which its features' SparseTensor cannot be "
      "(tensors and ragged tensors can); set gradient_accumulation_steps=1."
  )
  assert trainer.global_step == 0
