"""Argument checks shared by the wrappers and the schema; each raises ConfigError."""

from collections.abc import Collection
import difflib
import math
import numbers
from typing import Any, TypeVar

from strategies.errors import ConfigError

_Value = TypeVar("_Value")


def did_you_mean(value: object, valid: Collection[object]) -> str:
  """Returns ' Did you mean 'x'?' for the closest valid name, or ''."""
  close = difflib.get_close_matches(str(value), [str(v) for v in valid], n=1)
  return f" Did you mean {close[0]!r}?" if close else ""


def one_of(value: _Value, valid: Collection[_Value], what: str) -> _Value:
  """Returns `value` if it is in `valid`.

  Raises:
    ConfigError: naming `what`, the valid values and the closest one.
  """
  if value not in valid:
    raise ConfigError(
        f"{what}={value!r} is not valid.{did_you_mean(value, valid)} Valid: {', '.join(map(str, valid))}."
    )
  return value


def is_int(value: object) -> bool:
  """Returns whether `value` is an int and not a bool (to Python, True and False are ints)."""
  return isinstance(value, int) and not isinstance(value, bool)


def positive_int(value: Any, what: str, *, optional: bool = False) -> Any:
  """Returns `value` if it is an int >= 1 (or None when `optional`).

  Raises:
    ConfigError: `value` is not a positive int.
  """
  if value is None and optional:
    return None
  if not is_int(value) or value < 1:
    raise ConfigError(f"{what} must be a positive int, got {value!r}.")
  return value


def positive_number(value: Any, what: str, *, optional: bool = False, allow_zero: bool = False) -> Any:
  """Returns `value` if it is a finite int or float > 0 (>= 0 with `allow_zero`; None when `optional`).

  Raises:
    ConfigError: `value` is not such a number.
  """
  if value is None and optional:
    return None
  is_real = isinstance(value, numbers.Real) and not isinstance(value, bool)
  if not is_real or not value < math.inf or not (value >= 0 if allow_zero else value > 0):
    kind = "a number >= 0" if allow_zero else "a positive number"
    raise ConfigError(f"{what} must be {'None or ' if optional else ''}{kind}, got {value!r}.")
  return value


def boolean(value: Any, what: str) -> bool:
  """Returns `value` if it is True or False.

  Raises:
    ConfigError: `value` is not a bool.
  """
  if not isinstance(value, bool):
    raise ConfigError(f"{what} must be True or False, got {value!r}.")
  return value


def strings(value: Any, what: str, example: object) -> list[str]:
  """Returns `value`, a non-empty list or tuple of strings, as a list.

  Args:
    value: the value to check.
    what: the argument's name for the message.
    example: a valid value for the message.

  Raises:
    ConfigError: `value` is not a non-empty list or tuple of strings.
  """
  if not isinstance(value, (list, tuple)) or not value or not all(isinstance(v, str) and v for v in value):
    raise ConfigError(f"{what} must be a non-empty list of strings such as {example!r}, got {value!r}.")
  return list(value)
