"""absl flags that pick a strategy in a user's script, in two lines.

  import strategies
  strategies.flags.define_flags()                   # at module level
  ...
  def main(argv):
    strategy = strategies.flags.create_from_flags()  # after flags are parsed

  app.run(main, flags_parser=strategies.flags.parse_flags)  # optional: exit 2, 0

Then `--strategy=mirrored --virtual_cpus=2`, `--strategy=tpu --tpu=local`,
`--strategy=multi_worker_mirrored --worker_hosts=h1:2222,h2:2222 --task_index=0`
and so on work, with the same names, defaults and checks as `config.strategy`
(`--strategy` is `config.strategy.name`, every other flag has its field's name).
Bad combinations fail when the flags are parsed. With `parse_flags` as absl's
flags parser, a bad flag is one line `error: ...` on stderr and exit status 2
(absl's own parser prints "FATAL Flags parsing error" and exits 1), and
`--help` exits 0 (absl: 1). Defining, parsing and checking the flags imports
no TensorFlow; building the strategy does.
"""

from collections.abc import Callable, Sequence
import sys
from typing import Any, TYPE_CHECKING

from absl import flags

from strategies import schema
from strategies.errors import ConfigError
from strategies.errors import print_error_line

if TYPE_CHECKING:  # Only the type checker: building a strategy imports TensorFlow, parsing flags does not.
  import tensorflow as tf

_DEFINE: dict[type, Callable[..., Any]] = {
    str: flags.DEFINE_string,
    tuple: flags.DEFINE_list,
    int: flags.DEFINE_integer,
    float: flags.DEFINE_float,
    bool: flags.DEFINE_bool,
}
_HELP_FLAGS = ("help", "helpshort", "helpfull", "helpxml", "h", "?")


def _flag(field: str) -> str:
  return "strategy" if field == "name" else field


def _help(field: str) -> str:
  """The flag's help: the strategies that read the field, and where the docs describe it."""
  if field == "name":
    return f"Strategy: one of {', '.join(schema.NAMES)}."
  users = [name for name, used in schema.FIELDS_USED.items() if field in used]
  return f"{', '.join(users)}: config.strategy.{field} (docs/strategies.md)."


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
  """Defines the strategy flags (once; calling again is a no-op).

  Args:
    flag_values: the absl FlagValues to define them in.
  """
  if "strategy" in flag_values:
    return
  for field, (default, field_type) in schema.FIELDS.items():
    _DEFINE[field_type](_flag(field), default, _help(field), flag_values=flag_values)
  # One validator on --strategy that reads every flag, so absl's message stays short.
  flags.register_validator("strategy", lambda _: _check(flag_values), flag_values=flag_values)


def parse_flags(argv: Sequence[str], flag_values: flags.FlagValues = flags.FLAGS) -> list[str]:
  """Parses `argv` into `flag_values` for `absl.app.run(main, flags_parser=parse_flags)`; returns the rest.

  `--help` (and absl's other help flags) prints the usage and exits 0. A bad
  flag, a bad value or a bad combination of the strategy flags prints one
  line `error: ...` on stderr and exits 2.
  """
  try:
    return flag_values(argv)
  except flags.Error as e:
    print_error_line(e)
    sys.exit(2)
  except SystemExit:
    if any(argument.lstrip("-").split("=")[0] in _HELP_FLAGS for argument in argv[1:] if argument.startswith("-")):
      sys.exit(0)  # absl's help flags print the usage, then exit 1.
    raise


def config_from_flags(flag_values: flags.FlagValues = flags.FLAGS) -> dict[str, Any]:
  """Returns the `config.strategy` fields the parsed flags give, as a dict.

  Raises:
    ConfigError: --computation_shape is not a list of ints.
  """
  fields = {field: flag_values[_flag(field)].value for field in schema.FIELDS}
  shape = fields["computation_shape"]
  if shape is not None:
    if not all(n.strip().isdigit() for n in shape):
      raise ConfigError(f"--computation_shape={','.join(shape)} must be comma-separated ints such as 1,1,1,2.")
    fields["computation_shape"] = [int(n) for n in shape]
  return fields


def create_from_flags(flag_values: flags.FlagValues = flags.FLAGS) -> "tf.distribute.Strategy":
  """Builds the strategy the parsed flags describe, like `strategies.create`.

  Raises:
    ConfigError: any bad input.
  """
  from strategies import factory  # noqa: PLC0415  # Imports TensorFlow: only here.

  return factory.create(config_from_flags(flag_values))


def _check(flag_values: flags.FlagValues) -> bool:
  try:
    schema.resolve(config_from_flags(flag_values))
  except ConfigError as e:
    raise flags.ValidationError(
        str(e).replace("config.strategy.name", "--strategy").replace("config.strategy.", "--")
    ) from None
  return True
