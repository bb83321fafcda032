"""The local devices TensorFlow sees, and checking device names against them."""

import tensorflow as tf

from strategies.errors import ConfigError


def _key(name: str) -> tuple[str, int] | None:
  spec = tf.DeviceSpec.from_string(name)
  if spec.job not in (None, "localhost") or spec.device_type is None:
    return None
  return spec.device_type.upper(), spec.device_index or 0


def logical_devices(device_type: str | None = None) -> list[str]:
  """Returns the names of the local logical devices, e.g. '/device:CPU:0'."""
  return [d.name for d in tf.config.list_logical_devices(device_type)]


def existing_device(name: str, what: str = "device") -> str:
  """Returns the logical device named `name` ('/cpu:1', 'GPU:0', '/device:CPU:0', ...).

  Raises:
    ConfigError: no local logical device has that type and index; the message
      lists the devices that exist.
  """
  if not isinstance(name, str) or not name:
    raise ConfigError(f"{what} must be a device name such as '/cpu:0' or '/gpu:0', got {name!r}.")
  try:
    key = _key(name)
  except ValueError:
    key = None
  available = logical_devices()
  for device in available:
    if key is not None and _key(device) == key:
      return device
  raise ConfigError(
      f"{what}={name!r} does not exist in this process. Devices TensorFlow sees: "
      f"{', '.join(available)}. (More CPUs come from virtual_cpus.)"
  )


def accelerators_or_cpus() -> list[str]:
  """Returns all logical GPUs, or all logical CPUs when there is no GPU."""
  return logical_devices("GPU") or logical_devices("CPU")


def short_name(device: str) -> str:
  """Returns 'CPU:0' for a local device name, the full name for a remote one."""
  spec = tf.DeviceSpec.from_string(device)
  if spec.job in (None, "localhost") and spec.device_type is not None:
    return f"{spec.device_type.upper()}:{spec.device_index or 0}"
  return device
