"""`runner.run(config)`: the digits example end to end, the modes, and bad input caught before training."""

import dataclasses
import json
import os
import re
import sys
import tempfile
import textwrap

import pytest
import tensorflow as tf

import runner
from strategies import ConfigError
from testlib import paths
from testlib import process_testlib

REPO = paths.REPO
DIGITS = os.path.join(REPO, "configs", "digits.py")
SYNTHETIC = os.path.join(REPO, "configs", "synthetic.py")
SUBPROCESS_TIMEOUT_SECONDS = 300


def _run(arguments, env, tmp_path):
  """`python ARGUMENTS` from the repository; returns `(status, stdout, stderr)`."""
  return process_testlib.Process([sys.executable, *arguments], env=env, logs=tmp_path / "logs").wait(
      timeout=SUBPROCESS_TIMEOUT_SECONDS
  )


@pytest.fixture(scope="module")
def digits_default(tmp_path_factory):
  """Runs `runner.run(runner.load_config('configs/digits.py', ...))` mirrored over 2 logical CPUs, workdir None.

  workdir None -> a temp dir. The README's command (one_device, in a fresh process) is compared with it.
  """
  original, tempfile.tempdir = tempfile.tempdir, str(tmp_path_factory.mktemp("tmp"))
  mirrored = {"strategy.name": "mirrored", "strategy.devices": ("/cpu:0", "/cpu:1")}
  try:
    return runner.run(runner.load_config(DIGITS, mirrored)), tempfile.tempdir
  finally:
    tempfile.tempdir = original


def _quick(mode="train_and_eval", **sections):
  """A synthetic config that trains 40 steps in loops of 20 on one device."""
  config = {
      "mode": mode,
      "strategy": {"name": "one_device"},
      "data": {"name": "synthetic", "global_batch_size": 32, "num_examples": 256, "num_eval_examples": 100},
      "model": {"hidden_units": (16,)},
      "trainer": {"train_steps": 40, "steps_per_loop": 20},
  }
  for section, fields in sections.items():
    config[section] = {**config.get(section, {}), **fields}
  return config


def test_digits_reaches_095_test_accuracy(digits_default):
  result, temporary_root = digits_default
  assert result.eval_metrics["accuracy"] >= 0.95, result.eval_metrics
  assert result.eval_metrics["num_examples"] == 360
  assert result.global_step == 1000 and result.num_replicas == result.strategy.num_replicas_in_sync == 2
  assert os.path.dirname(result.workdir) == temporary_root  # workdir=None made a new temporary directory
  assert result.checkpoint_path == os.path.join(result.workdir, "checkpoints", "ckpt-1000")
  with open(os.path.join(result.workdir, "config.json"), encoding="utf-8") as f:
    written = json.load(f)
  assert written == json.loads(json.dumps(result.config.to_dict()))
  assert written["data"]["name"] == "digits" and written["data"]["eval_global_batch_size"] == 64
  with open(os.path.join(result.workdir, "metrics.jsonl"), encoding="utf-8") as f:
    evals = [row for row in map(json.loads, f) if row["split"] == "eval"]
  assert [row["step"] for row in evals] == [500, 1000]  # eval_every=500, and no second final evaluation
  assert evals[-1]["accuracy"] == pytest.approx(result.eval_metrics["accuracy"])
  with pytest.raises(dataclasses.FrozenInstanceError):
    result.global_step = 0


def test_readme_command_and_mirrored_over_two_logical_cpus_agree(digits_default, tmp_path, subprocess_env):
  """The README's first command (one_device in a fresh process) against the in-process run on 2 replicas.

  Mirrored through the command line (`--config.strategy.virtual_cpus=2`) is test_cli.py's `quiet` case.
  """
  status, stdout, stderr = _run(
      ["-m", "runner", f"--config={DIGITS}", f"--workdir={tmp_path / 'one_device'}"], subprocess_env, tmp_path
  )
  assert status == 0, stderr[-3000:]
  assert "strategy: one_device: 1 replica on CPU:0" in stdout and "workdir: " in stdout
  match = re.search(r"^eval: accuracy=([0-9.]+) loss=[0-9.]+ num_examples=360$", stdout, re.M)
  assert match, stdout
  assert float(match.group(1)) >= 0.95
  assert abs(float(match.group(1)) - digits_default[0].eval_metrics["accuracy"]) <= 0.01


def test_modes_train_eval_export_resume_and_a_finished_run_again(tmp_path):
  first = runner.run(_quick(mode="train"), str(tmp_path))
  assert first.global_step == 40 and first.eval_metrics is None and first.export_path is None
  assert set(first.train_metrics) == {"loss", "accuracy"}
  evaluated = runner.run(_quick(mode="eval"), str(tmp_path))
  assert evaluated.global_step == 40 and evaluated.train_metrics is None
  assert evaluated.eval_metrics["num_examples"] == 100
  exported = runner.run(_quick(mode="export"), str(tmp_path))
  assert exported.export_path == os.path.join(str(tmp_path), "export")
  served = tf.saved_model.load(exported.export_path).signatures["serving_default"]
  outputs = list(served(tf.zeros([3, 16])).values())[0]
  assert outputs.shape == (3, 10)
  resumed = runner.run(_quick(trainer={"train_steps": 60}), str(tmp_path))
  assert resumed.global_step == 60 and resumed.checkpoint_path.endswith("ckpt-60")
  assert resumed.eval_metrics["num_examples"] == 100
  # The finished train_and_eval run again returns its evaluation, without a second row.
  again = runner.run(_quick(trainer={"train_steps": 60}), str(tmp_path))
  assert again.global_step == 60 and again.eval_metrics == resumed.eval_metrics
  assert again.train_metrics == pytest.approx(resumed.train_metrics)  # Step 60's train row, throughput left out.
  with open(tmp_path / "metrics.jsonl", encoding="utf-8") as f:
    rows = [(row["split"], row["step"]) for row in map(json.loads, f)]
  assert rows == [("train", 20), ("train", 40), ("eval", 40), ("train", 60), ("eval", 60)]
  evaluated = runner.run(_quick(mode="eval", trainer={"train_steps": 60}), str(tmp_path))  # Anew, with its own row.
  assert evaluated.eval_metrics == resumed.eval_metrics
  with open(tmp_path / "metrics.jsonl", encoding="utf-8") as f:
    assert [(row["split"], row["step"]) for row in map(json.loads, f)] == rows + [("eval", 60)]


def test_mirrored_in_process_and_separate_eval_batch_size(tmp_path, cpu_devices):
  config = _quick(
      strategy={"name": "mirrored", "devices": tuple(cpu_devices(2))},
      data={"eval_global_batch_size": 50},
      trainer={"eval_steps": 1},
  )
  result = runner.run(config, str(tmp_path))
  assert result.num_replicas == 2
  assert result.eval_metrics["num_examples"] == 50  # eval_steps=1 batch of eval_global_batch_size=50


def test_import_path_model_dataset_and_task_are_called_as_designed(tmp_path, monkeypatch):
  (tmp_path / "plugins.py").write_text(textwrap.dedent("""
      import keras
      import numpy as np
      import tensorflow as tf
      from runner import data, tasks

      CALLS = []

      def line_model(config):
        CALLS.append(("model", config.units))
        return keras.Sequential([keras.layers.Dense(config.units)])

      def line_data(config, split):
        CALLS.append(("data", split, config.slope))
        x = np.linspace(-1, 1, 64, dtype=np.float32)[:, None]
        return data.InMemory(x, config.slope * x, shuffle=split == "train", seed=0)

      def mse(config):
        CALLS.append(("task", config.name))
        return tasks.Regression()
      """))
  monkeypatch.syspath_prepend(str(tmp_path))
  config = {
      "strategy": {"name": "one_device"},
      "data": {"name": "plugins:line_data", "global_batch_size": 16, "slope": 3.0},
      "model": {"name": "plugins:line_model", "units": 1},
      "task": {"name": "plugins:mse"},
      "optimizer": {"learning_rate": 0.1},
      "trainer": {"train_steps": 100, "steps_per_loop": 50},
  }
  result = runner.run(config, str(tmp_path / "work"))
  import plugins  # noqa: PLC0415

  assert ("model", 1) in plugins.CALLS and ("task", "plugins:mse") in plugins.CALLS
  assert ("data", "train", 3.0) in plugins.CALLS and ("data", "eval", 3.0) in plugins.CALLS
  assert result.eval_metrics["mae"] < 0.1
  sys.modules.pop("plugins", None)


def test_batch_size_not_divisible_by_replicas_fails_before_training(tmp_path, cpu_devices):
  config = _quick(strategy={"name": "mirrored", "devices": tuple(cpu_devices(3))})
  with pytest.raises(
      ConfigError,
      match=r"config.data.global_batch_size: global_batch_size=32 does not split "
      r"over the 3 replicas.*multiple of 3, e.g. 30 or 33",
  ):
    runner.run(config, str(tmp_path))
  assert os.listdir(tmp_path) == []  # nothing written, nothing trained
  config = _quick(strategy={"name": "mirrored", "devices": tuple(cpu_devices(2))}, data={"eval_global_batch_size": 25})
  with pytest.raises(
      ConfigError,
      match=r"config.data.eval_global_batch_size: global_batch_size=25 does not split over the 2 replicas",
  ):
    runner.run(config, str(tmp_path))


def test_no_tpu_is_a_config_error_before_anything_is_written(tmp_path):
  with pytest.raises(ConfigError, match=r"strategy 'tpu' with tpu='' found no TPU.*--config.strategy.tpu=local"):
    runner.run(_quick(strategy={"name": "tpu"}), str(tmp_path / "work"))
  assert not (tmp_path / "work").exists()


def test_bad_workdir_and_missing_checkpoint(tmp_path):
  (tmp_path / "a_file").write_text("")
  with pytest.raises(ConfigError, match=r"The workdir '.*a_file/run' cannot be written"):
    runner.run(_quick(), str(tmp_path / "a_file" / "run"))
  with pytest.raises(ConfigError, match=r"Mode 'eval' needs a checkpoint in .*checkpoints, and there is none"):
    runner.run(_quick(mode="eval"), str(tmp_path / "empty"))


def test_functions_returning_the_wrong_thing_are_config_errors(tmp_path, monkeypatch):
  (tmp_path / "wrongs.py").write_text(textwrap.dedent("""
      def not_a_model(config):
        return "model"

      def not_a_dataset(config, split):
        return [1, 2, 3]

      def not_a_task(config):
        return 42
      """))
  monkeypatch.syspath_prepend(str(tmp_path))
  cases = [
      (
          {"model": {"name": "wrongs:not_a_model"}},
          r"model_fn wrongs:not_a_model returned str; it must return a keras\.Model\.",
      ),
      (
          {"data": {"name": "wrongs:not_a_dataset"}},
          r"What the dataset 'wrongs:not_a_dataset' returned for split 'train' must be an unbatched "
          r"tf\.data\.Dataset .* or a runner\.data\.DatasetProvider, got list\.",
      ),
      (
          {"task": {"name": "wrongs:not_a_task"}},
          r"the task function wrongs:not_a_task returned int; it must return a runner\.Task\.",
      ),
  ]
  for i, (sections, message) in enumerate(cases):
    config = {**_quick(), **sections}
    with pytest.raises(ConfigError, match=message):
      runner.run(config, str(tmp_path / f"work{i}"))
  sys.modules.pop("wrongs", None)


def test_a_rerun_that_changes_what_the_checkpoint_holds_fails_and_changes_nothing(tmp_path):
  workdir = str(tmp_path / "work")
  runner.run(_quick(mode="train"), workdir)
  before = process_testlib.files_of(workdir)
  changed_model = _quick(mode="train", model={"hidden_units": (8,)}, trainer={"train_steps": 80})
  with pytest.raises(
      ConfigError,
      match=r"The workdir's checkpoint ckpt-40 was trained with another model, task, "
      r"optimizer, precision or data \(model\.hidden_units: \[16\] -> \[8\]\)\. "
      r"Rerun with the values it was trained with, or use a new --workdir\.",
  ):
    runner.run(changed_model, workdir)
  changed_data = _quick(mode="train", data={"num_features": 8})
  with pytest.raises(ConfigError, match=r"\(training data elements: .*shape=\(16,\).* -> .*shape=\(8,\).*\)"):
    runner.run(changed_data, workdir)
  assert process_testlib.files_of(workdir) == before


def test_a_rerun_that_changes_how_training_goes_on_resumes_and_keeps_the_history(tmp_path, caplog):
  workdir = str(tmp_path / "work")
  runner.run(_quick(mode="train"), workdir)
  with caplog.at_level("INFO", logger="absl"):
    result = runner.run(_quick(mode="train", optimizer={"learning_rate": 5e-4}, trainer={"train_steps": 60}), workdir)
  assert result.global_step == 60
  assert (
      "Resuming at step 40 with a changed config: optimizer.learning_rate 0.001 -> 0.0005, "
      "trainer.train_steps 40 -> 60."
  ) in caplog.text
  history = process_testlib.config_history(workdir)
  assert [(entry["step"], entry["changed"]) for entry in history] == [
      (0, {}),
      (40, {"optimizer.learning_rate": [0.001, 0.0005], "trainer.train_steps": [40, 60]}),
  ]
  assert history[1]["config"]["optimizer"]["learning_rate"] == 0.0005
  with open(os.path.join(workdir, "config.json"), encoding="utf-8") as f:
    assert json.load(f) == history[1]["config"]


def test_a_run_that_fails_before_training_leaves_no_new_workdir(tmp_path):
  workdir = tmp_path / "new"
  with pytest.raises(ConfigError, match=r"Mode 'eval' needs a checkpoint"):
    runner.run(_quick(mode="eval"), str(workdir))
  assert not workdir.exists()


def test_run_from_python_shows_the_clis_progress_and_quiet_silences_it(tmp_path, subprocess_env):
  """A plain Python program (no absl app, no logging set up) calls run() twice: shown, then quiet."""
  script = tmp_path / "program.py"
  script.write_text(textwrap.dedent(f"""
      import sys
      from absl import logging
      import runner

      overrides = {{"mode": "train", "strategy.name": "one_device", "trainer.steps_per_loop": 20}}
      before = logging.get_verbosity()
      runner.run(runner.load_config({SYNTHETIC!r}, {{**overrides, "trainer.train_steps": 40}}), sys.argv[1])
      print("=== quiet ===", file=sys.stderr, flush=True)
      runner.run(runner.load_config({SYNTHETIC!r}, {{**overrides, "trainer.train_steps": 80}}), sys.argv[1],
                 quiet=True)
      print(before, logging.get_verbosity())
      """))
  workdir = tmp_path / "run"
  status, stdout, stderr = _run([str(script), str(workdir)], subprocess_env, tmp_path)
  assert status == 0, stderr[-3000:]
  shown, quiet = stderr.split("=== quiet ===\n")
  assert re.search(rf"from_config.py:\d+\] Mode train in the workdir {re.escape(str(workdir))} \(new\)\.\n", shown)
  progress = re.findall(r"reports.py:\d+\] (step \d+/\d+: .*)", shown)
  assert len(progress) == 2, shown[-3000:]
  # The first loop's line shows the tracing apart; its steps/s (and ETA) count the steps only.
  assert re.fullmatch(
      r"step 20/40: loss [\d.]+, accuracy [\d.]+ \| traced in \d+\.\d s, then [\d.]+ steps/s, "
      r"\d+ examples/s, ETA 0:00:\d\d",
      progress[0],
  ), progress[0]
  assert re.fullmatch(
      r"step 40/40: loss [\d.]+, accuracy [\d.]+ \| [\d.]+ steps/s, \d+ examples/s, ETA 0:00:00", progress[1]
  ), progress[1]
  assert re.search(rf"checkpoints.py:\d+\] Saved checkpoint {re.escape(str(workdir))}/checkpoints/ckpt-40\.\n", shown)
  assert shown.count("step 20/40: ") == 1 and "INFO:absl:" not in shown  # Each line once, in the CLI's format.
  assert not re.search(r"^I\d{4} .*(functional_saver|tensorflow)", shown, re.MULTILINE)  # TensorFlow's INFO hidden.
  assert not re.search(r"^I\d{4} ", quiet, re.MULTILINE), quiet[-3000:]  # Quiet: no INFO line at all.
  assert stdout.split() == ["-1", "-1"]  # absl's verbosity as the program had it.
  assert json.loads((workdir / "metrics.jsonl").read_text().splitlines()[-1])["step"] == 80


def test_config_profile_steps_trace_those_steps_into_the_workdirs_summaries(tmp_path):
  result = runner.run(_quick(mode="train", trainer={"train_steps": 60, "profile_steps": (21, 30)}), str(tmp_path))
  assert result.config.trainer.profile_steps == (21, 30)
  with open(tmp_path / "metrics.jsonl", encoding="utf-8") as f:  # Loops of 20 end at 30 too, the window's last.
    assert [json.loads(line)["step"] for line in f] == [20, 30, 40, 60]
  (trace,) = (tmp_path / "summaries" / "train" / "plugins" / "profile").glob("*/*.xplane.pb")
  assert trace.stat().st_size > 1000


@pytest.mark.parametrize("in_background", [True, False])
def test_config_async_checkpoints_reaches_the_trainer(in_background):
  from runner import from_config  # noqa: PLC0415  (the module behind runner.run)

  config = runner.load_config(SYNTHETIC, {"trainer.async_checkpoints": in_background})
  trainer = from_config.create_trainer(config, tf.distribute.get_strategy(), None)
  assert trainer._options.async_checkpoints is in_background  # noqa: SLF001
