"""What a workdir held before a run, so that a run that fails before it trains leaves it as it was."""

from collections.abc import Callable, Mapping
import dataclasses
import os
from typing import Any

from absl import logging
import tensorflow as tf

from runner.workdir import atomic_files
from runner.workdir import config_history

# The small files a run rewrites; their earlier contents are kept to be put back.
_REWRITTEN = (config_history.CONFIG_FILE, config_history.HISTORY_FILE)
# Where training and evaluation write their results (`metrics_parts`: its parts on a remote workdir,
# `runner.outputs.metrics_file`). Once one of these grew, the workdir holds the run's work.
_OUTPUTS = ("metrics.jsonl", "metrics_parts", "checkpoints", "summaries")


@dataclasses.dataclass(frozen=True)
class WorkdirState:
  """A workdir's entries, the contents of the files a run rewrites and the sizes of its outputs.

  Attributes:
    workdir: the directory.
    created: the run created it (so putting it back removes it).
    entries: the names in it before the run.
    contents: `{name: text}` of the files of `_REWRITTEN` that were there.
    outputs: `{path: size in bytes}` of every file of `_OUTPUTS` (metrics.jsonl
      and the files under metrics_parts/, checkpoints/ and summaries/).
  """

  workdir: str
  created: bool
  entries: frozenset[str]
  contents: Mapping[str, str]
  outputs: Mapping[str, int]

  @classmethod
  def read(cls, workdir: str, *, created: bool) -> "WorkdirState":
    """Returns the state of `workdir` now; `created`: the run just made it (empty)."""
    entries = frozenset(tf.io.gfile.listdir(workdir))
    contents = {name: config_history.read_text(os.path.join(workdir, name)) for name in _REWRITTEN if name in entries}
    return cls(workdir=workdir, created=created, entries=entries, contents=contents, outputs=_outputs(workdir))

  def restore_unless_trained(self) -> None:
    """Puts the workdir back as it was, unless the run wrote outputs there (then they and the workdir are kept).

    Outputs are a `metrics.jsonl` row, a TensorBoard summary or a checkpoint
    (one being written included): a workdir a run has trained in is never
    removed. Otherwise a workdir the run created is removed; in one it did not
    create, the entries it added are removed and the files it rewrote get
    their old contents back, each replaced whole (a rollback that cannot
    write leaves the file as the run wrote it, never a part of it).

    It never raises: a step that fails is logged as a warning and the others
    go on, so the caller's own error is the one reported.
    """
    try:
      if not tf.io.gfile.exists(self.workdir) or self._has_new_outputs():
        return
      if self.created:
        tf.io.gfile.rmtree(self.workdir)
        return
      added = set(tf.io.gfile.listdir(self.workdir)) - self.entries
    except (OSError, tf.errors.OpError) as e:
      logging.warning("Could not put the workdir %s back as it was: %s", self.workdir, e)
      return
    for name in added:
      path = os.path.join(self.workdir, name.rstrip("/"))
      _warn_if_fails(path, tf.io.gfile.rmtree if tf.io.gfile.isdir(path) else tf.io.gfile.remove, path)
    for name, text in self.contents.items():
      path = os.path.join(self.workdir, name)
      if not tf.io.gfile.exists(path) or config_history.read_text(path) != text:
        _warn_if_fails(path, atomic_files.replace_all, {path: text})

  def _has_new_outputs(self) -> bool:
    """Whether an output file is new or grew since `read` (one removed, e.g. a leftover, does not count)."""
    return any(self.outputs.get(path, -1) < size for path, size in _outputs(self.workdir).items())


def _outputs(workdir: str) -> dict[str, int]:
  """`{path: size in bytes}` of metrics.jsonl and of every file under the other `_OUTPUTS` directories of `workdir`."""
  sizes = {}
  for name in _OUTPUTS:
    path = os.path.join(workdir, name)
    if tf.io.gfile.isdir(path):
      for directory, _, files in tf.io.gfile.walk(path):
        for file in files:
          sizes[os.path.join(directory, file)] = tf.io.gfile.stat(os.path.join(directory, file)).length
    elif tf.io.gfile.exists(path):
      sizes[path] = tf.io.gfile.stat(path).length
  return sizes


def _warn_if_fails(path: str, action: Callable[..., object], *args: Any) -> None:
  """Calls `action(*args)` to put `path` back; an error becomes a warning naming `path`."""
  try:
    action(*args)
  except (OSError, tf.errors.OpError) as e:
    logging.warning("Could not put %s back as it was before the run: %s", path, e)
