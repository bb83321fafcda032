"""`python -m runner`: the dry run, a user error as one line without a traceback, an internal error
with one, and the same command on two workers.

Each case is a child process (TensorFlow's import costs seconds), so the
cases run side by side. The digits example through the CLI is in test_run.py.
"""

import json
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import portpicker
import pytest

from runner import exit_codes
from runner.outputs import checkpoints
from runner.outputs import tensorflow_logs
from testlib import paths
from testlib import process_testlib

REPO = paths.REPO
DIGITS = os.path.join(REPO, "configs", "digits.py")
SYNTHETIC = os.path.join(REPO, "configs", "synthetic.py")
SUBPROCESS_TIMEOUT_SECONDS = 600  # A bound for a hang: ~20 TensorFlow processes start at once on a loaded machine.
USER_ERROR_EXIT_CODE = 2
_OWN_FILES = {
    f
    for d in ("runner", "strategies")
    for _, _, files in os.walk(os.path.join(REPO, d))
    for f in files
    if f.endswith(".py")
}


@pytest.fixture(scope="module")
def cli_runs(tmp_path_factory):
  """Runs every case's command line at once; returns {case: (returncode, stdout, stderr, workdir)}."""
  tmp = tmp_path_factory.mktemp("cli")
  (tmp / "explode.py").write_text(textwrap.dedent("""
      def model(config):
        raise RuntimeError("boom: a bug in the model function")
      """))
  (tmp / "nans.py").write_text(textwrap.dedent("""
      import numpy as np
      import runner

      def data(config, split):
        return runner.data.InMemory(np.full((64, 16), np.nan, np.float32), np.zeros(64, np.int32))

      def overflow_at_step_7(config, split):  # A finite target whose squared error overflows: the loss is inf.
        targets = np.zeros((64, 1), np.float32)
        targets[52] = 3e38  # In the batch of step 7 at a global batch of 8.
        return runner.data.InMemory(np.ones((64, 16), np.float32), targets)
      """))
  (tmp / "owndata.py").write_text(textwrap.dedent("""
      import numpy as np
      import runner

      @runner.config_fields(train_files="", shuffle_buffer=0)
      def files(config, split):
        return runner.data.InMemory(np.zeros((64, 16), np.float32), np.zeros(64, np.int32))
      """))
  (tmp / "mistakes.py").write_text(textwrap.dedent("""
      import numpy as np
      import tensorflow as tf

      def labels(config, split):  # Class ids up to 19 for the config's 10-class model.
        return tf.data.Dataset.from_tensor_slices((np.ones((64, 16), np.float32), np.arange(64) % 20))
      """))
  (tmp / "records.py").write_text(textwrap.dedent("""
      import tensorflow as tf
      import runner

      def parse(record):
        example = tf.io.parse_single_example(record, {"x": tf.io.FixedLenFeature([16], tf.float32),
                                                      "y": tf.io.FixedLenFeature([], tf.int64)})
        return example["x"], example["y"]

      def short_features(config, split):
        return runner.data.TFRecordFiles(__file__.replace("records.py", "short.tfrecord"), parse)

      def short_eval_features(config, split):  # Training records that parse, evaluation records that do not.
        name = "full.tfrecord" if split == "train" else "short.tfrecord"
        return runner.data.TFRecordFiles(__file__.replace("records.py", name), parse)
      """))
  _write_records(str(tmp / "short.tfrecord"), num_values=3)
  _write_records(str(tmp / "full.tfrecord"), num_values=16)
  env = dict(os.environ)
  env["PYTHONPATH"] = os.pathsep.join([REPO, str(tmp), env.get("PYTHONPATH", "")])
  env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  cases = {
      # The loop size as configs/digits.py leaves it (auto, evaluations every 500 steps); a dataset function of its
      # own, with the fields it declares.
      "dry_run": [
          f"--config={SYNTHETIC}",
          "--dry_run",
          "--mode=train",
          "--config.strategy.name=mirrored",
          "--config.strategy.virtual_cpus=2",
          "--config.trainer.train_steps=300",
          "--config.trainer.steps_per_loop=None",
          "--config.trainer.eval_every=500",
          "--noconfig.trainer.jit_compile",
          "--config.data.name=owndata:files",
          "--config.data.train_files=/data/train-*.rec",
      ],
      "internal_error": [
          f"--config={SYNTHETIC}",
          "--config.model.name=explode:model",
          "--config.trainer.train_steps=10",
          "--config.trainer.steps_per_loop=10",
          "--config.trainer.eval_every=None",
      ],
  }
  # Two data mistakes, one found in the batches and one in the files; the others' messages are checked in process
  # (tests/runner/data/test_data_mistakes.py): the command line turns every DataError into its line alike.
  for mistake in ("mistakes:labels", "records:short_features"):
    cases[f"data_{mistake.partition(':')[2]}"] = [
        f"--config={SYNTHETIC}",
        "--mode=train",
        f"--config.data.name={mistake}",
        "--config.trainer.train_steps=10",
        "--config.trainer.steps_per_loop=5",
    ]
  cases["eval_short_features"] = [
      f"--config={SYNTHETIC}",
      "--config.data.name=records:short_eval_features",
      "--config.data.global_batch_size=8",
      "--config.trainer.train_steps=4",
      "--config.trainer.steps_per_loop=2",
  ]
  cases["own_field_typo"] = [
      f"--config={SYNTHETIC}",
      "--config.data.name=owndata:files",
      "--config.data.train_file=/data/train-*.rec",
  ]
  cases["nan_features"] = [
      f"--config={SYNTHETIC}",
      "--mode=train",
      "--config.data.name=nans:data",
      "--config.trainer.train_steps=10",
      "--config.trainer.steps_per_loop=5",
  ]
  cases["diverges_after_checkpoint"] = [  # Checked steps 1-4, ckpt-4, unchecked 5-8 rerun checked from ckpt-4.
      f"--config={SYNTHETIC}:regression",
      "--mode=train",
      "--config.data.name=nans:overflow_at_step_7",
      "--config.data.global_batch_size=8",
      "--config.trainer.train_steps=12",
      "--config.trainer.steps_per_loop=4",
      "--config.trainer.checkpoint_every=4",
  ]
  # TensorFlow's log level as a user leaves it (unset: start-up chatter hidden) or sets it (0: everything).
  cases["quiet"] = [
      f"--config={SYNTHETIC}",
      "--config.strategy.name=mirrored",
      "--config.strategy.virtual_cpus=2",
      "--config.trainer.train_steps=40",
      "--config.trainer.steps_per_loop=20",
  ]
  # A quoted `~` reaches the runner as it is; run in a folder of its own, with a home of its own, at log level 3.
  # Its batch is larger than the data and its precision float16 on CPUs: a warning line each.
  cases["tilde"] = [
      f"--config={SYNTHETIC}",
      "--mode=train",
      "--config.data.num_examples=48",
      "--config.trainer.precision=mixed_float16",
      "--config.trainer.train_steps=2",
      "--config.trainer.steps_per_loop=2",
  ]
  (tmp / "tilde_cwd").mkdir()
  (tmp / "tilde_home").mkdir()
  # data_labels: TF imported by the config's module. The other cases set level 2, as tests do.
  # dry_run at 1; dry_run_resume (below) at 0.
  log_levels = {"quiet": None, "data_labels": None, "dry_run": "1", "tilde": "3"}
  hosts = tuple(f"localhost:{portpicker.pick_unused_port()}" for _ in range(2))
  for index in range(2):
    cases[f"worker_{index}"] = [
        f"--config={SYNTHETIC}",
        "--config.strategy.name=multi_worker_mirrored",
        f"--config.strategy.worker_hosts={hosts!r}",
        f"--config.strategy.task_index={index}",
        "--config.trainer.train_steps=20",
    ]
  workdirs = {case: tmp / ("workers" if case.startswith("worker_") else case) for case in cases}  # one shared
  workdirs["tilde"] = tmp / "tilde_home" / "runs" / "x"  # Where --workdir=~/runs/x must go.
  (tmp / "quiet_tmpdir").mkdir()
  temp_dirs = {"quiet": str(tmp / "quiet_tmpdir")}  # The run's own temporary folder, checked after it.
  processes = {
      case: subprocess.Popen(
          [sys.executable, "-m", "runner", "--workdir=~/runs/x" if case == "tilde" else f"--workdir={workdirs[case]}"]
          + args,
          env=dict(
              _with_log_level(env, log_levels.get(case, env["TF_CPP_MIN_LOG_LEVEL"])),
              TMPDIR=temp_dirs.get(case, env["TMPDIR"]),  # conftest sets one
              HOME=str(tmp / "tilde_home") if case == "tilde" else env["HOME"],
          ),
          cwd=tmp / "tilde_cwd" if case == "tilde" else REPO,
          stdout=subprocess.PIPE,
          stderr=subprocess.PIPE,
          text=True,
      )
      for case, args in cases.items()
  }

  def finish(case):
    stdout, stderr = processes[case].communicate(timeout=SUBPROCESS_TIMEOUT_SECONDS)
    return processes[case].returncode, stdout, stderr, workdirs[case]

  # Once the run "quiet" (40 steps) has finished, dry runs on its workdir beside the others: one taking it further,
  # one with another model; and mode predict, over an eval split of 101 examples (neither 64 nor 2 replicas divide it).
  results = {"quiet": finish("quiet")}
  listing = process_testlib.listing(workdirs["quiet"])
  for case, args in {
      "dry_run_resume": ["--config.trainer.train_steps=100", "--config.trainer.steps_per_loop=20"],
      "dry_run_other_model": ["--config.model.hidden_units=(8,)"],
      "predict": ["--mode=predict", *cases["quiet"][1:], "--config.data.num_eval_examples=101"],
  }.items():
    workdirs[case] = workdirs["quiet"]
    dry_run = [] if case == "predict" else ["--dry_run"]
    processes[case] = subprocess.Popen(
        [sys.executable, "-m", "runner", f"--workdir={workdirs['quiet']}", f"--config={SYNTHETIC}", *dry_run, *args],
        env=_with_log_level(env, "0") if case == "dry_run_resume" else env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
  results.update({case: finish(case) for case in processes if case != "quiet"})
  predictions = os.path.join(workdirs["quiet"], "predictions", "")
  unchanged = [file for file in process_testlib.listing(workdirs["quiet"]) if not file[0].startswith(predictions)]
  assert unchanged == listing, "a dry run or mode predict changed the workdir"
  return results


def _write_records(path, *, num_values):
  """Writes 8 tf.train.Examples whose feature 'x' holds `num_values` floats (records.py's parse reads 16)."""
  import tensorflow as tf  # noqa: PLC0415  # Only this fixture needs it.

  with tf.io.TFRecordWriter(path) as writer:
    for label in range(8):
      writer.write(
          tf.train.Example(
              features=tf.train.Features(
                  feature={
                      "x": tf.train.Feature(float_list=tf.train.FloatList(value=[1.0] * num_values)),
                      "y": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
                  }
              )
          ).SerializeToString()
      )


def _with_log_level(env, level):
  env = {k: v for k, v in env.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
  return env if level is None else dict(env, TF_CPP_MIN_LOG_LEVEL=level)


def _error_lines(stderr):
  return [line for line in stderr.splitlines() if line.startswith("error:")]


def test_dry_run_prints_the_plan_and_writes_nothing(cli_runs):
  returncode, stdout, stderr, workdir = cli_runs["dry_run"]
  assert returncode == 0, stderr[-3000:]
  assert "\nmode: train\n" in stdout and "  train_steps: 300\n" in stdout and "  jit_compile: false\n" in stdout
  assert "strategy: mirrored: 2 replicas on CPU:0, CPU:1" in stdout
  assert "replicas: 2" in stdout
  assert "per-replica batch size: train 32, eval 32" in stdout
  assert f"workdir: {workdir} does not exist yet: a new run" in stdout
  # At most 1000 steps, lowered to a divisor of the evaluations' cadence (eval_every=500).
  assert (
      "plan: mode train: train to step 300 in loops of a size chosen from the measured step time (auto: at most "
      "500 steps, host overhead under 2%)"
  ) in stdout
  assert not workdir.exists()


def test_a_dry_run_on_a_finished_workdir_says_it_would_resume_and_from_which_step(cli_runs):
  returncode, stdout, stderr, workdir = cli_runs["dry_run_resume"]  # The fixture checks it wrote nothing.
  assert returncode == 0, stderr[-3000:]
  assert f"workdir: {workdir} holds a run at step 40 (checkpoint ckpt-40): it would resume from step 40" in stdout
  assert (
      "plan: mode train_and_eval: train from step 40 to step 100 in 3 loop(s) of up to 20 steps; then evaluate "
      "all of the eval split"
  ) in stdout


def test_a_dry_run_on_a_workdir_trained_with_another_model_refuses_as_the_run_does(cli_runs):
  returncode, stdout, stderr, _ = cli_runs["dry_run_other_model"]  # The fixture checks it wrote nothing.
  assert returncode == USER_ERROR_EXIT_CODE, stderr[-3000:]
  assert _error_lines(stderr) == [  # The line of the real run (test_run.py).
      "error: The workdir's checkpoint ckpt-40 was trained with another model, task, optimizer, precision or data "
      "(model.hidden_units: [64] -> [8]). Rerun with the values it was trained with, or use a new --workdir."
  ]
  assert "Traceback" not in stderr and "would resume" not in stdout and "plan:" not in stdout


def test_mode_predict_writes_every_eval_example_once_to_the_predictions_folder(cli_runs):
  """Mirrored over 2 logical CPUs; the fixture checks that it changed no other file of the workdir."""
  import tensorflow as tf  # noqa: PLC0415  # As `_write_records`.

  returncode, stdout, stderr, workdir = cli_runs["predict"]
  assert returncode == 0, stderr[-3000:]
  assert stdout.endswith(f"global step: 40\npredictions: {workdir / 'predictions'}\n")
  assert os.listdir(workdir / "predictions") == ["part-00000.tfrecord"]
  spec = {"index": tf.io.FixedLenFeature([], tf.int64), "outputs": tf.io.FixedLenFeature([10], tf.float32)}
  records = tf.data.TFRecordDataset(str(workdir / "predictions" / "part-00000.tfrecord"))
  assert [int(tf.io.parse_single_example(record, spec)["index"]) for record in records] == list(range(101))


def test_a_quoted_tilde_in_the_workdir_is_the_home_folder(cli_runs):
  returncode, stdout, stderr, workdir = cli_runs["tilde"]
  assert returncode == 0, stderr[-3000:]
  assert f"workdir: {workdir}\n" in stdout and (workdir / "checkpoints" / "ckpt-2.index").exists()
  assert os.listdir(workdir.parent.parent.parent / "tilde_cwd") == []  # No folder '~' where the run started.


def test_an_internal_error_keeps_its_traceback(cli_runs):
  returncode, _, stderr, _ = cli_runs["internal_error"]
  assert returncode == 1
  assert "Traceback (most recent call last)" in stderr
  assert "RuntimeError: boom: a bug in the model function" in stderr
  assert not _error_lines(stderr)


def test_the_same_command_trains_on_two_workers(cli_runs):
  eval_lines = []
  for index in range(2):
    returncode, stdout, stderr, workdir = cli_runs[f"worker_{index}"]
    assert returncode == 0, stderr[-3000:]
    assert f"2 replicas on 2 workers; this is worker:{index}" in stdout
    assert "global step: 20" in stdout
    eval_lines += [line for line in stdout.splitlines() if line.startswith("eval: ")]
  assert len(eval_lines) == 2 and eval_lines[0] == eval_lines[1]  # the workers agree
  assert eval_lines[0].endswith(" num_examples=512")  # every eval example counted once over both workers
  assert sorted(os.listdir(workdir)) == [
      "checkpoints",
      "config.json",
      "config_history.jsonl",
      "metrics.jsonl",
      "summaries",
  ]


def test_a_dataset_functions_declared_fields_are_set_and_shown_by_the_dry_run(cli_runs):
  returncode, stdout, stderr, _ = cli_runs["dry_run"]
  assert returncode == 0, stderr[-3000:]
  assert "  name: owndata:files\n" in stdout
  assert "  shuffle_buffer: 0\n  train_files: /data/train-*.rec\n" in stdout
  assert "num_examples" not in stdout  # The config file's synthetic fields, at their defaults, are dropped.


def test_a_typo_in_a_declared_field_is_one_line_with_a_did_you_mean(cli_runs):
  returncode, _, stderr, workdir = cli_runs["own_field_typo"]
  assert returncode == USER_ERROR_EXIT_CODE
  assert "Traceback" not in stderr
  assert _error_lines(stderr) == [
      "error: Override 'data.train_file=/data/train-*.rec': config.data has no field 'train_file'. Did you mean "
      "'train_files'? Fields of config.data: eval_global_batch_size, global_batch_size, name, predict_split, "
      "service, service_mode, sharding, shuffle_buffer, train_files."
  ]
  assert not workdir.exists()


# An absl log line: level, date, time, thread, file:line] message.
_LOG_LINE = re.compile(r"^[IWEF]\d{4} [\d:.]+ +\d+ (?P<file>[\w.]+):\d+\] ")


def _foreign_lines(stderr):
  """The lines of `stderr` that are neither the project's own log lines nor an `error:` line."""
  return [
      line
      for line in stderr.splitlines()
      if not line.startswith("error:") and not (_LOG_LINE.match(line) and _LOG_LINE.match(line)["file"] in _OWN_FILES)
  ]


def test_a_successful_run_prints_only_the_projects_own_lines_on_stderr(cli_runs):
  returncode, stdout, stderr, _ = cli_runs["quiet"]
  assert returncode == 0, stderr[-3000:]
  assert "global step: 40" in stdout
  lines = stderr.splitlines()
  assert not _foreign_lines(stderr), "\n".join(_foreign_lines(stderr))
  assert sum(bool(re.search(r"reports.py:\d+\] step \d+/40: ", line)) for line in lines) == 2  # One per loop.


def test_a_run_leaves_nothing_in_the_temporary_folder(cli_runs):
  """AutoGraph writes a module per converted function there; the CLI's exit skips its atexit removal, so deletes them."""
  returncode, _, stderr, workdir = cli_runs["quiet"]
  assert returncode == 0, stderr[-3000:]
  assert os.listdir(workdir.parent / "quiet_tmpdir") == []


@pytest.mark.parametrize("case", ["dry_run", "predict", "tilde"])
def test_a_log_level_from_1_on_is_as_quiet_as_none(cli_runs, case):
  """TF_CPP_MIN_LOG_LEVEL 1 (dry_run), 2 (predict, mirrored) and 3 (tilde: a run that saves a checkpoint), as quiet
  as unset (the test above); 0 shows TensorFlow's lines (the test below).
  """
  returncode, _, stderr, _ = cli_runs[case]
  assert returncode == 0, stderr[-3000:]
  assert not _foreign_lines(stderr), "\n".join(_foreign_lines(stderr))


def test_a_user_who_sets_the_log_level_sees_tensorflows_output(cli_runs):
  returncode, stdout, stderr, _ = cli_runs["dry_run_resume"]  # At level 0.
  assert returncode == 0, stderr[-3000:]
  assert "dry run: nothing trained or written." in stdout
  assert "cpu_feature_guard" in stderr or "oneDNN" in stderr or "cudart_stub" in stderr


def test_lines_other_than_the_start_up_chatter_are_kept(capfd):
  chatter = (
      "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n"
      "I0000 00:00:1795419967.489718    8804 cudart_stub.cc:31] Could not find cuda drivers on your machine, "
      "GPU will not be used.\n"
  )
  real = "E0000 00:00:1795419967.5 8804 some_op.cc:12] a real error\nTraceback (most recent call last):\n"
  with tensorflow_logs._filtered_stderr(tensorflow_logs._is_chatter):  # noqa: SLF001
    os.write(2, (chatter + real).encode())
  assert capfd.readouterr().err == real


def test_non_finite_features_are_one_error_line_with_status_2_and_no_workdir(cli_runs):
  returncode, _, stderr, workdir = cli_runs["nan_features"]
  assert returncode == USER_ERROR_EXIT_CODE, stderr[-3000:]
  assert _error_lines(stderr) == [
      "error: The training data's features hold NaN or inf values in the batch of step 1; training stopped there, "
      "and no checkpoint holds weights from that step on. Find them with tf.debugging.check_numerics in the "
      "dataset, or leave such examples out (dataset.filter)."
  ]
  assert "Traceback" not in stderr
  assert not workdir.exists()  # The run created it and wrote no checkpoint: it is gone.


def test_a_loop_that_diverges_after_a_checkpoint_exits_3_naming_its_first_bad_step(cli_runs):
  returncode, _, stderr, workdir = cli_runs["diverges_after_checkpoint"]
  assert returncode == exit_codes.NON_FINITE, stderr[-3000:]
  (line,) = _error_lines(stderr)
  assert line.startswith(
      "error: Training stopped at step 7: the loss became inf; the batch's features and labels"
  ), line
  assert checkpoints.latest_step(str(workdir)) == 4
  assert all(np.all(np.isfinite(value)) for value in process_testlib.final_checkpoint_values(workdir).values())


@pytest.mark.parametrize(
    "case, message",
    [
        (
            "data_labels",
            "error: The training data's batch of step 1 holds a label outside the task's range: example 10 of "
            "the data (counting from 0) has label 10, but labels must be integers in [0, 10) (class ids of a "
            "model with 10 outputs (classes)).",
        ),
        (
            "data_short_features",
            "error: The training data cannot be parsed at step 1: {tmp}/short.tfrecord, record 0 "
            "(counting from 0): Key: x. Can't parse serialized Example: Some float_list slice was not "
            "parsed. Write the files with the features parse_fn reads, or change the features it reads.",
        ),
    ],
)
def test_a_data_mistake_is_one_error_line_with_status_2_and_no_workdir(cli_runs, case, message):
  returncode, _, stderr, workdir = cli_runs[case]
  assert returncode == USER_ERROR_EXIT_CODE, stderr[-3000:]
  assert _error_lines(stderr) == [message.replace("{tmp}", str(workdir.parent))]
  assert "Traceback" not in stderr
  assert not workdir.exists()


def test_evaluation_records_of_another_schema_are_one_error_line_with_status_2_after_the_trained_checkpoint(cli_runs):
  returncode, _, stderr, workdir = cli_runs["eval_short_features"]
  assert returncode == USER_ERROR_EXIT_CODE, stderr[-3000:]
  assert _error_lines(stderr) == [
      f"error: The evaluation data cannot be parsed: {workdir.parent}/short.tfrecord, record 0 (counting from 0): Key: "
      "x. Can't parse serialized Example: Some float_list slice was not parsed. Write the files with the features "
      "parse_fn reads, or change the features it reads."
  ]
  assert "Traceback" not in stderr
  assert sorted(os.listdir(workdir / "checkpoints")) == ["checkpoint", "ckpt-4.data-00000-of-00001", "ckpt-4.index"]
  with open(workdir / "metrics.jsonl", encoding="utf-8") as f:  # The steps trained are kept; no eval row.
    assert [(row["split"], row["step"]) for row in map(json.loads, f)] == [("train", 2), ("train", 4)]


def test_a_batch_larger_than_the_data_and_float16_on_cpus_train_with_one_warning_line_each(cli_runs):
  returncode, stdout, stderr, _ = cli_runs["tilde"]  # At log level 3.
  assert returncode == 0, stderr[-3000:]
  assert "global step: 2" in stdout
  warnings = [line.split("] ", 1)[1] for line in stderr.splitlines() if re.match(r"^W\d{4} .*\.py:\d+\] ", line)]
  assert warnings == [
      "precision='mixed_float16' without a GPU: the replicas train on CPU, where float16 math is emulated on most "
      "CPUs (slower than float32) and adds loss scaling. Use precision='float32' on CPUs, or 'mixed_bfloat16' on a "
      "TPU or a CPU with AVX512_BF16 or AMX.",
      "The global batch of 64 examples is larger than the whole training data (48 examples): every step repeats "
      "examples within its batch. Use a global batch of at most 48 (config.data.global_batch_size), or more data.",
  ]


def test_tensorflow_imported_by_the_configs_own_module_starts_quietly_too(cli_runs):
  _, _, stderr, _ = cli_runs["data_labels"]  # mistakes.py imports TensorFlow as the config loads; level unset.
  assert not _foreign_lines(stderr), "\n".join(_foreign_lines(stderr))


# Answers that need no device, each (arguments after `python`, exit status, the start of its one `error:` line).
_ANSWERS_WITHOUT_TENSORFLOW = {
    "help": (["-m", "runner", "--workdir={tmp}/run", "--help"], 0, None),
    "positional": (
        ["-m", "runner", f"--config={SYNTHETIC}", "--workdir={tmp}/run", "train"],
        2,
        "error: Unexpected arguments ['train']",
    ),
    "bad_flag": (
        ["-m", "runner", f"--config={SYNTHETIC}", "--workdir={tmp}/run", "--mode=trian"],
        2,
        "error: flag --mode=trian: value should be one of",
    ),
    "override_typo": (
        ["-m", "runner", f"--config={DIGITS}", "--workdir={tmp}/run", "--config.trainer.train_step=300"],
        2,
        "error: Override 'trainer.train_step=300': config.trainer has no field 'train_step'.",
    ),
    "dry_run_typo": (
        ["-m", "runner", f"--config={DIGITS}", "--dry_run", "--config.trainer.train_stepz=5"],
        2,
        "error: Override 'trainer.train_stepz=5': config.trainer has no field 'train_stepz'. "
        "Did you mean 'train_steps'?",
    ),
    "mode": (
        ["-m", "runner", f"--config={DIGITS}", "--config.mode=trian"],
        2,
        "error: config.mode='trian' is not valid. Did you mean 'train'?",
    ),
    "strategy_name": (
        ["-m", "runner", f"--config={DIGITS}", "--config.strategy.name=mirored"],
        2,
        "error: config.strategy.name='mirored' is not valid. Did you mean 'mirrored'?",
    ),
    "unused_field": (
        ["-m", "runner", f"--config={DIGITS}", "--config.strategy.name=one_device", "--config.strategy.num_packs=2"],
        2,
        "error: config.strategy.num_packs=2 is not used by strategy 'one_device'",
    ),
    "type": (
        ["-m", "runner", f"--config={DIGITS}", "--config.trainer.train_steps=abc"],
        2,
        "error: Override 'trainer.train_steps=abc': config.trainer.train_steps must be an int, got 'abc'.",
    ),
    "dataset": (
        ["-m", "runner", f"--config={DIGITS}", "--config.data.name=digitz"],
        2,
        "error: Unknown dataset 'digitz'. Did you mean 'digits'?",
    ),
    "precision": (
        ["-m", "runner", f"--config={DIGITS}", "--config.trainer.precision=float16"],
        2,
        "error: config.trainer.precision='float16' is not valid.",
    ),
    "no_config": (["-m", "runner", "--dry_run"], 2, "error: --config is required"),
    "no_file": (["-m", "runner", "--config=configs/nope.py"], 2, "error: Config file 'configs/nope.py' does not exist"),
    "variant": (["-m", "runner", f"--config={DIGITS}:tpux"], 2, "error: configs/digits.py has no variant 'tpux'"),
    "strategies_help": (["-m", "strategies", "--help"], 0, None),
    "strategies_flag": (
        ["-m", "strategies", "--strategy=mirored"],
        2,
        "error: flag --strategy=mirored: --strategy='mirored' is not valid.",
    ),
    "launch_help": (["-m", "runner.launch", "--help"], 0, None),
    # The console scripts setup.py installs, beside this Python.
    "script_help": ([os.path.join(os.path.dirname(sys.executable), "tf-runner"), "--help"], 0, None),
    "script_launch_help": ([os.path.join(os.path.dirname(sys.executable), "tf-runner-launch"), "--help"], 0, None),
    "flagfile": (
        ["-m", "runner", f"--config={DIGITS}", "--workdir={tmp}/run", "--flagfile={tmp}/missing.flags"],
        2,
        "error: Unable to open flagfile: [Errno 2] No such file or directory: '{tmp}/missing.flags'; --flagfile names "
        "a file of flags, one per line.",
    ),
    "empty_workdir": (
        ["-m", "runner", f"--config={DIGITS}", "--workdir="],
        2,
        "error: The workdir is empty (--workdir=''); give a directory, or leave --workdir out for a new temporary one.",
    ),
    "workdir_space": (
        ["-m", "runner", f"--config={DIGITS}", "--workdir= {tmp}/run"],
        2,
        "error: The workdir ' {tmp}/run' starts or ends with white space",
    ),
    "workdir_unknown_user": (
        ["-m", "runner", f"--config={DIGITS}", "--workdir=~nosuchuser/run"],
        2,
        "error: The workdir '~nosuchuser/run' names the home folder of a user this machine does not have.",
    ),
    "workdir_one_slash_url": (
        ["-m", "runner", f"--config={DIGITS}", "--workdir=gs:/bucket/run"],
        2,
        "error: The workdir 'gs:/bucket/run' looks like a URL with one slash",
    ),
    "two_modes": (
        ["-m", "runner", f"--config={DIGITS}", "--workdir={tmp}/run", "--mode=eval", "--config.mode=train"],
        2,
        "error: --mode=eval and --config.mode=train disagree; give one of them.",
    ),
    "config_syntax": (
        ["-m", "runner", "--config={tmp}/broken.py"],
        2,
        "error: Config file '{tmp}/broken.py', line 2: SyntaxError: invalid syntax",
    ),
    "config_syntax_verbose": (
        ["-m", "runner", "--config={tmp}/broken.py", "--verbose"],
        2,
        "error: Config file '{tmp}/broken.py', line 2: SyntaxError: invalid syntax",
    ),
    "config_exit": (
        ["-m", "runner", "--config={tmp}/exits.py"],
        2,
        "error: Config file '{tmp}/exits.py', line 2: the config file tried to end the process with "
        "SystemExit('bye');",
    ),
}
_WITH_TRACEBACK = {"config_syntax_verbose"}
_IMPORT_TIME = re.compile(r"^import time: +\d+ \| +\d+ \| +(?P<module>[\w.]+)$")


def _imported(stderr):
  """The top-level packages that `python -X importtime` reports importing in `stderr`."""
  return {match["module"].split(".")[0] for match in map(_IMPORT_TIME.match, stderr.splitlines()) if match}


@pytest.fixture(scope="module")
def answer_runs(tmp_path_factory):
  """Runs every command of `_ANSWERS_WITHOUT_TENSORFLOW` at once; returns (folder, {case: (status, stdout, stderr)}).

  Each answers without loading TensorFlow (`test_help_and_config_errors_answer_before_tensorflow_loads`) and
  writes nothing in its folder, where `--workdir={tmp}/run` would go.
  """
  tmp_path = tmp_path_factory.mktemp("answers")
  (tmp_path / "broken.py").write_text("import ml_collections\ndef get_config(:\n  pass\n")
  (tmp_path / "exits.py").write_text("import sys\nsys.exit('bye')\n")
  env = dict(os.environ, PYTHONPATH=REPO, PYTHONPROFILEIMPORTTIME="1")  # -X importtime, for the scripts too
  processes = {
      case: subprocess.Popen(
          ([] if os.path.isabs(args[0]) else [sys.executable]) + [a.format(tmp=tmp_path) for a in args],
          env=env,
          cwd=tmp_path,
          stdout=subprocess.PIPE,
          stderr=subprocess.PIPE,
          text=True,
      )
      for case, (args, _, _) in _ANSWERS_WITHOUT_TENSORFLOW.items()
  }
  outputs = {case: process.communicate(timeout=SUBPROCESS_TIMEOUT_SECONDS) for case, process in processes.items()}
  return tmp_path, {case: (process.returncode, *outputs[case]) for case, process in processes.items()}


@pytest.fixture
def answers(answer_runs):
  return answer_runs[1]


def test_help_and_config_errors_answer_before_tensorflow_loads(answer_runs):
  tmp_path, answers = answer_runs
  for case, (returncode, stdout, stderr) in answers.items():
    _, status, error = _ANSWERS_WITHOUT_TENSORFLOW[case]
    assert returncode == status, (case, stderr[-3000:])
    errors = _error_lines(stderr)
    assert (
        (len(errors) == 1 and errors[0].startswith(error.format(tmp=tmp_path)))
        if error
        else ("--" in stdout and not errors)
    ), case
    assert ("Traceback (most recent call last)" in stderr) == (case in _WITH_TRACEBACK), (case, stderr[-3000:])
    assert "absl" in _imported(stderr), case  # What -X importtime prints is read.
    assert not {"tensorflow", "keras", "sklearn"} & _imported(stderr), case
  assert sorted(os.listdir(tmp_path)) == ["broken.py", "exits.py"]  # Nothing written, no workdir made.
  # A console script prints what `python -m` prints, but for the name of the program whose flags it lists.
  script = _ANSWERS_WITHOUT_TENSORFLOW["script_help"][0][0]
  assert answers["script_help"][1].replace(script, "X") == answers["help"][1].replace(
      os.path.join(REPO, "runner", "__main__.py"), "X"
  )
  assert answers["script_launch_help"][1] == answers["launch_help"][1]


def test_help_prints_the_usage_and_exits_0(answers):
  returncode, stdout, stderr = answers["help"]
  assert returncode == 0, stderr[-3000:]
  assert "python -m runner --config=FILE[:ARG]" in stdout and "--dry_run" in stdout and "--check_tpu" in stdout


def test_a_positional_argument_is_one_error_line_with_status_2(answers):
  returncode, _, stderr = answers["positional"]
  assert returncode == USER_ERROR_EXIT_CODE and "Traceback" not in stderr
  assert _error_lines(stderr) == [
      "error: Unexpected arguments ['train']; give overrides as --config.SECTION.FIELD=VALUE."
  ]


def test_a_bad_flag_value_is_one_error_line_with_status_2(answers):
  returncode, _, stderr = answers["bad_flag"]
  assert returncode == USER_ERROR_EXIT_CODE
  assert "Traceback" not in stderr and "FATAL" not in stderr
  assert len(_error_lines(stderr)) == 1 and _error_lines(stderr)[0].startswith(
      "error: flag --mode=trian: value should be one of"
  )


def test_a_typo_in_an_override_is_one_line_without_traceback(answers):
  returncode, _, stderr = answers["override_typo"]
  assert returncode == USER_ERROR_EXIT_CODE
  assert "Traceback" not in stderr
  assert _error_lines(stderr) == [
      "error: Override 'trainer.train_step=300': config.trainer has no field 'train_step'. Did you mean "
      "'train_steps'? Fields of config.trainer: async_checkpoints, best_metric, best_mode, checkpoint_every, eval_every, "
      "eval_steps, eval_timeout_seconds, export_every, jit_compile, max_to_keep, precision, profile_steps, report_metric, "
      "seed, steps_per_loop, train_steps."
  ]


def test_a_workdir_that_cannot_be_reached_is_one_line_with_a_transient_status(tmp_path):
  """No network (a network namespace of its own, `unshare -n`): gs:// cannot be reached, a retry may; foo:// never.

  The run and the dry run check the workdir with the same function: a run on one, a dry run on the other.
  """
  if subprocess.run(["unshare", "-n", "true"], check=False, capture_output=True).returncode:
    pytest.skip("needs `unshare -n` (root, or user namespaces)")
  cases = {
      "gs://tf-runner-no-bucket/run": (
          [],
          exit_codes.UNREACHABLE,
          "error: The workdir 'gs://tf-runner-no-bucket/run' cannot be reached (Error executing an HTTP request: ",
      ),
      "foo://host/run": (
          ["--dry_run"],
          USER_ERROR_EXIT_CODE,
          "error: The workdir 'foo://host/run' cannot be used (File system scheme 'foo' not implemented",
      ),
  }
  processes = {
      workdir: subprocess.Popen(
          ["unshare", "-n", sys.executable, "-m", "runner", f"--config={SYNTHETIC}", f"--workdir={workdir}", *args],
          env=paths.subprocess_environment(),
          cwd=tmp_path,
          stdout=subprocess.PIPE,
          stderr=subprocess.PIPE,
          text=True,
      )
      for workdir, (args, _, _) in cases.items()
  }
  for workdir, process in processes.items():
    _, stderr = process.communicate(timeout=SUBPROCESS_TIMEOUT_SECONDS)
    _, status, error = cases[workdir]
    assert process.returncode == status, stderr[-3000:]
    assert len(_error_lines(stderr)) == 1 and _error_lines(stderr)[0].startswith(error), stderr[-3000:]
    assert "Traceback" not in stderr
  assert os.listdir(tmp_path) == []
