"""The private TensorFlow and Keras behaviour the loops' workarounds rely on, against the installed versions.

Each test fails with a message naming the workaround and the versions it was checked with when that
behaviour changes: then look at the workaround again.
"""

import pytest
import tensorflow as tf
from tensorflow.python.framework import ops  # noqa: TID251

from runner import keras_workarounds
from strategies import tensorflow_workarounds


def _registered_for(strategy, after):
  """The custom gradients registered after uid `after` whose function refers to `strategy`.

  Only those: a worker that ran other tests first holds thousands of older ones.
  """
  prefix = "CustomGradient-"
  return {
      name
      for name, entry in ops._gradient_registry._registry.items()
      if name.startswith(prefix)
      and int(name[len(prefix) :]) > after
      and tensorflow_workarounds._refers_to(entry["type"], strategy, depth=3)
  }


def test_release_gradients_when_collected_removes_what_all_reduce_registered():
  changed = (
      "release_gradients_when_collected: TensorFlow's gradient registry changed since "
      f"{tensorflow_workarounds.CHECKED_WITH}"
  )
  strategy = tf.distribute.OneDeviceStrategy("/cpu:0")

  class Owner:
    pass

  owner = Owner()
  after = ops.uid()
  tensorflow_workarounds.release_gradients_when_collected(owner, strategy)

  @tf.function
  def summed(value):
    return strategy.run(lambda v: tf.distribute.get_replica_context().all_reduce("sum", v), args=(value,))

  assert float(summed(tf.constant(2.0))) == 2.0
  assert _registered_for(strategy, after), f"{changed}: tracing all_reduce registers no custom gradient that holds it."
  del owner  # Freed at once: no cycle holds it. No `gc.collect()`: the suite's collector is off (tests/conftest.py).
  assert not _registered_for(strategy, after), f"{changed}: the registrations stayed after their owner was collected."


def test_tf_keras_learning_rate_is_the_schedule_itself():
  tf_keras = pytest.importorskip("tf_keras")
  changed = f"tf_keras_learning_rate: tf_keras changed since {keras_workarounds.CHECKED_WITH}"
  schedule = tf_keras.optimizers.schedules.ExponentialDecay(1.0, decay_steps=1, decay_rate=0.5)
  optimizer = tf_keras.optimizers.SGD(learning_rate=schedule)
  assert keras_workarounds.tf_keras_learning_rate(optimizer) is schedule, changed
  wrapped = tf_keras.mixed_precision.LossScaleOptimizer(tf_keras.optimizers.SGD(learning_rate=schedule))
  assert keras_workarounds.tf_keras_learning_rate(wrapped) is schedule, changed
  fixed = keras_workarounds.tf_keras_learning_rate(tf_keras.optimizers.SGD(learning_rate=0.25))
  assert float(tf.convert_to_tensor(fixed)) == 0.25, changed
