"""Files under multi-worker strategies: the chief writes them, every other worker writes to scratch.

TensorFlow's multi-worker saving needs every worker to take part in a save
(variables may be read collectively), but only the chief's copy is kept; the
others write to a temporary directory that is deleted right after.
"""

import contextlib
import tempfile
from typing import Any


def destination(strategy: Any, path: str) -> contextlib.AbstractContextManager[str]:
  """A context that yields where this worker writes `path`: `path` itself on the chief, else a scratch directory.

  The scratch directory is deleted when the block ends, whatever happened in it.

  Args:
    strategy: the `tf.distribute.Strategy`; its `extended.should_checkpoint`
      tells the chief (true on single-worker strategies).
    path: the directory the chief writes.
  """
  if strategy.extended.should_checkpoint:
    return contextlib.nullcontext(path)
  return tempfile.TemporaryDirectory(prefix="tf_runner_worker_", ignore_cleanup_errors=True)
