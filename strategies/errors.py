"""The one error type for bad user input, shared by `strategies` and `runner`, and how a command line shows it."""

import re
import sys


class ConfigError(ValueError):
  """A config value, flag or argument that cannot work.

  The message names what was wrong and what is valid. The CLI prints it as one
  line and exits non-zero, without a traceback; any other exception is treated
  as an internal error and keeps its traceback.
  """


class ClusterError(RuntimeError):
  """A peer of a multi-process job could not be reached, or stopped answering.

  Not a mistake in the input: restarting the job (every task) resumes it from
  its last checkpoint. The message names the peers that are missing. The CLI
  prints it as one line and exits with status 170 (`runner.exit_codes.CLUSTER`), which orchestrators retry.
  """


def print_error_line(error: BaseException | str) -> None:
  """Prints `error` as the one line `error: ...` on stderr (its whitespace and newlines collapsed)."""
  print(f"error: {' '.join(str(error).split())}", file=sys.stderr)


def first_line(error: BaseException | str, *, limit: int | None = None) -> str:
  """Returns the first line of `error`'s message, fit to quote inside another message.

  TensorFlow's `{{function_node ...}}` and `[Op:...]` wrapping is left out, and
  each run of control characters (a zeroed or binary file's) becomes one '?'.

  Args:
    error: an exception, or its message.
    limit: None, or the most characters to keep; a longer line is cut to end in '...'.
  """
  line = (str(error).strip().splitlines() or [""])[0]
  line = _CONTROL_CHARACTERS.sub("?", _TENSORFLOW_WRAPPING.sub("", line)).strip()
  return line if limit is None or len(line) <= limit else line[: limit - 3] + "..."


_TENSORFLOW_WRAPPING = re.compile(r"\{\{function_node [^}]*\}\}\s*|\s*\[Op:\w+\]")
_CONTROL_CHARACTERS = re.compile(r"[\x00-\x1f\x7f-\x9f]+")
