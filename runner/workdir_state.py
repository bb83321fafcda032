"""What a workdir held before a run, so that a run that fails without a new checkpoint leaves it as it was."""

import dataclasses
import os
from typing import FrozenSet, Mapping, Optional

import tensorflow as tf

from runner import checkpointing

# The small files a run rewrites or appends to; their earlier contents are kept to be put back.
_REWRITTEN = ("config.json", "config_history.jsonl")


@dataclasses.dataclass(frozen=True)
class WorkdirState:
  """A workdir's entries, its latest checkpoint and the contents of the files a run rewrites.

  Attributes:
    workdir: the directory.
    created: the run created it (so putting it back removes it).
    entries: the names in it before the run.
    checkpoint: its latest checkpoint before the run, or None.
    contents: `{name: text}` of the files of `_REWRITTEN` that were there.
  """
  workdir: str
  created: bool
  entries: FrozenSet[str]
  checkpoint: Optional[str]
  contents: Mapping[str, str]

  @classmethod
  def read(cls, workdir, *, created):
    """Returns the state of `workdir` now; `created`: the run just made it (empty)."""
    entries = frozenset(tf.io.gfile.listdir(workdir))
    contents = {}
    for name in _REWRITTEN:
      if name in entries:
        with tf.io.gfile.GFile(os.path.join(workdir, name)) as f:
          contents[name] = f.read()
    return cls(workdir=workdir, created=created, entries=entries, checkpoint=checkpointing.latest(workdir),
               contents=contents)

  def restore_unless_checkpointed(self):
    """Puts the workdir back as it was, unless the run wrote a checkpoint since (then its files belong to it).

    A workdir the run created is removed; otherwise the entries the run
    added are removed and the files it rewrote get their old contents.
    Rows appended to an existing `metrics.jsonl` stay.
    """
    if not tf.io.gfile.exists(self.workdir) or checkpointing.latest(self.workdir) != self.checkpoint:
      return
    if self.created:
      tf.io.gfile.rmtree(self.workdir)
      return
    for name in set(tf.io.gfile.listdir(self.workdir)) - self.entries:
      path = os.path.join(self.workdir, name.rstrip("/"))
      if tf.io.gfile.isdir(path):
        tf.io.gfile.rmtree(path)
      else:
        tf.io.gfile.remove(path)
    for name, text in self.contents.items():
      with tf.io.gfile.GFile(os.path.join(self.workdir, name), "w") as f:
        f.write(text)
