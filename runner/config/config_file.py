"""Where a config file is and how Python loads it: a local `FILE.py`, or a URL read through `tf.io.gfile`.

`--config=gs://BUCKET/configs/run.py:ARG` works as a local path does. A
remote file is read with `tf.io.gfile` (TensorFlow is imported only then, so
a local config still loads without it) and executed as a module whose
`__file__` is the URL; tracebacks and error messages name the URL and its
lines. The file must be one Python file: imports of modules beside it
resolve against `sys.path`, as for a local config file outside the working
directory.
"""

import importlib.abc
import importlib.machinery
import importlib.util
import os

from runner.workdir import remote
from strategies.errors import ConfigError

MODULE_NAME = "runner_config_file"


def split(path: str) -> tuple[str, str]:
  """Returns `(file, argument)` of 'FILE.py[:ARG]', where FILE may be a URL ('gs://b/run.py:tpu')."""
  scheme, separator, rest = path.rpartition("://")
  if not separator:
    file_path, _, argument = path.partition(":")
    return file_path, argument
  file_rest, _, argument = rest.partition(":")
  return f"{scheme}://{file_rest}", argument


def module_spec(file_path: str, path: str) -> importlib.machinery.ModuleSpec:
  """Returns the spec that loads the config file at `file_path` (`path` is what the user gave, for messages).

  Raises:
    ConfigError: the file does not exist, cannot be read (a remote
      filesystem's error named), or is not a Python file.
  """
  loader: importlib.abc.Loader | None = None
  if remote.is_remote(file_path):
    if not _remote_file_exists(file_path, path):
      raise ConfigError(f"Config file {file_path!r} does not exist (from {path!r}).")
    if not file_path.endswith(".py"):
      raise ConfigError(f"Config file {file_path!r} is not a Python file; give FILE.py (from {path!r}).")
    loader = _RemoteSourceLoader(file_path)
  elif not os.path.isfile(file_path):
    raise ConfigError(f"Config file {file_path!r} does not exist (from {path!r}).")
  spec = importlib.util.spec_from_file_location(MODULE_NAME, file_path, loader=loader)
  if spec is None or spec.loader is None:  # Python loads only its own files (FILE.py).
    raise ConfigError(f"Config file {file_path!r} is not a Python file; give FILE.py (from {path!r}).")
  return spec


def _remote_file_exists(file_path: str, path: str) -> bool:
  """Whether the remote `file_path` is a file.

  Raises:
    ConfigError: the filesystem answers with an error (an unknown scheme, no
      credentials, no permission, ...).
  """
  import tensorflow as tf  # noqa: PLC0415  (only for a remote config: a local one loads without TensorFlow)

  try:
    return tf.io.gfile.exists(file_path) and not tf.io.gfile.isdir(file_path)
  except tf.errors.OpError as e:
    raise ConfigError(
        f"Config file {file_path!r} cannot be read (from {path!r}): {type(e).__name__}: "
        f"{(e.message or str(e)).strip().splitlines()[0]}"
    ) from e


class _RemoteSourceLoader(importlib.abc.SourceLoader):
  """Loads a Python file read through `tf.io.gfile` (no bytecode cache is read or written)."""

  def __init__(self, file_path: str) -> None:
    self._file_path = file_path

  def get_filename(self, fullname: str) -> str:  # noqa: ARG002  (one file, whatever the module's name)
    return self._file_path

  def get_data(self, path: str) -> bytes:
    """The bytes of `path` (the config file; Python asks for no other)."""
    import tensorflow as tf  # noqa: PLC0415  (imported already by `_remote_file_exists`)

    with tf.io.gfile.GFile(path, "rb") as f:
      return f.read()
