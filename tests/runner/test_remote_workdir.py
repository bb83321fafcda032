"""A whole run on a remote workdir: TensorFlow's in-memory filesystem (`ram://`) stands for `gs://`.

Every file a run reads or writes there goes through `tf.io.gfile`: an `os` or
`open` call on a `ram://` path fails, or makes a local folder `ram:` in the
working directory, which the fixture checks is never made.
"""

import dataclasses
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from tensorboard.backend.event_processing import event_accumulator
import tensorflow as tf

import runner
from runner.outputs import checkpoint_list
from runner.outputs import metrics_file
from runner.workdir import lock as workdir_lock
from strategies import ConfigError
from testlib import paths

SUBPROCESS_TIMEOUT_SECONDS = 120
CONFIG = textwrap.dedent("""
    import ml_collections

    def get_config(steps="20"):
      return ml_collections.ConfigDict({
          "mode": "train_and_eval",
          "strategy": {"name": "one_device"},
          "data": {"name": "synthetic", "global_batch_size": 32, "num_examples": 256, "num_eval_examples": 100},
          "model": {"hidden_units": (16,)},
          "trainer": {"train_steps": int(steps), "steps_per_loop": 10, "seed": 7},
      })
    """)


@pytest.fixture(scope="module")
def remote_runs(tmp_path_factory):
  """Trains 20 steps, resumes to 40, evaluates, exports and predicts, workdir and config file on `ram://`.

  Returns {name: RunResult} ('first', 'resumed', 'eval', 'export', 'predict', and 'local': 40 steps uninterrupted on a
  local workdir), the remote workdir, and the local folder that was the working directory.
  """
  local = tmp_path_factory.mktemp("remote_runs")
  root = f"ram://{local}"  # Unique per test session; ram:// is one namespace for the whole process.
  config_path = f"{root}/configs/tiny.py"
  tf.io.gfile.makedirs(os.path.dirname(config_path))
  with tf.io.gfile.GFile(config_path, "w") as f:
    f.write(CONFIG)
  workdir = f"{root}/work"
  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(workdir_lock, "REMOTE_SETTLE_SECONDS", 0.1)  # One writer here: no other write to wait for.
    patch.chdir(local)
    results = {
        "first": runner.run(runner.load_config(f"{config_path}:20"), workdir, quiet=True),
        "resumed": runner.run(runner.load_config(f"{config_path}:40"), workdir, quiet=True),
        "eval": runner.run(runner.load_config(f"{config_path}:40", ["mode=eval"]), workdir, quiet=True),
        "export": runner.run(runner.load_config(f"{config_path}:40", ["mode=export"]), workdir, quiet=True),
        "predict": runner.run(runner.load_config(f"{config_path}:40", ["mode=predict"]), workdir, quiet=True),
    }
  with tf.io.gfile.GFile(config_path) as remote_file, open(local / "tiny.py", "w", encoding="utf-8") as f:
    f.write(remote_file.read())
  results["local"] = runner.run(runner.load_config(f"{local / 'tiny.py'}:40"), str(local / "work"), quiet=True)
  return results, workdir, local


def test_a_remote_run_trains_resumes_and_writes_nothing_locally(remote_runs):
  results, workdir, local = remote_runs
  assert (results["first"].global_step, results["resumed"].global_step) == (20, 40)
  assert results["resumed"].checkpoint_path == f"{workdir}/checkpoints/ckpt-40"
  assert sorted(os.listdir(local)) == ["tiny.py", "work"]  # No `ram:` folder: no path went through `os` or `open`.
  assert sorted(tf.io.gfile.listdir(workdir)) == [
      "checkpoints",
      "config.json",
      "config_history.jsonl",
      "export",
      "metrics_parts",
      "predictions",
      "summaries",
  ]  # The lock is gone: each run released it; the predictions' temporary folder is gone too.
  history = [row["step"] for row in map(json.loads, _lines(f"{workdir}/config_history.jsonl"))]
  assert history == [0, 20, 40, 40]


def _lines(path):
  with tf.io.gfile.GFile(path) as f:
    return f.read().splitlines()


def test_the_resumed_remote_run_has_the_weights_of_an_uninterrupted_local_one(remote_runs):
  results, _, _ = remote_runs
  for got, want in zip(results["resumed"].model.get_weights(), results["local"].model.get_weights(), strict=True):
    np.testing.assert_array_equal(got, want)
  assert results["resumed"].eval_metrics["loss"] == pytest.approx(results["local"].eval_metrics["loss"], rel=1e-6)


def test_evaluating_a_remote_workdir_restores_its_checkpoint(remote_runs):
  results, _, _ = remote_runs
  assert results["eval"].global_step == 40
  assert results["eval"].eval_metrics["num_examples"] == 100
  assert results["eval"].eval_metrics["loss"] == pytest.approx(results["resumed"].eval_metrics["loss"], rel=1e-6)


def test_the_remote_checkpoint_list_names_both_checkpoints(remote_runs):
  _, workdir, _ = remote_runs
  listed = checkpoint_list.read(f"{workdir}/checkpoints")
  assert [os.path.basename(path) for path in listed.paths] == ["ckpt-20", "ckpt-40"]


def test_remote_predictions_hold_every_eval_example(remote_runs):
  results, workdir, _ = remote_runs
  assert tf.io.gfile.listdir(results["predict"].predictions_path) == ["part-00000.tfrecord"]
  spec = {"index": tf.io.FixedLenFeature([], tf.int64)}
  records = tf.data.TFRecordDataset(f"{workdir}/predictions/part-00000.tfrecord")
  assert [int(tf.io.parse_single_example(record, spec)["index"]) for record in records] == list(range(100))


def test_a_remote_export_loads_and_serves(remote_runs):
  results, workdir, _ = remote_runs
  assert results["export"].export_path == f"{workdir}/export"
  serve = tf.saved_model.load(results["export"].export_path).signatures["serving_default"]
  features = np.random.default_rng(0).normal(size=(5, 16)).astype(np.float32)
  (outputs,) = serve(tf.constant(features)).values()
  np.testing.assert_allclose(outputs.numpy(), results["resumed"].model(features).numpy(), rtol=1e-5, atol=1e-6)


def test_remote_metrics_rows_are_complete_and_in_order(remote_runs):
  results, workdir, _ = remote_runs
  rows = metrics_file.rows(workdir)
  assert [(row["split"], row["step"]) for row in rows] == [
      ("train", 10),
      ("train", 20),
      ("eval", 20),
      ("train", 30),
      ("train", 40),
      ("eval", 40),
      ("eval", 40),  # Mode 'eval' evaluates anew, with a row of its own.
  ]
  assert rows[-1]["loss"] == pytest.approx(results["eval"].eval_metrics["loss"])
  assert not tf.io.gfile.exists(f"{workdir}/{metrics_file.FILE_NAME}")  # Only parts, never one file rewritten.


def test_remote_tensorboard_summaries_are_read_by_tensorboard(remote_runs):
  _, workdir, _ = remote_runs
  steps = {}
  for split in ("train", "eval"):
    accumulator = event_accumulator.EventAccumulator(
        f"{workdir}/summaries/{split}", size_guidance={event_accumulator.TENSORS: 0}
    )
    accumulator.Reload()
    steps[split] = sorted(event.step for event in accumulator.Tensors("loss"))
  assert steps == {"train": [10, 20, 30, 40], "eval": [20, 40, 40]}


def test_a_missing_remote_config_file_is_a_config_error(tmp_path):
  path = f"ram://{tmp_path}/configs/missing.py"
  with pytest.raises(ConfigError, match=rf"^Config file '{path}' does not exist \(from '{path}:tpu'\)\.$"):
    runner.load_config(f"{path}:tpu")


def test_a_config_file_on_an_unknown_filesystem_is_one_error_line(tmp_path, subprocess_env):
  command = [sys.executable, "-m", "runner", "--config=nofs://bucket/run.py", f"--workdir={tmp_path / 'work'}"]
  finished = subprocess.run(
      command,
      env=subprocess_env,
      cwd=paths.REPO,
      capture_output=True,
      text=True,
      timeout=SUBPROCESS_TIMEOUT_SECONDS,
      check=False,
  )
  assert finished.returncode == 2 and "Traceback" not in finished.stderr
  assert [line for line in finished.stderr.splitlines() if line.startswith("error:")] == [
      "error: Config file 'nofs://bucket/run.py' cannot be read (from 'nofs://bucket/run.py'): UnimplementedError: "
      "File system scheme 'nofs' not implemented (file: 'nofs://bucket/run.py')"
  ]
  assert not (tmp_path / "work").exists()


def test_a_lock_of_another_host_on_a_filesystem_without_modification_times_is_never_taken_over(tmp_path):
  workdir = f"ram://{tmp_path}/work"
  tf.io.gfile.makedirs(workdir)
  holder = workdir_lock.Holder(
      host="elsewhere", pid=4242, process_start="", since=0.0, mode="train", command="python -m runner"
  )
  lock_path = f"{workdir}/{workdir_lock.FILE_NAME}"
  with tf.io.gfile.GFile(lock_path, "w") as f:
    f.write(_holder_json(holder))
  assert tf.io.gfile.stat(lock_path).mtime_nsec == 0  # ram:// keeps no modification times.
  with pytest.raises(workdir_lock.WorkdirInUseError) as raised:
    workdir_lock.acquire(workdir, mode="train")
  assert str(raised.value) == (
      f"The workdir {workdir} is in use by another run: {holder.describe()}; the workdir's filesystem keeps no "
      f"modification times, so a lock of another host is never taken over: if that run is gone, remove {lock_path}. "
      f"Wait for it to end, or stop it, or use another --workdir (a killed run's lock {lock_path} is taken over by "
      "the next run)."
  )
  assert _lines(lock_path) == [_holder_json(holder)]  # Untouched.


def _holder_json(holder):
  return json.dumps(dataclasses.asdict(holder), sort_keys=True)
