"""Argument checks shared by the wrappers and the schema; each raises ConfigError."""

import difflib

from strategies.errors import ConfigError


def did_you_mean(value, valid):
  """Returns ' Did you mean 'x'?' for the closest valid name, or ''."""
  close = difflib.get_close_matches(str(value), [str(v) for v in valid], n=1)
  return f" Did you mean {close[0]!r}?" if close else ""


def one_of(value, valid, what):
  """Returns `value` if it is in `valid`.

  Raises:
    ConfigError: naming `what`, the valid values and the closest one.
  """
  if value not in valid:
    raise ConfigError(
        f"{what}={value!r} is not valid.{did_you_mean(value, valid)} "
        f"Valid: {', '.join(map(str, valid))}.")
  return value


def positive_int(value, what, *, optional=False):
  """Returns `value` if it is an int >= 1 (or None when `optional`).

  Raises:
    ConfigError: `value` is not a positive int.
  """
  if value is None and optional:
    return None
  if isinstance(value, bool) or not isinstance(value, int) or value < 1:
    raise ConfigError(f"{what} must be a positive int, got {value!r}.")
  return value


def strings(value, what, example):
  """Returns `value`, a non-empty list or tuple of strings, as a list.

  Args:
    value: the value to check.
    what: the argument's name for the message.
    example: a valid value for the message.

  Raises:
    ConfigError: `value` is not a non-empty list or tuple of strings.
  """
  if (not isinstance(value, (list, tuple)) or not value
      or not all(isinstance(v, str) and v for v in value)):
    raise ConfigError(f"{what} must be a non-empty list of strings such as {example!r}, got {value!r}.")
  return list(value)
