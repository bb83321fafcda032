"""Composite features (ragged, sparse) through batching, distribution, the data checks, exact evaluation and export.

TF-GNN's `GraphTensor`, the composite the issue is about, takes the same paths;
its end-to-end runs are in tests/runner/test_gnn_example.py. The models here
are tf_keras models, whose `Input` declares a composite input.
"""

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

import runner
from runner.data import DataError
import strategies

NUM_EXAMPLES = 50
GLOBAL_BATCH = 10


def _rows():
  """Variable-length rows of Gaussian values; label 1 where a row sums above 0."""
  rng = np.random.default_rng(0)
  rows = [rng.standard_normal(1 + i % 5).astype(np.float32) for i in range(NUM_EXAMPLES)]
  return rows, np.array([int(row.sum() > 0) for row in rows], np.int32)


def _ragged_data(count=NUM_EXAMPLES):
  rows, labels = _rows()
  return tf.data.Dataset.from_tensor_slices((tf.ragged.constant(rows[:count]), labels[:count]))


def _sum_and_length(rows):
  return tf.stack([tf.reduce_sum(rows, axis=1), tf.cast(rows.row_lengths(), tf.float32)], axis=1)


def _ragged_model():
  """Logits from each row's sum and length: a tf_keras model whose input is declared ragged."""
  rows = tf_keras.Input(shape=(None,), ragged=True)
  return tf_keras.Model(rows, tf_keras.layers.Dense(2)(tf_keras.layers.Lambda(_sum_and_length)(rows)))


def _trainer(strategy, model_fn=_ragged_model, task=None, **options):
  return runner.Trainer(
      strategy,
      model_fn=model_fn,
      optimizer_fn=lambda: tf_keras.optimizers.SGD(0.1),
      task=task or runner.tasks.Classification(),
      seed=0,
      quiet=True,
      **options,
  )


def _scored_by_hand(model, rows, labels):
  logits = model(tf.ragged.constant(rows)).numpy()
  log_probs = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
  return -log_probs[np.arange(len(labels)), labels].mean(), np.mean(logits.argmax(axis=1) == labels)


@pytest.mark.parametrize("replicas", [1, 2])
def test_ragged_features_train_alike_on_any_replicas_and_evaluate_every_example_once(replicas, cpu_devices):
  strategy = strategies.MirroredStrategy(cpu_devices(replicas))
  trainer = _trainer(strategy, steps_per_loop=3)
  trainer.train(_ragged_data(), global_batch_size=GLOBAL_BATCH, steps=6)
  one_device = _trainer(tf.distribute.OneDeviceStrategy(cpu_devices(1)[0]), steps_per_loop=3)
  one_device.train(_ragged_data(), global_batch_size=GLOBAL_BATCH, steps=6)
  for got, want in zip(trainer.model.get_weights(), one_device.model.get_weights()):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  rows, labels = _rows()
  for count in (NUM_EXAMPLES, 7):  # 7: one partial batch, filled up with copies of the first example.
    results = trainer.evaluate(_ragged_data(count), global_batch_size=16)
    loss, accuracy = _scored_by_hand(trainer.model, rows[:count], labels[:count])
    assert results["num_examples"] == count
    assert results["loss"] == pytest.approx(loss, rel=1e-5)
    assert results["accuracy"] == pytest.approx(accuracy)


def test_sparse_features_train_as_their_dense_values_do(cpu_devices):
  rng = np.random.default_rng(1)
  dense = (rng.random((64, 6)) < 0.3) * rng.standard_normal((64, 6)).astype(np.float32)
  labels = (dense.sum(axis=1) > 0).astype(np.int32)
  sparse = tf.sparse.from_dense(dense.astype(np.float32))

  def model(declared_sparse):
    return lambda: tf_keras.Sequential([tf_keras.Input((6,), sparse=declared_sparse), tf_keras.layers.Dense(2)])

  strategy = strategies.MirroredStrategy(cpu_devices(2))
  from_sparse = _trainer(strategy, model_fn=model(True))
  from_sparse.train(tf.data.Dataset.from_tensor_slices((sparse, labels)), global_batch_size=16, steps=4)
  from_dense = _trainer(strategy, model_fn=model(False))
  from_dense.train(
      tf.data.Dataset.from_tensor_slices((dense.astype(np.float32), labels)), global_batch_size=16, steps=4
  )
  assert not np.allclose(from_sparse.model.get_weights()[0], model(True)().get_weights()[0])  # It trained.
  for got, want in zip(from_sparse.model.get_weights(), from_dense.model.get_weights()):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  results = from_sparse.evaluate(tf.data.Dataset.from_tensor_slices((sparse, labels)).take(20), global_batch_size=16)
  assert results == pytest.approx(
      from_dense.evaluate(
          tf.data.Dataset.from_tensor_slices((dense.astype(np.float32), labels)).take(20), global_batch_size=16
      ),
      rel=1e-5,
  )


class _Densified(runner.tasks.Classification):
  """Classification whose preprocess pads each batch's ragged rows with zeros to 5 values."""

  def preprocess(self, features):
    return features.to_tensor(shape=[None, 5])


def test_a_tasks_preprocess_gives_the_model_its_features_in_training_evaluation_and_export(cpu_devices, tmp_path):
  def dense_model():
    return tf_keras.Sequential([tf_keras.Input((5,)), tf_keras.layers.Dense(2)])

  trainer = _trainer(strategies.MirroredStrategy(cpu_devices(2)), model_fn=dense_model, task=_Densified())
  trainer.train(_ragged_data(), global_batch_size=GLOBAL_BATCH, steps=5)
  rows, labels = _rows()
  padded = np.stack([np.pad(row, (0, 5 - len(row))) for row in rows])
  by_hand = _trainer(tf.distribute.OneDeviceStrategy(cpu_devices(1)[0]), model_fn=dense_model)
  by_hand.train(tf.data.Dataset.from_tensor_slices((padded, labels)), global_batch_size=GLOBAL_BATCH, steps=5)
  for got, want in zip(trainer.model.get_weights(), by_hand.model.get_weights()):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  results = trainer.evaluate(_ragged_data(13), global_batch_size=8)
  assert results == pytest.approx(
      by_hand.evaluate(tf.data.Dataset.from_tensor_slices((padded[:13], labels[:13])), global_batch_size=8), rel=1e-5
  )
  exported = tf.saved_model.load(trainer.export(str(tmp_path / "model")))
  served = exported.signatures["serving_default"](features=tf.constant(padded[:3]))["outputs"]
  np.testing.assert_allclose(served, trainer.model(padded[:3]), rtol=1e-6)


def test_export_of_a_model_with_a_ragged_input_serves_it_as_an_attribute(tmp_path):
  trainer = _trainer(tf.distribute.get_strategy())
  trainer.train(_ragged_data(), global_batch_size=GLOBAL_BATCH, steps=2)
  exported = tf.saved_model.load(trainer.export(str(tmp_path / "model")))
  rows, _ = _rows()
  batch = tf.ragged.constant(rows[:4])
  np.testing.assert_allclose(exported.serve(batch)["outputs"], trainer.model(batch), rtol=1e-6)


def test_composite_features_that_do_not_fit_the_models_input_are_named_with_both():
  rows, labels = _rows()
  dense_input = _trainer(
      tf.distribute.get_strategy(),
      model_fn=lambda: tf_keras.Sequential([tf_keras.Input((5,)), tf_keras.layers.Dense(2)]),
  )
  with pytest.raises(
      DataError,
      match=r"^The training data's features are ragged \(RaggedTensorSpec\(TensorShape\(\[None\]\), tf\.float32, 0, "
      r"tf\.int64\)\) per example, but the model's input takes dense \(TensorSpec\(shape=\(5,\), dtype=tf\.float32, "
      r"name=None\)\)\. Pad or cut them to a fixed length in the dataset \(e\.g\. ragged\.to_tensor\(shape=\[N\]\) "
      r"or tf\.sparse\.to_dense\)\.$",
  ):
    dense_input.train(_ragged_data(), global_batch_size=GLOBAL_BATCH, steps=1)
  padded = np.stack([np.pad(row, (0, 5 - len(row))) for row in rows])
  with pytest.raises(
      DataError,
      match=r"^The training data's features are dense \(TensorSpec\(shape=\(5,\), dtype=tf\.float32, name=None\)\) "
      r"per example, but the model's input takes ragged \(RaggedTensorSpec\(TensorShape\(\[None\]\), tf\.float32, "
      r"0, tf\.int64\)\)\.$",
  ):
    _trainer(tf.distribute.get_strategy()).train(
        tf.data.Dataset.from_tensor_slices((padded, labels)), global_batch_size=GLOBAL_BATCH, steps=1
    )
