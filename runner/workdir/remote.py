"""Which paths are remote: URLs of TensorFlow filesystems, read and written only through `tf.io.gfile`.

Remote paths are `gs://`, `s3://`, `hdfs://`, `ram://` and the like. A
remote filesystem may lack what a local one has: appending in place, an
exclusive create, file locks, atomic renames, modification times. The
workdir's files are laid out so that none of these is needed there
(`runner.outputs.metrics_file`, `runner.workdir.lock`).
"""

import os
import re

from strategies.errors import ConfigError


class UnreachableError(RuntimeError):
  """The workdir's filesystem could not be reached (no network, a storage service down).

  Not a mistake in the input: a later run may reach it. The CLI prints it as
  one line and exits with status 171 (`runner.exit_codes.UNREACHABLE`), which
  orchestrators retry.
  """


def is_remote(path: str) -> bool:
  """Whether `path` is a URL (`scheme://...`) rather than a local path."""
  return "://" in path


def user_path(workdir: str | None) -> str | None:
  """The workdir as a user gave it, ready to use: a local path's `~` expanded (a quoted one reaches us as it is).

  None stays None (a new temporary directory). Imports no TensorFlow.

  Raises:
    ConfigError: an empty path, one that starts or ends with white space, a
      `~user` of no such user, or a URL with one slash (`gs:/bucket`).
  """
  if workdir is None:
    return None
  if not workdir.strip():
    raise ConfigError(
        f"The workdir is empty (--workdir={workdir!r}); give a directory, or leave --workdir out for a new "
        "temporary one."
    )
  if workdir != workdir.strip():
    raise ConfigError(
        f"The workdir {workdir!r} starts or ends with white space, which would become part of a folder's name; "
        f"give {workdir.strip()!r}."
    )
  if is_remote(workdir):
    return workdir
  expanded = os.path.expanduser(workdir)
  if expanded.startswith("~"):
    raise ConfigError(f"The workdir {workdir!r} names the home folder of a user this machine does not have.")
  if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*:/(?!/)", workdir):
    raise ConfigError(f"The workdir {workdir!r} looks like a URL with one slash; a URL is SCHEME://..., e.g. gs://.")
  return expanded
