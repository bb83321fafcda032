"""Strategy wrappers over the real tf.distribute classes, chosen from a config.

The public names load on first use (PEP 562): the config schema, its checks,
the flags and the errors import no TensorFlow, so a command line can parse
and check its input before TensorFlow loads; the wrappers, `create`,
`describe` and `virtual_cpus` import it.
"""

import importlib

# Public name -> the module that defines it (a module's own name: the module itself).
_PUBLIC = {
    "ClusterError": "strategies.errors",
    "ConfigError": "strategies.errors",
    "DefaultStrategy": "strategies.local",
    "MirroredStrategy": "strategies.local",
    "MultiWorkerMirroredStrategy": "strategies.multi_worker",
    "OneDeviceStrategy": "strategies.local",
    "ParameterServerStrategy": "strategies.parameter_server",
    "TPUStrategy": "strategies.tpu",
    "create": "strategies.factory",
    "default_config": "strategies.schema",
    "describe": "strategies.description",
    "flags": "strategies.flags",
    "names": "strategies.factory",
    "virtual_cpus": "strategies.virtual_devices",
}
__all__ = sorted(_PUBLIC)


def __getattr__(name):
  if name not in _PUBLIC:
    raise AttributeError(f"module 'strategies' has no attribute {name!r}")
  module = importlib.import_module(_PUBLIC[name])
  value = module if _PUBLIC[name] == f"strategies.{name}" else getattr(module, name)
  globals()[name] = value
  return value


def __dir__():
  return sorted(set(globals()) | set(_PUBLIC))
