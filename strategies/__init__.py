"""Strategy wrappers over the real tf.distribute classes, chosen from a config."""

from strategies.errors import ConfigError
from strategies.virtual_devices import virtual_cpus
