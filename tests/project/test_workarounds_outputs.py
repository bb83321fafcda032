"""The private TensorFlow behaviour that `strategies.tensorflow_workarounds` works around for checkpoints still holds.

When a test here fails, the installed TensorFlow changed what `end_async_checkpoint_writer` relies on: check it
against the new version, then update it, `CHECKED_WITH` and this test (or delete all three when public API does it).
"""

import os
import threading

import pytest
import tensorflow as tf

from strategies import tensorflow_workarounds

CHANGED = (
    f"TensorFlow changed since tensorflow_workarounds.end_async_checkpoint_writer was checked with "
    f"{tensorflow_workarounds.CHECKED_WITH}"
)


def _writer_threads():
  return sum("_async_save" in thread.name for thread in threading.enumerate())


def _written_in_the_background(path):
  """A `tf.train.Checkpoint` that wrote `path` with TensorFlow's asynchronous writer, the write complete."""
  checkpoint = tf.train.Checkpoint(v=tf.Variable([1.0, 2.0]))
  checkpoint.write(path, options=tf.train.CheckpointOptions(enable_async=True))
  checkpoint.sync()
  return checkpoint


def test_end_async_checkpoint_writer_ends_the_thread_that_tensorflow_keeps_until_exit(tmp_path):
  threads = _writer_threads()
  checkpoint = _written_in_the_background(str(tmp_path / "ckpt"))
  assert _writer_threads() == threads + 1, f"{CHANGED}: its writer's thread no longer outlives a complete write."
  tensorflow_workarounds.end_async_checkpoint_writer(checkpoint)
  assert _writer_threads() == threads, f"{CHANGED}: the writer's thread is not ended."
  values = tf.train.load_checkpoint(str(tmp_path / "ckpt")).get_tensor("v/.ATTRIBUTES/VARIABLE_VALUE")
  assert values.tolist() == [1.0, 2.0]


def test_end_async_checkpoint_writer_raises_the_error_of_the_write_in_flight(tmp_path):
  open(tmp_path / "ckpt_temp", "w").close()  # noqa: SIM115  # Where the write puts its shards: it fails.
  checkpoint = _written_in_the_background(str(tmp_path / "ckpt"))
  try:
    tensorflow_workarounds.end_async_checkpoint_writer(checkpoint)
  except tf.errors.OpError:
    pass
  else:
    pytest.fail(f"{CHANGED}: the error of a failed background write is not raised when its writer ends.")
  assert not os.path.exists(tmp_path / "ckpt.index")
