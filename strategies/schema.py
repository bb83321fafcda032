"""The `config.strategy` schema: its fields, their defaults, and which strategy uses which."""

import collections.abc
from typing import Any

import ml_collections
from ml_collections import config_dict

from strategies import checks
from strategies import cluster
from strategies.errors import ConfigError

# Field -> (default, type). A field counts as set when its value differs from its default; the fields whose
# default is None, and timeout_seconds, may be set to None.
FIELDS: dict[str, tuple[Any, type]] = {
    "name": ("auto", str),
    "device": (None, str),
    "devices": (None, tuple),
    "virtual_cpus": (None, int),
    "cross_device_ops": ("auto", str),
    "num_packs": (1, int),
    "communication": ("auto", str),
    "timeout_seconds": (300.0, float),
    "cluster": ("auto", str),
    "num_ps": (None, int),
    "worker_hosts": (None, tuple),
    "task_index": (None, int),
    "min_shard_bytes": (None, int),
    "tpu": ("", str),
    "zone": (None, str),
    "project": (None, str),
    "computation_shape": (None, tuple),
    "num_replicas": (None, int),
    "spmd_xla_partitioning": (False, bool),
}
DEFAULTS = {field: default for field, (default, _) in FIELDS.items()}

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
  for field, (default, field_type) in FIELDS.items():
    nullable = default is None or field == "timeout_seconds"
    setattr(config, field, config_dict.FieldReference(default, field_type=field_type) if nullable else default)
  return config


def resolve(config: collections.abc.Mapping[str, Any] | ml_collections.ConfigDict | None) -> dict[str, Any]:
  """Returns every field's value: `config` over the defaults, with the usage checked.

  Args:
    config: a ConfigDict (or FrozenConfigDict) shaped like `default_config()`,
      a plain mapping with some of its fields, or None for all defaults.

  Returns:
    A dict with every field of `FIELDS`.

  Raises:
    ConfigError: an unknown field or strategy name, or a field set that the
      chosen strategy does not use.
  """
  config = {} if config is None else config.to_dict() if hasattr(config, "to_dict") else config
  if not isinstance(config, collections.abc.Mapping):
    raise ConfigError(f"The strategy config must be a ConfigDict or a mapping, got {type(config).__name__}.")
  unknown = [field for field in config if field not in FIELDS]
  if unknown:
    raise ConfigError(
        f"config.strategy has no field {unknown[0]!r}.{checks.did_you_mean(unknown[0], FIELDS)} "
        f"Fields: {', '.join(FIELDS)}."
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
