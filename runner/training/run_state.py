"""Where a Trainer's run is, its step and latest results, and what it keeps of them: checkpoints, the best, reports."""

from collections.abc import Mapping
import functools
import os
from typing import Any

from absl import logging
import tensorflow as tf

from runner.outputs import best
from runner.outputs import checkpoints
from runner.outputs import hypertune
from runner.outputs import profiling
from runner.outputs import reports
from runner.training import export


class RunState:
  """A Trainer's global step and latest results, with its checkpoints (none without a `model_dir`) and reports.

  Attributes:
    step: the global step (an int), as the last loop, restore or failure left it.
    train_results: the last train loop's results ({} before any).
    eval_results: the latest evaluation's results, or None.
    evaluated_step: the global step of the latest evaluation, or None.
    step_variable: the global step variable (`ModelParts.step`).
    checkpoints: the `checkpoints.Checkpoints` of `model_dir`, or None.
    reporter: the `reports.Reporter` of the progress lines, summaries and metrics.jsonl.
    best: the `best.BestCheckpoint` of the option `best_metric`, or None.
    report: the `hypertune.ReportMetric` of the option `report_metric`, or None.
    profile: the `profiling.ProfileWindow` of `profile_steps` (on the chief only), or None.
  """

  def __init__(self, strategy: tf.distribute.Strategy, parts: Any, options: Any) -> None:
    """Initializes the `RunState` of a Trainer's `model_parts.ModelParts` and `options.TrainerOptions`."""
    self.step = 0
    self.train_results: Mapping[str, float] = {}
    self.eval_results: dict[str, float] | None = None
    self.evaluated_step: int | None = None
    self.step_variable = parts.step
    self.checkpoints = None
    if options.model_dir is not None:
      self.checkpoints = checkpoints.Checkpoints(
          strategy,
          options.model_dir,
          model=parts.model,
          optimizer=parts.optimizer,
          step=parts.step,
          max_to_keep=options.max_to_keep,
          asynchronous=options.async_checkpoints,
      )
    reported = ["loss", *(metric.name for metric in parts.metrics)]
    self.best = None
    if options.best_metric is not None and self.checkpoints is not None:  # (best_metric needs a model_dir)
      self.best = best.BestCheckpoint(
          strategy,
          options.model_dir,
          metric=options.best_metric,
          mode=options.best_mode,
          reported=reported,
          save_checkpoint=self.checkpoints.write,
          export=functools.partial(export.export_saved_model, strategy, parts),
      )
    self.report = None
    if options.report_metric is not None:
      self.report = hypertune.ReportMetric(options.report_metric, reported=reported)
    is_chief = strategy.extended.should_checkpoint
    self.reporter = reports.Reporter(options.model_dir, is_chief=is_chief, summary_dir=options.summary_dir)
    self.profile = None  # Only the chief profiles (itself: the host where it runs, and its devices).
    if options.profile_steps is not None and is_chief:
      first, last = options.profile_steps
      self.profile = profiling.ProfileWindow(first=first, last=last, logdir=self.reporter.summaries_of("train"))

  def advance(self, step: int, train_results: Mapping[str, float]) -> None:
    """Notes the step a train loop reached and its results."""
    self.step, self.train_results = step, train_results

  def read_step(self) -> int:
    """Sets `step` from the step variable (after a loop that raised part-way); returns it."""
    self.step = int(self.step_variable.numpy())
    return self.step

  def restore_latest(self) -> None:
    """Restores the latest checkpoint of the model_dir, if there is one (`Checkpoints.restore_latest`)."""
    if self.checkpoints is not None and self.checkpoints.restore_latest():
      self.read_step()

  def restore(self, path: str) -> int:
    """Restores the checkpoint at `path` (`Checkpoints.restore`); its step becomes the global step."""
    assert self.checkpoints is not None  # The Trainer checked that it has a model_dir.
    self.step, self.train_results = self.checkpoints.restore(path), {}
    return self.step

  def start_training(self) -> None:
    """Before a train call's first loop: removes what interrupted saves left, and reports from the current step on."""
    if self.checkpoints is not None:
      self.checkpoints.remove_interrupted_saves()
    if self.best is not None:
      self.best.remove_leftovers()
    self.reporter.resume_at(self.step)

  def save(self, *, in_background: bool = False) -> None:
    """Writes a checkpoint at the current step, if there is a model_dir and none of this step yet.

    Without `in_background` it returns once the checkpoint is complete; with
    it, while it is written (with `async_checkpoints`).
    """
    if self.checkpoints is not None:
      self.checkpoints.save_unless_saved(self.step, in_background=in_background)

  def save_for_exit(self) -> str | None:
    """Saves (`save`), flushes the reports; returns the latest checkpoint's path, or None without a model_dir."""
    self.save()
    self.reporter.flush()
    if self.checkpoints is None or self.checkpoints.saved_step is None:
      return None
    # The path by its step, not from the list: a worker other than the chief may read the list before the chief
    # has listed the checkpoint they just saved together.
    return os.path.join(self.checkpoints.directory, f"ckpt-{self.checkpoints.saved_step}")

  def wait_quietly(self) -> None:
    """Lets a checkpoint being written in the background complete as training fails; logs, not raises, its failure."""
    if self.checkpoints is None:
      return
    try:
      self.checkpoints.wait()
    except checkpoints.CheckpointWriteError as error:
      logging.warning("%s", error)

  def evaluated(self, results: dict[str, float], *, seconds: float) -> None:
    """Reports an evaluation at the current step, and notes it."""
    self.reporter.evaluation(step=self.step, results=results, seconds=seconds)
    self.reporter.flush()
    self.eval_results, self.evaluated_step = results, self.step

  def nothing_to_train(self, steps: int) -> dict[str, float]:
    """Says that the global step is at `steps` already; returns the results of the loop that reached it.

    Those of this Trainer, else the train row of that step in the model_dir's
    metrics.jsonl (without its throughput), else {}.
    """
    if self.checkpoints is not None and self.checkpoints.saved_step == self.step:
      where = f"the checkpoint in {self.checkpoints.model_dir} is at step {self.step}"
    else:
      where = f"the global step is {self.step}"
    logging.info("Nothing to train: %s >= steps=%d.", where, steps)
    if not self.train_results and self.checkpoints is not None:
      return reports.train_results_at(self.checkpoints.model_dir, self.step)
    return dict(self.train_results)
