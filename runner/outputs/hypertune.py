"""The metric Vertex AI's hyperparameter tuning reads, written as cloudml-hypertune writes it, without that package."""

from collections import deque
from collections.abc import Sequence
import json
import os
import time
from typing import Any

from runner.interfaces import Action
from runner.interfaces import LoopEnd
from runner.outputs import best

# cloudml-hypertune's defaults (see `ReportMetric`).
METRIC_FILE = "/tmp/hypertune/output.metrics"
_KEPT_REPORTS = 100


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

  def __init__(self, metric: str, *, reported: Sequence[str]) -> None:
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
