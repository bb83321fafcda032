"""Building a strategy from its config: `create` and `names`."""

from collections.abc import Mapping
from typing import Any

from absl import logging
import tensorflow as tf

from strategies import auto
from strategies import schema
from strategies.errors import ConfigError
from strategies.local import DefaultStrategy
from strategies.local import MirroredStrategy
from strategies.local import OneDeviceStrategy
from strategies.multi_worker import MultiWorkerMirroredStrategy
from strategies.parameter_server import ParameterServerStrategy
from strategies.tpu import TPUStrategy
from strategies.virtual_devices import virtual_cpus

WRAPPERS = {
    "default": DefaultStrategy,
    "one_device": OneDeviceStrategy,
    "mirrored": MirroredStrategy,
    "multi_worker_mirrored": MultiWorkerMirroredStrategy,
    "parameter_server": ParameterServerStrategy,
    "tpu": TPUStrategy,
}


def names() -> list[str]:
  """Returns the strategy names `config.strategy.name` accepts, 'auto' first."""
  return list(schema.NAMES)


def split_cpus(n: int) -> None:
  """Runs `strategies.virtual_cpus(n)`, raising ConfigError when it cannot.

  Raises:
    ConfigError: `n` is not a positive int, or TensorFlow already initialized
      its devices with another number of logical CPUs.
  """
  try:
    virtual_cpus(n)
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
    choice = auto.choose()
    logging.info("Strategy auto chose %s: %s.", choice.name, choice.reason)
    name = choice.name
  arguments = {field: fields[field] for field in schema.FIELDS_USED[name] if field != "virtual_cpus"}
  return WRAPPERS[name](**arguments)
