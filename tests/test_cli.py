"""`python -m runner`: the dry run, a user error as one line without a traceback, an internal error
with one, and the same command on two workers.

Each case is a child process (TensorFlow's import costs seconds), so the
cases run side by side. The digits example through the CLI is in test_run.py.
"""

import os
import subprocess
import sys
import textwrap

import portpicker
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DIGITS = os.path.join(REPO, "configs", "digits.py")
SYNTHETIC = os.path.join(REPO, "configs", "synthetic.py")
SUBPROCESS_TIMEOUT_SECONDS = 300
USER_ERROR_EXIT_CODE = 2


@pytest.fixture(scope="module")
def cli_runs(tmp_path_factory):
  """Runs every case's command line at once; returns {case: (returncode, stdout, stderr, workdir)}."""
  tmp = tmp_path_factory.mktemp("cli")
  (tmp / "explode.py").write_text(textwrap.dedent("""
      def model(config):
        raise RuntimeError("boom: a bug in the model function")
      """))
  env = dict(os.environ)
  env["PYTHONPATH"] = os.pathsep.join([REPO, str(tmp), env.get("PYTHONPATH", "")])
  env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  cases = {
      "dry_run": [f"--config={DIGITS}", "--dry_run", "--mode=train", "--config.strategy.name=mirrored",
                  "--config.strategy.virtual_cpus=2", "--config.trainer.train_steps=300",
                  "--noconfig.trainer.jit_compile"],
      "override_typo": [f"--config={DIGITS}", "--config.trainer.train_step=300"],
      "internal_error": [f"--config={DIGITS}", "--config.model.name=explode:model", "--config.trainer.train_steps=10",
                         "--config.trainer.steps_per_loop=10", "--config.trainer.eval_every=None"],
  }
  hosts = tuple(f"localhost:{portpicker.pick_unused_port()}" for _ in range(2))
  for index in range(2):
    cases[f"worker_{index}"] = [
        f"--config={SYNTHETIC}", "--config.strategy.name=multi_worker_mirrored",
        f"--config.strategy.worker_hosts={hosts!r}", f"--config.strategy.task_index={index}"]
  workdirs = {case: tmp / ("workers" if case.startswith("worker_") else case) for case in cases}  # one shared
  processes = {
      case: subprocess.Popen([sys.executable, "-m", "runner", f"--workdir={workdirs[case]}"] + args, env=env,
                             cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
      for case, args in cases.items()}
  results = {}
  for case, process in processes.items():
    stdout, stderr = process.communicate(timeout=SUBPROCESS_TIMEOUT_SECONDS)
    results[case] = (process.returncode, stdout, stderr, workdirs[case])
  return results


def _error_lines(stderr):
  return [line for line in stderr.splitlines() if line.startswith("error:")]


def test_dry_run_prints_the_plan_and_writes_nothing(cli_runs):
  returncode, stdout, stderr, workdir = cli_runs["dry_run"]
  assert returncode == 0, stderr[-3000:]
  assert "\nmode: train\n" in stdout and "  train_steps: 300\n" in stdout and "  jit_compile: false\n" in stdout
  assert "strategy: mirrored: 2 replicas on CPU:0, CPU:1" in stdout
  assert "replicas: 2" in stdout
  assert "per-replica batch size: train 32, eval 32" in stdout
  assert "plan: mode train: train to step 300 in 3 loop(s) of up to 100 steps" in stdout
  assert not workdir.exists()


def test_a_typo_in_an_override_is_one_line_without_traceback(cli_runs):
  returncode, _, stderr, workdir = cli_runs["override_typo"]
  assert returncode == USER_ERROR_EXIT_CODE
  assert "Traceback" not in stderr
  assert _error_lines(stderr) == [
      "error: Override 'trainer.train_step=300': config.trainer has no field 'train_step'. Did you mean "
      "'train_steps'? Fields of config.trainer: checkpoint_every, eval_every, eval_steps, jit_compile, "
      "max_to_keep, precision, seed, steps_per_loop, train_steps."]
  assert not workdir.exists()


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
    assert "global step: 200" in stdout
    eval_lines += [line for line in stdout.splitlines() if line.startswith("eval: ")]
  assert len(eval_lines) == 2 and eval_lines[0] == eval_lines[1]  # the workers agree
  assert eval_lines[0].endswith(" num_examples=512")  # every eval example counted once over both workers
  assert sorted(os.listdir(workdir)) == ["checkpoints", "config.json", "metrics.jsonl", "summaries"]
