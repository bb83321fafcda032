"""One training run per workdir: the lock a run takes, what a second run says, and a killed holder's stale lock.

Two `python -m runner` processes are started together on one workdir; the
rest runs in this process against real lock files and real processes.
"""

import dataclasses
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import filelock
import pytest
import tensorflow as tf

import runner
from runner.workdir import lock as workdir_lock
from testlib import paths
from testlib import process_testlib

REPO = paths.REPO
SYNTHETIC = os.path.join(REPO, "configs", "synthetic.py")
LOCK = workdir_lock.FILE_NAME
SINCE = r"since \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC"


def _quick(mode="train", train_steps=40):
  """A synthetic config that trains `train_steps` in loops of 20 on one device."""
  return {
      "mode": mode,
      "strategy": {"name": "one_device"},
      "data": {"name": "synthetic", "global_batch_size": 32, "num_examples": 256, "num_eval_examples": 64},
      "model": {"hidden_units": (16,)},
      "trainer": {"train_steps": train_steps, "steps_per_loop": 20},
  }


def test_a_held_workdir_stops_a_training_run_touching_nothing_while_eval_still_runs(tmp_path):
  workdir = str(tmp_path / "work")
  runner.run(_quick(), workdir, quiet=True)
  assert not os.path.exists(os.path.join(workdir, LOCK))  # Released after a normal run.
  held = workdir_lock.acquire(workdir, mode="train")
  before = process_testlib.files_of(workdir)
  with pytest.raises(
      workdir_lock.WorkdirInUseError,
      match=(
          rf"^The workdir {re.escape(workdir)} is in use by another run: pid {os.getpid()} on host "
          rf"{re.escape(socket.gethostname())}, mode 'train', {SINCE} \(.+\)\. Wait for it to end, or stop it, or use "
          rf"another --workdir \(a killed run's lock {re.escape(os.path.join(workdir, LOCK))} is taken over by the next "
          r"run\)\.$"
      ),
  ):
    runner.run(_quick(train_steps=60), workdir, quiet=True)
  assert process_testlib.files_of(workdir) == before  # Byte for byte.
  assert runner.run(_quick(mode="eval"), workdir, quiet=True).eval_metrics["num_examples"] == 64  # Not blocked.
  held.release()
  assert LOCK not in os.listdir(workdir)
  for steps in (60, 80):  # One run after another, in one process.
    assert runner.run(_quick(train_steps=steps), workdir, quiet=True).global_step == steps
    assert LOCK not in os.listdir(workdir)


def _write_lock(path, *, host=None, pid=None, process_start="", text=None):
  """Writes a lock file as a run on `host` with `pid` would (or `text`), through tf.io.gfile (a local or ram:// path)."""
  holder = workdir_lock.Holder(
      host=host or socket.gethostname(),
      pid=pid or os.getpid(),
      process_start=process_start,
      since=time.time(),
      mode="train",
      command="python -m runner --config=other.py",
  )
  with tf.io.gfile.GFile(path, "w") as f:
    f.write(json.dumps(dataclasses.asdict(holder)) if text is None else text)


def test_a_lock_file_no_live_run_holds_is_taken_over_with_a_warning_naming_what_it_held(tmp_path, caplog):
  """A local lock is held by its holder's `flock`: a file without one (its holder killed, or damaged) is stale."""
  path = os.path.join(tmp_path, LOCK)
  leftovers = {
      "a killed run": (dict(pid=4242), r"of a run that is gone: pid 4242 on host .*, mode 'train', since .*"),
      "empty": (dict(text=""), None),
      "not a holder's JSON": (
          dict(text='{"pid": "12"}'),
          r"of a run that is gone: its lock file names no run \(it is damaged\)",
      ),
      "cut short": (
          dict(text='{"host": "h", "pid": 12'),
          r"of a run that is gone: its lock file names no run \(it is damaged\)",
      ),
  }
  for case, (lock_file, warning) in leftovers.items():
    _write_lock(path, **lock_file)
    caplog.clear()
    with caplog.at_level("WARNING", logger="absl"):
      taken = workdir_lock.acquire(str(tmp_path), mode="train")
    with open(path, encoding="utf-8") as f:
      assert json.load(f)["pid"] == os.getpid(), case
    took_over = [r.getMessage() for r in caplog.records if "Took over" in r.getMessage()]
    assert [bool(re.fullmatch(rf"Took over the workdir lock {re.escape(path)} {warning}\.", w)) for w in took_over] == (
        [True] if warning else []
    ), (case, took_over)
    taken.release()
    assert os.listdir(tmp_path) == [], case


def test_a_held_lock_whose_file_names_no_run_yet_is_a_run_starting_now(tmp_path):
  path = os.path.join(tmp_path, LOCK)
  held = filelock.FileLock(path, blocking=False)  # As a run holds it between its flock and its first write.
  with held:
    with pytest.raises(
        workdir_lock.WorkdirInUseError,
        match=rf"^The workdir .* is in use by another run: a run starting now \(its lock {re.escape(path)} does not ",
    ):
      workdir_lock.acquire(str(tmp_path), mode="train")
    assert process_testlib.files_of(tmp_path) == {LOCK: b""}


def test_a_remote_lock_of_a_gone_run_is_taken_over_and_a_live_ones_is_not(tmp_path, monkeypatch, caplog):
  monkeypatch.setattr(workdir_lock, "REMOTE_SETTLE_SECONDS", 0.1)  # One writer here: no other write to wait for.
  workdir = f"ram://{tmp_path}/work"
  tf.io.gfile.makedirs(workdir)
  path = f"{workdir}/{LOCK}"
  gone = subprocess.Popen([sys.executable, "-c", "pass"])
  gone.wait()  # Reaped: its pid names no process.
  stale = {
      "same host, the pid gone": {"pid": gone.pid, "process_start": "boot:1"},
      "same host, the pid now another process": {"pid": os.getpid(), "process_start": "another-boot:1"},
      "damaged": {"text": "{"},
  }
  for case, lock_file in stale.items():
    _write_lock(path, **lock_file)
    with caplog.at_level("WARNING", logger="absl"):
      taken = workdir_lock.acquire(workdir, mode="train")
    assert f"Took over the workdir lock {path} of a run that is gone" in caplog.text, case
    taken.release()
    assert tf.io.gfile.listdir(workdir) == [], case
  _write_lock(path, process_start=workdir_lock._process_start(os.getpid()))  # noqa: SLF001  This process: live.
  with pytest.raises(workdir_lock.WorkdirInUseError, match=f"is in use by another run: pid {os.getpid()} on host "):
    workdir_lock.acquire(workdir, mode="train")


_RUN_OVERRIDES = [
    "mode=train",
    "strategy.name=one_device",
    "data.num_examples=512",
    "trainer.train_steps=1000000",
    "trainer.steps_per_loop=10",
    "trainer.checkpoint_every=50",
]


def _runner(workdir, env, *args, name="run"):
  """`python -m runner` training a synthetic run into `workdir` for far longer than the test lasts."""
  command = [sys.executable, "-m", "runner", f"--config={SYNTHETIC}", f"--workdir={workdir}"]
  command += [f"--{o}" if o.startswith("mode=") else f"--config.{o}" for o in _RUN_OVERRIDES]
  return process_testlib.TrainingProcess([*command, *args], workdir=workdir, env=env, name=name)


def _first_to_exit(runs):
  deadline = time.monotonic() + process_testlib.TIMEOUT_SECONDS
  while all(run.process.poll() is None for run in runs):
    assert time.monotonic() < deadline, "neither run stopped"
    time.sleep(0.05)
  return next(run for run in runs if run.process.poll() is not None)


def test_two_runs_started_together_one_trains_the_other_stops_at_once(tmp_path, subprocess_env, caplog):
  """Twice two processes on a new workdir (the four at once), each time a holder and one refused at once.

  First the second has another model (the lock is checked before the model) and its holder is stopped by SIGTERM;
  then the same command twice, its holder SIGKILLed and its stale lock taken over by the next run (in this process:
  the CLI's exit status and summary of a resumed run are checked in tests/runner/cluster/test_fault_tolerance.py).
  """
  another_model = ["--config.model.hidden_units=(32,)"]
  attempts = []
  for attempt, (second_args, stop) in enumerate([(another_model, signal.SIGTERM), ((), signal.SIGKILL)]):
    workdir = str(tmp_path / f"attempt{attempt}")
    runs = [
        _runner(workdir, subprocess_env, name=f"first{attempt}"),
        _runner(workdir, subprocess_env, *second_args, name=f"second{attempt}"),
    ]
    attempts.append((workdir, stop, runs))
  holders = []
  for workdir, stop, runs in attempts:
    stopped = _first_to_exit(runs)
    (holder,) = [run for run in runs if run is not stopped]
    holders.append(holder)
    status, stdout, stderr = stopped.wait()
    assert status == 2 and stdout == "", stderr[-3000:]
    assert "Traceback" not in stderr
    (error,) = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert re.fullmatch(
        rf"error: The workdir {re.escape(workdir)} is in use by another run: pid {holder.process.pid} on host "
        rf"{re.escape(socket.gethostname())}, mode 'train', {SINCE} \(.*runner.* --workdir={re.escape(workdir)} .*\)"
        r"\. Wait for it to end, .*",
        error,
    ), error
  for (_, stop, _), holder in zip(attempts, holders, strict=True):
    holder.wait_for_rows(6)  # Trained on, past its first checkpoint.
    holder.process.send_signal(stop)
  for (workdir, stop, _), holder in zip(attempts, holders, strict=True):
    status, _, stderr = holder.wait()
    assert status == (143 if stop == signal.SIGTERM else -signal.SIGKILL), stderr[-3000:]
    history = process_testlib.config_history(workdir)
    assert len(history) == 1  # Only the holder recorded its config.
    with open(os.path.join(workdir, "config.json"), encoding="utf-8") as f:
      assert json.load(f)["model"]["hidden_units"] == history[0]["config"]["model"]["hidden_units"]
    steps = [row["step"] for row in holder.train_rows()]
    assert steps == sorted(set(steps))  # One writer: each step once, in order.
    assert not [name for name in os.listdir(workdir) if ".tmp-" in name or ".write-test-" in name]
    if stop == signal.SIGTERM:
      assert LOCK not in os.listdir(workdir)
  with open(os.path.join(workdir, LOCK), encoding="utf-8") as f:
    assert json.load(f)["pid"] == holder.process.pid  # The SIGKILLed holder's lock stays, stale.
  config = runner.load_config(SYNTHETIC, [*_RUN_OVERRIDES, f"trainer.train_steps={steps[-1] + 20}"])
  with caplog.at_level("WARNING", logger="absl"):
    assert runner.run(config, workdir, quiet=True).global_step == steps[-1] + 20
  assert (
      f"Took over the workdir lock {os.path.join(workdir, LOCK)} of a run that is gone: pid {holder.process.pid}"
      in caplog.text
  )
  assert LOCK not in os.listdir(workdir)


def test_a_run_that_trained_keeps_its_workdir_when_it_fails_before_a_checkpoint(tmp_path, monkeypatch):
  (tmp_path / "late_nans.py").write_text(
      "import numpy as np\nimport runner\n\n"
      "def data(config, split):\n"
      "  features = np.ones((256, 16), np.float32)\n"
      "  features[64:] = np.nan  # From the batch of step 3 on.\n"
      "  return runner.data.InMemory(features, np.zeros(256, np.int32))\n"
  )
  monkeypatch.syspath_prepend(str(tmp_path))
  config = _quick(train_steps=100)
  config["data"]["name"] = "late_nans:data"
  config["trainer"].update(steps_per_loop=1, checkpoint_every=50)
  workdir = tmp_path / "new"
  with pytest.raises(runner.data.DataError, match="hold NaN or inf values in the batch of step 3"):
    runner.run(config, str(workdir), quiet=True)
  assert [row["step"] for row in process_testlib.train_rows(workdir)] == [1, 2]  # Kept: it trained there.
  assert sorted(os.listdir(workdir)) == ["config.json", "config_history.jsonl", "metrics.jsonl", "summaries"]


def test_a_remote_workdir_is_locked_through_tf_io_gfile(tmp_path, monkeypatch):
  """TensorFlow's in-memory file system (`ram://`) stands for `gs://`: no exclusive create, written and read back."""
  monkeypatch.setattr(workdir_lock, "REMOTE_SETTLE_SECONDS", 0.1)  # One writer here: no other write to wait for.
  workdir = f"ram://{tmp_path}/work"
  tf.io.gfile.makedirs(workdir)
  held = workdir_lock.acquire(workdir, mode="train_and_eval")
  assert tf.io.gfile.listdir(workdir) == [LOCK] and workdir_lock.is_held(workdir)
  with pytest.raises(
      workdir_lock.WorkdirInUseError,
      match=(
          rf"^The workdir {re.escape(workdir)} is in use by another run: pid {os.getpid()} on host .*, "
          "mode 'train_and_eval', "
      ),
  ):
    workdir_lock.acquire(workdir, mode="train")
  held.release()
  assert tf.io.gfile.listdir(workdir) == [] and not workdir_lock.is_held(workdir)
