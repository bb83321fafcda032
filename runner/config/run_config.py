"""The run config: its schema, loading it from a file with overrides, and checking it.

`default_config()` is the schema: every field with its default. `load_config`
loads a config file the way the CLI does (`FILE.py[:ARG]` plus
`section.field=value` overrides, parsed by ml-collections `config_flags`) and
`validate` completes and checks a config, before any TensorFlow device work.
Every bad input raises ConfigError, naming what was wrong and what is valid.
"""

from collections.abc import Iterable, Iterator, Mapping
import contextlib
import importlib.util
import os
import traceback
from typing import Any

from absl import flags
import ml_collections
from ml_collections import config_dict
from ml_collections import config_flags

from runner import sharding_policies
from runner.config import config_file
from runner.config import optimizers
from runner.config import registry
from runner.outputs import profiling
from runner.training import scoped_settings
from strategies import checks
from strategies import schema as strategy_schema
from strategies.errors import ConfigError

MODES = ("train", "eval", "train_and_eval", "export", "continuous_eval")
# The sections that name a model, dataset or task; besides their common fields
# they hold that model's, dataset's or task's own fields.
NAMED_SECTIONS = {"data": "dataset", "model": "model", "task": "task"}
NONE_VALUES = ("None", "none", "null")


def _common_config() -> ml_collections.ConfigDict:
  """Returns the schema without the own fields of the named dataset, model and task."""
  config = ml_collections.ConfigDict()
  config.mode = "train_and_eval"
  config.strategy = strategy_schema.default_config()
  config.data = ml_collections.ConfigDict(
      {
          "name": "synthetic",
          "global_batch_size": 64,
          "eval_global_batch_size": config_dict.placeholder(int),
          "sharding": "auto",
      }
  )
  config.model = ml_collections.ConfigDict({"name": "mlp"})
  config.task = ml_collections.ConfigDict({"name": "classification"})
  config.optimizer = ml_collections.ConfigDict(
      {
          "name": "adam",
          "learning_rate": 1e-3,
          "schedule": "constant",
          "warmup_steps": 0,
          "weight_decay": 0.0,
          "clipnorm": config_dict.placeholder(float),
      }
  )
  config.trainer = ml_collections.ConfigDict(
      {
          "train_steps": 1000,
          "steps_per_loop": config_dict.placeholder(int),  # None: auto, see runner.training.steps_per_loop.
          "eval_every": config_dict.placeholder(int),
          "eval_steps": config_dict.placeholder(int),
          "checkpoint_every": config_dict.placeholder(int),
          "max_to_keep": 3,
          "async_checkpoints": True,  # checkpoint_every's saves written in the background (runner.Trainer).
          "jit_compile": False,
          "precision": "float32",
          "seed": 0,
          "profile_steps": config_dict.placeholder(tuple),  # None, or (first, last): see runner.outputs.profiling.
          "eval_timeout_seconds": 3600.0,  # Mode continuous_eval ends after this long with no new checkpoint.
      }
  )
  return config


def default_config() -> ml_collections.ConfigDict:
  """Returns the schema of the run config: every field at its default.

  The data, model and task sections hold their common fields plus the own
  fields of the default choice (dataset 'synthetic', model 'mlp', task
  'classification'), so the default config runs as it is.
  """
  return _complete(ml_collections.ConfigDict())


def _complete(config: Any, previous_names: Mapping[str, str] | None = None) -> ml_collections.ConfigDict:
  """Returns `config` over the schema: every field present, names and types checked.

  The data, model and task sections get the own fields of the dataset, model
  or task they name, with defaults for those not given: a built-in's, or those
  an import path's function declares (`runner.config_fields`); a section
  naming a function that declares none keeps whatever other fields it has.

  Args:
    config: a ConfigDict (or mapping) with any part of the schema.
    previous_names: {section: name} that overrides replaced; the own fields of
      those names still at their defaults give way to the new names' (see
      `_with_own_fields`).

  Returns:
    A new, unlocked ConfigDict.

  Raises:
    ConfigError: an unknown section or field (with a did-you-mean), an
      unknown built-in name, an import path that does not resolve, or a value
      of the wrong type.
  """
  if not hasattr(config, "items"):
    raise ConfigError(f"A config must be a ConfigDict, got {type(config).__name__}.")
  result = _common_config()
  _merge(result, {k: v for k, v in config.items() if k not in NAMED_SECTIONS}, "config")
  for section, kind in NAMED_SECTIONS.items():
    given = config[section] if section in config else {}
    if not hasattr(given, "items"):
      raise ConfigError(f"config.{section} must be a section (a ConfigDict), got {given!r}.")
    previous = (previous_names or {}).get(section)
    _merge(
        result[section],
        _with_own_fields(result[section], given, f"config.{section}", kind, previous),
        f"config.{section}",
    )
  return result


def _with_own_fields(
    section: ml_collections.ConfigDict, given: Any, where: str, kind: str, previous: str | None = None
) -> dict[str, Any]:
  """Adds to `section` the own fields of the `kind` that `given` names; returns `given`'s fields to merge.

  Own fields (a built-in's, or those its function declares) come with their
  defaults. A field of `previous` (the name an override replaced) still at
  that one's default gives way to the new name's default, or is dropped; so is
  a field of another built-in of that kind still at that built-in's default (so
  a config may switch, say, from dataset 'digits' to 'synthetic' or to
  'my.data:fn'); any other field not its own is an error. For a function that
  declares no fields, `given`'s fields are all kept, as they are.
  """
  name = given.get("name", section.name)
  if not isinstance(name, str) or not name:
    raise ConfigError(f"{where}.name must be a non-empty string, got {name!r}.")
  fields = registry.own_fields(kind, name)
  if fields is None:
    for field in given:
      if field not in section:
        section[field] = _typed(given, field)
    return dict(given.items())
  common = sorted(set(fields) & set(section))
  if common:
    raise ConfigError(
        f"The {kind} {name!r} declares the field(s) {', '.join(common)}, which {where} has for every {kind}; "
        f"give its own fields other names."
    )
  for field, default in fields.items():
    section[field] = default
  replaced = _defaults(kind, previous) if previous not in (None, name) else {}
  others: dict[str, list[str]] = {}
  for other in registry.names(kind):
    for field, default in _defaults(kind, other).items():
      others.setdefault(field, []).append(default)
  kept = {}
  for field, value in given.items():
    if field in replaced and value == replaced[field]:
      continue
    if field in section:
      kept[field] = value
    elif value not in others.get(field, ()):
      hint = f" (a field of another {kind}, set to {value!r})" if field in others or field in replaced else ""
      raise ConfigError(
          f"{where}.{field} is not a field of {kind} {name!r}{hint}.{checks.did_you_mean(field, section)} "
          f"Fields of {where} for {kind} {name!r}: {', '.join(section)}."
      )
  return kept


def _defaults(kind: str, name: str) -> Mapping[str, Any]:
  """Returns {field: default value} of the own fields of `name` ({} for a function that declares none)."""
  fields = registry.own_fields(kind, name) or {}
  return {
      field: default.get() if isinstance(default, config_dict.FieldReference) else default
      for field, default in fields.items()
  }


def _typed(given: Any, field: str) -> Any:
  """Returns `given[field]`, or a typed placeholder for a None with a known type."""
  value = given[field]
  if value is None and hasattr(given, "get_type") and given.get_type(field) is not type(None):
    return config_dict.placeholder(given.get_type(field))
  return value


def _merge(schema: ml_collections.ConfigDict, given: Any, where: str) -> None:
  """Writes the fields of `given` into `schema` (a ConfigDict), checking names and types."""
  for field in given:
    if field not in schema:
      raise ConfigError(
          f"{where} has no field {field!r}.{checks.did_you_mean(field, schema)} "
          f"Fields of {where}: {', '.join(schema)}."
      )
    default = schema[field]
    if isinstance(default, ml_collections.ConfigDict):
      if not hasattr(given[field], "items"):
        raise ConfigError(f"{where}.{field} must be a section (a ConfigDict), got {given[field]!r}.")
      _merge(default, given[field], f"{where}.{field}")
    else:
      schema[field] = _checked_value(given[field], default, schema.get_type(field), f"{where}.{field}")


_TYPE_NAMES = {bool: "a bool", int: "an int", float: "a float", str: "a string", tuple: "a tuple"}


def _type_name(field_type: type) -> str:
  return _TYPE_NAMES.get(field_type, f"a {field_type.__name__}")


def _checked_value(value: Any, default: Any, field_type: type, where: str) -> Any:
  """Returns `value` converted to the schema field's type.

  Raises:
    ConfigError: `value` does not fit the type, or is None for a required field.
  """
  if value is None:
    if default is None:
      return None
    raise ConfigError(f"{where} must be {_type_name(field_type)}, got None.")
  if field_type is type(None):
    return value
  fits = {
      bool: lambda v: isinstance(v, bool),
      int: lambda v: isinstance(v, int) and not isinstance(v, bool),
      float: lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
      tuple: lambda v: isinstance(v, (tuple, list)),
  }.get(field_type, lambda v: isinstance(v, field_type))
  if not fits(value):
    raise ConfigError(f"{where} must be {_type_name(field_type)}, got {value!r} ({type(value).__name__}).")
  if field_type is float:
    return float(value)
  if field_type is tuple:
    return tuple(value)
  return value


def validate(config: Any) -> ml_collections.ConfigDict:
  """Returns `config` completed, checked and locked.

  Completed: every field of the schema is there, and the data, model and task
  sections have the own fields of what they name (defaults for those not
  given); `eval_global_batch_size` None becomes `global_batch_size`.

  Runs no TensorFlow device work, so it comes first in `runner.run`. Checks
  that need the replica count (batch sizes) come once the strategy exists.

  Raises:
    ConfigError: any field that cannot work; the message names the field,
      its value and what is valid.
  """
  config = _complete(config)
  checks.one_of(config.mode, MODES, "config.mode")
  strategy_schema.resolve(config.strategy)
  checks.positive_int(config.data.global_batch_size, "config.data.global_batch_size")
  if config.data.eval_global_batch_size is None:
    config.data.eval_global_batch_size = config.data.global_batch_size
  checks.positive_int(config.data.eval_global_batch_size, "config.data.eval_global_batch_size")
  checks.one_of(config.data.sharding, sharding_policies.SHARDING, "config.data.sharding")
  for section, kind in NAMED_SECTIONS.items():
    registry.resolve(kind, config[section].name)
    found = registry.builtin(kind, config[section].name)
    if found is not None:
      found.check(config[section])
  trainer = config.trainer
  for field in ("train_steps", "max_to_keep"):
    checks.positive_int(trainer[field], f"config.trainer.{field}")
  checks.positive_int(trainer.steps_per_loop, "config.trainer.steps_per_loop", optional=True)
  for field in ("eval_every", "checkpoint_every"):
    checks.positive_int(trainer[field], f"config.trainer.{field}", optional=True)
    if trainer[field] is not None and trainer.steps_per_loop and trainer[field] % trainer.steps_per_loop:
      multiple = max(1, round(trainer[field] / trainer.steps_per_loop)) * trainer.steps_per_loop
      raise ConfigError(
          f"config.trainer.{field}={trainer[field]} is not a multiple of config.trainer.steps_per_loop="
          f"{trainer.steps_per_loop}: the trainer evaluates and checkpoints between loops of "
          f"steps_per_loop steps. Use a multiple such as {multiple}."
      )
  checks.positive_int(trainer.eval_steps, "config.trainer.eval_steps", optional=True)
  checks.boolean(trainer.async_checkpoints, "config.trainer.async_checkpoints")
  checks.positive_number(trainer.eval_timeout_seconds, "config.trainer.eval_timeout_seconds")
  profile_steps = profiling.check_steps(trainer.profile_steps, "config.trainer.profile_steps")
  if profile_steps is not None and profile_steps[1] > trainer.train_steps:
    raise ConfigError(
        f"config.trainer.profile_steps={profile_steps} goes past config.trainer.train_steps={trainer.train_steps}; "
        "choose steps the run trains."
    )
  checks.one_of(trainer.precision, scoped_settings.PRECISIONS, "config.trainer.precision")
  optimizers.check(config.optimizer, trainer.train_steps)
  config.lock()
  return config


def load_config(path: str, overrides: Iterable[str] | Mapping[str, Any] = ()) -> ml_collections.ConfigDict:
  """Loads a config file, applies overrides, checks the result and locks it.

  The same loading as `python -m runner --config=PATH --config.a.b=v ...`.

  Args:
    path: 'FILE.py' or 'FILE.py:ARG'; the file's `get_config()` (or
      `get_config(ARG)`) returns a ConfigDict with any part of the schema.
      FILE may be a URL of a TensorFlow filesystem (`gs://...`), read
      through `tf.io.gfile` (`runner.config.config_file`).
    overrides: strings 'section.field=value' (as after `--config.` on the
      command line; a bool field alone means True, 'None' sets an optional
      field to None), or a mapping {'section.field': value}.

  Returns:
    The locked, complete, checked config (see `validate`).

  Raises:
    ConfigError: a missing file, a remote one that cannot be read, a file that does not load (a SyntaxError,
      an ImportError, any exception, a `sys.exit` call: the message names the
      file, its line and the error, the exception is chained), a `get_config` that is missing,
      raises or returns something other than a ConfigDict, an unknown
      field (with a did-you-mean), a value of the wrong type, or any check of
      `validate`.
  """
  file_path, argument = config_file.split(path)
  spec = config_file.module_spec(file_path, path)
  assert spec.loader is not None  # `module_spec` returns only a spec with a loader.
  module = importlib.util.module_from_spec(spec)
  with _failures_named(file_path, ""):
    spec.loader.exec_module(module)
  if not callable(getattr(module, "get_config", None)):
    raise ConfigError(f"Config file {file_path!r} has no function get_config().")
  call = f"get_config({argument!r})" if argument else "get_config()"
  with _failures_named(file_path, f", in {call}"):
    config = module.get_config(argument) if argument else module.get_config()
  if not hasattr(config, "items"):
    raise ConfigError(
        f"Config file {file_path!r}: {call} returned {_short_repr(config)} ({type(config).__name__}); "
        "it must return an ml_collections.ConfigDict."
    )
  config = _complete(config)
  if isinstance(overrides, str):
    raise ConfigError(f"overrides must be a list of 'section.field=value' strings, got the string {overrides!r}.")
  items = list(overrides.items() if hasattr(overrides, "items") else overrides)
  names = [item for item in items if _path_of(item) in NAME_FIELDS]
  if names:  # New names first, so that the other overrides may set the new dataset's, model's or task's fields.
    previous_names = {section: config[section].name for section in NAMED_SECTIONS}
    config.lock()
    _apply_overrides(config, names)
    config = _complete(config, previous_names)
  config.lock()
  _apply_overrides(config, [item for item in items if _path_of(item) not in NAME_FIELDS])
  return validate(config)


@contextlib.contextmanager
def _failures_named(file_path: str, during: str) -> Iterator[None]:
  """Turns an exception raised by the config file's code into a ConfigError naming the file and the line.

  A ConfigError the file raises itself passes as it is. The original
  exception is chained (`__cause__`), so its traceback stays available (the
  CLI prints it with `--verbose`). A `SystemExit` (the file calls `sys.exit`)
  is one too: loading a config never ends the process.

  Raises:
    ConfigError: "Config file '{file}', line {n}{during}: {ExceptionType}:
      {message}" ("...: the config file tried to end the process with
      SystemExit(...); ..." for a `SystemExit`), the line being the last one
      of the config file in the traceback (for a SyntaxError in another file, that file and line).
  """
  try:
    yield
  except ConfigError:
    raise
  except SystemExit as e:  # sys.exit() or exit() in the file: it would end the run with no word of why.
    raise ConfigError(
        f"Config file {file_path!r}{_where(e, file_path)}{during}: the config file tried to end the process with "
        f"{e!r}; a config file must return its config (raise an exception to report a problem)."
    ) from e
  except Exception as e:
    raise ConfigError(
        f"Config file {file_path!r}{_where(e, file_path)}{during}: {type(e).__name__}: {_described(e)}"
    ) from e


def _where(error: BaseException, file_path: str) -> str:
  """Returns ', line N' (', in FILE, line N' for another file's SyntaxError) for the error's place, or ''."""
  if isinstance(error, SyntaxError) and error.filename and error.lineno:
    if os.path.abspath(error.filename) == os.path.abspath(file_path):
      return f", line {error.lineno}"
    return f", in {error.filename!r}, line {error.lineno}"
  lines = [
      frame.lineno
      for frame in traceback.extract_tb(error.__traceback__)
      if os.path.abspath(frame.filename) == os.path.abspath(file_path)
  ]
  return f", line {lines[-1]}" if lines else ""


def _described(error: BaseException) -> str:
  """Returns the error's message; a SyntaxError's without its place (`_where` gives that)."""
  if isinstance(error, SyntaxError):
    return error.msg
  return str(error) or "(no message)"


def _short_repr(value: Any, limit: int = 80) -> str:
  text = repr(value)
  return text if len(text) <= limit else text[: limit - 3] + "..."


NAME_FIELDS = tuple(f"{section}.name" for section in NAMED_SECTIONS)


def _path_of(item: str | tuple[str, Any]) -> str:
  """Returns the field path of an override, a 'path=value' string or a (path, value) pair."""
  return item.partition("=")[0] if isinstance(item, str) else item[0]


def _apply_overrides(config: ml_collections.ConfigDict, items: Iterable[str | tuple[str, Any]]) -> None:
  """Sets overrides, 'path=value' strings or (path, value) pairs, on the locked `config`."""
  pairs = [item for item in items if not isinstance(item, str)]
  for field_path, value in pairs:
    _set(config, field_path, value, f"{field_path}={value!r}")
  _parse_overrides(config, [item for item in items if isinstance(item, str)])


def _parse_overrides(config: ml_collections.ConfigDict, overrides: Iterable[str]) -> None:
  """Sets 'section.field=value' strings on `config` with config_flags' parsers.

  The strings for one field are parsed together, so a tuple field may be
  given once per element, as on the command line.
  """
  by_field: dict[str, list[str]] = {}
  for override in overrides:
    field_path, equals, value = override.partition("=")
    holder, field = _field(config, field_path, override)
    if not equals and holder.get_type(field) is not bool:
      raise ConfigError(f"Override {override!r} has no value; write {field_path}=VALUE.")
    if value in NONE_VALUES:
      _set(config, field_path, None, override)
      by_field.pop(field_path, None)
    else:
      by_field.setdefault(field_path, []).append(override)
  for field_path, given in by_field.items():
    argv = ["runner"] + [f"--config.{override}" for override in given]
    flag_values = flags.FlagValues()
    try:
      config_flags.DEFINE_config_dict("config", config, flag_values=flag_values, sys_argv=argv)
      flag_values(argv)
    except (flags.Error, TypeError, ValueError):
      holder, field = _field(config, field_path, given[-1])
      raise ConfigError(
          f"Override {given[-1]!r}: config.{field_path} must be {_type_name(holder.get_type(field))}, "
          f"got {given[-1].partition('=')[2]!r}."
      ) from None


def _field(config: ml_collections.ConfigDict, field_path: str, override: Any) -> tuple[ml_collections.ConfigDict, str]:
  """Returns (the ConfigDict that holds the field `field_path`, the field's name).

  Raises:
    ConfigError: a part of the path is not a field (the message suggests the
      closest one and lists the valid ones), or the path ends at a section.
  """
  holder, where = config, "config"
  parts = field_path.split(".")
  for i, part in enumerate(parts):
    if part not in holder:
      raise ConfigError(
          f"Override {override!r}: {where} has no field {part!r}.{checks.did_you_mean(part, holder)} "
          f"Fields of {where}: {', '.join(holder)}."
      )
    is_section = isinstance(holder[part], ml_collections.ConfigDict)
    if i < len(parts) - 1 and not is_section:
      raise ConfigError(f"Override {override!r}: {where}.{part} is a value, not a section.")
    if i == len(parts) - 1 and is_section:
      raise ConfigError(f"Override {override!r}: {where}.{part} is a section; override its fields one by one.")
    if i < len(parts) - 1:
      holder, where = holder[part], f"{where}.{part}"
  return holder, parts[-1]


def _set(config: ml_collections.ConfigDict, field_path: str, value: Any, override: Any) -> None:
  """Sets one field of `config` to a Python value, checking its type."""
  holder, field = _field(config, field_path, override)
  try:
    holder[field] = value
  except TypeError:
    raise ConfigError(
        f"Override {override!r}: config.{field_path} must be {_type_name(holder.get_type(field))}, got {value!r}."
    ) from None
