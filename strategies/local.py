"""Strategies on this machine's devices: default, one device, mirrored."""

import itertools

import tensorflow as tf
from tensorflow.python.distribute import distribute_lib  # noqa: TID251

from strategies import checks
from strategies import devices as local_devices
from strategies.errors import ConfigError

CROSS_DEVICE_OPS = ("auto", "nccl", "hierarchical_copy", "reduce_to_one")

# Collective group keys start at 1 in every MirroredStrategy, and the runtime
# remembers each key's group size, so a second strategy over other devices in
# the same process would clash ("joining a group with size 4, but that group
# has size 2"). Each instance gets its own key range, as TensorFlow's tests do.
_COLLECTIVE_KEY_BASES = itertools.count(start=100_000, step=100_000)


class _IsTheDefaultStrategy(type):
  """Makes `isinstance(s, DefaultStrategy)` true for TensorFlow's default strategy."""

  def __instancecheck__(cls, instance: object) -> bool:
    return type(instance) is distribute_lib._DefaultDistributionStrategy  # noqa: SLF001


class DefaultStrategy(distribute_lib._DefaultDistributionStrategy, metaclass=_IsTheDefaultStrategy):  # noqa: SLF001
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
    if device is None:
      device = local_devices.accelerators_or_cpus()[0]
    super().__init__(local_devices.existing_device(device))


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
      devices = local_devices.accelerators_or_cpus()
    else:
      devices = [
          local_devices.existing_device(d, "devices[]")
          for d in checks.strings(devices, "devices", ["/cpu:0", "/cpu:1"])
      ]
      repeated = sorted({d for d in devices if devices.count(d) > 1})
      if repeated:
        raise ConfigError(f"devices lists {', '.join(repeated)} more than once; each device holds one replica.")
    all_reduce = _cross_device_ops(cross_device_ops, num_packs, devices)
    self._collective_key_base = next(_COLLECTIVE_KEY_BASES)  # Read by TensorFlow's MirroredExtended.
    super().__init__(devices=devices, cross_device_ops=all_reduce)


def _cross_device_ops(name: str, num_packs: int, devices: list[str]) -> tf.distribute.CrossDeviceOps | None:
  """Returns the tf.distribute.CrossDeviceOps for `name`, None for 'auto'."""
  checks.one_of(name, CROSS_DEVICE_OPS, "cross_device_ops")
  checks.positive_int(num_packs, "num_packs")
  if num_packs != 1 and name not in ("nccl", "hierarchical_copy"):
    raise ConfigError(
        f"num_packs={num_packs} is used only by cross_device_ops 'nccl' or 'hierarchical_copy', "
        f"not {name!r}; leave num_packs at 1 or pick one of those."
    )
  if name == "nccl":
    not_gpus = [d for d in devices if tf.DeviceSpec.from_string(d).device_type.upper() != "GPU"]
    if not_gpus:
      raise ConfigError(
          f"cross_device_ops='nccl' all-reduces across GPUs, but {', '.join(not_gpus)} is not a GPU; "
          "use 'auto', 'hierarchical_copy' or 'reduce_to_one'."
      )
    return tf.distribute.NcclAllReduce(num_packs=num_packs)
  if name == "hierarchical_copy":
    return tf.distribute.HierarchicalCopyAllReduce(num_packs=num_packs)
  if name == "reduce_to_one":
    return tf.distribute.ReductionToOneDevice()
  return None
