"""Building a strategy from its config: `create`, `names`, and what `auto` picks on this machine."""

from collections.abc import Mapping
from typing import Any

from absl import logging
import tensorflow as tf

from strategies import local
from strategies import schema
from strategies import tpu
from strategies.errors import ConfigError
from strategies.multi_worker import MultiWorkerMirroredStrategy
from strategies.parameter_server import ParameterServerStrategy

WRAPPERS = {
    "default": local.DefaultStrategy,
    "one_device": local.OneDeviceStrategy,
    "mirrored": local.MirroredStrategy,
    "multi_worker_mirrored": MultiWorkerMirroredStrategy,
    "parameter_server": ParameterServerStrategy,
    "tpu": tpu.TPUStrategy,
}


def names() -> list[str]:
  """Returns the strategy names `config.strategy.name` accepts, 'auto' first."""
  return list(schema.NAMES)


def choose() -> tuple[str, str]:
  """Returns the strategy `auto` picks for this process and why, decided without waiting on the network.

  A reachable TPU (TPU_NAME set, or this machine is a TPU VM) gives `tpu`;
  more than one GPU gives `mirrored` over them; one GPU gives `one_device` on
  it; on a CPU-only host, more than one logical CPU (`virtual_cpus`) gives
  `mirrored` over them, else `one_device` on '/cpu:0'.
  """
  reachable = tpu.reachable_tpu()
  if reachable:
    return ("tpu", f"a TPU is reachable ({reachable!r})")
  gpus, cpus = len(local.logical_devices("GPU")), len(local.logical_devices("CPU"))
  if gpus:
    return ("mirrored", f"no TPU, {gpus} GPUs") if gpus > 1 else ("one_device", "no TPU, one GPU")
  if cpus > 1:
    return ("mirrored", f"no TPU or GPU, {cpus} logical CPUs")
  return ("one_device", "no TPU or GPU, one CPU")


def split_cpus(n: int) -> None:
  """Runs `strategies.virtual_cpus(n)`, raising ConfigError when it cannot.

  Raises:
    ConfigError: `n` is not a positive int, or TensorFlow already initialized
      its devices with another number of logical CPUs.
  """
  try:
    local.virtual_cpus(n)
  except (ValueError, RuntimeError) as e:
    raise ConfigError(f"virtual_cpus={n!r}: {e}") from None


def create(config: Mapping[str, Any] | None = None) -> tf.distribute.Strategy:
  """Builds the strategy `config` describes.

  Names and fields are checked first (no TensorFlow work), then
  `virtual_cpus` splits the CPU if set, then the strategy is built. `auto`
  logs its decision in one line.

  Args:
    config: `config.strategy`, a ConfigDict from `strategies.default_config()`
      or a plain mapping with some of its fields; None means `auto`.

  Returns:
    A `tf.distribute.Strategy`, an instance of one of this package's wrappers.

  Raises:
    ConfigError: any bad input; the message names what was wrong and what is
      valid.
  """
  fields = schema.resolve(config)
  if fields["virtual_cpus"] is not None:
    split_cpus(fields["virtual_cpus"])
  name = fields["name"]
  if name == "auto":
    name, reason = choose()
    logging.info("Strategy auto chose %s: %s.", name, reason)
  return WRAPPERS[name](**{field: fields[field] for field in schema.FIELDS_USED[name] if field != "virtual_cpus"})
