"""What a run tells the user: progress lines, TensorBoard scalars and `metrics.jsonl`."""

from collections.abc import Mapping
import datetime
import os
import time
from typing import Any

from absl import logging
import tensorflow as tf

from runner.outputs import metrics_file

# What tf.summary.scalar (from the tensorboard package, not a dependency) attaches: TensorBoard shows these as scalars.
_SCALAR_METADATA = tf.compat.v1.SummaryMetadata(
    plugin_data=tf.compat.v1.SummaryMetadata.PluginData(plugin_name="scalars"), data_class=1
).SerializeToString()
_THROUGHPUT = ("steps_per_sec", "examples_per_sec")


def summary_dir(model_dir: str, split: str) -> str:
  """Returns the directory of the TensorBoard summaries of `split` ('train' or 'eval') under `model_dir`."""
  return os.path.join(model_dir, "summaries", split)


def train_results_at(model_dir: str, step: int) -> dict[str, float]:
  """Returns the `loss` and metrics of the last train row of `step` in `model_dir`'s metrics rows, or {}.

  {} when the file or such a row is missing; rows that do not parse (a line
  cut short by a kill) are skipped. The throughput (`steps_per_sec`,
  `examples_per_sec`) is left out, as from `Trainer.train`.
  """
  return {name: value for name, value in _last_row(model_dir, "train", step).items() if name not in _THROUGHPUT}


def eval_results_at(model_dir: str, step: int) -> dict[str, float]:
  """Returns the last evaluation at `step` in the metrics of `model_dir` (as `Trainer.evaluate` returned it), or {}.

  {} when the file or such a row is missing; rows that do not parse are skipped.
  """
  return _last_row(model_dir, "eval", step)


def _last_row(model_dir: str, split: str, step: int) -> dict[str, float]:
  """The values of the last row of `split` and `step` in the metrics of `model_dir` (without those two keys), or {}."""
  rows = [row for row in metrics_file.rows(model_dir, step=step) if isinstance(row, dict)]
  found = [row for row in rows if row.get("split") == split and row.get("step") == step]
  return {name: value for name, value in (found or [{}])[-1].items() if name not in ("split", "step")}


class Reporter:
  """Reports each train loop and each evaluation.

  Every worker logs one progress line per report. The chief (alone) also
  writes TensorBoard scalars to `summaries/train` and `summaries/eval` under
  `model_dir` (or `train` and `eval` under `summary_dir`), and one JSON object
  per report to `model_dir/metrics.jsonl`:
  `{"split": "train" | "eval", "step": int, "loss": float, <metric>: float, ...}`,
  train rows with `steps_per_sec` and `examples_per_sec`, eval rows with
  `num_examples`. Rows go through `metrics_file.Appender`: on a local
  workdir each row is on disk when the report returns; on a remote one
  (`gs://`) rows are written as a new part at `flush` or after a minute,
  never by rewriting what is written. A trainer and an evaluator beside it
  can write to one workdir's metrics, local or remote, and neither loses a
  row (`runner.outputs.metrics_file`).
  Scalars are buffered (see `_BufferedScalars`); the Trainer flushes at the end
  of every train and evaluate call.

  A run that resumes at step S trains again the steps a stopped run took past
  its last checkpoint: `resume_at(S)` has the rows of `metrics.jsonl` past S
  dropped, so each step has one row. TensorBoard's event files have no such
  purge: TensorBoard shows both runs' points for the replayed steps.
  """

  def __init__(self, model_dir: str | None, *, is_chief: bool, summary_dir: str | None = None) -> None:
    """Initializes the `Reporter`.

    Args:
      model_dir: the run's directory, or None to only log.
      is_chief: whether this worker writes files.
      summary_dir: where the TensorBoard summaries go; None: `model_dir/summaries`.
    """
    self._dir = model_dir if is_chief else None
    self._summary_dir = summary_dir or os.path.join(model_dir or "", "summaries")
    self._rows = None if self._dir is None else metrics_file.Appender(self._dir)
    self._scalars: dict[str, _BufferedScalars] = {}  # split -> _BufferedScalars
    self._resumed = False  # Whether `resume_at` was called.
    self._replayed_after: int | None = None  # The step it gave, until the rows past it are dropped.

  def resume_at(self, step: int) -> None:
    """Says that training (re)starts at global step `step`: rows of `metrics.jsonl` past it are dropped.

    They were written by a run that stopped (killed, crashed) before its
    next checkpoint, whose steps this run trains again. They are dropped
    when this run writes its first row, so a run that fails before leaves
    the file as it was. Only the first call counts: later ones come from
    this process, which wrote no row past its own step.
    """
    if self._dir is not None and not self._resumed:
      self._resumed, self._replayed_after = True, step

  def train_loop(
      self,
      *,
      step: int,
      total_steps: int,
      results: Mapping[str, float],
      learning_rate: float,
      steps_per_sec: float,
      examples_per_sec: float,
      tracing_seconds: float | None = None,
  ) -> None:
    """Reports one train loop.

    Args:
      step: the global step at its end.
      total_steps: the step training runs to.
      results: `loss` and every metric, floats.
      learning_rate: the optimizer's learning rate after the loop.
      steps_per_sec: the loop's steps per second (tracing excluded).
      examples_per_sec: the loop's examples per second (tracing excluded).
      tracing_seconds: None, or the time tracing the loop took before it
        (shown apart: the ETA counts steps only).
    """
    eta = datetime.timedelta(seconds=round((total_steps - step) / steps_per_sec)) if steps_per_sec > 0 else "?"
    traced = "" if tracing_seconds is None else f"traced in {tracing_seconds:.1f} s, then "
    logging.info(
        f"step {step}/{total_steps}: {_formatted(results)} | {traced}{steps_per_sec:.1f} steps/s, "
        f"{examples_per_sec:.0f} examples/s, ETA {eta}"
    )
    throughput = {"steps_per_sec": steps_per_sec, "examples_per_sec": examples_per_sec}
    self._write("train", step, {**results, **throughput}, {**results, "learning_rate": learning_rate, **throughput})

  def evaluation(self, *, step: int, results: Mapping[str, float], seconds: float) -> None:
    """Reports one evaluation: `results` holds `loss`, every metric and `num_examples`."""
    logging.info("eval at step %d: %s (%.1f s)", step, _formatted(results), seconds)
    self._write("eval", step, results, results)

  def summaries_of(self, split: str) -> str:
    """Returns the directory of the TensorBoard summaries of `split` ('train' or 'eval')."""
    return os.path.join(self._summary_dir, split)

  def flush(self) -> None:
    """Writes buffered TensorBoard scalars and `metrics.jsonl` rows to disk."""
    for scalars in self._scalars.values():
      scalars.flush()
    if self._rows is not None:
      self._rows.flush()

  def close(self) -> None:
    """Flushes, then closes `metrics.jsonl` and the TensorBoard writers; a later report opens them again."""
    self.flush()
    for scalars in self._scalars.values():
      scalars.writer.close()
    self._scalars = {}
    if self._rows is not None:
      self._rows.close()

  def _write(self, split: str, step: int, row: Mapping[str, Any], scalars: Mapping[str, float]) -> None:
    """Appends `row` to `metrics.jsonl` (first dropping replayed rows) and buffers `scalars`, where files are."""
    if self._dir is None or self._rows is None:
      return
    if self._replayed_after is not None:
      self._rows.close()
      metrics_file.drop_rows_past(self._dir, self._replayed_after)
      self._replayed_after = None
    self._rows.append({"split": split, "step": step, **row})
    if split not in self._scalars:
      self._scalars[split] = _BufferedScalars(self.summaries_of(split))
    self._scalars[split].add(step, scalars)


class _BufferedScalars:
  """The TensorBoard scalars of one split, written in batches by one `tf.function` call.

  Writing a scalar eagerly runs ops of its own, too much per loop when a
  loop is one short step; buffered, a report costs a list append.
  Rows are written every `MAX_ROWS` rows or `MAX_SECONDS` seconds and on
  `flush` (TensorBoard's own writer buffers up to 2 minutes anyway).
  """

  MAX_ROWS = 100
  MAX_SECONDS = 10.0

  def __init__(self, directory: str) -> None:
    self.writer = tf.summary.create_file_writer(directory)
    self._names: tuple[str, ...] = ()
    self._write: Any = None  # The concrete function that writes rows of `_names`.
    self._steps: list[int] = []
    self._rows: list[list[float]] = []
    self._last_write = time.monotonic()

  def add(self, step: int, scalars: Mapping[str, float]) -> None:
    """Buffers `scalars` (name -> float) at `step`; writes the buffer when it is due."""
    if tuple(scalars) != self._names:
      self.flush()
      self._names, self._write = tuple(scalars), self._writer_function(tuple(scalars))
    self._steps.append(step)
    self._rows.append(list(scalars.values()))
    if len(self._rows) >= self.MAX_ROWS or time.monotonic() - self._last_write >= self.MAX_SECONDS:
      self.flush()

  def flush(self) -> None:
    if self._rows:
      self._write(tf.constant(self._steps, tf.int64), tf.constant(self._rows, tf.float32))
      self._steps, self._rows = [], []
    self.writer.flush()
    self._last_write = time.monotonic()

  def _writer_function(self, names: tuple[str, ...]) -> Any:
    writer = self.writer  # Not `self`: the function would keep it alive in a cycle.

    @tf.function(input_signature=[tf.TensorSpec([None], tf.int64), tf.TensorSpec([None, len(names)], tf.float32)])
    def write(steps: tf.Tensor, rows: tf.Tensor) -> None:
      with writer.as_default():
        for i in tf.range(tf.shape(steps)[0]):
          for j, name in enumerate(names):
            tf.summary.write(name, rows[i, j], step=steps[i], metadata=_SCALAR_METADATA)

    return write.get_concrete_function()


def _formatted(results: Mapping[str, float]) -> str:
  """`name value, ...`: floats to 4 significant digits."""
  return ", ".join(f"{name} {v:.4g}" if isinstance(v, float) else f"{name} {v}" for name, v in results.items())
