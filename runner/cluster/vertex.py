"""Vertex AI: its output directories, and the metric its hyperparameter tuning service reads.

A Vertex AI custom job with a base output directory (and each trial of a
hyperparameter tuning job) names, in every replica, where its outputs go:
`AIP_CHECKPOINT_DIR`, `AIP_TENSORBOARD_LOG_DIR` and `AIP_MODEL_DIR`. A run
given no workdir (`runner.run(config)`, the command line without `--workdir`)
follows them (`output_dirs`): each one set takes the outputs it names, as
any other remote workdir (`gs://`, through `tf.io.gfile`); unset, those stay
where they are without it.
"""

from collections import deque
import json
import os
import time
from typing import Any, NamedTuple
import uuid

import tensorflow as tf

from runner.interfaces import Action
from runner.interfaces import LoopEnd
from runner.outputs import best
from strategies.errors import ConfigError
from strategies.errors import first_line

# cloudml-hypertune's defaults (see `ReportMetric`).
METRIC_FILE = "/tmp/hypertune/output.metrics"
_KEPT_REPORTS = 100


# The variables, the `OutputDirs` field each sets and what goes there.
_VARIABLES = {
    "AIP_CHECKPOINT_DIR": ("workdir", "the workdir: config.json, metrics.jsonl, checkpoints/"),
    "AIP_TENSORBOARD_LOG_DIR": ("summary_dir", "the TensorBoard summaries: train/, eval/"),
    "AIP_MODEL_DIR": ("export_dir", "the SavedModel exported when training ends"),
}


class OutputDirs(NamedTuple):
  """Where a run's outputs go; None: the default without Vertex (see the fields).

  Attributes:
    workdir: `AIP_CHECKPOINT_DIR`: the workdir (config.json,
      config_history.jsonl, metrics.jsonl, checkpoints/, best/, exports/);
      None: a new temporary directory.
    summary_dir: `AIP_TENSORBOARD_LOG_DIR`: the TensorBoard summaries
      (`train/`, `eval/`); None: `WORKDIR/summaries`.
    export_dir: `AIP_MODEL_DIR`: the SavedModel a training run exports when
      it ends (and mode 'export' writes); None: no export after training,
      mode 'export' writes `WORKDIR/export`.
    variables: `{variable: path}` of the Vertex variables these come from.
  """

  workdir: str | None
  summary_dir: str | None = None
  export_dir: str | None = None
  variables: dict[str, str] = {}

  def describe(self) -> list[str]:
    """One line per Vertex variable in use: its name, its path and what goes there."""
    return [f"{name}={path}: {_VARIABLES[name][1]}" for name, path in self.variables.items()]


def output_dirs(workdir: str | None) -> OutputDirs:
  """`OutputDirs(workdir)` for a workdir given; without one, those the Vertex variables set (unset or empty: None)."""
  if workdir is not None:
    return OutputDirs(workdir)
  variables = {name: os.environ[name] for name in _VARIABLES if os.environ.get(name)}
  return OutputDirs(**{_VARIABLES[name][0]: path for name, path in variables.items()}, variables=variables)


def check_writable(dirs: OutputDirs) -> None:
  """Makes each Vertex directory in `dirs` and checks that a file can be written there.

  Raises:
    ConfigError: one cannot be made or written; the message names its variable and path.
  """
  for name, path in dirs.variables.items():
    probe = os.path.join(path, f".write-test-{uuid.uuid4().hex}")
    try:
      tf.io.gfile.makedirs(path)
      with tf.io.gfile.GFile(probe, "w") as f:
        f.write("")
      tf.io.gfile.remove(probe)
    except (tf.errors.OpError, OSError) as e:
      reason = first_line(getattr(e, "message", None) or str(e))
      raise ConfigError(
          f"{name}={path!r} cannot be written ({reason}); the run puts its outputs there when no workdir is "
          "given: fix the job's output directory, or give --workdir."
      ) from None


class ReportMetric(Action):
  """After each evaluation during training, the chief reports `metric` as Vertex AI's hyperparameter tuning reads it.

  It writes what cloudml-hypertune's `report_hyperparameter_tuning_metric`
  writes (GoogleCloudPlatform/cloudml-hypertune, hypertune/hypertune.py),
  without that package: the file `CLOUD_ML_HP_METRIC_FILE` (default
  /tmp/hypertune/output.metrics) is rewritten with this process's latest 100
  reports, one JSON object a line, keys sorted, values as strings but the
  timestamp: `{"global_step": "STEP", TAG: "VALUE", "timestamp": SECONDS,
  "trial": CLOUD_ML_TRIAL_ID (default "0")}`, TAG being
  `CLOUD_ML_HP_METRIC_TAG` if set, else the metric's name.
  """

  def __init__(self, metric: str, *, reported: Any) -> None:
    """Reports `metric`, one of `reported` (the evaluation's result names); ConfigError naming them otherwise."""
    self.metric = best.check_result(metric, reported, field="report_metric")
    self.path = os.environ.get("CLOUD_ML_HP_METRIC_FILE", METRIC_FILE)
    self.tag = os.environ.get("CLOUD_ML_HP_METRIC_TAG") or metric
    self._trial = str(os.environ.get("CLOUD_ML_TRIAL_ID", 0))
    self._reports: deque[dict[str, Any]] = deque(maxlen=_KEPT_REPORTS)

  def __call__(self, loop: LoopEnd) -> None:
    """Reports the loop's evaluation, if it has one, on the chief."""
    if loop.eval_results is None or not loop.is_chief:
      return
    value, step = float(loop.eval_results[self.metric]), str(int(loop.step))
    self._reports.append({"timestamp": time.time(), "trial": self._trial, self.tag: str(value), "global_step": step})
    os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
    with open(self.path, "w") as f:
      f.writelines(json.dumps(report, sort_keys=True) + "\n" for report in self._reports)
