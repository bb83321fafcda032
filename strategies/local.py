"""Strategies on this machine's devices (default, one device, mirrored), the devices they check, `virtual_cpus`."""

import concurrent.futures
import functools
import itertools

import tensorflow as tf

from strategies import checks
from strategies.errors import ConfigError

CROSS_DEVICE_OPS = {
    "auto": None,
    "nccl": tf.distribute.NcclAllReduce,
    "hierarchical_copy": tf.distribute.HierarchicalCopyAllReduce,
    "reduce_to_one": tf.distribute.ReductionToOneDevice,
}

# Collective group keys start at 1 in every MirroredStrategy, and the runtime
# remembers each key's group size, so a second strategy over other devices in
# the same process would clash ("joining a group with size 4, but that group
# has size 2"). Each instance gets its own key range, as TensorFlow's tests do.
_COLLECTIVE_KEY_BASES = itertools.count(start=100_000, step=100_000)


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
    if len(tf.config.list_logical_devices("CPU")) != n:
      raise RuntimeError(
          f"virtual_cpus({n}) came too late: TensorFlow already initialized its devices with "
          f"{len(tf.config.list_logical_devices('CPU'))} logical CPU(s). Call strategies.virtual_cpus (or set "
          "config.strategy.virtual_cpus / --virtual_cpus) before any TensorFlow op, strategy or device listing runs."
      ) from None
  return tf.config.list_logical_devices("CPU")


def logical_devices(device_type: str | None = None) -> list[str]:
  """Returns the names of the local logical devices, e.g. '/device:CPU:0'."""
  return [d.name for d in tf.config.list_logical_devices(device_type)]


def short_name(device: str) -> str | None:
  """Returns 'CPU:0' for a local device name ('/cpu:0', 'GPU:1', '/device:CPU:0', ...), None for a remote one."""
  spec = tf.DeviceSpec.from_string(device)
  if spec.job not in (None, "localhost") or spec.device_type is None:
    return None
  return f"{spec.device_type.upper()}:{spec.device_index or 0}"


def existing_device(name: str, what: str = "device") -> str:
  """Returns the logical device named `name` ('/cpu:1', 'GPU:0', '/device:CPU:0', ...).

  Raises:
    ConfigError: no local logical device has that type and index; the message
      lists the devices that exist.
  """
  try:
    key = short_name(name) if isinstance(name, str) and name else None
  except ValueError:  # Not a device name.
    key = None
  available = logical_devices()
  found = [device for device in available if key and short_name(device) == key]
  if not found:
    raise ConfigError(
        f"{what}={name!r} does not exist in this process. Devices TensorFlow sees: {', '.join(available)}."
    )
  return found[0]


def accelerators_or_cpus() -> list[str]:
  """Returns all logical GPUs, or all logical CPUs when there is no GPU."""
  return logical_devices("GPU") or logical_devices("CPU")


@functools.cache
def default_strategy() -> tf.distribute.Strategy:
  """TensorFlow's default strategy, one per process: what `tf.distribute.get_strategy()` gives outside every scope.

  Strategy scopes belong to a thread, so a new thread is outside all of them.
  """
  with concurrent.futures.ThreadPoolExecutor(1) as thread:
    return thread.submit(tf.distribute.get_strategy).result()


class _IsTheDefaultStrategy(type):
  """Makes `isinstance(s, DefaultStrategy)` true for TensorFlow's default strategy (its class is private)."""

  def __instancecheck__(cls, instance: object) -> bool:
    return instance is default_strategy()


class DefaultStrategy(tf.distribute.Strategy, metaclass=_IsTheDefaultStrategy):
  """TensorFlow's default strategy: no distribution, one replica, the current device.

  TensorFlow keeps exactly one default strategy per process, so
  `DefaultStrategy()` returns that object, `tf.distribute.get_strategy()`
  outside any scope, and `isinstance(s, strategies.DefaultStrategy)` is true
  for it.

  Raises:
    ConfigError: called inside another strategy's scope.
  """

  def __new__(cls) -> tf.distribute.Strategy:
    """Returns TensorFlow's default strategy (no class of its own)."""
    if tf.distribute.has_strategy():
      raise ConfigError(
          f"DefaultStrategy() was asked for inside the scope of {type(tf.distribute.get_strategy()).__name__}; "
          "create it outside any `strategy.scope()`."
      )
    return tf.distribute.get_strategy()


class OneDeviceStrategy(tf.distribute.OneDeviceStrategy):
  """`tf.distribute.OneDeviceStrategy` on a device that is checked to exist."""

  def __init__(self, device: str | None = None) -> None:
    """Builds the strategy; every argument is checked first.

    Args:
      device: a local device name such as '/cpu:1' or '/gpu:0'; by default the
        first GPU, else '/cpu:0'.

    Raises:
      ConfigError: the device does not exist in this process.
    """
    super().__init__(existing_device(accelerators_or_cpus()[0] if device is None else device))


class MirroredStrategy(tf.distribute.MirroredStrategy):
  """`tf.distribute.MirroredStrategy` over checked local devices, with named all-reduce."""

  def __init__(
      self, devices: list[str] | tuple[str, ...] | None = None, *, cross_device_ops: str = "auto", num_packs: int = 1
  ) -> None:
    """Builds the strategy; every argument is checked first.

    Args:
      devices: local device names; by default all GPUs, else all logical CPUs
        (as TensorFlow's own default), listed so that they are checked.
      cross_device_ops: 'auto' (TensorFlow picks), 'nccl' (GPUs only),
        'hierarchical_copy' or 'reduce_to_one'.
      num_packs: gradient packing for 'nccl' and 'hierarchical_copy'.

    Raises:
      ConfigError: a device does not exist or repeats, or the all-reduce
        choice is unknown or does not fit the devices.
    """
    if devices is None:
      devices = accelerators_or_cpus()
    else:
      devices = [existing_device(d, "devices[]") for d in checks.strings(devices, "devices", ["/cpu:0", "/cpu:1"])]
      repeated = sorted({d for d in devices if devices.count(d) > 1})
      if repeated:
        raise ConfigError(f"devices lists {', '.join(repeated)} more than once; each device holds one replica.")
    checks.one_of(cross_device_ops, tuple(CROSS_DEVICE_OPS), "cross_device_ops")
    checks.positive_int(num_packs, "num_packs")
    packs = cross_device_ops in ("nccl", "hierarchical_copy")
    if num_packs != 1 and not packs:
      raise ConfigError(
          f"num_packs={num_packs} is used only by cross_device_ops 'nccl' or 'hierarchical_copy', "
          f"not {cross_device_ops!r}; leave num_packs at 1 or pick one of those."
      )
    not_gpus = [d for d in devices if not (short_name(d) or "").startswith("GPU")]
    if cross_device_ops == "nccl" and not_gpus:
      raise ConfigError(
          f"cross_device_ops='nccl' all-reduces across GPUs, but {', '.join(not_gpus)} is not a GPU; "
          "use 'auto', 'hierarchical_copy' or 'reduce_to_one'."
      )
    all_reduce = CROSS_DEVICE_OPS[cross_device_ops]
    self._collective_key_base = next(_COLLECTIVE_KEY_BASES)  # Read by TensorFlow's MirroredExtended.
    super().__init__(
        devices=devices, cross_device_ops=all_reduce and (all_reduce(num_packs=num_packs) if packs else all_reduce())
    )
