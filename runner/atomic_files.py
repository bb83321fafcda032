"""Files replaced whole: written beside their path, then renamed over it, so a reader or a crash sees old or new."""

import os
import uuid

import tensorflow as tf


def replace(path, contents):
  """Replaces the file at `path` (local or `gs://`, through `tf.io.gfile`) with `contents`.

  On a local file system the rename is atomic; on Cloud Storage it is a copy,
  which is never seen half-written either.

  Args:
    path: the file to write.
    contents: `str` or `bytes`.

  Raises:
    tf.errors.OpError: the file could not be written (disk full, no
      permission, ...); `path` is unchanged and no temporary file is left.
  """
  temporary = f"{path}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
  try:
    with tf.io.gfile.GFile(temporary, "wb" if isinstance(contents, bytes) else "w") as f:
      f.write(contents)
    tf.io.gfile.rename(temporary, path, overwrite=True)
  finally:
    if tf.io.gfile.exists(temporary):
      tf.io.gfile.remove(temporary)
