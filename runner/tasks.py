"""What the model is trained to do: the `Task` interface and the built-in tasks."""

import abc

import keras
import tensorflow as tf


class Task(abc.ABC):
  """The loss and metrics of one kind of problem.

  The Trainer calls `loss` inside each replica's step with float32 outputs and
  averages the per-example values over the global batch itself (honouring
  sample weights), so a task never reduces over the batch. `metrics` is called
  once, inside `strategy.scope()`.
  """

  @abc.abstractmethod
  def loss(self, labels, outputs):
    """Returns the per-example loss, a float32 tensor of shape `[batch]`.

    Args:
      labels: the labels of one per-replica batch, as the dataset gives them.
      outputs: the model's outputs for that batch, cast to float32.
    """

  def metrics(self):
    """Returns fresh Keras metrics, each updated with `(labels, outputs, sample_weight)`.

    Their names are the keys of the Trainer's results; each must give a scalar.
    """
    return []


class Classification(Task):
  """Single-label classification: integer class ids against one score per class.

  The loss is the sparse categorical cross-entropy; the metric is `accuracy`.
  """

  def __init__(self, *, from_logits=True):
    """Args:
      from_logits: the model outputs logits (True) or probabilities (False).
    """
    self.from_logits = from_logits

  def loss(self, labels, outputs):
    return keras.losses.sparse_categorical_crossentropy(labels, outputs, from_logits=self.from_logits)

  def metrics(self):
    return [keras.metrics.SparseCategoricalAccuracy(name="accuracy")]


class Regression(Task):
  """Real-valued targets: the loss is the squared error, averaged over the output units.

  Labels must hold as many values per example as the outputs (a `[batch]`
  label vector fits a `[batch, 1]` output). The metric is `mae`, the mean
  absolute error.
  """

  def loss(self, labels, outputs):
    labels = tf.reshape(tf.cast(labels, outputs.dtype), tf.shape(outputs))
    squared = tf.reshape(tf.square(outputs - labels), [tf.shape(outputs)[0], -1])
    return tf.reduce_mean(squared, axis=1)

  def metrics(self):
    return [keras.metrics.MeanAbsoluteError(name="mae")]
