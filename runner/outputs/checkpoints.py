"""Checkpoints of model, optimizer and step: where they go, who writes them, how they come back."""

import contextlib
import os
from typing import Any

from absl import logging
import keras
import tensorflow as tf

from runner.outputs import checkpoint_list
from runner.outputs import worker_files
from strategies import description
from strategies import tensorflow_workarounds
from strategies.errors import ConfigError
from strategies.errors import first_line

DIRECTORY = "checkpoints"  # Under the Trainer's model_dir.


def latest(model_dir: str) -> str | None:
  """Returns the path of the newest checkpoint the Trainer wrote under `model_dir`, or None.

  It is the first one `Checkpoints.restore_latest` tries: the newest of the
  checkpoint list, which is completed from the `ckpt-N` files when it is
  missing or damaged (see `checkpoint_list`). Restoring falls back to an
  older one if it cannot be read.
  """
  return (checkpoint_list.read(os.path.join(model_dir, DIRECTORY)).paths or (None,))[-1]


def latest_step(model_dir: str | None) -> int | None:
  """Returns the global step of the newest checkpoint under `model_dir` (a run resumes there), or None.

  None also when `model_dir` is None or does not exist. Checkpoints are named
  `ckpt-STEP` by `Checkpoints.save`.
  """
  path = None if model_dir is None or not tf.io.gfile.isdir(model_dir) else latest(model_dir)
  return None if path is None else checkpoint_list.step_of(path)


# Why checkpoints are written synchronously under a ParameterServerStrategy (True), or several workers (False).
_SYNCHRONOUS_BECAUSE = {
    True: "under a ParameterServerStrategy the variables live on the ps tasks, where this project has not tested "
    "TensorFlow's asynchronous checkpointing",
    False: "under several workers every worker takes part in each save, and the workers other than the chief write "
    "to a scratch directory removed right after the save",
}


class CheckpointWriteError(ConfigError):
  """A checkpoint could not be written (disk full, no permission, ...); the previous ones are intact."""


class UnreadableCheckpointError(Exception):
  """A checkpoint's files cannot be read; the message says how."""


class CheckpointGoneError(UnreadableCheckpointError):
  """A checkpoint's files were deleted (its `.index` is gone), e.g. rotated away by a trainer's `max_to_keep`."""


class Checkpoints:
  """A `tf.train.Checkpoint` of `model`, `optimizer`, `step` and what the run trains on, in `model_dir/checkpoints`.

  Each save goes through a `tf.train.CheckpointManager` (`max_to_keep`). Under
  multi-worker strategies every worker takes part in a save, but only the
  chief keeps what it writes (see `worker_files`). All workers restore from
  the chief's directory.

  What can go wrong on disk is handled so that no work is lost silently:
  - a checkpoint is listed in the directory's `checkpoint` state file only
    once it is completely written, so a process killed while writing leaves
    the previous one as the latest; what such a save left (`ckpt-N_temp/`)
    is removed when training starts again (`remove_interrupted_saves`);
  - a state file that is missing or damaged (removed, truncated, zeroed,
    empty, garbled) is rebuilt from the `ckpt-N` files, with a warning, and
    rewritten at the next save, so that `max_to_keep` rotates every
    checkpoint on disk, oldest first (see `checkpoint_list`);
  - only the checkpoints in `model_dir/checkpoints` are restored from and
    rotated: those a state file names in another directory (a copied
    workdir's list naming the original's) are left out with a warning, and
    are an error when they are all it names;
  - a latest checkpoint that cannot be read (truncated, corrupt) is skipped
    for the one before it, with a warning naming it; if none can be read,
    restoring fails with an error naming each;
  - a checkpoint of another model or optimizer is an error, and restores
    nothing: the variables keep their values;
  - a save that fails (disk full, no permission) raises CheckpointWriteError
    naming the previous checkpoint, which stays (rotation by `max_to_keep`
    only happens after a new checkpoint is complete);
  - no checkpoint is written with non-finite weights;
  - a save `in_background` copies the variables to host memory and returns
    while TensorFlow writes them (`tf.train.CheckpointOptions(enable_async=True)`);
    TensorFlow lists the checkpoint, and rotates old ones, only once its
    files are complete, so a process killed during the write leaves the
    previous checkpoint the latest. The next save, `wait` and every restore
    first wait for the write in flight (a failed one raises
    CheckpointWriteError then).

  Attributes:
    saved_step: the step of the checkpoint restored or last saved, or None.
  """

  def __init__(
      self,
      strategy: tf.distribute.Strategy,
      model_dir: str,
      *,
      model: Any,
      optimizer: Any,
      step: tf.Variable,
      max_to_keep: int | None,
      asynchronous: bool = True,
  ) -> None:
    """Initializes the `Checkpoints`.

    Args:
      strategy: the `tf.distribute.Strategy` of the variables.
      model_dir: the run's directory; checkpoints go to its DIRECTORY.
      model: the Keras model a checkpoint holds.
      optimizer: the optimizer a checkpoint holds.
      step: the global step variable a checkpoint holds.
      max_to_keep: how many recent checkpoints the chief keeps (None: all).
      asynchronous: whether saves `in_background` are written in the
        background; they are synchronous anyway where TensorFlow's
        asynchronous checkpointing is not used (multi-worker and
        parameter-server strategies), with one line saying why at the first
        such save.
    """
    self.model_dir = model_dir
    self.directory = os.path.join(model_dir, DIRECTORY)
    # What the run trains on (`runner.data.providers.description`; '' where not known), written with each
    # checkpoint; restored apart from the rest, so that a checkpoint written before it was kept restores too.
    self.training_data = tf.Variable("", trainable=False, name="training_data")
    self._strategy, self._max_to_keep, self._asynchronous = strategy, max_to_keep, asynchronous
    self._model, self._optimizer, self._step = model, optimizer, step
    self._weights_finite: Any = None  # A concrete function: whether the model's weights are finite.
    self.saved_step: int | None = None  # The step of the checkpoint restored or last saved by this object.
    # (its tf.train.Checkpoint, step, the saved_step before it) of the write in flight in the background, or None.
    self._in_flight: tuple[tf.train.Checkpoint, int, int | None] | None = None

  def restore_latest(self) -> str | None:
    """Restores the newest checkpoint that can be read, if any, and returns its path (or None).

    A checkpoint deleted while it is read is not a damaged one when the list
    no longer names it (a running trainer rotated it away by `max_to_keep`):
    it is skipped for the one before it.

    Raises:
      ConfigError: the checkpoint does not match the model or optimizer
        (another architecture, optimizer or precision wrote it), or no
        checkpoint (listed, or found on disk) can be read, or the list names
        checkpoints only in another directory (never restored from: a run
        must not start over them unseen). Either way no variable changed.
    """
    self.wait()
    found = checkpoint_list.read(self.directory)
    list_file = os.path.join(self.directory, checkpoint_list.LIST_FILE)
    if found.outside and not found.paths:
      raise ConfigError(
          f"The checkpoint list {list_file} names only checkpoints outside its directory: {', '.join(found.outside)}. "
          f"A run restores from and rotates only the checkpoints in {self.directory}: copy them there to resume from "
          "them, or remove the list to train from scratch."
      )
    names = ", ".join(map(os.path.basename, found.paths))
    if found.problem:
      rebuilt = f"rebuilt it from the checkpoint files: {names} (newest last). It is rewritten at the next save."
      own = rebuilt if found.paths else "its directory holds no checkpoint of its own."
      logging.warning(f"The checkpoint list {list_file} {found.problem}; {own}")
    unreadable: list[str] = []
    for path in reversed(found.paths):
      try:
        self._restore_all_or_nothing(path)
      except UnreadableCheckpointError as damage:  # Unless gone and no longer listed: rotated away, not damaged.
        if not isinstance(damage, CheckpointGoneError) or path in checkpoint_list.read(self.directory).paths:
          unreadable.append(f"{os.path.basename(path)} ({damage})")
        continue
      if unreadable:
        logging.warning(
            f"Skipped the newest checkpoint(s) of {self.directory}, which cannot be read: {'; '.join(unreadable)}. "
            f"Resumed from {os.path.basename(path)} instead; the next save replaces them."
        )
      return path
    if unreadable:
      raise ConfigError(
          f"No checkpoint in {self.directory} can be read: {'; '.join(unreadable)}. Restore them from a copy, or "
          f"move them away to train from scratch."
      )
    return None

  def restore(self, path: str) -> int:
    """Restores the checkpoint at `path` (a path prefix such as `DIRECTORY/ckpt-N`); returns its step.

    All or nothing: when it raises, no variable changed.

    Raises:
      CheckpointGoneError: its files were deleted while it was read, or
        before (a trainer's `max_to_keep` rotated it away).
      UnreadableCheckpointError: it cannot be read (truncated, corrupt).
      ConfigError: it does not match the model or optimizer.
    """
    self.wait()
    return self._restore_all_or_nothing(path)

  def restore_saved(self) -> int:
    """Restores the checkpoint this object restored or saved last, once a write in flight is complete; its step.

    Raises:
      As `wait` and `restore`.
    """
    return self.restore(os.path.join(self.directory, f"ckpt-{self.saved_step}"))

  def save(self, step: int, *, in_background: bool = False) -> str:
    """Writes a checkpoint numbered `step`; returns its path (a deleted scratch path off the chief).

    It first waits for the write in flight, if any (see `wait`).

    Args:
      step: the global step the checkpoint is numbered by.
      in_background: return once the variables are copied to host memory,
        while TensorFlow writes them (on one worker, with `asynchronous`);
        the next save, or `wait`, raises what went wrong with the write.

    Raises:
      FloatingPointError: the model's weights are not finite (nothing is written).
      CheckpointWriteError: the checkpoint (or the one written in the background
        before) could not be written.
    """
    background = in_background and self._in_background()
    self.wait()
    if not self._finite():
      raise FloatingPointError(
          f"The model's weights are not finite at step {step}; not writing a checkpoint. "
          f"Lower the learning rate, set clipnorm, or check the data for NaN or inf values."
      )
    # A new one for each save: each asynchronous write has a writer of its own, ended by `wait`.
    checkpoint = tf.train.Checkpoint(
        model=self._model, optimizer=self._optimizer, step=self._step, training_data=self.training_data
    )
    with worker_files.destination(self._strategy, self.directory) as directory:
      try:
        if directory != self.directory:
          path = checkpoint.write(os.path.join(directory, f"ckpt-{step}"))
        else:
          if (found := checkpoint_list.read(directory)).problem is not None:
            checkpoint_list.write(found)  # The manager learns the checkpoints on disk, in order, from the list.
          manager = tf.train.CheckpointManager(checkpoint, directory, max_to_keep=self._max_to_keep)
          options = tf.train.CheckpointOptions(enable_async=background, experimental_write_callbacks=[self._written])
          path = manager.save(checkpoint_number=step, options=options)
      except (tf.errors.OpError, OSError) as error:
        raise self._write_error(step, directory, error) from None
    if background:
      self._in_flight = (checkpoint, step, self.saved_step)
    self.saved_step = step
    return path

  def write(self, directory: str, step: int) -> str:
    """Writes the checkpoint `save` writes to `directory` (`ckpt-STEP` and its list), a directory of its own.

    Every worker takes part; only the chief's is kept (see `worker_files`).
    `restore` restores it. Returns its path.
    """
    self.wait()
    checkpoint = tf.train.Checkpoint(
        model=self._model, optimizer=self._optimizer, step=self._step, training_data=self.training_data
    )
    with worker_files.destination(self._strategy, directory) as written:
      return tf.train.CheckpointManager(checkpoint, written, max_to_keep=None).save(checkpoint_number=step)

  def save_unless_saved(self, step: int, *, in_background: bool = False) -> None:
    """Writes a checkpoint numbered `step` unless this object restored or saved that step's; as `save` otherwise.

    Without `in_background` it returns once the checkpoint of `step` is
    complete (waiting for it if it is being written in the background).
    """
    if self.saved_step != step:
      self.save(step, in_background=in_background)
    elif not in_background:
      self.wait()

  def wait(self) -> None:
    """Waits for the checkpoint being written in the background, if any, to be complete and listed.

    It also ends TensorFlow's writer of it, so that nothing holds the model
    once the Trainer is gone.

    Raises:
      CheckpointWriteError: it could not be written (what it left is removed;
        the previous checkpoint stays the latest).
    """
    if self._in_flight is None:
      return
    checkpoint, step, previous_step = self._in_flight
    self._in_flight = None
    try:
      tensorflow_workarounds.end_async_checkpoint_writer(checkpoint)
    except (tf.errors.OpError, OSError) as error:
      self.saved_step = previous_step
      raise self._write_error(step, self.directory, error) from None

  def remove_interrupted_saves(self) -> None:
    """On the chief, deletes the `ckpt-N_temp/` directories that saves killed part-way left.

    Call it after restoring and before this run saves: no save of this run
    is in flight then, and a save of another process writes elsewhere (a
    non-chief worker's scratch directory).
    """
    if not self._strategy.extended.should_checkpoint:
      return
    for leftover in checkpoint_list.interrupted_saves(self.directory):
      try:
        tf.io.gfile.rmtree(leftover)
        logging.info(
            f"Removed {leftover}, left by a save that was interrupted (the checkpoint it wrote was never complete)."
        )
      except (tf.errors.OpError, OSError) as error:
        logging.warning(
            f"Could not remove {leftover}, left by an interrupted save ({first_line(error)}); it is never read, "
            "remove it by hand."
        )

  def swap_training_data(self, description: str) -> str:
    """Keeps `description` for the checkpoints saved from now; returns what the run trained on until now.

    `description` is `runner.data.providers.description` of the data the run
    trains on from now. The one returned is the restored checkpoint's, or the
    last one kept; '' where not known (no checkpoint, or one written before
    it was kept).
    """
    was = self.training_data.numpy().decode()
    self.training_data.assign(description)
    return was

  def _written(self, path: str) -> None:
    """Says that the checkpoint at `path` is written (TensorFlow's writer calls it, before listing it)."""
    logging.info("Saved checkpoint %s.", path)

  def _in_background(self) -> bool:
    """Whether saves in the background are written so; says once why not where they cannot be."""
    ps = isinstance(self._strategy, tf.distribute.experimental.ParameterServerStrategy)
    if self._asynchronous and (ps or not description.is_single_worker(self._strategy)):
      logging.info("Checkpoints are written synchronously: %s.", _SYNCHRONOUS_BECAUSE[ps])
      self._asynchronous = False
    return self._asynchronous

  def _write_error(self, step: int, directory: str, error: BaseException) -> CheckpointWriteError:
    """Removes what the failed save of `step` into `directory` left; returns the error that names it."""
    prefix = os.path.join(directory, f"ckpt-{step}")
    complete = tf.io.gfile.exists(prefix + ".index")  # Written last: then only the listing failed.
    for leftover in tf.io.gfile.glob(prefix + "_temp*") + ([] if complete else tf.io.gfile.glob(prefix + ".*")):
      with contextlib.suppress(tf.errors.OpError, OSError):
        (tf.io.gfile.rmtree if tf.io.gfile.isdir(leftover) else tf.io.gfile.remove)(leftover)
    previous = latest(self.model_dir)
    intact = f"The previous checkpoint {previous} is intact: free some space or fix the permissions, then run again"
    return CheckpointWriteError(
        f"Could not write the checkpoint of step {step} to {directory} "
        f"({first_line(getattr(error, 'message', None) or str(error))}). "
        + (f"{intact} to resume from it." if previous else "There is no earlier checkpoint.")
    )

  def _restore_all_or_nothing(self, path: str) -> int:
    """Restores `path`; returns its step (now `saved_step`). If that fails part-way, puts every variable back, raises.

    Raises:
      ConfigError: `path` can be read but does not match the model and optimizer.
      CheckpointGoneError: `path` cannot be read, and its `.index` file is gone (deleted).
      UnreadableCheckpointError: `path` cannot be read (truncated, corrupt, missing files).
    """
    before = [(v, v.numpy()) for v in [*self._model.weights, *self._optimizer.variables, self._step]]
    try:
      restored = tf.train.Checkpoint(model=self._model, optimizer=self._optimizer, step=self._step)
      restored.restore(path).assert_existing_objects_matched().expect_partial()
      self.training_data.assign("")  # Stays so for a checkpoint written before it was kept.
      tf.train.Checkpoint(training_data=self.training_data).read(path).expect_partial()  # Deleted meanwhile: gone.
    except Exception as error:  # noqa: BLE001  # Corrupt files fail in many ways; sorted below.
      with self._strategy.scope():
        for variable, value in before:
          variable.assign(value)
      damage = _damage(path)
      if damage and not tf.io.gfile.exists(path + ".index"):  # Read after the failure: a deletion has gone on.
        raise CheckpointGoneError(damage) from None
      if damage:
        raise UnreadableCheckpointError(damage) from None
      raise ConfigError(
          f"The checkpoint {path} does not match this model and optimizer ({first_line(error)}). "
          f"Use a new model_dir, or the model, optimizer and precision that wrote it."
      ) from None
    logging.info("Restored %s.", path)
    self.saved_step = int(self._step.numpy())
    return self.saved_step

  def _finite(self) -> bool:
    if self._weights_finite is None:
      variables = [v.value if isinstance(v, keras.Variable) else v for v in self._model.weights]
      floating = [v for v in variables if v.dtype.is_floating]
      self._weights_finite = tf.function(
          lambda: tf.reduce_all([tf.reduce_all(tf.math.is_finite(v)) for v in floating])
      ).get_concrete_function()
    return bool(self._weights_finite())


def _damage(path: str) -> str | None:
  """Returns how the checkpoint at `path` cannot be read (reading every tensor), or None if it can."""
  try:
    reader = tf.train.load_checkpoint(path)
    for name in reader.get_variable_to_shape_map():
      reader.get_tensor(name)
  except Exception as error:  # noqa: BLE001
    return f"{type(error).__name__}: {first_line(error)}"
  return None
