"""Vertex AI: its output directories (`AIP_*`) and the metric reported for its tuning, set to local paths here."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import runner
from runner.outputs import metrics_file
from strategies import ConfigError
from testlib import paths

SYNTHETIC = os.path.join(paths.REPO, "configs", "synthetic.py")


def _config(**trainer):
  """Synthetic data, trained 3 steps in loops of 1, evaluated at step 2 and (the final evaluation) at 3."""
  return {
      "strategy": {"name": "one_device"},
      "data": {"name": "synthetic", "global_batch_size": 32, "num_examples": 256, "num_eval_examples": 64},
      "model": {"hidden_units": (8,)},
      "trainer": {"train_steps": 3, "steps_per_loop": 1, "eval_every": 2, **trainer},
  }


def _vertex(monkeypatch, tmp_path):
  """Sets Vertex's variables to folders under `tmp_path`; returns them by variable."""
  dirs = {
      name: str(tmp_path / folder)
      for name, folder in (
          ("AIP_CHECKPOINT_DIR", "checkpoints"),
          ("AIP_TENSORBOARD_LOG_DIR", "logs"),
          ("AIP_MODEL_DIR", "model"),
      )
  }
  for name, path in dirs.items():
    monkeypatch.setenv(name, path)
  return dirs


def test_without_a_workdir_the_outputs_go_where_vertex_says_and_each_evaluation_is_reported(monkeypatch, tmp_path):
  dirs = _vertex(monkeypatch, tmp_path)
  metric_file = tmp_path / "hypertune" / "output.metrics"
  monkeypatch.setenv("CLOUD_ML_HP_METRIC_FILE", str(metric_file))
  monkeypatch.setenv("CLOUD_ML_TRIAL_ID", "7")
  monkeypatch.delenv("CLOUD_ML_HP_METRIC_TAG", raising=False)

  result = runner.run(_config(report_metric="accuracy"), quiet=True)

  workdir = dirs["AIP_CHECKPOINT_DIR"]
  assert result.workdir == workdir and result.global_step == 3
  assert sorted(os.listdir(workdir)) == ["checkpoints", "config.json", "config_history.jsonl", "metrics.jsonl"]
  assert result.checkpoint_path == os.path.join(workdir, "checkpoints", "ckpt-3")
  for split in ("train", "eval"):
    assert tf.io.gfile.glob(os.path.join(dirs["AIP_TENSORBOARD_LOG_DIR"], split, "events.out.tfevents.*"))
  assert result.export_path == dirs["AIP_MODEL_DIR"]
  features = tf.random.stateless_normal([3, 16], seed=[1, 2])
  (served,) = tf.saved_model.load(dirs["AIP_MODEL_DIR"]).signatures["serving_default"](features).values()
  np.testing.assert_allclose(served, result.model(features), rtol=1e-5)

  evaluations = [row for row in metrics_file.rows(workdir) if row["split"] == "eval"]
  assert [row["step"] for row in evaluations] == [2, 3]  # Every 2 steps, and the final one.
  lines = metric_file.read_text().splitlines()
  reports = [json.loads(line) for line in lines]
  assert lines == [json.dumps(report, sort_keys=True) for report in reports]  # cloudml-hypertune's own format.
  assert [{k: v for k, v in report.items() if k != "timestamp"} for report in reports] == [
      {"accuracy": str(row["accuracy"]), "global_step": str(row["step"]), "trial": "7"} for row in evaluations
  ]
  assert all(isinstance(report["timestamp"], float) for report in reports)


def test_the_tag_comes_from_the_environment_and_a_workdir_given_keeps_every_output(monkeypatch, tmp_path):
  dirs = _vertex(monkeypatch, tmp_path)
  metric_file = tmp_path / "output.metrics"
  monkeypatch.setenv("CLOUD_ML_HP_METRIC_FILE", str(metric_file))
  monkeypatch.setenv("CLOUD_ML_HP_METRIC_TAG", "val_loss")
  monkeypatch.delenv("CLOUD_ML_TRIAL_ID", raising=False)

  result = runner.run(_config(report_metric="loss", train_steps=2), str(tmp_path / "run"), quiet=True)

  assert result.export_path is None and not any(os.path.exists(path) for path in dirs.values())
  assert "summaries" in os.listdir(tmp_path / "run")
  (report,) = [json.loads(line) for line in metric_file.read_text().splitlines()]
  assert (report["val_loss"], report["global_step"], report["trial"]) == (str(result.eval_metrics["loss"]), "2", "0")


def test_a_report_metric_the_evaluation_does_not_produce_is_an_error_naming_those_it_does(tmp_path):
  with pytest.raises(ConfigError) as error:
    runner.run(_config(report_metric="acuracy"), str(tmp_path / "run"), quiet=True)
  assert str(error.value) == (
      "report_metric='acuracy' is not a result of the evaluation. Did you mean 'accuracy'? "
      "The evaluation reports: loss, accuracy."
  )
  assert not os.path.exists(tmp_path / "run")
  with pytest.raises(ConfigError, match=r"report_metric='loss' reports each evaluation during training, and mode"):
    runner.run({**_config(report_metric="loss"), "mode": "train"}, str(tmp_path / "run"), quiet=True)


def test_a_vertex_directory_that_cannot_be_written_is_an_error_naming_its_variable(monkeypatch, tmp_path):
  dirs = _vertex(monkeypatch, tmp_path)
  (tmp_path / "model").write_text("a file where Vertex's model folder should be")
  with pytest.raises(ConfigError) as error:
    runner.run(_config(), quiet=True)
  assert str(error.value).startswith(f"AIP_MODEL_DIR={dirs['AIP_MODEL_DIR']!r} cannot be written (")
  assert str(error.value).endswith(
      "); the run puts its outputs there when no workdir is given: fix the job's "
      "output directory, or give --workdir."
  )
  assert not os.listdir(dirs["AIP_CHECKPOINT_DIR"])  # Nothing trained, nothing written.


def test_the_dry_run_prints_where_each_output_goes_and_writes_nothing(tmp_path, subprocess_env):
  env = dict(subprocess_env, AIP_CHECKPOINT_DIR=str(tmp_path / "c"), AIP_MODEL_DIR="gs://bucket/model")
  done = subprocess.run(
      [sys.executable, "-m", "runner", f"--config={SYNTHETIC}", "--dry_run", "--config.strategy.name=one_device"],
      env=env,
      cwd=paths.REPO,
      capture_output=True,
      text=True,
      timeout=300,
      check=False,
  )
  assert done.returncode == 0, done.stderr[-3000:]
  assert f"workdir: {tmp_path / 'c'} does not exist yet: a new run\n" in done.stdout
  assert (
      f"vertex: AIP_CHECKPOINT_DIR={tmp_path / 'c'}: the workdir: config.json, metrics.jsonl, checkpoints/\n"
      "vertex: AIP_MODEL_DIR=gs://bucket/model: the SavedModel exported when training ends\n"
  ) in done.stdout
  assert not os.listdir(tmp_path)
