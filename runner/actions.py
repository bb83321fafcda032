"""Periodic work after each train loop: the built-in actions (`Action` and `LoopEnd` are in `runner.interfaces`).

After every call of the inner loop, the Trainer's controller runs a list of
actions, in order, on every worker: report progress, save and exit on a stop
signal (SIGTERM, Ctrl-C), evaluate when due (at the last step after a
checkpoint), checkpoint when due, keep the best (`runner.outputs.best`), the
user's own actions, export (`runner.outputs.exports`) when due.
"""

from collections.abc import Callable, Mapping
import math
from typing import Any, NoReturn

from absl import logging

from runner import exit_codes
from runner.cluster import stop_signals
from runner.interfaces import Action  # noqa: F401  (public here too)
from runner.interfaces import LoopEnd  # noqa: F401  (public here too)
from strategies import checks
from strategies.errors import ConfigError


def is_due(action: Action, step: int) -> bool:
  """Returns whether `action` runs after the loop that ended at `step`."""
  return action.every_steps is None or step % action.every_steps == 0


class ReportProgress(Action):
  """The progress line, TensorBoard scalars and metrics.jsonl row of every loop (see `reports.Reporter`)."""

  def __init__(self, reporter: Any) -> None:  # A `runner.outputs.reports.Reporter`.
    self._reporter = reporter

  def __call__(self, loop: LoopEnd) -> None:
    """Reports the loop that ended: its step, results and throughput."""
    self._reporter.train_loop(
        step=loop.step,
        total_steps=loop.total_steps,
        results=loop.train_results,
        learning_rate=loop.learning_rate,
        steps_per_sec=loop.steps_per_sec,
        examples_per_sec=loop.examples_per_sec,
        tracing_seconds=loop.tracing_seconds,
    )


class ExitOnStopSignal(Action):
  """Ends the process after a loop in which SIGTERM or SIGINT reached any worker: save, say so, exit.

  Every worker sees the signal after the same loop (it is reduced with the
  loss), so all save at the same step; all exit with the signal's status
  (143 for SIGTERM, 130 for SIGINT).
  """

  def __init__(self, *, save: Callable[[], str | None]) -> None:
    """Initializes the `ExitOnStopSignal`.

    Args:
      save: writes a checkpoint at the current step (if there is a model_dir),
        flushes the reports, and returns the latest checkpoint's path or None.
    """
    self._save = save

  def __call__(self, loop: LoopEnd) -> None:
    """Exits (see `exit`) when a stop signal arrived during the loop."""
    if loop.stop_signal is not None:
      self.exit(loop.stop_signal, step=loop.step)

  def exit(self, signum: int, *, step: int) -> NoReturn:
    """Saves, says so and ends the process with the status of `signum` (143 for SIGTERM, 130 for SIGINT).

    The Trainer also calls it for a stop that arrived after its last loop
    (during the final evaluation).

    Raises:
      SystemExit: always.
    """
    path = self._save()
    where = f"nothing saved at step {step} (no model_dir)"
    if path:
      where = f"saved a checkpoint at step {step} ({path}); run the same command again to resume from there"
    logging.warning(f"Stopped by {stop_signals.NAMES[signum]}: {where}.")
    raise SystemExit(exit_codes.STOPPED_BY[signum])


class Evaluate(Action):
  """Evaluates every `every_steps` steps; returns the `LoopEnd` with the results, for the actions after it.

  At the step training runs to (`loop.total_steps`) it saves first: the steps
  trained are in a checkpoint before the final evaluation starts, so an
  evaluation that fails or is stopped loses none of them.
  """

  def __init__(
      self, evaluate: Callable[[], Mapping[str, float]], *, every_steps: int, save: Callable[[], None]
  ) -> None:
    """Initializes the `Evaluate`.

    Args:
      evaluate: evaluates at the current step and reports it; returns the results.
      every_steps: the evaluations' cadence in steps.
      save: writes a checkpoint at the current step unless there is one.
    """
    self._evaluate = evaluate
    self._save = save
    self.every_steps = every_steps

  def __call__(self, loop: LoopEnd) -> LoopEnd:
    """Evaluates (saving first at the last step); returns `loop` with the results."""
    if loop.step >= loop.total_steps:
      self._save()
    return loop.with_eval_results(self._evaluate())


class SaveCheckpoint(Action):
  """Writes a checkpoint every `every_steps` steps."""

  def __init__(self, save: Callable[[], None], *, every_steps: int) -> None:
    """Initializes the `SaveCheckpoint`.

    Args:
      save: writes a checkpoint at the current step unless there is one
        (the final evaluation's may have written it).
      every_steps: the checkpoints' cadence in steps.
    """
    self._save = save
    self.every_steps = every_steps

  def __call__(self, loop: LoopEnd) -> None:
    """Writes a checkpoint at the current step unless there is one."""
    self._save()


class EarlyStopping(Action):
  """Stops training when an evaluation metric has stopped improving.

  It watches `eval_results[metric]` of the evaluations during training
  (`train(..., eval_data=..., eval_every=N)`) and stops after `patience`
  evaluations in a row without an improvement of more than `min_delta`.
  Loops without an evaluation are ignored.
  """

  def __init__(self, *, metric: str = "loss", mode: str = "min", patience: int = 3, min_delta: float = 0.0) -> None:
    """Initializes the `EarlyStopping`.

    Args:
      metric: the name of an evaluation result: 'loss' or a task metric.
      mode: 'min' (lower is better) or 'max'.
      patience: evaluations without improvement before stopping.
      min_delta: the least change that counts as an improvement.

    Raises:
      ConfigError: an invalid argument.
    """
    self.metric = metric
    self.mode = checks.one_of(mode, ("min", "max"), "mode")
    self.patience = checks.positive_int(patience, "patience")
    self.min_delta = float(checks.positive_number(min_delta, "min_delta", allow_zero=True))
    self.best: float | None = None
    self.evaluations_without_improvement = 0

  def __call__(self, loop: LoopEnd) -> None:
    """Asks training to stop once the metric has not improved for `patience` evaluations."""
    if loop.eval_results is None:
      return
    if self.metric not in loop.eval_results:
      raise ConfigError(
          f"EarlyStopping watches {self.metric!r}, which the evaluation does not report."
          f"{checks.did_you_mean(self.metric, loop.eval_results)} It reports: {', '.join(loop.eval_results)}."
      )
    value = loop.eval_results[self.metric]
    gain = (self.best - value if self.mode == "min" else value - self.best) if self.best is not None else math.inf
    if gain > self.min_delta:
      self.best, self.evaluations_without_improvement = value, 0
      return
    self.evaluations_without_improvement += 1
    if self.evaluations_without_improvement >= self.patience:
      logging.info(
          f"Early stopping at step {loop.step}: {self.metric} has not improved on {self.best:.4g} for "
          f"{self.patience} evaluations."
      )
      loop.stop()
