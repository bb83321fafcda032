"""Process-wide settings the Trainer changes only for a while: the random seeds; and the precisions it knows.

Imports no TensorFlow: the config checks use PRECISIONS before it loads. The
dtype policy is set per Keras by `runner.training.keras_versions.dtype_policies`.
"""

from collections.abc import Iterator
import contextlib
import random

import numpy as np

PRECISIONS = ("float32", "mixed_bfloat16", "mixed_float16")


@contextlib.contextmanager
def random_seed(seed: int | None) -> Iterator[None]:
  """Seeds Python's and NumPy's generators inside the block (if `seed` is not None), then restores their states.

  Keras draws the seeds of initializers and dropout layers from Python's
  `random` when they are created, so a model made inside the block gets the
  same initial weights for the same seed.
  """
  if seed is None:
    yield
    return
  python_state, numpy_state = random.getstate(), np.random.get_state()
  random.seed(seed)
  np.random.seed(seed)
  try:
    yield
  finally:
    random.setstate(python_state)
    np.random.set_state(numpy_state)
