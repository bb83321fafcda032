"""What the model is trained to do: the built-in tasks (the `Task` interface is in `runner.interfaces`)."""

from typing import Any

import keras
import tensorflow as tf

from runner.interfaces import LabelRange  # noqa: F401  (public here too)
from runner.interfaces import Task  # noqa: F401  (public here too)
from strategies.errors import ConfigError


class Classification(Task):
  """Single-label classification: integer class ids against one score per class.

  The loss is the sparse categorical cross-entropy; the metric is `accuracy`.
  """

  def __init__(self, *, from_logits: bool = True) -> None:
    """Initializes the `Classification`.

    Args:
      from_logits: the model outputs logits (True) or probabilities (False).
    """
    self.from_logits = from_logits

  def loss(self, labels: tf.Tensor, outputs: tf.Tensor) -> tf.Tensor:
    """The per-example sparse categorical cross-entropy."""
    return keras.losses.sparse_categorical_crossentropy(labels, outputs, from_logits=self.from_logits)

  def metrics(self) -> list[Any]:
    """The accuracy."""
    return [keras.metrics.SparseCategoricalAccuracy(name="accuracy")]

  def check_labels(self, labels_spec: Any, outputs_spec: Any) -> LabelRange | None:
    """One output tensor; one class id per example (shape () or (1,)), of an integer dtype, in [0, outputs)."""
    _check_one_output(self, outputs_spec)
    if not _is_dense(outputs_spec) or outputs_spec.shape.rank != 2 or outputs_spec.shape[-1] is None:
      return None
    classes = outputs_spec.shape[-1]
    if not _is_dense(labels_spec) or labels_spec.shape.as_list() not in ([], [1]):
      hint = ""
      if _is_dense(labels_spec) and labels_spec.shape.as_list() == [classes]:
        hint = " They look one-hot: give the class id instead (tf.argmax(labels) in the dataset)."
      elif _is_dense(labels_spec) and labels_spec.shape.rank and labels_spec.shape[0] is None:
        hint = " The dataset looks batched: the Trainer batches the data itself (drop the .batch(...))."
      raise ConfigError(
          f"labels are {labels_spec} per example, but task Classification takes one class id per example "
          f"(shape () or (1,)) for a model with {classes} outputs.{hint}"
      )
    if not labels_spec.dtype.is_integer:
      hint = (
          " If they hold whole numbers, cast them in the dataset (tf.cast(labels, tf.int32)); for targets "
          "in [0, 1) use task 'regression' or a task of your own."
          if labels_spec.dtype.is_floating
          else ""
      )
      raise ConfigError(
          f"labels are {labels_spec.dtype.name}, but task Classification takes class ids, integers in "
          f"[0, {classes}).{hint}"
      )
    return LabelRange(
        low=0, high=classes, integer=True, meaning=f"class ids of a model with {classes} outputs (classes)"
    )


class Regression(Task):
  """Real-valued targets: the loss is the squared error, averaged over the output units.

  Labels must hold as many values per example as the outputs (a `[batch]`
  label vector fits a `[batch, 1]` output). The metric is `mae`, the mean
  absolute error.
  """

  def loss(self, labels: tf.Tensor, outputs: tf.Tensor) -> tf.Tensor:
    """The per-example mean squared error."""
    labels = tf.reshape(tf.cast(labels, outputs.dtype), tf.shape(outputs))
    squared = tf.reshape(tf.square(outputs - labels), [tf.shape(outputs)[0], -1])
    return tf.reduce_mean(squared, axis=1)

  def metrics(self) -> list[Any]:
    """The mean absolute error."""
    return [keras.metrics.MeanAbsoluteError(name="mae")]

  def check_labels(self, labels_spec: Any, outputs_spec: Any) -> LabelRange | None:
    """One output tensor; real-valued labels with as many values per example as it has."""
    _check_one_output(self, outputs_spec)
    if not (_is_dense(labels_spec) and _is_dense(outputs_spec)):
      return None
    if not (labels_spec.dtype.is_floating or labels_spec.dtype.is_integer):
      raise ConfigError(f"labels are {labels_spec.dtype.name}, but task Regression takes real-valued targets.")
    per_example = outputs_spec.shape[1:]
    counts = (labels_spec.shape.num_elements(), per_example.num_elements())  # None: not fully defined.
    if None not in counts and counts[0] != counts[1]:
      raise ConfigError(
          f"labels have shape {tuple(labels_spec.shape.as_list())} per example, but task Regression needs as many "
          f"values as the model's outputs per example, {tuple(per_example.as_list())}."
      )
    return None


def _is_dense(spec: Any) -> bool:
  return isinstance(spec, tf.TensorSpec)


def _check_one_output(task: Task, outputs_spec: Any) -> None:
  """Raises ConfigError (naming what the model returns) unless `outputs_spec` is one tensor's (or a list of one)."""
  count = len(tf.nest.flatten(outputs_spec))
  if count > 1 or isinstance(outputs_spec, dict):
    shapes = tf.nest.map_structure(lambda spec: tuple(spec.shape.as_list()), outputs_spec)
    raise ConfigError(
        f"Task {type(task).__name__}'s loss takes one output tensor, but the model returns a "
        f"{type(outputs_spec).__name__} of {count} tensor{'s' * (count > 1)} of shapes {shapes}. "
        "Give the model one output, or name a task of your own whose loss takes them (config.task.name="
        "'module:function')."
    )
