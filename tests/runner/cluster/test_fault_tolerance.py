"""Long runs that nothing spoils: real signals, a full disk and failing runs, through `python -m runner`.

Every case is a real child process. A stopped run is restarted with the same
command and must end with the final checkpoint of an uninterrupted run,
within 1e-6 on 2 logical CPUs. The same on one device, bit for bit, with
SIGTERM and SIGKILL during background checkpoint writes:
tests/runner/outputs/test_async_checkpoints.py; on 2 workers:
tests/runner/cluster/test_launch.py.
"""

import json
import os
import random
import re
import resource
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
import tensorflow as tf

import runner
from runner.workdir import lock as workdir_lock
from testlib import paths
from testlib import process_testlib

REPO = paths.REPO
SYNTHETIC = os.path.join(REPO, "configs", "synthetic.py")
# A stopped run's steps: its stop comes after row 12 (step 120), past the checkpoint at step 100; the rest leaves
# room for a stop that a busy machine delivers late, yet keeps each run within a few seconds.
STEPS = 600


def _run_args(**trainer):
  """The command line of a synthetic training run; by default a few seconds in loops of 10, a checkpoint every 100."""
  trainer = {"train_steps": STEPS, "steps_per_loop": 10, "checkpoint_every": 100, **trainer}
  return [f"--config={SYNTHETIC}", "--mode=train", "--config.data.num_examples=512"] + [
      f"--config.trainer.{field}={value}" for field, value in trainer.items()
  ]


RUN = _run_args()
ONE_DEVICE = ["--config.strategy.name=one_device"]
MIRRORED_2 = ["--config.strategy.name=mirrored", "--config.strategy.virtual_cpus=2"]
# The same 2 replicas in this process, whose CPU tests/conftest.py split into 4 logical CPUs already.
MIRRORED_IN_PROCESS = ["strategy.name=mirrored", "strategy.devices=/cpu:0", "strategy.devices=/cpu:1"]


class Run(process_testlib.TrainingProcess):
  """`python -m runner --workdir=WORKDIR ARGS` in a child process, its output in files."""

  def __init__(self, workdir, args, env, preexec_fn=None):
    super().__init__(
        [sys.executable, "-m", "runner", f"--workdir={workdir}", *args],
        workdir=workdir,
        env=env,
        name="run",
        preexec_fn=preexec_fn,
    )


def _no_traceback(stderr):
  assert "Traceback" not in stderr, stderr[-3000:]


def test_ctrl_c_saves_and_exits_and_the_same_command_resumes_exactly_on_two_replicas(tmp_path, subprocess_env):
  # SIGTERM, and stops during background writes, on one device: tests/runner/outputs/test_async_checkpoints.py.
  stopped = Run(tmp_path / "stopped", RUN + MIRRORED_2, subprocess_env)
  stopped.wait_for_rows(12)  # Past the checkpoint at step 100, mid-way to the next one.
  stopped.process.send_signal(signal.SIGINT)
  status, _, stderr = stopped.wait()
  assert status == 130, stderr[-3000:]
  step = stopped.train_rows()[-1]["step"]
  assert 120 <= step < STEPS
  assert (
      len(
          re.findall(
              rf"Stopped by Ctrl-C \(SIGINT\): saved a checkpoint at step {step} \(.*ckpt-{step}\); run the same "
              rf"command again to resume from there\.",
              stderr,
          )
      )
      == 1
  ), stderr[-3000:]
  _no_traceback(stderr)
  assert tf.train.latest_checkpoint(str(tmp_path / "stopped" / "checkpoints")).endswith(f"ckpt-{step}")
  assert workdir_lock.FILE_NAME not in os.listdir(tmp_path / "stopped")  # Released before the exit.

  resumed = Run(tmp_path / "stopped", RUN + MIRRORED_2, subprocess_env)
  # The uninterrupted run, on 2 of this process's logical CPUs while the rerun resumes.
  overrides = [arg.removeprefix("--").removeprefix("config.") for arg in RUN[1:]]
  whole = runner.run(
      runner.load_config(SYNTHETIC, overrides + MIRRORED_IN_PROCESS), str(tmp_path / "whole"), quiet=True
  )
  assert whole.global_step == STEPS
  status, stdout, stderr = resumed.wait()
  assert status == 0, stderr[-3000:]
  assert f"Resuming at step {step}: each input pipeline starts its stream at the examples of step {step}" in stderr
  assert f"global step: {STEPS}" in stdout
  got = process_testlib.final_checkpoint_values(tmp_path / "stopped")
  want = process_testlib.final_checkpoint_values(tmp_path / "whole")
  assert sorted(got) == sorted(want) and len(got) > 4
  for name, value in want.items():
    np.testing.assert_allclose(got[name], value, rtol=1e-6, atol=1e-7, err_msg=name)


def _catches(pid, signum):
  """Whether process `pid` has a handler for `signum` now (its SigCgt mask in /proc)."""
  with open(f"/proc/{pid}/status", encoding="utf-8") as f:
    caught = next(int(line.split()[1], 16) for line in f if line.startswith("SigCgt:"))
  return bool(caught >> (signum - 1) & 1)


@pytest.mark.parametrize(
    "signum, name", [(signal.SIGTERM, "SIGTERM"), (signal.SIGINT, "Ctrl-C")], ids=["SIGTERM", "SIGINT"]
)
def test_a_signal_during_start_up_is_one_line_and_its_status_and_writes_nothing(signum, name, tmp_path, subprocess_env):
  run = Run(tmp_path / "run", RUN + ONE_DEVICE, subprocess_env)
  run.wait_for(lambda: _catches(run.process.pid, signal.SIGTERM), "a SIGTERM handler", timeout=30)
  time.sleep(random.Random(signum).uniform(0, 0.8))  # Within start-up: loading TensorFlow alone takes longer.
  run.process.send_signal(signum)
  status, stdout, stderr = run.wait(timeout=60)
  assert (status, stdout) == (128 + signum, ""), stderr[-3000:]
  assert stderr.splitlines()[-1] == f"Stopped by {name} during start-up; nothing was written."
  assert not (tmp_path / "run").exists()
  _no_traceback(stderr)


def test_a_second_ctrl_c_aborts_at_once_without_saving(tmp_path, subprocess_env):
  # Loops of several seconds (about 4 s here): both Ctrl-Cs come while the second one runs, inside TensorFlow,
  # where Python runs no signal handler until the loop's call returns.
  long_loops = _run_args(train_steps=1000000, steps_per_loop=10000, checkpoint_every=10000)
  run = Run(tmp_path / "run", long_loops + ONE_DEVICE, subprocess_env)
  checkpoints = str(tmp_path / "run" / "checkpoints")
  run.wait_for(lambda: tf.train.latest_checkpoint(checkpoints) is not None, "the first loop's checkpoint")
  run.process.send_signal(signal.SIGINT)
  run.wait_for(
      lambda: "Press Ctrl-C again to abort without saving." in run.stderr(), "the first Ctrl-C's line", timeout=5
  )  # Said at once, not when the loop ends.
  run.process.send_signal(signal.SIGINT)
  sent = time.monotonic()
  status, _, stderr = run.wait()
  assert status == 130 and time.monotonic() - sent < 5, stderr[-3000:]
  assert "Press Ctrl-C again to abort without saving." in stderr
  assert "Second Ctrl-C: aborted without saving; a rerun resumes from the last checkpoint." in stderr
  assert "Stopped by" not in stderr
  _no_traceback(stderr)
  assert [row["step"] for row in run.train_rows()] == [10000]  # Aborted within the second loop.
  assert tf.train.latest_checkpoint(checkpoints).endswith("ckpt-10000")
  assert process_testlib.final_checkpoint_values(tmp_path / "run")
  assert workdir_lock.FILE_NAME not in os.listdir(tmp_path / "run")  # Released by process_exit.exit_now.


def _full_disk():
  """In the child: files may not grow past 200 kB (the checkpoint does), and writing past that fails, not kills."""
  signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
  resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, 200_000))


def _one_kilobyte_files(command, env):
  """Starts `command` as under `ulimit -f 1`: no file may grow past 1 kB, and writing past that fails (EFBIG).

  Its output goes to pipes, as to a terminal (a log file would be limited too).

  Returns:
    A function that waits for the exit and returns `(status, stdout, stderr, pid)`.
  """

  def limit():
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1024, 1024))

  process = subprocess.Popen(
      command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=limit  # noqa: PLW1509
  )

  def wait():
    with process:
      stdout, stderr = process.communicate(timeout=process_testlib.TIMEOUT_SECONDS)
    return process.returncode, stdout, stderr, process.pid

  return wait


# The runs that end by themselves (a failure, a stop they send themselves): all started at once by `ended_runs`.
_CONVERTING = """
    import os, signal, time

    def data(config, split):
      try:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30)
      except BaseException:
        raise ImportError("initialization failed")
    """
_STOP_MID_IMPORT = """
    import os, signal, sys

    class _StopMidImport:
      def find_spec(self, name, path=None, target=None):
        if name == "tensorflow._api.v2.config":
          sys.meta_path.remove(self)
          os.kill(os.getpid(), signal.SIGTERM)
        return None

    sys.meta_path.insert(0, _StopMidImport())
    """
_FAILING = """
    import tensorflow as tf

    def fail_after_30(index):
      if index >= 30:
        raise RuntimeError("the dataset broke down")  # A program error, not a data mistake: exit 1.
      return tf.zeros([16])

    def data(config, split):
      features = tf.data.Dataset.range(10_000).map(
          lambda i: tf.ensure_shape(tf.py_function(fail_after_30, [i], tf.float32), [16]))
      return tf.data.Dataset.zip(features, tf.data.Dataset.range(10_000).map(lambda i: tf.cast(i % 10, tf.int32)))
    """
_ROLLBACK = """
    import sys
    from runner.workdir import state as workdir_state
    workdir = sys.argv[1]
    state = workdir_state.WorkdirState.read(workdir, created=False)
    for name, text in [("config.json", "{}\\n"), ("config_history.jsonl", '{"step": 0}\\n{"step": 5}\\n'),
                       ("added.txt", "a file the run added")]:
      with open(f"{workdir}/{name}", "w") as f:  # What a run wrote before it failed.
        f.write(text)
    state.restore_unless_trained()
    print("returned")
    """
# The full disk's run: a checkpoint of about 900 kB; the run the full disk interrupts resumes one that ended at step
# 100 (trained in this process).
_FULL_DISK = [
    "mode=train",
    "strategy.name=one_device",
    "data.num_examples=512",
    "model.hidden_units=(256,256)",
    "trainer.steps_per_loop=10",
    "trainer.checkpoint_every=50",
    "trainer.max_to_keep=1",
]
_UNWRITABLE_CONFIG = ["mode=train", "strategy.name=one_device", "data.num_examples=512", "trainer.steps_per_loop=10"]


def _with_path(env, directory):
  return dict(env, PYTHONPATH=os.pathsep.join([str(directory), env["PYTHONPATH"]]))


def _module_file(directory, name, text):
  directory.mkdir()
  (directory / name).write_text(textwrap.dedent(text))
  return directory


@pytest.fixture(scope="module")
def ended_runs(tmp_path_factory):
  """The runs of the tests below, started at once (each a TensorFlow start-up: together they take far less time).

  Returns:
    {case: (status, stdout, stderr[, pid])}, and {case: its workdir} under "workdirs".
  """
  tmp = tmp_path_factory.mktemp("ended")
  env = paths.subprocess_environment()
  workdirs = {case: tmp / case for case in ("converting", "half_imported", "rollback", "full_disk", "unwritable")}
  waits = {}
  # 4 runs whose dataset raises mid-run (status 1) at once: a 1-in-4 hang shows in 68% of runs of that test.
  failing = _with_path(env, _module_file(tmp / "failing", "failing.py", _FAILING))
  short = [
      f"--config={SYNTHETIC}",
      "--mode=train",
      "--config.strategy.name=one_device",
      "--config.trainer.train_steps=20",
      "--config.trainer.steps_per_loop=10",
      "--config.data.name=failing:data",
  ]
  for i in range(4):
    waits[f"raises{i}"] = Run(tmp / f"raises{i}", short, failing).wait
  converting = _with_path(env, _module_file(tmp / "converting_module", "converting.py", _CONVERTING))
  waits["converting"] = Run(
      workdirs["converting"], RUN + ONE_DEVICE + ["--config.data.name=converting:data"], converting
  ).wait
  mid_import = _with_path(env, _module_file(tmp / "mid_import", "sitecustomize.py", _STOP_MID_IMPORT))
  waits["half_imported"] = Run(workdirs["half_imported"], RUN + ONE_DEVICE, mid_import).wait
  rollback = workdirs["rollback"]
  rollback.mkdir()
  (rollback / "config.json").write_text(json.dumps({"padding": "x" * 2000}))  # Too big to write back under 1 kB.
  (rollback / "config_history.jsonl").write_text('{"step": 0}\n')
  waits["rollback"] = _one_kilobyte_files([sys.executable, "-c", textwrap.dedent(_ROLLBACK), str(rollback)], env)
  # Runs that continue one trained here, while the runs above start.
  finished = runner.run(
      runner.load_config(SYNTHETIC, _FULL_DISK + ["trainer.train_steps=100"]), str(workdirs["full_disk"]), quiet=True
  )
  assert finished.global_step == 100
  more = [f"--config={SYNTHETIC}"] + [f"--{o}" if o.startswith("mode=") else f"--config.{o}" for o in _FULL_DISK]
  waits["full_disk"] = Run(
      workdirs["full_disk"], more + ["--config.trainer.train_steps=200"], env, preexec_fn=_full_disk
  ).wait
  unwritable = workdirs["unwritable"]
  runner.run(
      runner.load_config(SYNTHETIC, _UNWRITABLE_CONFIG + ["trainer.train_steps=20"]), str(unwritable), quiet=True
  )
  before = process_testlib.files_of(unwritable)
  waits["unwritable"] = _one_kilobyte_files(
      [sys.executable, "-m", "runner", f"--config={SYNTHETIC}", f"--workdir={unwritable}"]
      + [f"--config.{override}" for override in _UNWRITABLE_CONFIG]
      + ["--config.trainer.train_steps=40"],
      env,
  )
  ended = {case: wait() for case, wait in waits.items()}
  return dict(ended, workdirs=workdirs, unwritable_before=before)


def test_a_signal_that_a_library_turns_into_another_error_is_still_the_stop(ended_runs):
  # TensorFlow's import turns the stop's exception into `ImportError: initialization failed` when the signal comes
  # inside its native module's start-up, a moment a test cannot hit at will. A data function that does the same
  # makes that moment certain (`_CONVERTING`): the workdir exists by then, holding the run's lock.
  status, stdout, stderr = ended_runs["converting"]
  assert (status, stdout) == (143, ""), stderr[-3000:]
  assert stderr.splitlines()[-1] == "Stopped by SIGTERM during start-up; nothing was written."
  assert not ended_runs["workdirs"]["converting"].exists()
  _no_traceback(stderr)


def test_a_signal_while_tensorflow_is_half_imported_is_the_stop(ended_runs):
  # An import hook sends SIGTERM the moment TensorFlow loads `tf.config` (`_STOP_MID_IMPORT`): `tf.distribute` is
  # set by then, `tf.train` is not. The handler must not import anything that reads TensorFlow's half-made module.
  status, stdout, stderr = ended_runs["half_imported"]
  assert (status, stdout) == (143, ""), stderr[-3000:]
  assert stderr.splitlines()[-1] == "Stopped by SIGTERM during start-up; nothing was written."
  _no_traceback(stderr)


def test_a_full_disk_at_save_time_is_one_error_and_the_previous_checkpoint_stays(ended_runs):
  workdir = ended_runs["workdirs"]["full_disk"]
  status, _, stderr = ended_runs["full_disk"]
  errors = [line for line in stderr.splitlines() if line.startswith("error:")]
  assert status == 2 and len(errors) == 1, stderr[-3000:]
  assert errors[0].startswith("error: Could not write the checkpoint of step 150 to ")
  assert "File too large" in errors[0] or "too large" in errors[0].lower()
  assert "{{function_node" not in errors[0] and "[Op:" not in errors[0]  # TensorFlow's wrapping, not the user's.
  assert errors[0].endswith(
      "ckpt-100 is intact: free some space or fix the permissions, then run again to resume from it."
  )
  _no_traceback(stderr)
  assert sorted(os.listdir(workdir / "checkpoints")) == [
      "checkpoint",
      "ckpt-100.data-00000-of-00001",
      "ckpt-100.index",
  ]
  # Space again: the same run (here in this process) resumes from ckpt-100.
  resumed = runner.run(
      runner.load_config(SYNTHETIC, _FULL_DISK + ["trainer.train_steps=200"]), str(workdir), quiet=True
  )
  assert resumed.global_step == 200
  assert process_testlib.config_history(workdir)[-1]["step"] == 100


def test_a_config_that_cannot_be_written_is_one_error_and_every_file_stays_as_it_was(ended_runs):
  workdir = ended_runs["workdirs"]["unwritable"]
  before = ended_runs["unwritable_before"]
  assert len(before["config.json"]) > 1024 and len(before["config_history.jsonl"]) > 1024
  status, stdout, stderr, pid = ended_runs["unwritable"]
  assert status == 2 and stdout == "", stderr[-3000:]
  _no_traceback(stderr)
  [error] = [line for line in stderr.splitlines() if line.startswith("error:")]
  assert re.fullmatch(
      re.escape(
          f"error: Could not write the run's config.json and config_history.jsonl in {workdir} ({workdir}/"
          f"config_history.jsonl.tmp-{pid}-"
      )
      + r"[0-9a-f]{8}"
      + re.escape("; File too large); neither was changed: free some space or fix the permissions, then run again."),
      error,
  ), error
  # Byte for byte: config files, metrics.jsonl, checkpoints; no lock, no .tmp-*.
  assert process_testlib.files_of(workdir) == before


def test_a_rollback_that_cannot_write_leaves_each_file_whole_and_does_not_raise(ended_runs):
  workdir = ended_runs["workdirs"]["rollback"]
  status, stdout, stderr, _ = ended_runs["rollback"]
  assert status == 0 and stdout == "returned\n", stderr[-3000:]
  assert f"Could not put {workdir}/config.json back as it was before the run: {workdir}/config.json.tmp-" in stderr
  # Each file whole (the run's config.json, the old history), no part, no .tmp- file.
  assert process_testlib.files_of(workdir) == {"config.json": b"{}\n", "config_history.jsonl": b'{"step": 0}\n'}


def test_a_run_that_fails_ends_promptly_with_status_1(ended_runs):
  """A failed run must exit: TensorFlow's tf.data can deadlock at interpreter exit (1 in 4 seen).

  4 runs whose dataset raises mid-run (status 1, `_FAILING`), started at once with the other runs of `ended_runs`.
  Runs that end well (status 0) are the rest of the suite's processes, each waited for with a timeout.
  """
  for i in range(4):
    status, stdout, stderr = ended_runs[f"raises{i}"]
    assert (status, stdout) == (1, ""), stderr[-3000:]
    assert "RuntimeError: the dataset broke down" in stderr, stderr[-3000:]
