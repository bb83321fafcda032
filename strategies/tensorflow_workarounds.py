"""Every use of TensorFlow's private API in the project, each with what it works around.

The only module of `strategies/` and `runner/` that reads `tensorflow.python` or a private attribute
(`obj._name`) of a TensorFlow object (Keras's are in `runner/keras_workarounds.py`). Each function says which
TensorFlow behaviour it works around and the version it was checked against (`CHECKED_WITH`);
`tests/project/test_workarounds.py` runs each one against the installed TensorFlow and fails loudly when
that behaviour changes.
"""

import atexit
from typing import Any

CHECKED_WITH = "tensorflow 2.21.0"


# --- outputs ---


def end_async_checkpoint_writer(checkpoint: Any) -> None:
  """Waits for the asynchronous write of `checkpoint` (a `tf.train.Checkpoint`) in flight, then ends its writer.

  Works around TensorFlow 2.21 (`CHECKED_WITH`): the writer that
  `tf.train.CheckpointOptions(enable_async=True)` starts for a checkpoint runs
  a thread that only an `atexit` hook ends, and that hook holds the
  checkpointed objects (a model, its optimizer) and their host copies until
  the process exits, so a sweep of runs in one process would keep every run's;
  and the error of a failed write is raised only at the next asynchronous
  save or by that hook (`Checkpoint.sync()` waits, but neither ends the
  thread nor raises). Drop `checkpoint` afterwards: a later asynchronous save
  through it would start another writer.

  Raises:
    Exception: the error of the write in flight (as TensorFlow raised it in its writer's thread).
  """
  writer = getattr(checkpoint, "_async_checkpointer_impl", None)
  if writer is not None:
    join = writer._join_async_save_thread  # noqa: SLF001
    atexit.unregister(join)
    join()
