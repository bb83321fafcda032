"""The checkpoints of a directory: the list in its `checkpoint` file, completed from the `ckpt-N` files themselves.

`tf.train.CheckpointManager` lists its checkpoints, oldest first, in the
directory's `checkpoint` file (a text protobuf), rewritten once a new
checkpoint is complete. TensorFlow reads a removed, truncated or zeroed list
as "no checkpoint" (a run would start again from step 0 over the checkpoints
still there) and an empty or garbled one as an exception. Here the list is
completed from the `ckpt-N.index` files (a save writes a checkpoint's
`.index` last; one cut short is found unreadable when restored, and skipped),
so every reader sees the same checkpoints whatever happened to the list, and
`write` puts a sound list back atomically.

Only the directory's own checkpoints are its checkpoints: a list may name
paths elsewhere (a copied workdir whose list has absolute paths into the
original, a list written by TF1 or by hand). Those are left out, so they are
never restored from nor deleted by rotation, and the list is rewritten
without them; an absolute path into the directory itself is its own file,
named once. A listed checkpoint with no file left is left out too.
"""

from collections.abc import Sequence
import dataclasses
import os
import re

from google.protobuf import text_format
import tensorflow as tf
from tensorflow.python.training import checkpoint_state_pb2  # noqa: TID251

from runner.workdir import atomic_files
from runner.workdir import remote
from strategies.errors import first_line

PREFIX = "ckpt"  # What `tf.train.CheckpointManager` names its checkpoints: ckpt-N.
LIST_FILE = "checkpoint"
# What a save leaves when its process dies before the save completes: `Checkpoint.write` writes the shards of
# `ckpt-N` under `ckpt-N_temp/`, then merges them into `ckpt-N.index` and `ckpt-N.data-*` and deletes that directory.
INTERRUPTED_SAVE_SUFFIX = "_temp"
_NUMBERED = re.compile(rf"^{PREFIX}-(\d+)$")


@dataclasses.dataclass(frozen=True)
class CheckpointList:
  """The checkpoints of a directory, oldest first.

  Attributes:
    directory: the checkpoint directory.
    paths: the checkpoints' path prefixes (`DIRECTORY/ckpt-N`), oldest first:
      those the list file names, in its order, when it names every `ckpt-N`
      on disk; else those it names and those on disk, by step.
    listed: the paths in the directory that the list file names, as
      `DIRECTORY/NAME`, once each, those with no file left included.
    outside: the paths the list file names in another directory, left out
      of `paths`.
    problem: None when the list file names every checkpoint on disk and
      nothing else; else what is wrong with it, a phrase that follows "The
      checkpoint list FILE" (e.g. "is missing", "cannot be read
      (UnicodeDecodeError: ...)", "names checkpoints outside its directory:
      ...").
  """

  directory: str
  paths: tuple[str, ...]
  listed: tuple[str, ...]
  outside: tuple[str, ...]
  problem: str | None

  @property
  def newest(self) -> str | None:
    """The newest checkpoint's path prefix, or None."""
    return self.paths[-1] if self.paths else None

  def rebuilt_warning(self) -> str | None:
    """The line that says the list was rebuilt from the files (None if nothing was)."""
    if self.problem is None:
      return None
    path = os.path.join(self.directory, LIST_FILE)
    if not self.paths:
      return f"The checkpoint list {path} {self.problem}; its directory holds no checkpoint of its own."
    return (
        f"The checkpoint list {path} {self.problem}; rebuilt it from the checkpoint files: "
        f"{', '.join(os.path.basename(p) for p in self.paths)} (newest last). It is rewritten at the next save."
    )


def read(directory: str) -> CheckpointList:
  """Returns the `CheckpointList` of `directory` (empty if it does not exist); never raises for a damaged list."""
  names, problem = _listed(directory)
  listed, outside, twice = _sorted_out(names, directory)
  without_files = [path for path in listed if not tf.io.gfile.glob(path + ".*")]
  kept = tuple(path for path in listed if path not in without_files)
  unlisted = [path for _, path in _on_disk(directory) if path not in kept]
  problems = [] if problem is None or (problem == "is missing" and not unlisted) else [problem]
  if outside:  # A copied workdir's list naming the original's, say: never this directory's to restore or delete.
    problems.append(
        f"names checkpoints outside its directory: {', '.join(outside)} (left out: they are neither "
        "restored from nor deleted)"
    )
  if twice:
    problems.append(f"names {_basenames(twice)} more than once")
  if without_files:
    problems.append(f"names checkpoints that have no files: {_basenames(without_files)}")
  if unlisted and problem is None:
    problems.append(f"does not name {_basenames(unlisted)}")
  paths = sorted(kept + tuple(unlisted), key=_step_or_oldest) if unlisted else kept
  return CheckpointList(
      directory=directory, paths=tuple(paths), listed=listed, outside=outside, problem=", and ".join(problems) or None
  )


def write(checkpoints: CheckpointList) -> None:
  """Writes `checkpoints.paths` as the list file of its directory, replacing it whole (see `atomic_files`).

  Paths in the directory are written relative to it, as `tf.train.CheckpointManager`
  does, so the directory can be moved. With no checkpoint the list file is
  removed (a list must name one).

  Raises:
    tf.errors.OpError, OSError: the file could not be written (see `atomic_files.replace`); the previous one is
      unchanged.
  """
  path = os.path.join(checkpoints.directory, LIST_FILE)
  if not checkpoints.paths:
    if tf.io.gfile.exists(path):
      tf.io.gfile.remove(path)
    return
  names = [_relative(p, checkpoints.directory) for p in checkpoints.paths]
  state = checkpoint_state_pb2.CheckpointState(
      model_checkpoint_path=names[-1],
      all_model_checkpoint_paths=names,
      all_model_checkpoint_timestamps=[_modified(p) for p in checkpoints.paths],
  )
  atomic_files.replace(path, text_format.MessageToString(state))


def interrupted_saves(directory: str) -> list[str]:
  """Returns the `ckpt-N_temp` directories in `directory`: what saves whose process died left, never read again."""
  pattern = os.path.join(directory, f"{PREFIX}-*{INTERRUPTED_SAVE_SUFFIX}")
  return sorted(
      path
      for path in tf.io.gfile.glob(pattern)
      if step_of(path[: -len(INTERRUPTED_SAVE_SUFFIX)]) is not None and tf.io.gfile.isdir(path)
  )


def _listed(directory: str) -> tuple[tuple[str, ...], str | None]:
  """Returns `(paths the list file names, oldest first; what is wrong with it or None)`."""
  path = os.path.join(directory, LIST_FILE)
  if not tf.io.gfile.exists(path):
    return (), "is missing"
  state = checkpoint_state_pb2.CheckpointState()
  try:
    with tf.io.gfile.GFile(path, "rb") as f:
      text_format.Parse(f.read().decode("utf-8"), state)
  except (text_format.ParseError, UnicodeDecodeError, tf.errors.OpError) as error:
    return (), f"cannot be read ({type(error).__name__}: {first_line(error, limit=160)})"
  if not state.model_checkpoint_path:
    return (), "names no checkpoint"
  names = list(state.all_model_checkpoint_paths)
  if state.model_checkpoint_path not in names:
    names.append(state.model_checkpoint_path)
  return (
      tuple(name if os.path.isabs(name) or remote.is_remote(name) else os.path.join(directory, name) for name in names),
      None,
  )


def _sorted_out(names: Sequence[str], directory: str) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
  """Returns `(the paths of names in directory, once each, as DIRECTORY/NAME; those elsewhere; those named twice)`.

  A name is in `directory` when its (absolute, normalised) parent is the
  directory, whatever the spelling: relative, or absolute as TF1 wrote it.
  """
  inside, outside, twice = [], [], []
  for name in names:
    path = os.path.join(directory, os.path.basename(name))
    if not _is_in(name, directory):
      if name not in outside:
        outside.append(name)
    elif path in inside:
      twice.append(path)
    else:
      inside.append(path)
  return tuple(inside), tuple(outside), tuple(twice)


def _is_in(path: str, directory: str) -> bool:
  """Whether `path` (a list file's entry, made absolute) names a file directly in `directory`."""
  if remote.is_remote(path) or remote.is_remote(directory):
    return os.path.dirname(path).rstrip("/") == directory.rstrip("/")
  return os.path.realpath(os.path.dirname(path)) == os.path.realpath(directory)


def _basenames(paths: Sequence[str]) -> str:
  return ", ".join(os.path.basename(path) for path in paths)


def _on_disk(directory: str) -> list[tuple[int, str]]:
  """Returns `[(step, path prefix)]` of the `ckpt-N` with an `.index` file in `directory`, by step."""
  found = []
  for index in tf.io.gfile.glob(os.path.join(directory, f"{PREFIX}-*.index")):
    prefix = index[: -len(".index")]
    step = step_of(prefix)
    if step is not None:
      found.append((step, prefix))
  return sorted(found)


def step_of(path: str) -> int | None:
  """The step N of a checkpoint path prefix `.../ckpt-N`, or None for a path of another form."""
  match = _NUMBERED.match(os.path.basename(path))
  return None if match is None else int(match.group(1))


def _step_or_oldest(path: str) -> int:
  """The step of `path`; -1 for a path in another form than ckpt-N (the list may name one; the Trainer writes none)."""
  step = step_of(path)
  return -1 if step is None else step


def _relative(path: str, directory: str) -> str:
  return os.path.basename(path) if os.path.dirname(path) == directory.rstrip("/") else path


def _modified(path: str) -> float:
  """The time `path`'s checkpoint was written (its `.index` file's), in seconds; 0 if it is gone."""
  try:
    return tf.io.gfile.stat(path + ".index").mtime_nsec / 1e9
  except tf.errors.NotFoundError:
    return 0.0
