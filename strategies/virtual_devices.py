"""Splitting the host CPU into logical devices, TensorFlow's way to get replicas on one CPU."""

import tensorflow as tf

from strategies import checks


def virtual_cpus(n: int) -> list[tf.config.LogicalDevice]:
  """Splits the first physical CPU into `n` logical CPU devices.

  Several replicas on one CPU come from this: after `virtual_cpus(4)`,
  `tf.distribute.MirroredStrategy()` has four replicas `/cpu:0` .. `/cpu:3`.
  Calling it again with the same `n` is a no-op, so a test process and the code
  it runs may both ask for the split they need.

  Args:
    n: the number of logical CPUs, an int >= 1.

  Returns:
    The logical CPU devices, a list of `tf.config.LogicalDevice`.

  Raises:
    ValueError: `n` is not a positive int.
    RuntimeError: TensorFlow already initialized its devices with another
      number of logical CPUs (this must run before any TensorFlow op, strategy
      or device listing).
  """
  if not checks.is_int(n) or n < 1:
    raise ValueError(f"virtual_cpus needs a positive int number of logical CPUs, got {n!r}.")
  cpu = tf.config.list_physical_devices("CPU")[0]
  try:
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(n)])
  except RuntimeError:
    existing = tf.config.list_logical_devices("CPU")
    if len(existing) != n:
      raise RuntimeError(
          f"virtual_cpus({n}) came too late: TensorFlow already initialized its devices "
          f"with {len(existing)} logical CPU(s). Call strategies.virtual_cpus (or set "
          f"config.strategy.virtual_cpus / --virtual_cpus) before any TensorFlow op, "
          f"strategy or device listing runs in this process."
      ) from None
    return existing
  return tf.config.list_logical_devices("CPU")
