"""Every use of Keras's (and tf_keras's) private API in the project, each with what it works around.

The only module of `strategies/` and `runner/` that reads `keras.src`, `tf_keras.src` or a private attribute
(`obj._name`) of a Keras object (TensorFlow's are in `strategies/tensorflow_workarounds.py`). Each function says
which Keras behaviour it works around and the versions it was checked against (`CHECKED_WITH`);
`tests/project/test_workarounds.py` runs each one against the installed Keras and fails loudly when that
behaviour changes.
"""

CHECKED_WITH = "keras 3.15.1, tf_keras 2.21.0"
