"""The one error type for bad user input, shared by `strategies` and `runner`, and how a command line shows it."""

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
  prints it as one line and exits with status 4.
  """


def print_error_line(error):
  """Prints `error` as the one line `error: ...` on stderr (its whitespace and newlines collapsed)."""
  print(f"error: {' '.join(str(error).split())}", file=sys.stderr)
