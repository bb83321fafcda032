"""The moving average of the weights (an optimizer's `use_ema`, `config.optimizer.ema_momentum`).

Evaluation, export and prediction hold the average of each step's raw weights, computed
here by hand; training goes on with the raw weights; a checkpoint holds both,
so a resumed run equals an uninterrupted one.
"""

import os

import keras
import numpy as np
import pytest
import tensorflow as tf
import tf_keras

import strategies
from testlib import tf_keras_testlib
from testlib import trainer_testlib

MOMENTUM = 0.8
BATCH = 16


def _optimizer_fn(module):
  return lambda: module.optimizers.SGD(0.5, momentum=0.9, use_ema=True, ema_momentum=MOMENTUM)


def _loss(weights, features, labels):
  """The mean cross-entropy of the Dense model with `weights` (kernel, bias), in numpy."""
  logits = features @ weights[0] + weights[1]
  logits = logits - logits.max(axis=1, keepdims=True)
  log_softmax = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
  return -log_softmax[np.arange(len(labels)), labels].mean()


@pytest.mark.parametrize(
    "keras_module, replicas", [(keras, 1), (keras, 2), (tf_keras, 1)], ids=["one_device", "mirrored2", "tf_keras"]
)
def test_evaluation_and_export_hold_the_average_of_each_steps_weights(keras_module, replicas, cpu_devices, tmp_path):
  devices = cpu_devices(replicas)
  strategy = strategies.MirroredStrategy(devices) if replicas > 1 else strategies.OneDeviceStrategy(devices[0])
  testlib = trainer_testlib if keras_module is keras else tf_keras_testlib
  trainer = testlib.make_trainer(
      strategy, optimizer_fn=_optimizer_fn(keras_module), model_dir=str(tmp_path), quiet=True
  )
  features, labels = trainer_testlib.classification_arrays(64)
  data = tf.data.Dataset.from_tensor_slices((features, labels))
  if keras_module is keras and replicas == 1:  # Before any step Keras 3 has no average: the raw weights count.
    loss = _loss(trainer.model.get_weights(), features, labels)
    assert trainer.evaluate(data, global_batch_size=BATCH)["loss"] == pytest.approx(loss, rel=1e-5)
  # Keras 3 starts the average at the first step's weights, tf_keras at the initial ones.
  average = None if keras_module is keras else trainer.model.get_weights()
  for step in range(1, 4):  # One loop per step, each checkpointed: the raw weights of each step.
    trainer.train(data, global_batch_size=BATCH, steps=step)
    raw = trainer.model.get_weights()
    average = raw if average is None else [MOMENTUM * a + (1 - MOMENTUM) * w for a, w in zip(average, raw)]
  assert not np.allclose(average[0], raw[0], atol=1e-3)

  assert trainer.evaluate(data, global_batch_size=BATCH)["loss"] == pytest.approx(
      _loss(average, features, labels), rel=1e-5
  )
  if replicas > 1:
    exported = tf.saved_model.load(trainer.export(str(tmp_path / "export")))
    outputs = exported.signatures["serving_default"](features=features)["outputs"]
    np.testing.assert_allclose(outputs, features @ average[0] + average[1], rtol=1e-5, atol=1e-6)
    predictions = trainer.predict(data, global_batch_size=BATCH, path=str(tmp_path / "predictions"))
    rows = tf.data.TFRecordDataset(tf.io.gfile.glob(os.path.join(predictions, "*.tfrecord"))).map(
        lambda record: tf.io.parse_single_example(record, {"outputs": tf.io.VarLenFeature(tf.float32)})
    )
    predicted = np.stack([tf.sparse.to_dense(row["outputs"]).numpy() for row in rows])
    np.testing.assert_allclose(predicted, outputs, rtol=1e-5, atol=1e-6)  # Predictions hold the average too.
  held = [v.numpy() for v in [*trainer.model.weights, *trainer._parts.optimizer.variables]]  # noqa: SLF001
  for got, want in zip(trainer.model.get_weights(), raw):  # Training goes on from the raw weights, exactly.
    np.testing.assert_array_equal(got, want)

  if keras_module is keras and replicas == 1:  # Resumed from step 1's checkpoint: step 3's weights and averages.
    trainer.restore(checkpoint=os.path.join(str(tmp_path), "checkpoints", "ckpt-1"))
    trainer.train(data, global_batch_size=BATCH, steps=3)
    optimizer = trainer._parts.optimizer  # noqa: SLF001  (what a checkpoint holds)
    assert len(held) == len(optimizer.variables) + 2 > 5  # The weights, the step, the momentum, the averages.
    for got, want in zip([v.numpy() for v in [*trainer.model.weights, *optimizer.variables]], held):
      np.testing.assert_array_equal(got, want)
