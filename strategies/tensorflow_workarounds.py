"""Every use of TensorFlow's private API in the project, each with what it works around.

The only module of `strategies/` and `runner/` that reads `tensorflow.python` or a private attribute
(`obj._name`) of a TensorFlow object (Keras's are in `runner/keras_workarounds.py`). Each function says which
TensorFlow behaviour it works around and the version it was checked against (`CHECKED_WITH`);
`tests/project/test_workarounds.py` runs each one against the installed TensorFlow and fails loudly when
that behaviour changes.
"""

CHECKED_WITH = "tensorflow 2.21.0"
