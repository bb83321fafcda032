"""Periodic exports: a SavedModel every `every_steps` steps in `model_dir/exports/STEP/`, the newest kept."""

from collections.abc import Callable
import os
from typing import Any

from absl import logging
import tensorflow as tf

from runner.interfaces import Action
from runner.interfaces import LoopEnd

DIRECTORY = "exports"  # Under the model_dir.
_WRITING = ".writing-"  # The prefix of an export being written, renamed to its step once complete.


class ExportEvery(Action):
  """Exports every `every_steps` steps to `model_dir/exports/STEP/`; keeps the newest `max_to_keep` (None: all).

  Each export is written beside its place and renamed to its step once
  complete, so a directory named by a step always holds a whole SavedModel
  (what a model server watching `exports/` loads). It runs on every worker:
  each takes part in the save, the chief keeps it and removes the old ones.
  """

  def __init__(
      self,
      strategy: tf.distribute.Strategy,
      model_dir: str,
      *,
      every_steps: int,
      max_to_keep: int | None,
      export: Callable[[str], Any],
  ) -> None:
    """Initializes the `ExportEvery`.

    Args:
      strategy: the `tf.distribute.Strategy`; its chief writes.
      model_dir: where `exports/` goes.
      every_steps: the exports' cadence in steps.
      max_to_keep: how many exports to keep (None: all).
      export: writes the SavedModel to a directory (on the chief; other workers write to scratch).
    """
    self.every_steps = every_steps
    self._strategy, self._directory = strategy, os.path.join(model_dir, DIRECTORY)
    self._max_to_keep, self._export = max_to_keep, export

  def __call__(self, loop: LoopEnd) -> None:
    """Exports at `loop.step`, then (on the chief) removes exports beyond `max_to_keep` and unfinished ones."""
    path = os.path.join(self._directory, str(loop.step))
    writing = os.path.join(self._directory, f"{_WRITING}{loop.step}")
    self._export(writing)
    if not self._strategy.extended.should_checkpoint:
      return
    if tf.io.gfile.exists(path):  # Of a run that stopped after it, before its next checkpoint.
      tf.io.gfile.rmtree(path)
    tf.io.gfile.rename(writing, path)
    names = tf.io.gfile.listdir(self._directory)
    steps = sorted(int(name.rstrip("/")) for name in names if name.rstrip("/").isdigit())
    old = [str(step) for step in steps[: -self._max_to_keep if self._max_to_keep else 0]]
    for name in old + [name.rstrip("/") for name in names if name.startswith(_WRITING)]:
      tf.io.gfile.rmtree(os.path.join(self._directory, name))
    logging.info("Exported a SavedModel at step %d to %s.", loop.step, path)
