"""Gradients for variables sharded over parameter servers (`strategies.sharded_variables`), on local shards."""

import numpy as np
import pytest
import tensorflow as tf

from strategies import sharded_variables

VALUE = np.arange(30, dtype=np.float32).reshape(10, 3) / 10.0


def _sharded():
  """VALUE split 4 + 3 + 3 rows into a ShardedVariable, as the strategy's partitioner splits it."""
  return sharded_variables.ShardedVariable([tf.Variable(VALUE[:4]), tf.Variable(VALUE[4:7]), tf.Variable(VALUE[7:])])


@pytest.mark.parametrize("lookup", [False, True], ids=["dense", "embedding_lookup"])
def test_gradients_of_a_sharded_variable_equal_those_of_the_whole(lookup):
  whole, sharded, plain = tf.Variable(VALUE), _sharded(), tf.Variable([1.0, 2.0, 3.0])
  ids = tf.constant([1, 5, 5, 9])

  def loss(table):
    rows = tf.nn.embedding_lookup(table, ids) if lookup else tf.matmul(tf.ones([2, 10]), tf.convert_to_tensor(table))
    return tf.reduce_sum(tf.square(rows * plain))

  with tf.GradientTape(persistent=True) as tape:
    expected_loss, sharded_loss = loss(whole), loss(sharded)
  expected = tape.gradient(expected_loss, [whole, plain])
  got = sharded_variables.gradients(tape, sharded_loss, [sharded, plain])
  assert isinstance(got[0], tf.IndexedSlices) == lookup  # Embedding gradients stay sparse.
  np.testing.assert_allclose(tf.convert_to_tensor(got[0]), tf.convert_to_tensor(expected[0]), rtol=1e-6)
  np.testing.assert_allclose(got[1], expected[1], rtol=1e-6)
  assert sharded_variables.shards(plain) == [plain] and len(sharded_variables.shards(sharded)) == 3
