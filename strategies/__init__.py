"""Strategy wrappers over the real tf.distribute classes, chosen from a config.

The public names load on first use (PEP 562): the config schema, its checks,
the flags and the errors import no TensorFlow, so a command line can parse
and check its input before TensorFlow loads; the wrappers, `create`,
`describe` and `virtual_cpus` import it.
"""

from strategies import lazy_names

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
    "virtual_cpus": "strategies.local",
}
__all__ = sorted(_PUBLIC)

__getattr__, __dir__ = lazy_names.module_hooks(__name__, _PUBLIC)
