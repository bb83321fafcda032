"""What a run tells the user: progress lines, TensorBoard scalars and `metrics.jsonl`."""

import datetime
import json
import os

from absl import logging
import tensorflow as tf


# What tf.summary.scalar (from the tensorboard package, not a dependency) attaches: TensorBoard shows these as scalars.
_SCALAR_METADATA = tf.compat.v1.SummaryMetadata(
    plugin_data=tf.compat.v1.SummaryMetadata.PluginData(plugin_name="scalars"), data_class=1).SerializeToString()


class Reporter:
  """Reports each train loop and each evaluation.

  Every worker logs one progress line per report. The chief (alone) also
  writes, under `model_dir`, TensorBoard scalars to `summaries/train` and
  `summaries/eval`, and one JSON object per report to `metrics.jsonl`:
  `{"split": "train" | "eval", "step": int, "loss": float, <metric>: float, ...}`,
  train rows with `steps_per_sec` and `examples_per_sec`, eval rows with
  `num_examples`. A local `metrics.jsonl` stays open, line-buffered, so each
  row is on disk when the report returns; a remote one is written on `flush`.
  """

  def __init__(self, model_dir, *, is_chief):
    """Args:
      model_dir: the run's directory, or None to only log.
      is_chief: whether this worker writes files.
    """
    self._dir = model_dir if is_chief else None
    self._jsonl = None
    self._writers = {}

  def train_loop(self, *, step, total_steps, results, learning_rate, steps_per_sec, examples_per_sec):
    """Reports one train loop.

    Args:
      step: the global step at its end.
      total_steps: the step training runs to.
      results: `loss` and every metric, floats.
      learning_rate: the optimizer's learning rate after the loop.
      steps_per_sec, examples_per_sec: the loop's throughput.
    """
    eta = datetime.timedelta(seconds=round((total_steps - step) / steps_per_sec)) if steps_per_sec > 0 else "?"
    logging.info("step %d/%d: %s | %.1f steps/s, %.0f examples/s, ETA %s",
                 step, total_steps, _Formatted(results), steps_per_sec, examples_per_sec, eta)
    if self._dir is None:
      return
    self._write_row({"split": "train", "step": step, **results,
                     "steps_per_sec": steps_per_sec, "examples_per_sec": examples_per_sec})
    self._write_scalars("train", step, {**results, "learning_rate": learning_rate, "steps_per_sec": steps_per_sec,
                                        "examples_per_sec": examples_per_sec})

  def evaluation(self, *, step, results, seconds):
    """Reports one evaluation: `results` holds `loss`, every metric and `num_examples`."""
    logging.info("eval at step %d: %s (%.1f s)", step, _Formatted(results), seconds)
    if self._dir is None:
      return
    self._write_row({"split": "eval", "step": step, **results})
    self._write_scalars("eval", step, results)

  def flush(self):
    """Writes buffered TensorBoard events and `metrics.jsonl` rows to disk."""
    for writer in self._writers.values():
      writer.flush()
    if self._jsonl is not None:
      self._jsonl.flush()

  def _write_row(self, row):
    if self._jsonl is None:
      tf.io.gfile.makedirs(self._dir)
      path = os.path.join(self._dir, "metrics.jsonl")
      # A local file is line-buffered (each row on disk at once); a remote one (gs://...) is written on flush.
      self._jsonl = (tf.io.gfile.GFile(path, "a") if "://" in path
                     else open(path, "a", buffering=1, encoding="utf-8"))
    self._jsonl.write(json.dumps(row) + "\n")

  def _write_scalars(self, split, step, scalars):
    writer = self._writers.get(split)
    if writer is None:
      writer = self._writers[split] = tf.summary.create_file_writer(os.path.join(self._dir, "summaries", split))
    with writer.as_default(step=step):
      for name, value in scalars.items():
        tf.summary.write(name, tf.constant(value, tf.float32), metadata=_SCALAR_METADATA)


class _Formatted:
  """`name value` pairs, formatted only if the log line is emitted."""

  def __init__(self, results):
    self._results = results

  def __str__(self):
    return ", ".join(f"{name} {value:.4g}" if isinstance(value, float) else f"{name} {value}"
                     for name, value in self._results.items())
