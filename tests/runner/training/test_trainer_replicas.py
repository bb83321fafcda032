"""The Trainer under different strategies and replica counts gives the same training."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import runner
import strategies
from testlib import trainer_testlib

GLOBAL_BATCH = 16
STEPS = 4


def _weighted_data():
  features, labels = trainer_testlib.classification_arrays(128)
  weights = np.random.default_rng(1).uniform(0.5, 2.0, len(labels)).astype(np.float32)
  return tf.data.Dataset.from_tensor_slices((features, labels, weights))


def test_weights_and_metrics_agree_across_strategies_and_replica_counts(cpu_devices):
  runs = {
      "default": tf.distribute.get_strategy(),
      "one_device": tf.distribute.OneDeviceStrategy("/cpu:0"),
      "mirrored2": strategies.MirroredStrategy(cpu_devices(2)),
      "mirrored4": strategies.MirroredStrategy(cpu_devices(4)),
  }
  results, weights = {}, {}
  for name, strategy in runs.items():
    trainer = trainer_testlib.make_trainer(strategy, steps_per_loop=2)
    results[name] = trainer.train(_weighted_data(), global_batch_size=GLOBAL_BATCH, steps=STEPS)
    weights[name] = trainer.model.get_weights()
    assert trainer.global_step == STEPS
  initial = trainer_testlib.model_fn().get_weights()
  reference = weights["one_device"]
  assert not np.allclose(reference[0], initial[0])  # It trained.
  for name in runs:
    assert set(results[name]) == {"loss", "accuracy"}
    np.testing.assert_allclose(results[name]["loss"], results["one_device"]["loss"], rtol=1e-5)
    assert results[name]["accuracy"] == pytest.approx(results["one_device"]["accuracy"], abs=1e-6)
    for got, want in zip(weights[name], reference):
      np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_train_loss_is_the_global_average_a_single_device_computes(cpu_devices):
  # One step of SGD with learning rate 0: the reported loss is the loss of the initial model on the first batch.
  features, labels = trainer_testlib.classification_arrays(GLOBAL_BATCH)
  trainer = trainer_testlib.make_trainer(
      strategies.MirroredStrategy(cpu_devices(4)), optimizer_fn=lambda: keras.optimizers.SGD(0.0)
  )
  kernel, bias = trainer.model.get_weights()
  results = trainer.train(
      tf.data.Dataset.from_tensor_slices((features, labels)), global_batch_size=GLOBAL_BATCH, steps=1
  )
  logits = features @ kernel + bias
  log_probs = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
  assert results["loss"] == pytest.approx(-log_probs[np.arange(GLOBAL_BATCH), labels].mean(), rel=1e-5)
  assert results["accuracy"] == pytest.approx(np.mean(logits.argmax(axis=1) == labels))


class SubclassedModel(keras.Model):

  def __init__(self):
    super().__init__()
    self.hidden = keras.layers.Dense(6, activation="relu")
    self.logits = keras.layers.Dense(trainer_testlib.NUM_CLASSES)

  def call(self, features):
    return self.logits(self.hidden(features))


def _functional():
  inputs = keras.Input((trainer_testlib.NUM_FEATURES,))
  return keras.Model(inputs, keras.layers.Dense(trainer_testlib.NUM_CLASSES)(inputs))


@pytest.mark.parametrize(
    "model_fn",
    [
        lambda: keras.Sequential([keras.layers.Dense(trainer_testlib.NUM_CLASSES)]),  # Builds on its first batch.
        _functional,
        SubclassedModel,
    ],
    ids=["lazy_sequential", "functional", "subclassed"],
)
def test_any_keras_model_trains_with_mirrored_variables(model_fn, cpu_devices):
  trainer = trainer_testlib.make_trainer(strategies.MirroredStrategy(cpu_devices(2)), model_fn=model_fn)
  results = trainer.train(trainer_testlib.classification_data(64), global_batch_size=GLOBAL_BATCH, steps=2)
  assert np.isfinite(results["loss"])
  assert trainer.model.weights
  for weight in trainer.model.weights:
    assert isinstance(weight.value, tf.distribute.DistributedValues), weight.path
  assert trainer.evaluate(trainer_testlib.classification_data(40), global_batch_size=GLOBAL_BATCH)["num_examples"] == 40


def test_properties(cpu_devices):
  strategy = strategies.MirroredStrategy(cpu_devices(2))
  trainer = trainer_testlib.make_trainer(strategy)
  assert trainer.strategy is strategy
  assert isinstance(trainer.model, keras.Model)
  assert trainer.global_step == 0
  assert isinstance(runner.Trainer, type) and issubclass(runner.tasks.Classification, runner.Task)
