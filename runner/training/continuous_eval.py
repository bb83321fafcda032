"""The evaluator beside a trainer: each new checkpoint of a workdir evaluated once, at its step.

A trainer writes checkpoints to `WORKDIR/checkpoints`; the evaluator (mode
'continuous_eval', or the `evaluator` task of a cluster) reads the checkpoint
list every `POLL_SECONDS`, and restores each checkpoint newer than the last
one it took, oldest first, into its own Trainer (`Trainer.restore`), which
evaluates it (`Trainer.evaluate`) and reports it at the checkpoint's step
as a trainer's evaluation: a progress line, TensorBoard scalars in
`WORKDIR/summaries/eval` and an `eval` row of `WORKDIR/metrics.jsonl`
(appended beside the trainer's rows, see `reports.Reporter`). A checkpoint
whose step `metrics.jsonl` already holds an evaluation of (by an evaluator
that was stopped and started again, or by a 'train_and_eval' trainer) is not
evaluated again; one the trainer's `max_to_keep` deleted while it was read
is skipped with a warning.

One evaluator evaluates a workdir: once the workdir exists, it takes the
evaluator's lock (`WORKDIR/.tf-runner-evaluator.lock`, `runner.workdir.lock`,
not the trainer's), and a second evaluator of the same workdir stops there
with one line naming the first (`WorkdirInUseError`). Besides that lock,
removed when it ends, it writes nothing else into the workdir (no config, no
checkpoint, no rewrite of the checkpoint list), so it cannot disturb the
trainer.
"""

from collections.abc import Mapping
import contextlib
import dataclasses
import os
import time

from absl import logging
import tensorflow as tf

from runner import exit_codes
from runner import interfaces
from runner.cluster import stop_signals
from runner.outputs import checkpoint_list
from runner.outputs import checkpoints
from runner.outputs import reports
from runner.training.trainer import Trainer
from runner.workdir import lock as workdir_lock
from strategies.errors import ConfigError

POLL_SECONDS = 1.0  # How often the checkpoint list is read while no new checkpoint is there.


@dataclasses.dataclass(frozen=True)
class Evaluation:
  """The evaluation of one checkpoint.

  Attributes:
    checkpoint: the checkpoint's path prefix (`WORKDIR/checkpoints/ckpt-N`).
    step: its global step N.
    metrics: `loss`, the task's metrics and `num_examples`, as
      `Trainer.evaluate` returns them (or as `metrics.jsonl` held them).
  """

  checkpoint: str
  step: int
  metrics: Mapping[str, float]


def evaluate_checkpoint(
    trainer: Trainer,
    data: interfaces.DatasetProvider,
    checkpoint: str,
    *,
    global_batch_size: int,
    steps: int | None = None,
) -> dict[str, float] | None:
  """Restores `checkpoint` into `trainer` and evaluates it on `data`, reported at the checkpoint's step.

  Args:
    trainer: a Trainer whose `model_dir` is the workdir the checkpoint is in.
    data: the eval data, as for `Trainer.evaluate`.
    checkpoint: the checkpoint's path prefix.
    global_batch_size: the evaluation's global batch size.
    steps: None for all of `data`, or at most this many global batches.

  Returns:
    The results of `Trainer.evaluate`; None when the checkpoint was deleted
    before or while it was read, or cannot be read (one warning line naming
    it; nothing reported).

  Raises:
    ConfigError: the checkpoint does not match the model and optimizer, or
      an argument is invalid.
    DataError: as `Trainer.evaluate`.
  """
  try:
    trainer.restore(data=data, checkpoint=checkpoint)
  except checkpoints.UnreadableCheckpointError as e:  # CheckpointGoneError included.
    why = f"cannot be read ({e})"
    if isinstance(e, checkpoints.CheckpointGoneError):
      why = "was deleted while it was read (the trainer keeps its max_to_keep newest checkpoints)"
    logging.warning(f"Skipped {checkpoint}: it {why}; going on with the newer ones.")
    return None
  return trainer.evaluate(data, global_batch_size=global_batch_size, steps=steps)


def evaluate_new_checkpoints(
    trainer: Trainer,
    data: interfaces.DatasetProvider,
    *,
    final_step: int,
    timeout_seconds: float,
    global_batch_size: int,
    steps: int | None = None,
    poll_seconds: float = POLL_SECONDS,
) -> Evaluation | None:
  """Evaluates each checkpoint of `trainer`'s `model_dir` once as it appears; returns the last evaluation.

  It ends after the checkpoint of `final_step` (or a later one), or once no
  new checkpoint has come for `timeout_seconds` (one warning line says so);
  on SIGTERM or Ctrl-C, after the evaluation under way, with exit status 143
  or 130 (one line says which checkpoints are evaluated).

  Args:
    trainer: a Trainer with the run's model, optimizer and task whose
      `model_dir` is the workdir to watch.
    data: the eval data, as for `Trainer.evaluate`.
    final_step: the step of the last checkpoint (the run's `train_steps`).
    timeout_seconds: how long to wait for a new checkpoint (or the first).
    global_batch_size: the evaluations' global batch size.
    steps: None for all of `data`, or at most this many global batches.
    poll_seconds: how often to read the checkpoint list while waiting.

  Returns:
    The `Evaluation` of the newest checkpoint evaluated (or found evaluated
    in `metrics.jsonl`), or None when there was none.

  Raises:
    ConfigError: `trainer` has no `model_dir`; or as `evaluate_checkpoint`.
    runner.workdir.lock.WorkdirInUseError (a ConfigError): another evaluator
      holds the workdir's evaluator lock.
    DataError: as `evaluate_checkpoint`.
    SystemExit: on SIGTERM (143) or Ctrl-C (130).
  """
  model_dir = trainer.model_dir
  if model_dir is None:
    raise ConfigError("evaluate_new_checkpoints needs a Trainer with a model_dir: the workdir it watches.")
  directory = os.path.join(model_dir, checkpoints.DIRECTORY)
  last: Evaluation | None = None
  taken = -1  # The step of the newest checkpoint taken (evaluated, found evaluated, or skipped).
  since = time.monotonic()  # When the last new checkpoint was taken, or the watch began.
  lock = None  # The evaluator's lock, taken once the workdir exists.
  with stop_signals.StopSignals(in_training=False) as signals, contextlib.ExitStack() as cleanup:
    logging.info(
        f"Evaluating each new checkpoint in {directory} once, until the checkpoint of step {final_step} or "
        f"{timeout_seconds:g} s without a new one."
    )
    while True:
      after = "" if last is None else f"after the checkpoint of step {last.step}"
      if signals.received is not None:
        logging.warning(
            f"Stopped by {stop_signals.NAMES[signals.received]}: the evaluator ends "
            f"{after or 'before its first evaluation'}; run it again to go on (metrics.jsonl keeps what is evaluated)."
        )
        raise SystemExit(exit_codes.STOPPED_BY[signals.received])
      if taken >= final_step:
        return last
      if lock is None and tf.io.gfile.exists(model_dir):
        lock = workdir_lock.acquire(model_dir, mode="continuous_eval", evaluator=True)
        cleanup.callback(lock.release)
      # The list is read again after each evaluation: it may be stale.
      listed = [(path, checkpoint_list.step_of(path)) for path in checkpoint_list.read(directory).paths]
      found = next(((path, step) for path, step in listed if step is not None and step > taken), None)
      if found is None:
        if time.monotonic() - since >= timeout_seconds:
          logging.warning(
              f"No new checkpoint in {directory} for {timeout_seconds:g} s (config.trainer.eval_timeout_seconds): "
              f"the evaluator ends {after or 'without one evaluated'}, before the checkpoint of step {final_step}."
          )
          return last
        time.sleep(poll_seconds)
        continue
      path, taken = found
      metrics: Mapping[str, float] | None = reports.eval_results_at(model_dir, taken)
      if metrics:
        logging.info(f"Not evaluating {path} again: metrics.jsonl holds its evaluation.")
      else:
        metrics = evaluate_checkpoint(trainer, data, path, global_batch_size=global_batch_size, steps=steps)
      since = time.monotonic()
      if metrics is not None:
        last = Evaluation(checkpoint=path, step=taken, metrics=metrics)
