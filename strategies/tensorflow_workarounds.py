"""Every use of TensorFlow's private API in the project, each with what it works around.

The only module of `strategies/` and `runner/` that reads `tensorflow.python` or a private attribute
(`obj._name`) of a TensorFlow object (Keras's are in `runner/keras_workarounds.py`). Each function says which
TensorFlow behaviour it works around and the version it was checked against (`CHECKED_WITH`);
`tests/project/test_workarounds.py` runs each one against the installed TensorFlow and fails loudly when
that behaviour changes.
"""

import sys

CHECKED_WITH = "tensorflow 2.21.0"


# --- cluster ---


def joined_a_cluster() -> bool:
  """Whether this process's TensorFlow has joined a multi-worker cluster (collective ops or a remote server set up).

  Works around: TensorFlow has no public call that says so. Its eager context holds the server def that
  `MultiWorkerMirroredStrategy` (collective ops, `_collective_ops_server_def`) or `connect_to_cluster`
  (`get_server_def()`) set. A signal handler asks (`runner.cluster.stop_signals`), maybe while TensorFlow is being
  imported, so this imports nothing: it reads the context module if `sys.modules` holds it, half loaded or not.
  Checked with `CHECKED_WITH`.
  """
  context = sys.modules.get("tensorflow.python.eager.context")
  context_safe = getattr(context, "context_safe", None)  # Not there yet in a module half loaded: not joined.
  current = context_safe() if context_safe is not None else None
  return bool(current and (current.get_server_def() or current._collective_ops_server_def))  # noqa: SLF001
