"""Checkpoints of model, optimizer and step: where they go, who writes them, how they come back."""

import os
import shutil
import tempfile

from absl import logging
import tensorflow as tf

from strategies.errors import ConfigError

DIRECTORY = "checkpoints"  # Under the Trainer's model_dir.


class Checkpoints:
  """A `tf.train.Checkpoint` of `model`, `optimizer` and `step` managed in one directory.

  Under multi-worker strategies every worker must take part in a save, but
  only the chief (`strategy.extended.should_checkpoint`) writes to
  `directory`; the other workers write to a temporary directory that is
  deleted right after, as TensorFlow documents. All workers restore from
  `directory`.
  """

  def __init__(self, strategy, directory, *, model, optimizer, step, max_to_keep):
    """Args:
      strategy: the `tf.distribute.Strategy` of the variables.
      directory: where the chief keeps the checkpoints.
      model, optimizer, step: what a checkpoint holds.
      max_to_keep: how many recent checkpoints the chief keeps (None: all).
    """
    self.directory = directory
    self.checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, step=step)
    self._is_chief = strategy.extended.should_checkpoint
    self._manager = (tf.train.CheckpointManager(self.checkpoint, directory, max_to_keep=max_to_keep)
                     if self._is_chief else None)

  @property
  def latest(self):
    """The path of the newest checkpoint in `directory`, or None."""
    return tf.train.latest_checkpoint(self.directory)

  def restore_latest(self):
    """Restores the newest checkpoint, if any, and returns its path (or None).

    Raises:
      ConfigError: the checkpoint does not match the model or optimizer
        (another architecture, optimizer or precision wrote it).
    """
    path = self.latest
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
    """Writes a checkpoint numbered `step` and returns its path (a deleted temporary one off the chief)."""
    if self._is_chief:
      path = self._manager.save(checkpoint_number=step)
      logging.info("Saved checkpoint %s.", path)
      return path
    scratch = tempfile.mkdtemp(prefix="tf_runner_worker_checkpoint_")
    try:
      return self.checkpoint.write(os.path.join(scratch, f"ckpt-{step}"))
    finally:
      shutil.rmtree(scratch, ignore_errors=True)
