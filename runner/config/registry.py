"""Names in the config to functions: built-in names and `package.module:function` paths.

A config names its model, dataset and task as a built-in name (`'mlp'`,
`'digits'`, `'classification'`, ...) or as an import path
`'package.module:function'`. A built-in comes with its own config fields and
their defaults; an imported function has the fields it declares with
`runner.config_fields` (`runner.config.declared_fields`), or, declaring none, whatever
fields its config section has. A model function is called as
`fn(config.model)` and returns a Keras model; a dataset function as
`fn(config.data, split)`, split 'train' or 'eval', and returns an unbatched
`tf.data.Dataset` or a `runner.data.DatasetProvider`; a task function as
`fn(config.task)` and returns a `runner.Task` (docs/config.md).
"""

from collections.abc import Callable, Mapping
import dataclasses
import importlib
import inspect
from typing import Any

from runner import models as builtin_models
from runner.config import declared_fields
from runner.data import builtin_datasets
from strategies.checks import did_you_mean
from strategies.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class Builtin:
  """A built-in model, dataset or task.

  Attributes:
    fn: the function, called like an imported one.
    fields: its own config fields and their defaults.
    check: `check(section)` raises ConfigError for values that cannot work;
      it runs before any TensorFlow device work.
  """

  fn: Callable
  fields: Mapping[str, Any]
  check: Callable = lambda section: None


def _classification(config: Any) -> Any:
  from runner import tasks  # noqa: PLC0415

  return tasks.Classification(from_logits=config.from_logits)


def _regression(config: Any) -> Any:
  del config  # Regression has no fields.
  from runner import tasks  # noqa: PLC0415

  return tasks.Regression()


_BUILTINS = {
    "model": {name: Builtin(*entry) for name, entry in builtin_models.BUILTINS.items()},
    "dataset": {name: Builtin(*entry) for name, entry in builtin_datasets.BUILTINS.items()},
    "task": {
        "classification": Builtin(_classification, {"from_logits": True}),
        "regression": Builtin(_regression, {}),
    },
}


def builtins(kind: str) -> dict[str, Builtin]:
  """Returns {name: Builtin} of `kind` ('model', 'dataset' or 'task')."""
  return dict(_BUILTINS[kind])


def names(kind: str) -> list[str]:
  """Returns the built-in names of `kind`, sorted."""
  return sorted(_BUILTINS[kind])


def is_import_path(name: str) -> bool:
  """Returns whether `name` has the form 'package.module:function'."""
  return ":" in name


def builtin(kind: str, name: str) -> Builtin | None:
  """Returns the built-in `name` of `kind`, or None for an import path.

  Raises:
    ConfigError: `name` is neither a built-in nor an import path.
  """
  if is_import_path(name):
    return None
  if name not in _BUILTINS[kind]:
    raise ConfigError(
        f"Unknown {kind} {name!r}.{did_you_mean(name, _BUILTINS[kind])} Built-in {kind}s: "
        f"{', '.join(names(kind))}; or give an import path 'package.module:function'."
    )
  return _BUILTINS[kind][name]


def resolve(kind: str, name: str) -> Callable[..., Any]:
  """Returns the function that `name` stands for.

  Args:
    kind: 'model', 'dataset' or 'task'.
    name: a built-in name of that kind or an import path 'package.module:function'.

  Raises:
    ConfigError: an unknown built-in, a module that does not import, a missing
      attribute, an attribute that is not callable, or a function that
      cannot be called with the arguments a function of `kind` gets.
  """
  found = builtin(kind, name)
  if found is not None:
    return found.fn
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
        f"The {kind} {name!r}: module {module_name!r} has no attribute {attribute!r}."
        f"{did_you_mean(attribute, public)}"
    )
  if not callable(fn):
    raise ConfigError(f"The {kind} {name!r} is a {type(fn).__name__}, not a function.")
  _check_call(kind, name, fn)
  return fn


_CALLED_WITH = {
    "model": ("config.model",),
    "dataset": ("config.data", "split"),
    "task": ("config.task",),
}


def _check_call(kind: str, name: str, fn: Callable[..., Any]) -> None:
  """Raises ConfigError when `fn` cannot be called as a function of `kind` is (its parameters named).

  A callable whose signature Python cannot tell (some builtins) is not checked.
  """
  try:
    signature = inspect.signature(fn)
  except (TypeError, ValueError):
    return
  arguments = _CALLED_WITH[kind]
  try:
    signature.bind(*arguments)
  except TypeError as e:
    split = " with split 'train' or 'eval'" if "split" in arguments else ""
    raise ConfigError(
        f"The {kind} {name!r} has the parameters {signature}, but it is called as "
        f"{getattr(fn, '__name__', 'fn')}({', '.join(arguments)}){split} ({e}); give it those parameters."
    ) from None


def own_fields(kind: str, name: str) -> Mapping[str, Any] | None:
  """Returns {field: default} of the own config fields of `name`, or None for a function that declares none.

  A built-in's fields; for an import path, the fields its function declares
  with `runner.config_fields` (importing its module).

  Raises:
    ConfigError: as `resolve`.
  """
  found = builtin(kind, name)
  if found is not None:
    return dict(found.fields)
  return declared_fields.declared(resolve(kind, name))
