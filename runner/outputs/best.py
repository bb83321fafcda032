"""The best checkpoint: `model_dir/best/`, replaced whole after each evaluation during training that improves on it.

`best/` holds the evaluated weights as a checkpoint (`ckpt-STEP`, of the same
objects as those in `model_dir/checkpoints`), a SavedModel (`saved_model/`)
and `best.json`: `{"step": int, "metric": str, "value": float}`. A new best
is written into the sibling `best.tmp/` (best.json last), then swapped in by
two renames over the sibling `best.old/`, which is removed after; so there is
always a whole best to read: `best/`, or between the two renames `best.old/`.
What an interrupted swap left is tidied by the next training run
(`remove_leftovers`).
"""

from collections.abc import Callable, Sequence
import json
import math
import os
from typing import Any

from absl import logging
import tensorflow as tf

from runner.interfaces import Action
from runner.interfaces import LoopEnd
from strategies import checks
from strategies.errors import ConfigError

DIRECTORY = "best"  # Under the model_dir.
_NEW, _PREVIOUS = DIRECTORY + ".tmp", DIRECTORY + ".old"  # Its siblings during a swap.
INFO_FILE = "best.json"
SAVED_MODEL = "saved_model"


def mode_for(metric: str, mode: str | None) -> str:
  """Returns `mode` ('max' or 'min'), or for None the default of `metric`: 'min' for a name with 'loss', else 'max'.

  Raises:
    ConfigError: `mode` is neither None, 'max' nor 'min'.
  """
  return ("min" if "loss" in metric else "max") if mode is None else checks.one_of(mode, ("max", "min"), "best_mode")


def check_result(metric: str, reported: Sequence[str], *, field: str) -> str:
  """Returns `metric` if it is among `reported`, the evaluation's results; `field` names the option that gives it.

  Raises:
    ConfigError: it is not; the message names `reported` (with a did-you-mean).
  """
  if metric not in reported:
    raise ConfigError(
        f"{field}={metric!r} is not a result of the evaluation.{checks.did_you_mean(metric, reported)} "
        f"The evaluation reports: {', '.join(reported)}."
    )
  return metric


def read(model_dir: str) -> dict[str, Any] | None:
  """Returns the best under `model_dir`: best.json's `step`, `metric` and `value`, and `checkpoint`; or None.

  `checkpoint` is the path prefix of its checkpoint (`checkpoint_path`). It is
  read from `best/`, or from `best.old/` where an interrupted swap left no `best/`.

  Raises:
    ConfigError: best.json is not such a JSON object (edited by hand).
  """
  for directory in (os.path.join(model_dir, DIRECTORY), os.path.join(model_dir, _PREVIOUS)):
    if tf.io.gfile.exists(path := os.path.join(directory, INFO_FILE)):
      try:
        with tf.io.gfile.GFile(path) as f:
          info = json.load(f)
        step, metric, value = int(info["step"]), str(info["metric"]), float(info["value"])
      except (ValueError, KeyError, TypeError) as error:
        raise ConfigError(f"{path} cannot be read ({error!r}); remove {directory} to start over.") from None
      return {"step": step, "metric": metric, "value": value, "checkpoint": os.path.join(directory, f"ckpt-{step}")}
  return None


def checkpoint_path(model_dir: str) -> str | None:
  """Returns the path prefix of the best checkpoint under `model_dir` (`.../best/ckpt-STEP`), or None.

  It holds the objects of the Trainer's checkpoints, and restores as they do
  (`Trainer.restore(checkpoint=...)`).
  """
  return (read(model_dir) or {}).get("checkpoint")


class BestCheckpoint(Action):
  """After every evaluation during training, replaces `model_dir/best/` when `metric` improved on the best so far.

  It runs on every worker: each takes part in the saves (the same ones, as
  the evaluation's results are equal everywhere), the chief keeps them. The
  best so far is read from best.json when it is made (so a resumed run keeps
  it); a value that is not finite never improves.
  """

  def __init__(
      self,
      strategy: tf.distribute.Strategy,
      model_dir: str,
      *,
      metric: str,
      mode: str | None,
      reported: Sequence[str],
      save_checkpoint: Callable[[str, int], Any],
      export: Callable[[str], Any],
  ) -> None:
    """Initializes the `BestCheckpoint`.

    Args:
      strategy: the `tf.distribute.Strategy`; its chief writes.
      model_dir: where `best/` goes.
      metric: the evaluation result to watch.
      mode: 'max', 'min' or None (`mode_for`).
      reported: the names of the evaluation's results the metric may be.
      save_checkpoint: `(directory, step)` writes the Trainer's checkpoint `ckpt-STEP` into directory (on the
        chief; others write to scratch).
      export: writes the SavedModel to a directory (likewise).

    Raises:
      ConfigError: `metric` is not among `reported` (all named), or `mode` is invalid.
    """
    self.metric, self.mode = check_result(metric, reported, field="best_metric"), mode_for(metric, mode)
    self._strategy, self._model_dir = strategy, model_dir
    self._save_checkpoint, self._export = save_checkpoint, export
    info = read(model_dir) or {"metric": metric, "value": None}
    self.best: float | None = info["value"] if info["metric"] == metric else None  # The best value so far.
    if info["metric"] != metric:
      logging.warning(f"{model_dir}/{DIRECTORY} holds the best by {info['metric']!r}; the next evaluation replaces it.")

  def __call__(self, loop: LoopEnd) -> None:
    """Writes the best when the loop's evaluation improved on it."""
    if loop.eval_results is None:
      return
    self.remove_leftovers(trained=True)
    value = loop.eval_results[self.metric]
    if not math.isfinite(value) or (
        self.best is not None and not (value > self.best if self.mode == "max" else value < self.best)
    ):
      return
    self.best = value
    new = os.path.join(self._model_dir, _NEW)
    self._save_checkpoint(new, loop.step)
    self._export(os.path.join(new, SAVED_MODEL))
    if self._strategy.extended.should_checkpoint:
      with tf.io.gfile.GFile(os.path.join(new, INFO_FILE), "w") as f:
        json.dump({"step": loop.step, "metric": self.metric, "value": value}, f)
      best, previous = os.path.join(self._model_dir, DIRECTORY), os.path.join(self._model_dir, _PREVIOUS)
      if tf.io.gfile.exists(best):
        tf.io.gfile.rename(best, previous)
      tf.io.gfile.rename(new, best)
      if tf.io.gfile.exists(previous):
        tf.io.gfile.rmtree(previous)
      logging.info(f"New best {self.metric} {value:.6g} at step {loop.step}: saved in {best}.")

  def remove_leftovers(self, *, trained: bool = False) -> None:
    """On the chief, tidies what an interrupted swap left.

    That is a `best.tmp/`, and a `best.old/` beside a whole `best/`: never
    read, so they go when training starts. Once the run has `trained` (its
    metrics.jsonl grew, so a failure keeps the workdir as it is) a `best.old/`
    without `best/` (a swap stopped between its renames) is renamed back to `best/`.
    """
    if not self._strategy.extended.should_checkpoint:
      return
    exists = tf.io.gfile.exists
    best, new, previous = (os.path.join(self._model_dir, d) for d in (DIRECTORY, _NEW, _PREVIOUS))
    if trained and not exists(os.path.join(best, INFO_FILE)) and exists(os.path.join(previous, INFO_FILE)):
      tf.io.gfile.rename(previous, best)
    for leftover in (new, previous) if exists(os.path.join(best, INFO_FILE)) else (new,):
      if exists(leftover):
        tf.io.gfile.rmtree(leftover)
        logging.info(f"Removed {leftover}, left by an interrupted write of the best checkpoint.")
