"""Every use of Keras's (and tf_keras's) private API in the project, each with what it works around.

The only module of `strategies/` and `runner/` that reads `keras.src`, `tf_keras.src` or a private attribute
(`obj._name`) of a Keras object (TensorFlow's are in `strategies/tensorflow_workarounds.py`). Each function says
which Keras behaviour it works around and the versions it was checked against (`CHECKED_WITH`);
`tests/project/test_workarounds_*.py` run each one against the installed Keras and fails loudly when that
behaviour changes.
"""

from typing import Any

CHECKED_WITH = "keras 3.15.1, tf_keras 2.21.0"


# --- loops ---


def tf_keras_learning_rate(optimizer: Any) -> Any:
  """What a tf_keras optimizer (or the one a tf_keras `LossScaleOptimizer` wraps) was given as its learning rate.

  A `LearningRateSchedule`, else the variable of its fixed rate. Works around
  tf_keras's public `optimizer.learning_rate` under a schedule being the rate
  its last step used (the schedule at `iterations - 1`), not the next step's:
  the schedule itself is kept only in the private `_learning_rate` (checked
  with `CHECKED_WITH`).
  """
  return getattr(getattr(optimizer, "inner_optimizer", optimizer), "_learning_rate", None)
