"""The evaluator beside a trainer (mode 'continuous_eval'): each checkpoint once, at its step, and nothing else written.

Here in one process, deterministically; tests/runner/cluster/test_tfjob_cluster.py runs it beside a live
2-worker trainer, as a cluster's evaluator task.
"""

import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest
from tensorboard.backend.event_processing import event_accumulator
import tensorflow as tf

import runner
from runner import exit_codes
from runner import from_config
from runner.outputs import checkpoint_list
from runner.outputs import reports
from runner.training import continuous_eval
from strategies import ConfigError
from testlib import paths
from testlib import process_testlib

SYNTHETIC = os.path.join(paths.REPO, "configs", "synthetic.py")
# A small run: 512 training and 128 eval examples, a 16-unit MLP on one device.
SMALL = [
    "strategy.name=one_device",
    "data.num_examples=512",
    "data.num_eval_examples=128",
    "model.hidden_units=(16,)",
]


def _config(*overrides):
  return runner.load_config(SYNTHETIC, SMALL + list(overrides))


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """The workdir of a run to step 20 with a checkpoint every 10 steps (ckpt-10, ckpt-20), trained in this process."""
  workdir = str(tmp_path_factory.mktemp("trained") / "run")
  config = _config("mode=train", "trainer.train_steps=20", "trainer.steps_per_loop=10", "trainer.checkpoint_every=10")
  runner.run(config, workdir, quiet=True)
  return workdir


def _copy(trained, parent):
  workdir = str(parent / "run")
  shutil.copytree(trained, workdir)
  return workdir


def _eval_rows(workdir):
  return [row for row in process_testlib.metrics_rows(workdir) if row["split"] == "eval"]


def _eval_scalar_steps(workdir, tag="loss"):
  """The steps of the `tag` scalars in `workdir/summaries/eval`, read with TensorBoard's event_accumulator."""
  accumulator = event_accumulator.EventAccumulator(
      reports.summary_dir(workdir, "eval"), size_guidance={event_accumulator.TENSORS: 0}
  )
  accumulator.Reload()
  return sorted(event.step for event in accumulator.Tensors(tag))


def test_a_checkpoint_deleted_while_it_is_read_is_skipped_with_one_warning(trained, tmp_path, caplog):
  workdir = _copy(trained, tmp_path)
  config = _config("mode=continuous_eval", "trainer.train_steps=20")
  strategy = from_config.create_strategy(config)
  trainer = from_config.create_trainer(config, strategy, workdir)
  data = from_config.dataset(config, "eval")
  assert trainer.restore(data=data) == 20  # Built, and the latest checkpoint restored, as at its first evaluation.
  listed = checkpoint_list.read(os.path.join(workdir, "checkpoints")).paths
  assert [os.path.basename(path) for path in listed] == ["ckpt-10", "ckpt-20"]
  for name in tf.io.gfile.glob(listed[0] + ".*"):  # Between listing and reading: rotated away, as max_to_keep does.
    os.remove(name)

  with caplog.at_level("WARNING", logger="absl"):
    skipped = continuous_eval.evaluate_checkpoint(trainer, data, listed[0], global_batch_size=64)
  assert skipped is None
  assert [r.getMessage() for r in caplog.records if r.name == "absl"] == [
      f"Skipped {listed[0]}: it was deleted while it was read (the trainer keeps its max_to_keep newest "
      "checkpoints); going on with the newer ones."
  ]
  assert _eval_rows(workdir) == []

  metrics = continuous_eval.evaluate_checkpoint(trainer, data, listed[1], global_batch_size=64)
  assert trainer.global_step == 20
  assert _eval_rows(workdir) == [{"split": "eval", "step": 20, **metrics}]

  # Started again on that workdir, it evaluates no checkpoint twice: metrics.jsonl holds the one of step 20.
  last = continuous_eval.evaluate_new_checkpoints(
      trainer, data, final_step=20, timeout_seconds=60, global_batch_size=64
  )
  assert (last.checkpoint, last.step, dict(last.metrics)) == (listed[1], 20, metrics)
  assert len(_eval_rows(workdir)) == 1


def test_no_new_checkpoint_for_eval_timeout_seconds_ends_it_with_one_line_having_written_only_evaluations(
    trained, tmp_path, caplog
):
  workdir = _copy(trained, tmp_path)
  before = process_testlib.files_of(workdir)
  config = _config("mode=continuous_eval", "trainer.train_steps=40", "trainer.eval_timeout_seconds=0.5")
  with caplog.at_level("WARNING", logger="absl"):
    result = runner.run(config, workdir, quiet=True)

  assert [r.getMessage() for r in caplog.records if r.name == "absl"] == [
      f"No new checkpoint in {workdir}/checkpoints for 0.5 s (config.trainer.eval_timeout_seconds): the evaluator "
      "ends after the checkpoint of step 20, before the checkpoint of step 40."
  ]
  rows = _eval_rows(workdir)
  assert [row["step"] for row in rows] == [10, 20]
  assert (result.global_step, result.checkpoint_path) == (20, os.path.join(workdir, "checkpoints", "ckpt-20"))
  assert result.eval_metrics == {name: value for name, value in rows[1].items() if name not in ("split", "step")}
  assert result.train_metrics is None and result.export_path is None
  assert _eval_scalar_steps(workdir) == [10, 20]

  after = process_testlib.files_of(workdir)
  new_lines = after.pop("metrics.jsonl")[len(before["metrics.jsonl"]) :]
  assert [json.loads(line) for line in new_lines.splitlines()] == rows  # Appended, nothing else changed.
  before.pop("metrics.jsonl")
  added = {name for name in after if name not in before}
  assert added and all(name.startswith(os.path.join("summaries", "eval") + os.sep) for name in added), added
  assert {name: after[name] for name in before} == before


def test_a_failing_evaluator_leaves_the_workdir_as_it_was(trained, tmp_path):
  workdir = _copy(trained, tmp_path)
  before = process_testlib.files_of(workdir)
  with pytest.raises(ConfigError, match=r"The checkpoint .*/ckpt-20 does not match this model and optimizer"):
    runner.run(_config("mode=continuous_eval", "trainer.train_steps=20", "model.hidden_units=(8,)"), workdir)
  assert process_testlib.files_of(workdir) == before


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["trainer.eval_timeout_seconds=0"],
            "config.trainer.eval_timeout_seconds must be a positive number, got 0.0.",
        ),
        (
            ["trainer.eval_timeout_seconds=-5"],
            "config.trainer.eval_timeout_seconds must be a positive number, got -5.0.",
        ),
        (
            ["trainer.eval_timeout_seconds=soon"],
            "Override 'trainer.eval_timeout_seconds=soon': config.trainer.eval_timeout_seconds must be a float, "
            "got 'soon'.",
        ),
        (
            ["trainer.eval_timeout=60"],
            "Override 'trainer.eval_timeout=60': config.trainer has no field 'eval_timeout'. Did you mean "
            "'eval_timeout_seconds'?",
        ),
        (
            ["mode=continous_eval"],
            "config.mode='continous_eval' is not valid. Did you mean 'continuous_eval'? Valid: train, eval, "
            "train_and_eval, export, continuous_eval, predict.",
        ),
    ],
)
def test_bad_evaluator_settings_are_named(overrides, message):
  with pytest.raises(ConfigError) as raised:
    _config(*overrides)
  assert str(raised.value).startswith(message), str(raised.value)


def test_the_evaluator_needs_a_workdir():
  with pytest.raises(ConfigError) as raised:
    runner.run(_config("mode=continuous_eval"), None, quiet=True)
  assert str(raised.value) == (
      "Mode 'continuous_eval' evaluates the checkpoints a training run writes to its workdir: give that workdir "
      "(--workdir=DIR, or runner.run(config, workdir))."
  )


class _SignalOnceWatching(logging.Handler):
  """Sends this process `signum` when the evaluator logs that it watches (inside its signal handling), once."""

  def __init__(self, signum):
    super().__init__(logging.INFO)
    self.signum = signum
    self.sent = False

  def emit(self, record):
    if not self.sent and record.getMessage().startswith("Evaluating each new checkpoint in"):
      self.sent = True
      os.kill(os.getpid(), self.signum)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_sigterm_and_ctrl_c_end_a_waiting_evaluator_with_143_and_130(signum, tmp_path, caplog):
  workdir = str(tmp_path / "not-trained-yet")
  sender = _SignalOnceWatching(signum)
  absl_logger = logging.getLogger("absl")
  absl_logger.addHandler(sender)
  try:
    with caplog.at_level("INFO", logger="absl"), pytest.raises(SystemExit) as ended:
      runner.run(_config("mode=continuous_eval", "trainer.eval_timeout_seconds=120"), workdir)
  finally:
    absl_logger.removeHandler(sender)
  assert sender.sent
  assert ended.value.code == exit_codes.STOPPED_BY[signum]
  name = {signal.SIGTERM: "SIGTERM", signal.SIGINT: "Ctrl-C (SIGINT)"}[signum]
  assert caplog.messages[-1] == (
      f"Stopped by {name}: the evaluator ends before its first evaluation; run it again to go on (metrics.jsonl "
      "keeps what is evaluated)."
  )
  assert not os.path.exists(workdir)  # It waits for the trainer's workdir; it makes none.


def test_rows_of_an_evaluator_survive_the_trainers_rewrite_of_metrics_jsonl(tmp_path):
  """A resumed trainer rewrites metrics.jsonl once (its rows past the checkpoint dropped); the evaluator's stay."""
  workdir = str(tmp_path)
  killed_run = reports.Reporter(workdir, is_chief=True)
  for step in (10, 20, 30):  # A run killed after step 30, its last checkpoint at step 20.
    _train_row(killed_run, step, loss=1.0)
  evaluator = reports.Reporter(workdir, is_chief=True)
  evaluator.evaluation(step=10, results={"loss": 0.5, "num_examples": 8}, seconds=0.1)  # Its file stays open.
  resumed = reports.Reporter(workdir, is_chief=True)
  resumed.resume_at(20)
  _train_row(resumed, 30, loss=2.0)  # Drops the killed run's row of step 30: the file is replaced.
  evaluator.evaluation(step=20, results={"loss": 0.25, "num_examples": 8}, seconds=0.1)
  _train_row(resumed, 40, loss=2.0)
  assert [(row["split"], row["step"], row["loss"]) for row in process_testlib.metrics_rows(workdir)] == [
      ("train", 10, 1.0),
      ("train", 20, 1.0),
      ("eval", 10, 0.5),
      ("train", 30, 2.0),
      ("eval", 20, 0.25),
      ("train", 40, 2.0),
  ]


def _train_row(reporter, step, *, loss):
  reporter.train_loop(
      step=step, total_steps=40, results={"loss": loss}, learning_rate=0.1, steps_per_sec=1.0, examples_per_sec=8.0
  )


def test_a_second_evaluator_of_a_workdir_is_refused_in_one_line_and_each_checkpoint_is_evaluated_once(
    trained, tmp_path
):
  workdir = _copy(trained, tmp_path)
  command = [sys.executable, "-m", "runner", f"--config={SYNTHETIC}", f"--workdir={workdir}", "--mode=continuous_eval"]
  command += [f"--config.{override}" for override in SMALL + ["trainer.train_steps=40"]]
  evaluators = [
      subprocess.Popen(command, env=paths.subprocess_environment(), stderr=subprocess.PIPE, text=True) for _ in range(2)
  ]
  try:
    deadline = time.monotonic() + 120
    while all(evaluator.poll() is None for evaluator in evaluators) and time.monotonic() < deadline:
      time.sleep(0.2)
    refused = next((evaluator for evaluator in evaluators if evaluator.poll() is not None), None)
    assert refused is not None, "both evaluators are still evaluating the same workdir"
    _, stderr = refused.communicate()
    assert refused.returncode == exit_codes.USER_ERROR, stderr[-3000:]
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in stderr, stderr[-3000:]
    assert re.fullmatch(
        rf"error: The workdir {re.escape(workdir)} has an evaluator already: pid \d+ on host .*, mode "
        r"'continuous_eval', .*\. One evaluator evaluates each checkpoint once; stop that one to start this one \(a "
        rf"killed evaluator's lock {re.escape(workdir)}/\.tf-runner-evaluator\.lock is taken over by the next\)\.",
        errors[0],
    )
    # The trainer goes on to step 40 beside the evaluator left, which ends after the checkpoint of step 40.
    runner.run(
        _config(
            "mode=train",
            "trainer.train_steps=40",
            "trainer.steps_per_loop=10",
            "trainer.checkpoint_every=10",
            "trainer.max_to_keep=10",
        ),
        workdir,
        quiet=True,
    )
    (evaluator,) = [evaluator for evaluator in evaluators if evaluator is not refused]
    _, stderr = evaluator.communicate(timeout=120)
    assert evaluator.returncode == 0, stderr[-3000:]
  finally:
    for evaluator in evaluators:
      if evaluator.poll() is None:
        evaluator.kill()
        evaluator.communicate()
  assert [row["step"] for row in _eval_rows(workdir)] == [10, 20, 30, 40]
  assert not os.path.exists(os.path.join(workdir, ".tf-runner-evaluator.lock"))
