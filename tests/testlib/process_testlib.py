"""Child processes for tests: a command with its output in files, its exit, and the train rows a run writes."""

import json
import os
import re
import subprocess
import sys
import time

import tensorflow as tf

from testlib import paths

TIMEOUT_SECONDS = 240


class Process:
  """`command` in a child process started from the repository, its stdout and stderr in files under `logs`."""

  def __init__(self, command, *, env, logs, name="process", preexec_fn=None):
    self.name = name
    os.makedirs(logs, exist_ok=True)
    stem = os.path.join(logs, f"{name.replace(':', '')}.{time.monotonic_ns()}")
    self._out = open(stem + ".out", "w+", encoding="utf-8")  # noqa: SIM115
    self._err = open(stem + ".err", "w+", encoding="utf-8")  # noqa: SIM115
    self.process = subprocess.Popen(
        command, cwd=paths.REPO, env=env, stdout=self._out, stderr=self._err, preexec_fn=preexec_fn  # noqa: PLW1509
    )

  def wait(self, timeout=TIMEOUT_SECONDS):
    """Waits for the exit (killing the process past `timeout`); returns `(status, stdout, stderr)`."""
    try:
      self.process.wait(timeout=timeout)
    finally:
      self.process.kill()
    return self.process.returncode, self.stdout(), self.stderr()

  def stdout(self):
    self._out.seek(0)
    return self._out.read()

  def stderr(self):
    self._err.seek(0)
    return self._err.read()

  def wait_for(self, condition, what, timeout=TIMEOUT_SECONDS):
    """Polls `condition()` until it holds; fails if the process exits first or after `timeout`."""
    deadline = time.monotonic() + timeout
    while not condition():
      assert self.process.poll() is None, f"{self.name} exited before {what}: {self.stderr()[-3000:]}"
      assert time.monotonic() < deadline, f"{self.name}: no {what} in time"
      time.sleep(0.05)


def runner_cli(arguments, *, logs):
  """Starts `python -m runner arguments`, with tests/ importable (a config may name `testlib` functions)."""
  env = paths.subprocess_environment()
  env["PYTHONPATH"] = os.path.dirname(paths.TESTLIB) + os.pathsep + env["PYTHONPATH"]
  return Process([sys.executable, "-m", "runner", *arguments], env=env, logs=logs, name="runner")


def error_lines(stderr):
  """The lines of `stderr` that start with 'error:' (a user error is one such line)."""
  return [line for line in stderr.splitlines() if line.startswith("error:")]


def warning_lines(stderr):
  """The messages of the absl warning lines of `stderr` (after their `W1128 ... file.py:12] ` header)."""
  return [line.split("] ", 1)[1] for line in stderr.splitlines() if re.match(r"^W\d{4} .*\.py:\d+\] ", line)]


class TrainingProcess(Process):
  """A process whose run writes `workdir` (its output goes to `workdir.logs`): the train rows so far."""

  def __init__(self, command, *, workdir, env, name, preexec_fn=None):
    self.workdir = str(workdir)
    super().__init__(command, env=env, logs=self.workdir + ".logs", name=name, preexec_fn=preexec_fn)

  def train_rows(self):
    return train_rows(self.workdir)

  def wait_for_rows(self, count):
    self.wait_for(lambda: len(self.train_rows()) >= count, f"{count} train rows")


def final_checkpoint_values(workdir):
  """{variable name: value} of the latest checkpoint in `workdir` (the model's and the optimizer's variables)."""
  reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(os.path.join(str(workdir), "checkpoints")))
  return {
      name: reader.get_tensor(name)
      for name in reader.get_variable_to_shape_map()
      if name != "_CHECKPOINTABLE_OBJECT_GRAPH" and not name.startswith(("save_counter", "training_data"))
  }


def train_rows(workdir):
  """The complete train rows of `workdir/metrics.jsonl` so far."""
  return [row for row in metrics_rows(workdir) if row["split"] == "train"]


def metrics_rows(workdir):
  """The complete rows of `workdir/metrics.jsonl` so far (a last line still being written left out)."""
  return _json_lines(os.path.join(str(workdir), "metrics.jsonl"))


def files_of(directory):
  """{relative path: bytes} of every file under `directory`: to check that a run changed nothing, byte for byte."""
  found = {}
  for root, _, files in os.walk(directory):
    for name in files:
      path = os.path.join(root, name)
      with open(path, "rb") as f:
        found[os.path.relpath(path, directory)] = f.read()
  return found


def listing(directory, *, skip=None):
  """[(path, size, mtime_ns)] of every file under `directory` but those under a folder named `skip`: unchanged files."""
  return sorted(
      (
          os.path.join(root, name),
          os.stat(os.path.join(root, name)).st_size,
          os.stat(os.path.join(root, name)).st_mtime_ns,
      )
      for root, _, names in os.walk(directory)
      if skip is None or skip not in os.path.relpath(root, directory).split(os.sep)
      for name in names
  )


def config_history(workdir):
  """The entries of `workdir/config_history.jsonl`, one per run."""
  return _json_lines(os.path.join(str(workdir), "config_history.jsonl"))


def _json_lines(path):
  """The JSON value of each complete line of the file at `path`; [] if there is none."""
  if not os.path.exists(path):
    return []
  with open(path, encoding="utf-8") as f:
    return [json.loads(line) for line in f if line.endswith("\n")]
