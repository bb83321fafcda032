"""Checkpoints written in the background with TensorFlow's asynchronous checkpointing, and where it cannot be used.

`tf.train.CheckpointOptions(experimental_enable_async_checkpoint=True)`
makes `Checkpoint.write` (and `CheckpointManager.save`) copy every variable to
the host's memory (a `tf.function` that assigns into CPU copies made at the
first save), hand the copies to a writer thread and return: training goes on
while the files are written. The manager's write callback, which lists the
checkpoint in the directory's `checkpoint` file and rotates old ones, runs in
that thread once the files are complete. `Checkpoint.sync()` waits for the
write in flight; its error stays in the writer until taken (`take_error`).
The writer (its thread, and an `atexit` hook that would keep the model alive
for the life of the process) lasts until `close`.
"""

import atexit
import functools
from typing import Any

import keras
import tensorflow as tf

from strategies import description


def unsupported_reason(strategy: tf.distribute.Strategy) -> str | None:
  """Returns why checkpoints of `strategy`'s variables are written synchronously; None if they can be in the background.

  Args:
    strategy: the `tf.distribute.Strategy` of the checkpointed variables.
  """
  if isinstance(strategy, tf.distribute.experimental.ParameterServerStrategy):
    return (
        "under a ParameterServerStrategy the variables live on the ps tasks, where this project has not "
        "tested TensorFlow's asynchronous checkpointing"
    )
  if not description.is_single_worker(strategy):
    return (
        "under several workers every worker takes part in each save, and the workers other than the chief write to "
        "a scratch directory removed right after the save"
    )
  return None


def make_keras_variables_copyable(checkpoint: tf.train.Checkpoint) -> None:
  """Lets TensorFlow's asynchronous checkpointing copy the Keras 3 variables that `checkpoint` holds, at every save.

  Keras 3's `Variable._copy_trackable_to_cpu` makes a new `tf.Variable` each
  time it is called; TensorFlow calls it inside a `tf.function` from the
  second save on, which fails ("tf.function only supports singleton
  tf.Variables created on the first call"). Here each Keras variable's copy is
  the copy of the TensorFlow variable it wraps (made once, assigned at each
  save), which serializes to the same checkpoint entry. Only this method of
  these objects changes; tf_keras (Keras 2) variables are TensorFlow's own and
  are left as they are. Call it before the first asynchronous save.

  Args:
    checkpoint: the `tf.train.Checkpoint` to be written asynchronously.
  """
  for trackable in tf.train.TrackableView(checkpoint).descendants():
    if isinstance(trackable, keras.Variable):
      trackable._copy_trackable_to_cpu = functools.partial(_copy_keras_variable, trackable)  # noqa: SLF001


@tf.autograph.experimental.do_not_convert  # Plain Python calling TensorFlow; TensorFlow calls it in a tf.function.
def _copy_keras_variable(variable: Any, object_map: Any) -> None:
  """Updates (making it once) the host copy of Keras `variable`'s TensorFlow variable, and maps `variable` to it."""
  variable.value._copy_trackable_to_cpu(object_map)  # noqa: SLF001
  object_map[variable] = object_map[variable.value]


def expect_one_trace_per_writer(checkpoint: tf.train.Checkpoint) -> None:
  """Tells TensorFlow that the copy function of `checkpoint`'s writer is traced once per writer, as intended.

  Each writer (one per `train` call, see `close`) traces its own copy of
  its own variables once; TensorFlow counts traces by the function's code,
  so the fifth writer of a process (a sweep of `runner.run` calls) would log
  a "triggered tf.function retracing" warning about a trace that cannot be
  shared. Call it after the save that made the writer.
  """
  writer = _writer(checkpoint)
  if writer is not None:
    writer._copy_to_cpu._omit_frequent_tracing_warning = True  # noqa: SLF001


def take_error(checkpoint: tf.train.Checkpoint) -> Exception | None:
  """Returns the error of `checkpoint`'s last asynchronous write (after `checkpoint.sync()`), or None; clears it.

  TensorFlow keeps it in its writer and raises it at the next write; taken
  here, the caller names the checkpoint that failed instead.
  """
  writer = _writer(checkpoint)
  if writer is None:
    return None
  error, writer._async_error = writer._async_error, None  # noqa: SLF001
  return error


def close(checkpoint: tf.train.Checkpoint) -> None:
  """Ends `checkpoint`'s asynchronous writer, if any, after its write in flight; the next such save makes another.

  TensorFlow ends the writer's thread only at the process's exit, from an
  `atexit` hook that holds the checkpoint's objects (the model, the
  optimizer) until then; ended here, they can be freed with the Trainer.

  Raises:
    Exception: the error of the write in flight, unless taken (`take_error`).
  """
  writer = _writer(checkpoint)
  if writer is None:
    return
  atexit.unregister(writer._join_async_save_thread)  # noqa: SLF001
  checkpoint._async_checkpointer_impl = None  # noqa: SLF001
  checkpoint._checkpoint_options = None  # noqa: SLF001  # Else a restore would go through a new writer.
  writer._join_async_save_thread()  # noqa: SLF001


def _writer(checkpoint: tf.train.Checkpoint) -> Any:
  """`checkpoint`'s asynchronous writer (TensorFlow's `AsyncCheckpointHelper`), or None before its first save."""
  return getattr(checkpoint, "_async_checkpointer_impl", None)
