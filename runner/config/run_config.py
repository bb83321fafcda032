"""The run config: its schema, loading it from a file with overrides, and checking it.

`SCHEMA` (with `default_config()`) is the schema: every field with its
default and its check. `load_config` loads a config file the way the CLI does
(`FILE.py[:ARG]`, FILE local or a URL of a TensorFlow filesystem, plus
`section.field=value` overrides, parsed by ml-collections `config_flags`) and
`validate` completes and checks a config, before any TensorFlow device work.
Every bad input raises ConfigError, naming what was wrong and what is valid.
"""

import ast
from collections.abc import Callable, Iterable, Iterator, Mapping
import contextlib
import functools
import os
import reprlib
import traceback
import types
from typing import Any

from absl import flags
import ml_collections
from ml_collections import config_dict
from ml_collections import config_flags

from runner import sharding_policies
from runner.config import optimizers
from runner.config import registry
from runner.data import service as data_service
from runner.outputs import profiling
from runner.training import scoped_settings
from runner.workdir import remote
from strategies import checks
from strategies import schema as strategy_schema
from strategies.errors import ConfigError

MODES = ("train", "eval", "train_and_eval", "export", "continuous_eval", "predict")
PREDICT_SPLITS = ("train", "eval")  # What config.data.predict_split may name (None: 'eval').
# The sections that name a model, dataset or task; besides their common fields
# they hold that model's, dataset's or task's own fields.
NAMED_SECTIONS = {"data": "dataset", "model": "model", "task": "task"}
NAME_FIELDS = tuple(f"{section}.name" for section in NAMED_SECTIONS)
NONE_VALUES = ("None", "none", "null")
_TYPE_NAMES = {bool: "a bool", int: "an int", float: "a float", str: "a string", tuple: "a tuple"}


_OPTIONAL = functools.partial(checks.positive_int, optional=True)
# Fields whose default is not None but that take None too.
_NULLABLE = frozenset({"config.trainer.seed"})

# Section -> field -> (default, check). A type as the default: the field is None until set, of that type. A check,
# `check(value, 'config.SECTION.FIELD')`, raises ConfigError; the type is checked for every field. A field's meaning
# is its row in docs/config.md (a test keeps every field documented).
SCHEMA: dict[str, dict[str, tuple[Any, Callable[[Any, str], Any] | None]]] = {
    "data": {
        "name": ("synthetic", None),  # A built-in or 'module:function' (registry).
        "global_batch_size": (64, checks.positive_int),
        "eval_global_batch_size": (int, _OPTIONAL),  # None: global_batch_size.
        "sharding": ("auto", lambda value, what: checks.one_of(value, sharding_policies.SHARDING, what)),
        # Mode predict's split, the dataset function's `split` argument; None: 'eval'.
        "predict_split": (str, lambda value, what: value is None or checks.one_of(value, PREDICT_SPLITS, what)),
        "service": (str, data_service.check_address),  # None, or a tf.data service dispatcher 'grpc://HOST:PORT'.
        "service_mode": ("parallel_epochs", lambda value, what: checks.one_of(value, data_service.MODES, what)),
    },
    "model": {"name": ("mlp", None)},
    "task": {"name": ("classification", None)},
    "optimizer": optimizers.FIELDS,  # With the optimizer's own arguments (`runner.config.optimizers`).
    "trainer": {  # The Trainer's options of the same names (runner.training.options), and the run's steps.
        "train_steps": (1000, checks.positive_int),  # The global step to train to.
        "steps_per_loop": (int, _OPTIONAL),  # Steps per tf.function call; None: auto (runner.training.steps_per_loop).
        "eval_every": (int, _OPTIONAL),  # Evaluate every this many steps (a multiple of steps_per_loop), or at the end.
        "eval_steps": (int, _OPTIONAL),  # Batches per evaluation; None: the whole eval split.
        "checkpoint_every": (int, _OPTIONAL),  # Also checkpoint every this many steps (a multiple of steps_per_loop).
        "max_to_keep": (3, checks.positive_int),  # Checkpoints kept.
        "async_checkpoints": (True, None),  # checkpoint_every's saves written in the background.
        "jit_compile": (False, None),  # Compile each replica's step with XLA.
        # float32, mixed_bfloat16 or mixed_float16.
        "precision": ("float32", lambda value, what: checks.one_of(value, scoped_settings.PRECISIONS, what)),
        "seed": (0, None),  # Fixes the initial weights; None: random ones (one of `_NULLABLE`).
        "profile_steps": (tuple, profiling.check_steps),  # None, or (first, last): a profiler trace of those steps.
        "best_metric": (str, None),  # None, or the eval result by which WORKDIR/best/ keeps the best model.
        "best_mode": (str, lambda value, what: value is None or checks.one_of(value, ("max", "min"), what)),
        "export_every": (int, _OPTIONAL),  # Also export every this many steps (a multiple of steps_per_loop).
        "report_metric": (str, None),  # None, or the eval result reported for Vertex AI tuning (outputs.hypertune).
        # Mode continuous_eval ends after this long with no new checkpoint.
        "eval_timeout_seconds": (3600.0, checks.positive_number),
    },
    "predict": {  # Mode predict.
        "checkpoint": ("latest", lambda value, what: checks.one_of(value, ("latest", "best"), what)),
    },
}


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
  result = ml_collections.ConfigDict({"mode": "train_and_eval", "strategy": strategy_schema.default_config()})
  for section, fields in SCHEMA.items():  # The schema without the own fields of the named dataset, model and task.
    result[section] = {f: config_dict.placeholder(d) if isinstance(d, type) else d for f, (d, _) in fields.items()}
  _merge(result, {k: v for k, v in _section(config, "A config").items() if k not in NAMED_SECTIONS}, "config")
  for section, kind in NAMED_SECTIONS.items():
    given = _section(config[section] if section in config else {}, f"config.{section}")
    _with_own_fields(result[section], given, f"config.{section}", kind, (previous_names or {}).get(section))
  return result


def _section(value: Any, where: str) -> Any:
  """Returns `value` if it is a section (a ConfigDict or a mapping); raises ConfigError otherwise."""
  if not hasattr(value, "items"):
    raise ConfigError(f"{where} must be a section (a ConfigDict), got {value!r}.")
  return value


def _with_own_fields(
    section: ml_collections.ConfigDict, given: Any, where: str, kind: str, previous: str | None = None
) -> None:
  """Adds to `section` the own fields of the `kind` that `given` names, and merges `given`'s fields into it.

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
  declared = fields is not None
  if fields is None:  # Declaring none, it has the fields given (a None of a known type typed, for the overrides).
    typed = hasattr(given, "get_type")
    fields = {f: config_dict.placeholder(given.get_type(f)) if typed else given[f] for f in given if f not in section}
  common = sorted(set(fields) & set(section))
  if common:
    raise ConfigError(
        f"The {kind} {name!r} declares the field(s) {', '.join(common)}, which {where} has for every {kind}; "
        f"give its own fields other names."
    )
  for field, default in fields.items():  # A new placeholder for each config: a ConfigDict writes through it.
    section[field] = (
        config_dict.placeholder(default.get_type()) if isinstance(default, config_dict.FieldReference) else default
    )
  replaced = _defaults(kind, previous) if declared and previous not in (None, name) else {}
  others = [item for other in registry.names(kind) for item in _defaults(kind, other).items()]
  kept = {}
  for field, value in given.items():
    if (field, value) in replaced.items():
      continue
    if field in section:
      kept[field] = value
    elif (field, value) not in others:
      known = field in replaced or any(field == other for other, _ in others)
      hint = f" (a field of another {kind}, set to {value!r})" if known else ""
      raise ConfigError(
          f"{where}.{field} is not a field of {kind} {name!r}{hint}.{checks.did_you_mean(field, section)} "
          f"Fields of {where} for {kind} {name!r}: {', '.join(section)}."
      )
  _merge(section, kept, where)


def _defaults(kind: str, name: str) -> dict[str, Any]:
  """Returns {field: default value} of the own fields of `name` ({} for a function that declares none)."""
  fields = registry.own_fields(kind, name) or {}
  return {f: d.get() if isinstance(d, config_dict.FieldReference) else d for f, d in fields.items()}


def _merge(schema: ml_collections.ConfigDict, given: Any, where: str) -> None:
  """Writes the fields of `given` into `schema` (a ConfigDict), checking names and types.

  A value is converted to its field's type (an int to a float, a list to a
  tuple); a bool is no number, and None fits only a field that is None by
  default or one of `_NULLABLE`.
  """
  for field in given:
    value, here = given[field], f"{where}.{field}"
    if field not in schema and where == "config.optimizer":  # An argument of the optimizer (`optimizers.create`).
      schema[field] = value
      continue
    if field not in schema:
      raise ConfigError(_no_field(where, field, schema))
    if isinstance(schema[field], ml_collections.ConfigDict):
      _merge(schema[field], _section(value, here), here)
      continue
    field_type = schema.get_type(field)
    try:
      if value is None and schema[field] is not None and here not in _NULLABLE:
        raise TypeError(value)
      if isinstance(value, bool) and field_type in (int, float):
        raise TypeError(value)
      schema[field] = value
    except TypeError:
      shown = "None" if value is None else f"{value!r} ({type(value).__name__})"
      raise _wrong_type(here, field_type, shown) from None


def _no_field(where: str, field: str, section: Any) -> str:
  return (
      f"{where} has no field {field!r}.{checks.did_you_mean(field, section)} Fields of {where}: {', '.join(section)}."
  )


def _wrong_type(where: str, field_type: type, shown: str) -> ConfigError:
  return ConfigError(f"{where} must be {_TYPE_NAMES.get(field_type, f'a {field_type.__name__}')}, got {shown}.")


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
  for section, fields in SCHEMA.items():
    for field, (_, check) in fields.items():
      if check is not None:
        check(config[section][field], f"config.{section}.{field}")
  for section, kind in NAMED_SECTIONS.items():  # `_complete` resolved the names; a built-in's own fields are checked.
    found = registry.builtin(kind, config[section].name)
    if found and found[2]:
      found[2](config[section])
  config.data.eval_global_batch_size = config.data.eval_global_batch_size or config.data.global_batch_size
  trainer, optimizer = config.trainer, config.optimizer
  for field in ("eval_every", "checkpoint_every", "export_every"):
    if trainer[field] is not None and trainer.steps_per_loop and trainer[field] % trainer.steps_per_loop:
      multiple = max(1, round(trainer[field] / trainer.steps_per_loop)) * trainer.steps_per_loop
      raise ConfigError(
          f"config.trainer.{field}={trainer[field]} is not a multiple of config.trainer.steps_per_loop="
          f"{trainer.steps_per_loop}: the trainer evaluates, checkpoints and exports between loops of "
          f"steps_per_loop steps. Use a multiple such as {multiple}."
      )
  for field, use in (("best_metric", "keeps the best"), ("report_metric", "reports each")):
    if trainer[field] is not None and config.mode == "train":
      raise ConfigError(
          f"config.trainer.{field}={trainer[field]!r} {use} evaluation during training, and mode 'train' does not "
          f"evaluate; use mode 'train_and_eval' (with config.trainer.eval_every) or {field}=None."
      )
  if config.data.service is not None and config.strategy.name == "parameter_server":
    raise ConfigError(data_service.NOT_UNDER_PARAMETER_SERVERS)
  if trainer.profile_steps is not None and trainer.profile_steps[1] > trainer.train_steps:
    raise ConfigError(
        f"config.trainer.profile_steps={trainer.profile_steps} goes past config.trainer.train_steps="
        f"{trainer.train_steps}; choose steps the run trains."
    )
  optimizers.check(optimizer, trainer.train_steps)
  config.lock()
  return config


def load_config(path: str, overrides: Iterable[str] | Mapping[str, Any] = ()) -> ml_collections.ConfigDict:
  """Loads a config file, applies overrides, checks the result and locks it.

  The same loading as `python -m runner --config=PATH --config.a.b=v ...`.

  Args:
    path: 'FILE.py' or 'FILE.py:ARG'; the file's `get_config()` (or
      `get_config(ARG)`) returns a ConfigDict with any part of the schema.
      FILE may be a URL of a TensorFlow filesystem (`gs://...`), read through
      `tf.io.gfile` (TensorFlow is imported only then) and run as a module
      whose `__file__` is the URL; imports of modules beside it resolve
      against `sys.path`.
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
  scheme, separator, rest = path.rpartition("://")  # 'FILE.py[:ARG]', FILE maybe a URL ('gs://b/run.py:tpu').
  file_path, _, argument = rest.partition(":")
  file_path = f"{scheme}{separator}{file_path}"
  module = types.ModuleType("runner_config_file")
  module.__file__ = file_path
  with _failures_named(file_path, ""):
    exec(compile(_source(file_path, path), file_path, "exec"), vars(module))
  if not callable(getattr(module, "get_config", None)):
    raise ConfigError(f"Config file {file_path!r} has no function get_config().")
  call = f"get_config({argument!r})" if argument else "get_config()"
  with _failures_named(file_path, f", in {call}"):
    config = module.get_config(argument) if argument else module.get_config()
  if not hasattr(config, "items"):
    raise ConfigError(
        f"Config file {file_path!r}: {call} returned {reprlib.repr(config)} ({type(config).__name__}); "
        "it must return an ml_collections.ConfigDict."
    )
  return overridden(config, overrides)


def overridden(config: Any, overrides: Iterable[str] | Mapping[str, Any] = ()) -> ml_collections.ConfigDict:
  """Returns a copy of `config` with `overrides` set, then completed, checked and locked (`validate`).

  The overrides of `load_config` (and of `--config.section.field=value`):
  'section.field=value' strings or a mapping {'section.field': value}; a
  new dataset, model or task name first, so the others may set its own fields.

  Raises:
    ConfigError: an unknown field (with a did-you-mean), a value of the wrong
      type, or any check of `validate`.
  """
  config = _complete(config)
  if isinstance(overrides, str):
    raise ConfigError(f"overrides must be a list of 'section.field=value' strings, got the string {overrides!r}.")
  items = list(overrides.items() if hasattr(overrides, "items") else overrides)
  names = [item for item in items if (item.partition("=")[0] if isinstance(item, str) else item[0]) in NAME_FIELDS]
  previous_names = {section: config[section].name for section in NAMED_SECTIONS}
  config.lock()  # New names first, so that the other overrides may set the new dataset's, model's or task's fields.
  _apply_overrides(config, names)
  config = _complete(config, previous_names)
  config.lock()
  _apply_overrides(config, [item for item in items if item not in names])
  return validate(config)


def _source(file_path: str, path: str) -> bytes:
  """Returns the bytes of the config file at `file_path` (`path`: what the user gave, for messages).

  Raises:
    ConfigError: the file does not exist, cannot be read (a remote
      filesystem's error named), or is not a Python file.
  """
  if remote.is_remote(file_path):
    import tensorflow as tf  # noqa: PLC0415  (only for a remote config: a local one loads without TensorFlow)

    try:
      exists = tf.io.gfile.exists(file_path) and not tf.io.gfile.isdir(file_path)
    except tf.errors.OpError as e:
      raise ConfigError(
          f"Config file {file_path!r} cannot be read (from {path!r}): {type(e).__name__}: "
          f"{(e.message or str(e)).strip().splitlines()[0]}"
      ) from e
    opener = tf.io.gfile.GFile
  else:
    exists, opener = os.path.isfile(file_path), open
  if not exists:
    raise ConfigError(f"Config file {file_path!r} does not exist (from {path!r}).")
  if not file_path.endswith(".py"):
    raise ConfigError(f"Config file {file_path!r} is not a Python file; give FILE.py (from {path!r}).")
  with opener(file_path, "rb") as f:
    return f.read()


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
  except (SystemExit, Exception) as e:  # sys.exit() or exit() in the file would end the run with no word of why.
    other = ""
    lines = [frame.lineno for frame in traceback.extract_tb(e.__traceback__) if frame.filename == file_path]
    if isinstance(e, SyntaxError) and e.filename and e.lineno:  # The file's (compiled as `file_path`) or another's.
      lines, other = [e.lineno], "" if e.filename == file_path else f", in {e.filename!r}"
    where = f"{other}, line {lines[-1]}" if lines else ""
    if isinstance(e, SystemExit):
      raise ConfigError(
          f"Config file {file_path!r}{where}{during}: the config file tried to end the process with {e!r}; a config "
          "file must return its config (raise an exception to report a problem)."
      ) from e
    message = e.msg if isinstance(e, SyntaxError) else str(e) or "(no message)"
    raise ConfigError(f"Config file {file_path!r}{where}{during}: {type(e).__name__}: {message}") from e


def _apply_overrides(config: ml_collections.ConfigDict, items: Iterable[str | tuple[str, Any]]) -> None:
  """Sets overrides, 'path=value' strings or (path, value) pairs, on the locked `config`.

  A pair's value and a string's 'None' are set as they are; the other strings
  are parsed by config_flags' parsers, those of one field together, so a
  tuple field may be given once per element, as on the command line.
  """
  by_field: dict[str, tuple[ml_collections.ConfigDict, str, list[str]]] = {}
  for item in items:
    field_path, equals, value = item.partition("=") if isinstance(item, str) else (item[0], "=", item[1])
    override = item if isinstance(item, str) else f"{field_path}={value!r}"
    section, _, name = field_path.partition(".")
    if section == "optimizer" and name and "." not in name and name not in config.optimizer:
      with config.optimizer.unlocked():  # An argument of the optimizer (`optimizers.create`), of its value's type.
        config.optimizer[name] = (_literal(value) if equals else True) if isinstance(item, str) else value
    holder, field = _field(config, field_path, override)
    if not equals and holder.get_type(field) is not bool:
      raise ConfigError(f"Override {override!r} has no value; write {field_path}=VALUE.")
    if isinstance(item, str) and value not in NONE_VALUES:
      by_field.setdefault(field_path, (holder, field, []))[2].append(item)
      continue
    by_field.pop(field_path, None)
    value = None if isinstance(item, str) else value
    try:
      holder[field] = value
    except TypeError:
      raise _wrong_type(f"Override {override!r}: config.{field_path}", holder.get_type(field), repr(value)) from None
  for field_path, (holder, field, given) in by_field.items():
    argv = ["runner"] + [f"--config.{override}" for override in given]
    flag_values = flags.FlagValues()
    try:
      config_flags.DEFINE_config_dict("config", config, flag_values=flag_values, sys_argv=argv)
      flag_values(argv)
    except (flags.Error, TypeError, ValueError):
      shown = repr(given[-1].partition("=")[2])
      raise _wrong_type(f"Override {given[-1]!r}: config.{field_path}", holder.get_type(field), shown) from None


def _literal(text: str) -> Any:
  """The Python literal `text` stands for ('0.9', 'True', '(1, 2)'), else `text` itself."""
  try:
    return ast.literal_eval(text)
  except (ValueError, SyntaxError):
    return text


def _field(config: ml_collections.ConfigDict, field_path: str, override: str) -> tuple[ml_collections.ConfigDict, str]:
  """Returns (the ConfigDict that holds the field `field_path`, the field's name).

  Raises:
    ConfigError: a part of the path is not a field (the message suggests the
      closest one and lists the valid ones), or the path ends at a section.
  """
  parts = field_path.split(".")
  holder, where = config, "config"
  for i, part in enumerate(parts):
    if part not in holder:
      raise ConfigError(f"Override {override!r}: {_no_field(where, part, holder)}")
    last = i == len(parts) - 1
    if isinstance(holder[part], ml_collections.ConfigDict) == last:
      what = "a section; override its fields one by one" if last else "a value, not a section"
      raise ConfigError(f"Override {override!r}: {where}.{part} is {what}.")
    if not last:
      holder, where = holder[part], f"{where}.{part}"
  return holder, parts[-1]
