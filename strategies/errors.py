"""The one error type for bad user input, shared by `strategies` and `runner`."""


class ConfigError(ValueError):
  """A config value, flag or argument that cannot work.

  The message names what was wrong and what is valid. The CLI prints it as one
  line and exits non-zero, without a traceback; any other exception is treated
  as an internal error and keeps its traceback.
  """
