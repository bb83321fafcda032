"""The Trainer tests' tiny model in tf_keras (Keras 2), and a hand-written tf_keras training loop to compare with.

The data are `trainer_testlib`'s. `hand_written_training` is the reference:
a `tf.GradientTape` step per global batch, in order, with the mean sparse
categorical cross-entropy of the batch and `optimizer.apply_gradients`, in
float32 on one device; nothing of `runner` takes part.
"""

import numpy as np
import tensorflow as tf
import tf_keras

import runner
from testlib import trainer_testlib


def model_fn():
  """A Dense 8 -> 4 logits tf_keras model with a declared input."""
  return tf_keras.Sequential(
      [tf_keras.Input((trainer_testlib.NUM_FEATURES,)), tf_keras.layers.Dense(trainer_testlib.NUM_CLASSES)]
  )


def optimizer_fn():
  return tf_keras.optimizers.SGD(learning_rate=0.1, momentum=0.9)


def mlp(config):
  """A config's model function (`model.name='testlib.tf_keras_testlib:mlp'`): a tf_keras MLP of `hidden_units`."""
  layers = [tf_keras.layers.Flatten()]
  layers += [tf_keras.layers.Dense(units, activation="relu") for units in config.hidden_units]
  layers.append(tf_keras.layers.Dense(config.num_outputs, dtype="float32"))
  return tf_keras.Sequential(layers, name="tf_keras_mlp")


def make_trainer(strategy, **options):
  """Returns a classification Trainer of the tiny tf_keras model, seeded, with `options` for the rest."""
  arguments = dict(model_fn=model_fn, optimizer_fn=optimizer_fn, task=runner.tasks.Classification(), seed=0)
  arguments.update(options)
  return runner.Trainer(strategy, **arguments)


def hand_written_training(initial_weights, features, labels, *, global_batch_size, steps, clipnorm=None):
  """Trains `model_fn()` from `initial_weights` on the first `steps` batches of the arrays.

  Returns:
    `(weights, step_results)`: the final weights, and per step a dict of the
    batch's mean `loss` and `accuracy` (of the logits the step's gradients
    were taken at).

  Args:
    initial_weights: the weights to start from, e.g. a Trainer's before training.
    features: float32 [n, NUM_FEATURES], batched in order.
    labels: int [n].
    global_batch_size: the examples of one step.
    steps: how many steps, at most n / global_batch_size.
    clipnorm: None, or the bound on the global norm of each step's gradient.
  """
  assert steps * global_batch_size <= len(labels), "the loop does not repeat the data"
  model, optimizer = model_fn(), optimizer_fn()
  model.set_weights(initial_weights)

  @tf.function
  def step(batch_features, batch_labels):
    with tf.GradientTape() as tape:
      logits = model(batch_features, training=True)
      loss = tf.reduce_mean(tf_keras.losses.sparse_categorical_crossentropy(batch_labels, logits, from_logits=True))
    correct = tf.equal(tf.argmax(logits, axis=1, output_type=batch_labels.dtype), batch_labels)
    gradients = tape.gradient(loss, model.trainable_variables)
    if clipnorm is not None:
      gradients, _ = tf.clip_by_global_norm(gradients, clipnorm)
    optimizer.apply_gradients(zip(gradients, model.trainable_variables))
    return {"loss": loss, "accuracy": tf.reduce_mean(tf.cast(correct, tf.float32))}

  step_results = []
  for index in range(steps):
    batch = slice(index * global_batch_size, (index + 1) * global_batch_size)
    results = step(tf.constant(features[batch]), tf.constant(labels[batch]))
    step_results.append({name: float(value) for name, value in results.items()})
  return model.get_weights(), step_results


def assert_weights_close(got, want, *, rtol=1e-5, atol=1e-6):
  """Asserts two lists of weights have the same shapes and values within the tolerances."""
  assert [np.shape(w) for w in got] == [np.shape(w) for w in want]
  for got_weight, want_weight in zip(got, want):
    np.testing.assert_allclose(got_weight, want_weight, rtol=rtol, atol=atol)


class PyFunctionLayer(tf_keras.layers.Layer):
  """Doubles its input in Python (`tf.py_function`): what a TPU program cannot run."""

  def call(self, inputs):
    doubled = tf.py_function(lambda t: t * 2.0, [inputs], tf.float32)
    return tf.ensure_shape(doubled, inputs.shape)


def py_function_model(config):
  """A config's model function: a tf_keras model with a `PyFunctionLayer` named 'doubled_in_python'."""
  return tf_keras.Sequential(
      [
          tf_keras.Input((trainer_testlib.NUM_FEATURES,)),
          PyFunctionLayer(name="doubled_in_python"),
          tf_keras.layers.Dense(config.num_outputs),
      ]
  )
