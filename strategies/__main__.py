"""`python -m strategies [--strategy=... --virtual_cpus=...]`: what TensorFlow sees and what `auto` picks.

Prints the physical and logical devices, the strategy `auto` would choose and
why, and, when --strategy names another strategy, that strategy's one-line
description once built. Bad input prints one line `error: ...` and exits with
status 2; --help exits 0. Both come back before TensorFlow loads.
"""

import sys
from typing import Any

from absl import app

import strategies
from strategies.errors import ConfigError
from strategies.errors import print_error_line

strategies.flags.define_flags()


def main(argv: list[str]) -> None:
  """Prints the report of the strategy the flags name; exits with status 2 on a mistake (one line on stderr)."""
  if len(argv) > 1:
    print_error_line(f"Unexpected arguments {argv[1:]}; give flags as --NAME=VALUE.")
    sys.exit(2)
  try:
    report(strategies.flags.config_from_flags())
  except ConfigError as e:
    print_error_line(e)
    sys.exit(2)


def report(config: dict[str, Any]) -> None:
  """Prints the devices, auto's choice, and the strategy `config` names unless it is auto."""
  # TensorFlow loads here, once the flags hold.
  import tensorflow as tf  # noqa: PLC0415

  from strategies import factory  # noqa: PLC0415

  if config["virtual_cpus"] is not None:
    factory.split_cpus(config["virtual_cpus"])
  for kind, devices in (("Physical", tf.config.list_physical_devices()), ("Logical", tf.config.list_logical_devices())):
    print(f"{kind} devices:")
    for device in devices:
      print(f"  {device.name}")
  print("auto would choose: {} ({})".format(*factory.choose()))
  if config["name"] != "auto":
    print(f"--strategy={config['name']}: {strategies.describe(strategies.create(config))}")


if __name__ == "__main__":
  app.run(main, flags_parser=strategies.flags.parse_flags)
