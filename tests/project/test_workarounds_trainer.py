"""The private TensorFlow API the Trainer's area keeps (`strategies/tensorflow_workarounds.py`, section trainer).

Each test runs a workaround against the installed TensorFlow and fails, naming the function and the version it was
checked with, when that behaviour changes.
"""

import tensorflow as tf

from strategies import tensorflow_workarounds


def test_clear_kernel_cache_drops_the_cache_and_traced_functions_run_after_it():
  doubled = tf.function(lambda x: x * 2)
  assert int(doubled(tf.constant(2))) == 4
  try:
    tensorflow_workarounds.clear_kernel_cache()
  except (AttributeError, ImportError) as error:
    raise AssertionError(
        f"tensorflow_workarounds.clear_kernel_cache no longer works with tensorflow {tf.__version__} ({error}); it "
        f"was checked with {tensorflow_workarounds.CHECKED_WITH}."
    ) from None
  assert int(doubled(tf.constant(3))) == 6  # Its kernels are rebuilt.
