"""Files replaced whole: written beside their path, then renamed over it, so a reader or a crash sees old or new."""

from collections.abc import Mapping
import os
import uuid

import tensorflow as tf


def replace_all(contents_by_path: Mapping[str, str | bytes]) -> None:
  """Replaces each file of `{path: contents}` whole: all are written beside their paths first, then renamed.

  A failed write changes none of them; no temporary file is left either way.

  Args:
    contents_by_path: `{path: str or bytes}`, local paths or `gs://` (through `tf.io.gfile`).

  Raises:
    tf.errors.OpError, OSError: a file could not be written or renamed.
  """
  suffix = f".tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
  temporary = {path: path + suffix for path in contents_by_path}
  try:
    for path, contents in contents_by_path.items():
      with tf.io.gfile.GFile(temporary[path], "wb" if isinstance(contents, bytes) else "w") as f:
        f.write(contents)
    for path, written in temporary.items():
      tf.io.gfile.rename(written, path, overwrite=True)
  finally:
    for written in temporary.values():
      if tf.io.gfile.exists(written):
        tf.io.gfile.remove(written)
