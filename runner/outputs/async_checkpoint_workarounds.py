"""Private TensorFlow and Keras API that asynchronous checkpoints need: three workarounds to delete when fixed upstream.

Checked against TensorFlow 2.21.0 and Keras 3.15.1. The `test_upstream_*` tests of
tests/runner/outputs/test_async_checkpoints.py fail when the behaviour worked around changes (the Keras copy still
fails, TensorFlow's writer thread still outlives its last write, the trace flag still exists);
tests/runner/test_repeated_runs.py fails when a run's writer keeps its model alive.
"""

import atexit
import functools
from typing import Any

import keras
import tensorflow as tf


def make_keras_variables_copyable(checkpoint: tf.train.Checkpoint) -> None:
  """Lets the asynchronous writer of `checkpoint` copy its Keras 3 variables at every save; call it before the first.

  Keras 3.15.1's `Variable._copy_trackable_to_cpu` makes a new `tf.Variable`
  at every call, and TensorFlow 2.21 calls it inside a `tf.function` from the
  second save on, which fails ("tf.function only supports singleton
  tf.Variables created on the first call"). Running that copy eagerly instead
  (`tf.config.run_functions_eagerly`) made a save stall 8 times longer on a
  model of 1,200 variables. Here each Keras variable's host copy is made
  once (at the first save, which TensorFlow runs eagerly) and assigned at each
  save. tf_keras (Keras 2) variables are TensorFlow's own and left as they are.
  """
  for trackable in tf.train.TrackableView(checkpoint).descendants():
    if isinstance(trackable, keras.Variable):
      trackable._copy_trackable_to_cpu = functools.partial(_copy_to_host, trackable)  # noqa: SLF001


@tf.autograph.experimental.do_not_convert  # Plain Python; TensorFlow calls it inside a tf.function.
def _copy_to_host(variable: keras.Variable, object_map: Any) -> None:
  """Assigns Keras `variable`'s value to its host copy in `object_map`, making the copy (on its host's CPU) once."""
  if variable in object_map:
    object_map[variable].assign(variable.value)
  else:
    host = tf.DeviceSpec.from_string(variable.value.device).replace(device_type="CPU", device_index=0)
    with tf.device(host.to_string()):
      object_map[variable] = tf.Variable(variable.value, trainable=False)


def close_writer(checkpoint: tf.train.Checkpoint) -> None:
  """Waits for the asynchronous write of `checkpoint` in flight and ends its writer, so that the writer can be freed.

  TensorFlow 2.21 ends the writer's thread only from an `atexit` hook that
  holds the checkpointed objects (the model, the optimizer) and their host
  copies until the process exits, so a sweep of runs in one process would
  keep every run's. Drop `checkpoint` afterwards: a later asynchronous save
  or a restore through it would start another writer.

  Raises:
    Exception: the error of the write in flight (TensorFlow keeps it in the
      writer; there is no public way to take it before its next write).
  """
  writer = _writer(checkpoint)
  if writer is not None:
    join = writer._join_async_save_thread  # noqa: SLF001
    atexit.unregister(join)
    join()


def expect_one_trace_per_writer(checkpoint: tf.train.Checkpoint) -> None:
  """Tells TensorFlow that the copy function of `checkpoint`'s writer is traced once per writer, as intended.

  TensorFlow 2.21 counts traces by the function's code, not per writer, so the
  fifth writer of a process (a sweep of runs, each tracing its writer's copy
  at its second save) would log a "triggered tf.function retracing" warning
  about traces that cannot be shared. Call it after a save that made the writer.
  """
  writer = _writer(checkpoint)
  if writer is not None:
    writer._copy_to_cpu._omit_frequent_tracing_warning = True  # noqa: SLF001


def _writer(checkpoint: tf.train.Checkpoint) -> Any:
  """`checkpoint`'s asynchronous writer (TensorFlow 2.21's `AsyncCheckpointHelper`), or None before its first save."""
  return getattr(checkpoint, "_async_checkpointer_impl", None)
