"""The config fields a model, dataset or task function declares: `runner.config_fields`.

A function named in the config by an import path `package.module:function`
declares its own fields of its config section, with their defaults:

    @runner.config_fields(train_files="", num_classes=10, label_smoothing=0.0,
                          vocab_file=ml_collections.config_dict.placeholder(str))
    def my_dataset(config, split): ...

Those fields then behave like a built-in's own fields (`runner.config`): they
are in the completed config with their defaults, overridable
(`--config.data.train_files=...`), type-checked, and a field the function does
not declare is an error with a did-you-mean. A function without a declaration
gets whatever fields its config section has.

Imports no TensorFlow, so a module may declare its fields before it does.
"""

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from ml_collections import config_dict

from strategies.errors import ConfigError

_ATTRIBUTE = "_tf_runner_config_fields"
_Fn = TypeVar("_Fn", bound=Callable[..., Any])
_TYPES = (bool, int, float, str, tuple)
_VALID = (
    "a bool, int, float, str or tuple, or ml_collections.config_dict.placeholder(TYPE) "
    "(TYPE one of those) for an optional field that is None until set"
)


def config_fields(**fields: Any) -> Callable[[_Fn], _Fn]:
  """Returns a decorator that declares a function's own config fields and their defaults.

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
      _check_default(where, field, default)
    try:
      setattr(fn, _ATTRIBUTE, dict(fields))
    except AttributeError:
      raise ConfigError(
          f"{where}: a {type(fn).__name__} cannot carry the fields; decorate a Python function (def)."
      ) from None
    return fn

  return declare


def declared(fn: Callable[..., Any]) -> Mapping[str, Any] | None:
  """Returns the fields `fn` declares with `config_fields` and their defaults, or None if it declares none.

  Each call returns new placeholders: a ConfigDict that holds one writes
  through it, so configs must not share them.
  """
  fields = getattr(fn, _ATTRIBUTE, None)
  if fields is None:
    return None
  return {
      field: config_dict.placeholder(default.get_type()) if isinstance(default, config_dict.FieldReference) else default
      for field, default in fields.items()
  }


def _check_default(where: str, field: str, default: Any) -> None:
  """Raises ConfigError for a default that is not a value a config field can have (see `config_fields`)."""
  if isinstance(default, config_dict.FieldReference):
    if default.get() is not None or default.get_type() not in _TYPES:
      raise ConfigError(
          f"{where}: the default of {field!r} is a reference to {default.get()!r} of type "
          f"{default.get_type().__name__}; a default is {_VALID}."
      )
  elif default is None:
    raise ConfigError(
        f"{where}: the default of {field!r} is None, whose type the config cannot know; for an optional "
        f"field write {field}=ml_collections.config_dict.placeholder(str) (or int, float, bool, tuple)."
    )
  elif not isinstance(default, _TYPES):
    raise ConfigError(
        f"{where}: the default of {field!r} is {default!r} ({type(default).__name__}); a default is {_VALID}."
    )
