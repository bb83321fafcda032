"""Names in the config to functions, and the config fields those functions declare (`runner.config_fields`).

A config names its model, dataset and task as a built-in name (`'mlp'`,
`'digits'`, `'classification'`, ...) or as an import path
`'package.module:function'`. A built-in comes with its own config fields and
their defaults; an imported function has the fields it declares with
`runner.config_fields`, or, declaring none, whatever fields its config section
has. A model function is called as `fn(config.model)` and returns a Keras
model; a dataset function as `fn(config.data, split)`, split 'train' or
'eval', and returns an unbatched `tf.data.Dataset` or a
`runner.data.DatasetProvider`; a task function as `fn(config.task)` and
returns a `runner.Task` (docs/config.md).

Imports no TensorFlow, so a module may declare its fields before it does.
"""

from collections.abc import Callable, Mapping
import importlib
import inspect
from typing import Any, TypeVar

from ml_collections import config_dict

from runner import models as builtin_models
from runner.data import builtin_datasets
from strategies.checks import did_you_mean
from strategies.errors import ConfigError

_ATTRIBUTE = "_tf_runner_config_fields"
_Fn = TypeVar("_Fn", bound=Callable[..., Any])
_TYPES = (bool, int, float, str, tuple)
_VALID = (
    "a bool, int, float, str or tuple, or ml_collections.config_dict.placeholder(TYPE) "
    "(TYPE one of those) for an optional field that is None until set"
)


def _task(class_name: str) -> Callable[[Any], Any]:
  """Returns the function of a built-in task: the class of `runner.tasks` made with the section's own fields."""

  def make(config: Any) -> Any:
    from runner import tasks  # noqa: PLC0415  (only when a task is made: it imports TensorFlow)

    return getattr(tasks, class_name)(**{field: value for field, value in config.items() if field != "name"})

  return make


def _tfds(config: Any, split: str) -> Any:
  """The datasets 'tfds:NAME': `runner.data.tfds_files.dataset`, with the function `config.preprocess` names."""
  from runner.data import tfds_files  # noqa: PLC0415  (only for a 'tfds:' name: it imports TensorFlow and TFDS)

  return tfds_files.dataset(config, split, resolve("preprocess", config.preprocess) if config.preprocess else None)


# Kind -> name -> (function, its own config fields with their defaults, None or its check of a section, which runs
# before any TensorFlow device work). A name 'PREFIX:NAME' stands for every name that starts with 'PREFIX:'.
BUILTINS: dict[str, Mapping[str, tuple[Callable[..., Any], dict[str, Any], Callable[..., None] | None]]] = {
    "model": builtin_models.BUILTINS,
    "dataset": {
        **builtin_datasets.BUILTINS,
        "tfds:NAME": (_tfds, builtin_datasets.TFDS_FIELDS, builtin_datasets.check_tfds),
    },
    "task": {
        "classification": (_task("Classification"), {"from_logits": True}, None),
        "regression": (_task("Regression"), {}, None),
    },
    "preprocess": {},  # config.data.preprocess of a TFDS dataset: an import path.
    "optimizer": {},  # Import paths only; the names are Keras's (`runner.config.optimizers`).
    "schedule": {},  # Import paths only.
}
# Kind -> the arguments its function is called with.
_CALLED_WITH = {
    "model": ("config.model",),
    "dataset": ("config.data", "split"),
    "task": ("config.task",),
    "preprocess": ("features", "labels"),
    "optimizer": ("learning_rate",),  # With keyword arguments (`runner.config.optimizers.create`); no built-ins.
    "schedule": ("learning_rate", "decay_steps"),  # No built-ins.
}


def config_fields(**fields: Any) -> Callable[[_Fn], _Fn]:
  """Returns a decorator that declares a function's own config fields and their defaults.

  Those fields then behave like a built-in's own fields: they are in the
  completed config with their defaults, overridable, type-checked, and a field
  the function does not declare is an error with a did-you-mean.

  Args:
    **fields: field name -> default. A default is a bool, int, float, str or
      tuple, and fixes the field's type; an optional field that is None by
      default is `ml_collections.config_dict.placeholder(TYPE)`. 'name' is
      not a field name (it names the function).

  Returns:
    A decorator that records the fields in an attribute of the function and
    returns the function itself, not a wrapper.

  Raises:
    ConfigError (from the decorator): a field named 'name'; a default that is
      not one of those values, such as None (whose type the config cannot
      know), a list or a dict; or an object that cannot hold an attribute,
      such as a builtin.
  """

  def declare(fn: _Fn) -> _Fn:
    where = f"@runner.config_fields on {getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', fn)}"
    if "name" in fields:
      raise ConfigError(f"{where}: 'name' is the field that names the function; give the field another name.")
    for field, default in fields.items():
      ref = isinstance(default, config_dict.FieldReference)
      if not (default.get() is None and default.get_type() in _TYPES if ref else isinstance(default, _TYPES)):
        shown = f"{default!r} ({type(default).__name__})"
        raise ConfigError(f"{where}: the default of {field!r} is {shown}; a default is {_VALID}.")
    try:
      setattr(fn, _ATTRIBUTE, dict(fields))
    except AttributeError:
      raise ConfigError(
          f"{where}: a {type(fn).__name__} cannot carry the fields; decorate a Python function (def)."
      ) from None
    return fn

  return declare


def names(kind: str) -> list[str]:
  """Returns the built-in names of `kind` ('model', 'dataset' or 'task'), sorted."""
  return sorted(BUILTINS[kind])


def builtin(kind: str, name: str) -> tuple[Callable[..., Any], dict[str, Any], Callable[..., None] | None] | None:
  """Returns the built-in `name` of `kind` as (function, fields, check), or None for an import path.

  Raises:
    ConfigError: `name` is neither a built-in nor an import path 'package.module:function'.
  """
  if ":" in name:  # An import path, or a name of a family such as 'tfds:NAME'.
    return BUILTINS[kind].get(f"{name.partition(':')[0]}:NAME")
  if name not in BUILTINS[kind]:
    raise ConfigError(
        f"Unknown {kind} {name!r}.{did_you_mean(name, BUILTINS[kind])} Built-in {kind}s: "
        f"{', '.join(names(kind))}; or give an import path 'package.module:function'."
    )
  return BUILTINS[kind][name]


def resolve(kind: str, name: str) -> Callable[..., Any]:
  """Returns the function that `name` stands for.

  Args:
    kind: 'model', 'dataset', 'task', or 'optimizer' or 'schedule' (import paths only).
    name: a built-in name of that kind or an import path 'package.module:function'.

  Raises:
    ConfigError: an unknown built-in, a module that does not import, a missing
      attribute, an attribute that is not callable, or a function that
      cannot be called with the arguments a function of `kind` gets.
  """
  found = builtin(kind, name)
  if found is not None:
    return found[0]
  module_name, _, attribute = name.partition(":")
  if not module_name or not attribute:
    raise ConfigError(f"The {kind} {name!r} is not an import path of the form 'package.module:function'.")
  try:
    module = importlib.import_module(module_name)
  except ImportError as e:
    raise ConfigError(
        f"The {kind} {name!r} does not import: {type(e).__name__}: {e}. "
        "Check the module path and that its package is on PYTHONPATH."
    ) from e
  fn = getattr(module, attribute, None)
  if fn is None:
    public = [a for a in dir(module) if not a.startswith("_")]
    raise ConfigError(
        f"The {kind} {name!r}: module {module_name!r} has no attribute {attribute!r}.{did_you_mean(attribute, public)}"
    )
  if not callable(fn):
    raise ConfigError(f"The {kind} {name!r} is a {type(fn).__name__}, not a function.")
  arguments = _CALLED_WITH[kind]
  try:
    inspect.signature(fn).bind(*arguments)
  except ValueError:  # A callable whose signature Python cannot tell (some builtins) is not checked.
    pass
  except TypeError as e:
    split = " with split 'train' or 'eval'" if "split" in arguments else ""
    raise ConfigError(
        f"The {kind} {name!r} has the parameters {inspect.signature(fn)}, but it is called as "
        f"{getattr(fn, '__name__', 'fn')}({', '.join(arguments)}){split} ({e}); give it those parameters."
    ) from None
  return fn


def own_fields(kind: str, name: str) -> dict[str, Any] | None:
  """Returns {field: default} of the own config fields of `name`, or None for a function that declares none.

  A built-in's fields; for an import path, the fields its function declares
  with `config_fields` (importing its module). An optional field's default is
  a placeholder: a ConfigDict must hold a new one of its type, not this one
  (a ConfigDict writes through the reference it holds).

  Raises:
    ConfigError: as `resolve`.
  """
  found = builtin(kind, name)
  return found[1] if found else getattr(resolve(kind, name), _ATTRIBUTE, None)
