"""Every use of TensorFlow's private API in the project, each with what it works around.

The only module of `strategies/` and `runner/` that reads `tensorflow.python` or a private attribute
(`obj._name`) of a TensorFlow object (Keras's are in `runner/keras_workarounds.py`). Each function says which
TensorFlow behaviour it works around and the version it was checked against (`CHECKED_WITH`);
`tests/project/test_workarounds.py` runs each one against the installed TensorFlow and fails loudly when
that behaviour changes.
"""

CHECKED_WITH = "tensorflow 2.21.0"

# --- trainer ---


def clear_kernel_cache() -> None:
  """Drops TensorFlow's cache of the kernels it instantiated for traced functions (kernels in use are rebuilt).

  Works around: the cache keeps each traced function's executor after the function is gone, so a sweep of
  `runner.run` calls in one process grew by several MB and threads per run. TensorFlow has no public name for it
  (`keras.backend.clear_session` calls it, but also resets the user's global Keras state). Checked with
  `CHECKED_WITH`.
  """
  from tensorflow.python.eager import context  # noqa: PLC0415, TID251  Imported where used: TensorFlow loads late.

  context.context().clear_kernel_cache()
