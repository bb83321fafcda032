"""The checkpoints of a directory: the list in its `checkpoint` file, completed from the `ckpt-N` files themselves.

`tf.train.CheckpointManager` lists its checkpoints, oldest first, in the
directory's `checkpoint` file (a text protobuf), rewritten once a new
checkpoint is complete. TensorFlow (`tf.train.get_checkpoint_state`) reads a
removed, truncated or zeroed list as "no checkpoint" (a run would start again
from step 0 over the checkpoints still there) and an empty or garbled one as
an exception. Here the list is completed from the `ckpt-N.index` files (a save
writes a checkpoint's `.index` last; one cut short is found unreadable when
restored, and skipped), so every reader sees the same checkpoints whatever
happened to the list, and `write` puts a sound list back atomically.

Only the directory's own checkpoints are its checkpoints: a list may name
paths elsewhere (a copied workdir whose list has absolute paths into the
original, a list written by TF1 or by hand). Those are left out, so they are
never restored from nor deleted by rotation, and the list is rewritten
without them; an absolute path into the directory itself is its own file,
named once. A listed checkpoint with no file left is left out too.
"""

import dataclasses
import os
import re
import time

from google.protobuf import text_format
import tensorflow as tf

from runner.workdir import atomic_files
from runner.workdir import remote
from strategies.errors import first_line

PREFIX = "ckpt"  # What `tf.train.CheckpointManager` names its checkpoints: ckpt-N.
LIST_FILE = "checkpoint"
# What a save leaves when its process dies before the save completes: `Checkpoint.write` writes the shards of
# `ckpt-N` under `ckpt-N_temp/`, then merges them into `ckpt-N.index` and `ckpt-N.data-*` and deletes that directory.
INTERRUPTED_SAVE_SUFFIX = "_temp"
_NUMBERED = re.compile(rf"^{PREFIX}-(\d+)$")
# TensorFlow's `CheckpointState` protobuf, the list's format (its class has no public name; this public function
# makes one).
_CheckpointState = type(tf.compat.v1.train.generate_checkpoint_state_proto("/", "/ckpt", ["/ckpt"]))


@dataclasses.dataclass(frozen=True)
class CheckpointList:
  """The checkpoints of a directory, oldest first.

  Attributes:
    directory: the checkpoint directory.
    paths: the checkpoints' path prefixes (`DIRECTORY/ckpt-N`), oldest first:
      those the list file names, in its order, when it names every `ckpt-N`
      on disk; else those it names and those on disk, by step.
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
  outside: tuple[str, ...]
  problem: str | None


def read(directory: str) -> CheckpointList:
  """Returns the `CheckpointList` of `directory` (empty if it does not exist); never raises for a damaged list."""
  names, problem = _listed(directory)
  # Of `names`: those in `directory` (as DIRECTORY/NAME, once), those elsewhere, those named twice.
  listed: list[str] = []
  outside: list[str] = []
  twice: list[str] = []
  for name in names:
    path = os.path.join(directory, os.path.basename(name))
    if not _is_in(name, directory):
      outside += [] if name in outside else [name]
    else:
      (twice if path in listed else listed).append(path)
  no_files = [path for path in listed if not tf.io.gfile.glob(path + ".*")]
  kept = [path for path in listed if path not in no_files]
  prefixes = [index[: -len(".index")] for index in _glob(directory, ".index")]
  unlisted = sorted((p for p in prefixes if step_of(p) is not None and p not in kept), key=lambda p: step_of(p) or 0)
  problems = [] if problem is None or (problem == "is missing" and not unlisted) else [problem]
  if outside:  # A copied workdir's list naming the original's, say: never this directory's to restore or delete.
    problems.append(
        f"names checkpoints outside its directory: {', '.join(outside)} (left out: they are neither restored from "
        "nor deleted)"
    )
  for phrase, paths in [("names {} more than once", twice), ("names checkpoints that have no files: {}", no_files)]:
    if paths:
      problems.append(phrase.format(", ".join(map(os.path.basename, paths))))
  if unlisted and problem is None:
    problems.append(f"does not name {', '.join(map(os.path.basename, unlisted))}")
  if unlisted:  # A path of another form than ckpt-N (the list may name one; the Trainer writes none) sorts first.
    kept = sorted(kept + unlisted, key=lambda path: -1 if (step := step_of(path)) is None else step)
  return CheckpointList(directory, tuple(kept), tuple(outside), ", and ".join(problems) or None)


def write(checkpoints: CheckpointList) -> None:
  """Writes `checkpoints.paths` as the list file of its directory, replacing it whole (see `atomic_files`).

  The names are written relative to the directory, as `tf.train.CheckpointManager`
  does, so the directory can be moved. With no checkpoint the list file is
  removed (a list must name one).

  Raises:
    tf.errors.OpError, OSError: the file could not be written (see `atomic_files.replace_all`); the previous one is
      unchanged.
  """
  path = os.path.join(checkpoints.directory, LIST_FILE)
  names = [os.path.basename(p) for p in checkpoints.paths]
  if not names:
    if tf.io.gfile.exists(path):
      tf.io.gfile.remove(path)
    return
  # The manager that reads the list rotates the checkpoints with a time past 0, in the list's order.
  state = _CheckpointState(
      model_checkpoint_path=names[-1],
      all_model_checkpoint_paths=names,
      all_model_checkpoint_timestamps=[time.time()] * len(names),
  )
  atomic_files.replace_all({path: text_format.MessageToString(state)})


def interrupted_saves(directory: str) -> list[str]:
  """Returns the `ckpt-N_temp` directories in `directory`: what saves whose process died left, never read again."""
  return sorted(
      path
      for path in _glob(directory, INTERRUPTED_SAVE_SUFFIX)
      if step_of(path[: -len(INTERRUPTED_SAVE_SUFFIX)]) is not None and tf.io.gfile.isdir(path)
  )


def step_of(path: str) -> int | None:
  """The step N of a checkpoint path prefix `.../ckpt-N`, or None for a path of another form."""
  match = _NUMBERED.match(os.path.basename(path))
  return None if match is None else int(match.group(1))


def _listed(directory: str) -> tuple[list[str], str | None]:
  """Returns `(paths the list file names, oldest first; what is wrong with it or None)`."""
  path = os.path.join(directory, LIST_FILE)
  if not tf.io.gfile.exists(path):
    return [], "is missing"
  state = _CheckpointState()
  try:
    with tf.io.gfile.GFile(path, "rb") as f:
      text_format.Parse(f.read().decode("utf-8"), state)
  except (text_format.ParseError, UnicodeDecodeError, tf.errors.OpError) as error:
    return [], f"cannot be read ({type(error).__name__}: {first_line(error, limit=160)})"
  if not state.model_checkpoint_path:
    return [], "names no checkpoint"
  names = list(state.all_model_checkpoint_paths)
  names += [] if state.model_checkpoint_path in names else [state.model_checkpoint_path]
  return [n if os.path.isabs(n) or remote.is_remote(n) else os.path.join(directory, n) for n in names], None


def _is_in(path: str, directory: str) -> bool:
  """Whether `path` (a list file's entry, made absolute) names a file directly in `directory`, however spelt."""
  if remote.is_remote(path) or remote.is_remote(directory):
    return os.path.dirname(path).rstrip("/") == directory.rstrip("/")
  return os.path.realpath(os.path.dirname(path)) == os.path.realpath(directory)


def _glob(directory: str, suffix: str) -> list[str]:
  return tf.io.gfile.glob(os.path.join(directory, f"{PREFIX}-*{suffix}"))
