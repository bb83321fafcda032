"""Checkpoints of model, optimizer and step: where they go, who writes them, how they come back."""

import os

from absl import logging
import keras
import tensorflow as tf

from runner import worker_files
from strategies.errors import ConfigError

DIRECTORY = "checkpoints"  # Under the Trainer's model_dir.


def latest(model_dir):
  """Returns the path of the newest checkpoint the Trainer wrote under `model_dir`, or None."""
  return tf.train.latest_checkpoint(os.path.join(model_dir, DIRECTORY))


class Checkpoints:
  """A `tf.train.Checkpoint` of `model`, `optimizer` and `step`, kept in `model_dir/checkpoints`.

  Under multi-worker strategies every worker takes part in a save, but only
  the chief keeps what it writes (see `worker_files`). All workers restore
  from the chief's directory. No checkpoint is written with non-finite
  weights.
  """

  def __init__(self, strategy, model_dir, *, model, optimizer, step, max_to_keep):
    """Args:
      strategy: the `tf.distribute.Strategy` of the variables.
      model_dir: the run's directory; checkpoints go to its DIRECTORY.
      model, optimizer, step: what a checkpoint holds.
      max_to_keep: how many recent checkpoints the chief keeps (None: all).
    """
    self.model_dir = model_dir
    self.directory = os.path.join(model_dir, DIRECTORY)
    self.checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, step=step)
    self._strategy = strategy
    self._model = model
    self._max_to_keep = max_to_keep
    self._managers = {}  # directory written -> its CheckpointManager
    self._weights_finite = None

  def restore_latest(self):
    """Restores the newest checkpoint, if any, and returns its path (or None).

    Raises:
      ConfigError: the checkpoint does not match the model or optimizer
        (another architecture, optimizer or precision wrote it).
    """
    path = latest(self.model_dir)
    if path:
      try:
        self.checkpoint.restore(path).assert_existing_objects_matched()
      except (AssertionError, ValueError) as error:
        raise ConfigError(
            f"The checkpoint {path} does not match this model and optimizer ({str(error).splitlines()[0]}). "
            f"Use a new model_dir, or the model, optimizer and precision that wrote it.") from None
      logging.info("Restored %s.", path)
    return path

  def save(self, step):
    """Writes a checkpoint numbered `step`; returns its path (a deleted scratch path off the chief).

    Raises:
      FloatingPointError: the model's weights are not finite (nothing is written).
    """
    if not self._finite():
      raise FloatingPointError(
          f"The model's weights are not finite at step {step}; not writing a checkpoint. "
          f"Lower the learning rate, set clipnorm, or check the data for NaN or inf values.")
    with worker_files.destination(self._strategy, self.directory) as directory:
      if directory not in self._managers:
        self._managers[directory] = tf.train.CheckpointManager(
            self.checkpoint, directory, max_to_keep=self._max_to_keep)
      path = self._managers[directory].save(checkpoint_number=step)
    if directory == self.directory:
      logging.info("Saved checkpoint %s.", path)
    else:
      del self._managers[directory]
    return path

  def _finite(self):
    if self._weights_finite is None:
      variables = [v.value if isinstance(v, keras.Variable) else v for v in self._model.weights]
      floating = [v for v in variables if v.dtype.is_floating]
      self._weights_finite = tf.function(
          lambda: tf.reduce_all([tf.reduce_all(tf.math.is_finite(v)) for v in floating]))
    return bool(self._weights_finite())
