"""The `config.strategy` schema: its fields, their defaults, and which strategy uses which."""

import collections.abc
from typing import Any

import ml_collections
from ml_collections import config_dict

from strategies import checks
from strategies import cluster
from strategies.errors import ConfigError

# Field -> default. A field counts as set when its value differs from this.
DEFAULTS = {
    "name": "auto",
    "device": None,
    "devices": None,
    "virtual_cpus": None,
    "cross_device_ops": "auto",
    "num_packs": 1,
    "communication": "auto",
    "timeout_seconds": 300.0,
    "cluster": "auto",
    "num_ps": None,
    "worker_hosts": None,
    "task_index": None,
    "min_shard_bytes": None,
    "tpu": "",
    "zone": None,
    "project": None,
    "computation_shape": None,
    "num_replicas": None,
    "spmd_xla_partitioning": False,
}

# The type of each field that may be None, so config overrides can set it (and set it to None).
_PLACEHOLDER_TYPES = {
    "device": str,
    "devices": tuple,
    "virtual_cpus": int,
    "timeout_seconds": float,
    "worker_hosts": tuple,
    "task_index": int,
    "num_ps": int,
    "min_shard_bytes": int,
    "zone": str,
    "project": str,
    "computation_shape": tuple,
    "num_replicas": int,
}

# Strategy name -> the fields it reads besides `name`.
FIELDS_USED = {
    "auto": ("virtual_cpus",),
    "default": (),
    "one_device": ("device", "virtual_cpus"),
    "mirrored": ("devices", "virtual_cpus", "cross_device_ops", "num_packs"),
    "multi_worker_mirrored": ("communication", "timeout_seconds", "cluster", "worker_hosts", "task_index"),
    "parameter_server": ("timeout_seconds", "cluster", "num_ps", "min_shard_bytes"),
    "tpu": ("tpu", "zone", "project", "computation_shape", "num_replicas", "spmd_xla_partitioning"),
}

NAMES = tuple(FIELDS_USED)


def default_config() -> ml_collections.ConfigDict:
  """Returns the `config.strategy` ConfigDict: every field at its default."""
  config = ml_collections.ConfigDict()
  for field, default in DEFAULTS.items():
    if default is None or field in _PLACEHOLDER_TYPES:
      default = config_dict.FieldReference(default, field_type=_PLACEHOLDER_TYPES[field])
    setattr(config, field, default)
  return config


def resolve(config: collections.abc.Mapping[str, Any] | ml_collections.ConfigDict | None) -> dict[str, Any]:
  """Returns every field's value: `config` over the defaults, with the usage checked.

  Args:
    config: a ConfigDict (or FrozenConfigDict) shaped like `default_config()`,
      a plain mapping with some of its fields, or None for all defaults.

  Returns:
    A dict with every field of `DEFAULTS`.

  Raises:
    ConfigError: an unknown field or strategy name, or a field set that the
      chosen strategy does not use.
  """
  if config is None:
    config = {}
  elif hasattr(config, "to_dict"):
    config = config.to_dict()
  if not isinstance(config, collections.abc.Mapping):
    raise ConfigError(f"The strategy config must be a ConfigDict or a mapping, got {type(config).__name__}.")
  for field in config:
    if field not in DEFAULTS:
      raise ConfigError(
          f"config.strategy has no field {field!r}.{checks.did_you_mean(field, DEFAULTS)} "
          f"Fields: {', '.join(DEFAULTS)}."
      )
  fields = {**DEFAULTS, **config}
  name = checks.one_of(fields["name"], NAMES, "config.strategy.name")
  checks.one_of(fields["cluster"], cluster.SOURCES, "config.strategy.cluster")
  checks.positive_int(fields["num_ps"], "config.strategy.num_ps", optional=True)
  for field, value in fields.items():
    if field != "name" and field not in FIELDS_USED[name] and value != DEFAULTS[field]:
      users = [n for n, used in FIELDS_USED.items() if field in used]
      raise ConfigError(
          f"config.strategy.{field}={value!r} is not used by strategy {name!r}, which reads "
          f"{', '.join(FIELDS_USED[name]) or 'no other field'}. Remove it, or choose a strategy "
          f"that uses it: {', '.join(users)}."
      )
  return fields
