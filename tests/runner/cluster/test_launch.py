"""`python -m runner.launch`: the TF_CONFIG of every task, bad input, and real 2-worker jobs run through it.

The helpers and bad input need no TensorFlow and cost a fraction of a second.
The jobs are real processes on localhost ports. One uninterrupted job (a
module fixture) trains to the end, and is what the stopped jobs must end as:
one has a worker SIGKILLed and must restart, and the same 2 workers started
without the launcher get SIGTERM at one of them. Five jobs run side by side
(a module fixture): one fails with a user error and one with a bug, neither
restarted; the others get a stop at a random moment (SIGTERM, a terminal's
Ctrl-C) or lose their launcher to SIGKILL, and what they saved is checked on
disk. One job freezes and loses a parameter-server worker.
"""

import os
import random
import re
import signal
import subprocess
import sys
import time

import numpy as np
import portpicker
import pytest
import tensorflow as tf

from runner import exit_codes
from runner import launch as launcher
from testlib import paths
from testlib import process_testlib

REPO = paths.REPO
SYNTHETIC = os.path.join(REPO, "configs", "synthetic.py")
TIMEOUT_SECONDS = 240
STEPS = 300  # A killed job: killed after step 120, past its checkpoint at step 100, restarted to the end.
FAST_STOP = ["--grace_seconds=5"]  # A worker whose peer died may hang in a collective: do not wait 30 s for it.


def _runner_args(workdir, **trainer):
  """The runner's arguments for a synthetic 2-worker job; by default a few seconds in loops of 10."""
  trainer = {"train_steps": STEPS, "steps_per_loop": 10, "checkpoint_every": 100, **trainer}
  return [f"--config={SYNTHETIC}", f"--workdir={workdir}", "--mode=train", "--config.data.num_examples=512"] + [
      f"--config.trainer.{field}={value}" for field, value in trainer.items()
  ]


class Launch(process_testlib.TrainingProcess):
  """`python -m runner.launch LAUNCHER_ARGS -- RUNNER_ARGS` in a child process, its output in files."""

  def __init__(self, workdir, launcher_args, runner_args, env, preexec_fn=None):
    super().__init__(
        [sys.executable, "-m", "runner.launch", *launcher_args, "--", *runner_args],
        workdir=workdir,
        env=env,
        name="launch",
        preexec_fn=preexec_fn,
    )

  def pids(self, task):
    """The pids of `task` (e.g. 'worker:1'), one per start of the job, from the launcher's `[launch]` lines."""
    return [int(pid) for pid in re.findall(rf"^\[launch\] {task} pid (\d+) on localhost:\d+$", self.stderr(), re.M)]


def _launcher(args, env, timeout=60, **kwargs):
  """Runs `python -m runner.launch ARGS` to its end; returns the CompletedProcess."""
  return subprocess.run(
      [sys.executable, "-m", "runner.launch", *args],
      cwd=REPO,
      env=env,
      capture_output=True,
      text=True,
      timeout=timeout,
      check=False,
      **kwargs,
  )


def _latest_step(workdir):
  """The step of the checkpoint a rerun in `workdir` resumes from, or None."""
  path = tf.train.latest_checkpoint(os.path.join(str(workdir), "checkpoints"))
  return None if path is None else int(path.rpartition("-")[2])


def _ended(pid):
  """Whether process `pid` (not this one's child) has ended: gone, or a zombie nobody reaped yet."""
  try:
    with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
      return f.read().rpartition(")")[2].split()[0] == "Z"
  except FileNotFoundError:
    return True


def _ports(cluster):
  return [int(address.rsplit(":", 1)[1]) for addresses in cluster.values() for address in addresses]


def test_the_cluster_of_a_job_on_free_localhost_ports():
  cluster = launcher.cluster_spec(workers=2, ps=0)
  assert list(cluster) == ["worker"] and len(cluster["worker"]) == 2
  assert all(re.fullmatch(r"localhost:\d+", address) for address in cluster["worker"])
  assert len(set(_ports(cluster))) == 2
  cluster = launcher.cluster_spec(workers=2, ps=1)
  assert {job: len(addresses) for job, addresses in cluster.items()} == {"chief": 1, "worker": 2, "ps": 1}
  assert len(set(_ports(cluster))) == 4
  assert [launcher.task_name(job, 0) for job in cluster] == ["chief", "worker:0", "ps:0"]


def test_the_runner_arguments_get_the_jobs_strategy():
  assert launcher.runner_arguments(["--config=c.py", "--workdir=/w"], ps=0) == [
      "--config=c.py",
      "--workdir=/w",
      "--config.strategy.name=multi_worker_mirrored",
  ]
  assert launcher.runner_arguments(["--workdir", "/w"], ps=1) == [
      "--workdir",
      "/w",
      "--config.strategy.name=parameter_server",
  ]
  named = ["--workdir=/w", "--config.strategy.name=multi_worker_mirrored"]
  assert launcher.runner_arguments(named, ps=0) == named


def test_exit_statuses():
  assert [launcher.describe_exit(code) for code in (2, 143, -9)] == [
      "exited with status 2",
      "exited with status 143",
      "was killed by SIGKILL",
  ]
  assert [launcher.exit_status(code) for code in (1, 2, 3, 143, 255, -9, -15)] == [1, 2, 3, 143, 255, 137, 143]


def test_the_workdir_and_its_latest_checkpoint_are_read_without_tensorflow(tmp_path):
  assert launcher.workdir_of(["--config=c.py", f"--workdir={tmp_path}"]) == str(tmp_path)
  assert launcher.workdir_of(["-workdir", "gs://bucket/run", "--mode=train"]) == "gs://bucket/run"
  assert launcher.workdir_of(["--config=c.py", "--workdir"]) is None
  assert launcher.workdir_of(["--workdir=~/run"]) == os.path.join(os.path.expanduser("~"), "run")  # As the runner.
  assert launcher.stop_outcome(str(tmp_path), None) == (
      "no checkpoint was written; a rerun of the same command starts from step 0"
  )
  (tmp_path / "checkpoints").mkdir()
  for name in ("checkpoint", "ckpt-20.index", "ckpt-40.index", "ckpt-40.data-00000-of-00001", "ckpt-60_temp"):
    (tmp_path / "checkpoints" / name).write_text("")  # A damaged list, and what a killed save of step 60 left.
  assert launcher.latest_checkpoint(str(tmp_path)) == ("ckpt-40", 40)
  assert launcher.stop_outcome(str(tmp_path), None) == (
      "saved ckpt-40 at step 40; rerun the same command to resume from there"
  )
  assert launcher.stop_outcome(str(tmp_path), ("ckpt-40", 40)) == (
      "no checkpoint was written by this stop; the latest is ckpt-40 (step 40), where a rerun of the same command "
      "resumes"
  )
  assert launcher.stop_outcome("gs://bucket/run", None).endswith("(the workdir is not local)")


RUNNER = ["--", f"--config={SYNTHETIC}", "--workdir=/tmp/never-made"]
EXAMPLE = "e.g. python -m runner.launch --workers=2 -- --config=configs/synthetic.py --workdir=/tmp/job"


@pytest.mark.parametrize(
    "args, message",
    [
        (RUNNER, f"--workers is required, {EXAMPLE}"),
        (["--workers=0"] + RUNNER, "flag --workers=0: 0 is not a positive integer"),
        (["--workers=two"] + RUNNER, "flag --workers=two: invalid literal for int() with base 10: 'two'"),
        (["--workers=2", "--ps=-1"] + RUNNER, "flag --ps=-1: -1 is not a non-negative integer"),
        (["--workers=2", "--max_restarts=-1"] + RUNNER, "flag --max_restarts=-1: -1 is not a non-negative integer"),
        (["--workers=2", "--grace_seconds=-1"] + RUNNER, "flag --grace_seconds=-1: -1.0 is not a non-negative number"),
        (["--workers=2"], f"Give the runner's arguments after --, {EXAMPLE}"),
        (["--workers=2", "--"], f"Give the runner's arguments after --, {EXAMPLE}"),
        (
            ["--workers=2", f"--config={SYNTHETIC}"],
            f"Unknown command line flag 'config'; the runner's arguments go after --, {EXAMPLE}",
        ),
        (
            ["--workers=2", "train"] + RUNNER,
            f"Unexpected arguments ['train'] before --; the runner's arguments go after --, {EXAMPLE}",
        ),
        (
            ["--workers=2", "--", f"--config={SYNTHETIC}"],
            "The runner arguments have no --workdir=DIR: every task and every restart must use the same workdir (all tasks "
            "restore from the chief's checkpoints there), and without one each task would make its own temporary "
            "directory.",
        ),
        (
            ["--workers=2"] + RUNNER + ["--config.strategy.name=mirrored"],
            "--config.strategy.name=mirrored does not fit this job: a job without --ps runs "
            "--config.strategy.name=multi_worker_mirrored (the launcher adds it when the arguments do not name it).",
        ),
        (
            ["--workers=2", "--ps=1"] + RUNNER + ["--config.strategy.name=multi_worker_mirrored"],
            "--config.strategy.name=multi_worker_mirrored does not fit this job: a job with --ps runs "
            "--config.strategy.name=parameter_server (the launcher adds it when the arguments do not name it).",
        ),
        (["--workers=2", "--data_workers=-1"] + RUNNER, "flag --data_workers=-1: -1 is not a non-negative integer"),
        (["--data_workers=2"] + RUNNER, f"--workers is required, {EXAMPLE}"),
        (
            ["--workers=1", "--data_workers=2"] + RUNNER + ["--config.data.service=grpc://127.0.0.1:5050"],
            "--data_workers=2 starts a tf.data service and gives the job its dispatcher: remove "
            "--config.data.service=grpc://127.0.0.1:5050, or drop --data_workers to read from that dispatcher.",
        ),
        (
            ["--workers=2"] + RUNNER + ["--config.strategy.task_index=1"],
            "Remove --config.strategy.task_index=1: the launcher gives every task its place in the cluster in TF_CONFIG.",
        ),
    ],
    ids=lambda value: None if isinstance(value, list) else re.sub(r"\W+", "_", value[:40]),
)
def test_bad_input_is_one_error_line_and_exit_2(args, message, subprocess_env):
  result = _launcher(args, subprocess_env)
  assert (result.returncode, result.stdout, result.stderr) == (2, "", f"error: {message}\n")


def test_a_tf_config_in_the_environment_is_refused(subprocess_env):
  result = _launcher(["--workers=2"] + RUNNER, dict(subprocess_env, TF_CONFIG='{"cluster": {}}'))
  assert (result.returncode, result.stdout) == (2, "")
  assert result.stderr == (
      "error: TF_CONFIG is set in this environment, and the launcher gives every task its own: "
      "unset it. (On a real cluster, set TF_CONFIG on each host and run python -m runner "
      "there.)\n"
  )


def test_help_exits_0_and_the_launcher_imports_no_tensorflow(subprocess_env):
  result = _launcher(["--help"], subprocess_env)
  assert result.returncode == 0 and result.stderr == ""
  assert result.stdout.startswith("`python -m runner.launch --workers=N [--ps=M] [--max_restarts=K]")
  for flag in ("--workers", "--ps", "--max_restarts", "--grace_seconds"):
    assert f"  {flag}: " in result.stdout
  imported = subprocess.run(
      [
          sys.executable,
          "-c",
          "import sys, runner.launch; print(sorted({m.split('.')[0] for m in sys.modules} & "
          "{'tensorflow', 'keras', 'numpy'}))",
      ],
      cwd=REPO,
      env=subprocess_env,
      capture_output=True,
      text=True,
      timeout=60,
      check=True,
  )
  assert imported.stdout == "[]\n"


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
  """An uninterrupted 2-worker job of STEPS steps, started once for the file: what stopped jobs must end as."""
  workdir = tmp_path_factory.mktemp("uninterrupted") / "job"
  job = Launch(workdir, FAST_STOP + ["--workers=2"], _runner_args(workdir), paths.subprocess_environment())
  yield job
  job.process.kill()


def test_a_signal_to_one_worker_stops_both_then_a_killed_worker_restarts_the_job_which_ends_as_an_uninterrupted_one(
    uninterrupted, tmp_path, subprocess_env
):
  """One job in one workdir, started three times; at the end it holds the weights of the uninterrupted job.

  1. Its 2 workers started without the launcher (each with `worker_hosts` and `task_index`): SIGTERM to the non-chief
     stops both at one step, where both save.
  2. The same job under the launcher, which may restart it once, resumes from there; worker:1 is SIGKILLed past the
     next checkpoint.
  3. The launcher restarts the job, which resumes from its last checkpoint and trains to the end.
  """
  workdir = tmp_path / "job"
  hosts = tuple(f"localhost:{portpicker.pick_unused_port()}" for _ in range(2))
  stopped = [
      process_testlib.TrainingProcess(
          [sys.executable, "-m", "runner", *_runner_args(workdir), "--config.strategy.name=multi_worker_mirrored"]
          + [f"--config.strategy.worker_hosts={hosts!r}", f"--config.strategy.task_index={index}"],
          workdir=workdir,
          env=subprocess_env,
          name=f"worker{index}",
      )
      for index in range(2)
  ]
  stopped[0].wait_for_rows(3)
  stopped[1].process.send_signal(signal.SIGTERM)
  results = [run.wait() for run in stopped]
  assert [status for status, _, _ in results] == [143, 143], [stderr[-2000:] for _, _, stderr in results]
  step = stopped[0].train_rows()[-1]["step"]
  assert 30 <= step < STEPS - 100  # Room for a checkpoint after it, and for the kill past that one.
  for _, _, stderr in results:
    assert f"Stopped by SIGTERM: saved a checkpoint at step {step} (" in stderr
    assert "Traceback" not in stderr, stderr[-3000:]

  killed = Launch(workdir, FAST_STOP + ["--workers=2", "--max_restarts=1"], _runner_args(workdir), subprocess_env)
  past = (step // 100 + 1) * 100 + 20  # Past the next checkpoint.
  killed.wait_for(lambda: killed.train_rows()[-1]["step"] >= past, f"train rows to step {past}")
  [pid] = killed.pids("worker:1")
  os.kill(pid, signal.SIGKILL)
  status, stdout, stderr = killed.wait()
  assert status == 0, stderr[-3000:]
  assert (
      stderr.count("[launch] worker:1 was killed by SIGKILL; stopping the other tasks (SIGTERM, SIGKILL after 5 s).\n")
      == 1
  )
  assert len(re.findall(r"^\[launch\] restart", stderr, re.M)) == 1
  assert (
      "[launch] restart 1 of 1: worker:1 was killed by SIGKILL; the job resumes from the last checkpoint in its "
      "workdir.\n"
  ) in stderr
  assert [len(killed.pids(task)) for task in ("worker:0", "worker:1")] == [2, 2]
  resumed = re.findall(r"^\[worker:([01])\] .*Resuming at step (\d+): ", stderr, re.M)
  resumed_from = max(int(at) for _, at in resumed)  # The restart's.
  assert sorted(resumed) == sorted((worker, str(at)) for worker in "01" for at in (step, resumed_from)), resumed
  assert resumed_from % 100 == 0 and past - 20 <= resumed_from < STEPS  # The last checkpoint saved.
  # The first start under the launcher wrote rows past its last checkpoint (unless it saved again before the kill);
  # the restarted job dropped them and trained those steps again, so each step has one row.
  dropped = re.findall(r"^\[worker:0\] .*Dropped \d+ row\(s\) of .* past step (\d+)", stderr, re.M)
  assert [int(at) for at in dropped] in ([resumed_from], []), stderr[-3000:]
  assert [row["step"] for row in killed.train_rows()] == list(range(10, STEPS + 1, 10))
  for worker in (0, 1):
    assert stdout.count(f"[worker:{worker}] global step: {STEPS}\n") == 1
  assert uninterrupted.wait()[0] == 0

  got, want = killed.train_rows()[-1], uninterrupted.train_rows()[-1]
  np.testing.assert_allclose(got["loss"], want["loss"], rtol=1e-5)
  expected = process_testlib.final_checkpoint_values(uninterrupted.workdir)
  values = process_testlib.final_checkpoint_values(workdir)
  assert sorted(values) == sorted(expected) and len(values) > 4
  for name, value in expected.items():
    np.testing.assert_allclose(values[name], value, rtol=1e-6, atol=1e-7, err_msg=name)


def test_an_uninterrupted_two_worker_job_trains_to_the_configured_step(uninterrupted):
  status, stdout, stderr = uninterrupted.wait()
  assert status == 0, stderr[-3000:]
  assert len(uninterrupted.pids("worker:0")) == 1 and len(uninterrupted.pids("worker:1")) == 1
  for worker in (0, 1):
    assert f"[worker:{worker}] global step: {STEPS}\n" in stdout
    assert (
        f"[worker:{worker}] strategy: multi_worker_mirrored: 2 replicas on 2 workers; this is worker:{worker} on "
        in stdout
    )
  assert all(re.match(r"\[(worker:[01]|launch)\] ", line) for line in stdout.splitlines() + stderr.splitlines())
  rows = uninterrupted.train_rows()  # The chief's alone: one row per loop of 10 steps.
  assert [row["step"] for row in rows] == list(range(10, STEPS + 1, 10))
  train_line = re.search(r"^\[worker:0\] train: accuracy=[\d.]+ loss=([\d.]+)$", stdout, re.M)
  assert float(train_line.group(1)) == pytest.approx(rows[-1]["loss"], abs=5e-5)
  assert rows[-1]["loss"] < rows[0]["loss"] / 4
  assert tf.train.latest_checkpoint(os.path.join(uninterrupted.workdir, "checkpoints")).endswith(f"ckpt-{STEPS}")


NEVER = 10**6  # train_steps and checkpoint_every of a job that only a stop ends: no checkpoint before it.
STOPS = {signal.SIGTERM: "SIGTERM", signal.SIGINT: "Ctrl-C (SIGINT)"}


def _act_when_ready(events):
  """Calls each `act()` `delay` s after its `ready()` first holds; `events` are (job, what, ready, delay, act).

  The jobs run side by side: each act comes at its own job's moment.
  """
  due, done = {}, set()
  deadline = time.monotonic() + TIMEOUT_SECONDS
  while len(done) < len(events):
    for index, (job, what, ready, delay, act) in enumerate(events):
      if index in done:
        continue
      assert job.process.poll() is None, f"{job.name} exited before {what}: {job.stderr()[-3000:]}"
      if index not in due and ready():
        due[index] = time.monotonic() + delay
      if index in due and time.monotonic() >= due[index]:
        act()
        done.add(index)
    assert time.monotonic() < deadline, f"no {[events[i][1] for i in range(len(events)) if i not in done]} in time"
    time.sleep(0.05)


@pytest.fixture(scope="module")
def ended_early(tmp_path_factory):
  """Jobs that end before train_steps, started side by side once for the file: {name: (workdir, job, outcome)}.

  A user error in both tasks; a bug in a task; SIGTERM to the launcher within 2 s of the tasks' start (start-up,
  where nothing may be written); Ctrl-C at the launcher's terminal (SIGINT to its whole process group) within 2 s of
  a train row (training, before any checkpoint, where both workers must save at one step); SIGKILL to the launcher
  after 1 to 20 train rows (its workers' pids are `job.workers`). The tests check either outcome of a stop,
  whichever comes.
  """
  env = paths.subprocess_environment()
  workdirs = {
      name: tmp_path_factory.mktemp(name) / "job" for name in ("user_error", "bug", "SIGTERM", "SIGINT", "sigkill")
  }
  never = {field: NEVER for field in ("train_steps", "checkpoint_every")}
  jobs = {
      "user_error": Launch(
          workdirs["user_error"],
          FAST_STOP + ["--workers=2", "--max_restarts=3"],
          _runner_args(workdirs["user_error"], train_steps=-1),
          env,
      ),
      # json.loads(config.model) raises TypeError: an exception the runner does not know, a bug (status 1). One
      # worker is enough: the failing job of two workers is the user error's.
      "bug": Launch(
          workdirs["bug"],
          FAST_STOP + ["--workers=1", "--max_restarts=3"],
          _runner_args(workdirs["bug"]) + ["--config.model.name=json:loads"],
          env,
      ),
      **{
          signum.name: Launch(
              workdirs[signum.name],
              ["--workers=2"],
              _runner_args(workdirs[signum.name], **never),
              env,
              preexec_fn=os.setsid,  # A terminal's process group: the launcher leads it.
          )
          for signum in STOPS
      },
      "sigkill": Launch(workdirs["sigkill"], ["--workers=2"], _runner_args(workdirs["sigkill"], **never), env),
  }
  killed = jobs["sigkill"]
  killed.workers = []

  def kill_the_launcher():
    killed.workers = killed.pids("worker:0") + killed.pids("worker:1")
    killed.process.kill()

  try:
    _act_when_ready(
        [
            (
                jobs["SIGTERM"],
                "tasks' start",
                lambda: jobs["SIGTERM"].pids("worker:1"),
                random.Random(signal.SIGTERM).uniform(0, 2),
                lambda: jobs["SIGTERM"].process.send_signal(signal.SIGTERM),
            ),
            (
                jobs["SIGINT"],
                "train row",
                lambda: jobs["SIGINT"].pids("worker:1") and jobs["SIGINT"].train_rows(),
                random.Random(signal.SIGINT).uniform(0, 2),
                lambda: os.killpg(jobs["SIGINT"].process.pid, signal.SIGINT),
            ),
            (
                killed,
                "train rows",
                lambda: len(killed.train_rows()) >= random.Random(7).randint(1, 20),
                0,
                kill_the_launcher,
            ),
        ]
    )
    yield {name: (workdirs[name], job, job.wait()) for name, job in jobs.items()}
  finally:
    for job in jobs.values():
      job.process.kill()
    for pid in killed.workers:
      if not _ended(pid):
        os.kill(pid, signal.SIGKILL)


def test_a_user_error_in_a_task_ends_the_job_with_2_and_is_not_restarted(ended_early):
  _, job, (status, stdout, stderr) = ended_early["user_error"]
  assert (status, stdout) == (2, ""), stderr[-3000:]
  errors = re.findall(r"^(?:\[[\w:]+\] )?error: .*$", stderr, re.M)  # The tasks' `error:` lines, prefixed.
  assert 1 <= len(errors) <= 2, stderr[-3000:]  # One per worker that got to print it before being stopped.
  assert all(
      re.fullmatch(r"\[worker:[01]\] error: config\.trainer\.train_steps must be a positive int, got -1\.", line)
      for line in errors
  ), errors
  assert re.search(
      r"^\[launch\] the job failed: worker:[01] exited with status 2 \(a user error\), which a restart "
      r"would repeat; exit status 2\.$",
      stderr,
      re.M,
  ), stderr[-3000:]
  assert "restart" not in stderr.replace("which a restart would repeat", "")
  assert [len(job.pids(task)) for task in ("worker:0", "worker:1")] == [1, 1]
  assert "Traceback" not in stderr


def test_a_bug_in_a_task_is_permanent_and_not_restarted(ended_early):
  _, job, (status, _, stderr) = ended_early["bug"]
  assert status == exit_codes.BUG, stderr[-3000:]
  assert re.search(
      r"^\[launch\] the job failed: worker:0 exited with status 1 \(a bug\), which a restart would repeat; "
      r"exit status 1\.$",
      stderr,
      re.M,
  ), stderr[-3000:]
  assert len(job.pids("worker:0")) == 1
  assert "TypeError: the JSON object must be str, bytes or bytearray, not ConfigDict" in stderr


def test_transient_and_permanent_statuses():
  permanent = [exit_codes.BUG, exit_codes.USER_ERROR, exit_codes.NON_FINITE, 127]
  transient = [exit_codes.CLUSTER, *exit_codes.STOPPED_BY.values(), 128, 137, 255, -9, -15]
  assert [exit_codes.is_transient(status) for status in permanent] == [False] * 4
  assert [exit_codes.is_transient(status) for status in transient] == [True] * 8
  assert (exit_codes.CLUSTER, sorted(exit_codes.STOPPED_BY.values())) == (170, [130, 143])


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stop_to_the_launcher_ends_both_workers_at_one_step_and_its_last_line_says_what_was_saved(
    signum, ended_early
):
  """SIGTERM to the launcher at start-up, or Ctrl-C at its terminal in training (see `ended_early`)."""
  workdir, job, (status, _, stderr) = ended_early[signal.Signals(signum).name]
  assert status == 128 + signum, stderr[-3000:]
  name = STOPS[signum]
  again = " again" if signum == signal.SIGINT else ""  # After SIGTERM no Ctrl-C came before.
  assert re.search(rf"^\[launch\] {re.escape(name)} received: .*\. Press Ctrl-C{again} to kill", stderr, re.M), stderr
  step = _latest_step(workdir)
  if step is None:
    assert stderr.splitlines()[-1] == (
        f"[launch] stopped by {name}: no checkpoint was written; a rerun of the same command starts from step 0."
    )
    assert not workdir.exists() or not os.listdir(workdir)  # Stopped during start-up: nothing written.
  else:
    assert stderr.splitlines()[-1] == (
        f"[launch] stopped by {name}: saved ckpt-{step} at step {step}; rerun the same command to resume from there."
    )
    assert job.train_rows()[-1]["step"] == step
    assert {"config.json", "config_history.jsonl", "metrics.jsonl", "checkpoints"} <= set(os.listdir(workdir))
    for worker in (0, 1):  # Both stopped after the same loop (the non-chief may not see the chief's file yet).
      assert re.search(rf"^\[worker:{worker}\] .*Stopped by SIGTERM: .* at step {step}\b", stderr, re.M), stderr[-3000:]
  assert "Could not write" not in stderr and "Traceback" not in stderr


def test_under_parameter_servers_a_stop_saves_a_frozen_worker_is_named_and_a_dead_worker_is_no_error(
    tmp_path, subprocess_env
):
  """1 chief, 2 workers, 1 ps; 20 steps per loop (10 on each worker).

  A stop at a random moment of training saves. The same command resumes; worker:1 is frozen (SIGSTOP) until the chief
  names it, then killed; the chief trains on with worker:0 to train_steps, and the other tasks end by themselves.
  """
  workdir, steps = tmp_path / "job", 1000
  command = (
      ["--workers=2", "--ps=1"],
      [
          f"--config={SYNTHETIC}",
          f"--workdir={workdir}",
          "--mode=train",
          f"--config.trainer.train_steps={steps}",
          "--config.trainer.steps_per_loop=10",
      ],
  )
  stopped = Launch(workdir, *command, subprocess_env)
  rng = random.Random(6)
  stopped.wait_for_rows(1)
  time.sleep(rng.uniform(0, 1))
  stopped.process.send_signal(signal.SIGTERM)
  status, _, stderr = stopped.wait()
  assert status == 143, stderr[-3000:]
  step = _latest_step(workdir)
  assert step is not None and step < steps and stopped.train_rows()[-1]["step"] == step
  assert re.search(rf"^\[chief\] .*Stopped by SIGTERM: saved a checkpoint at step {step} \(", stderr, re.M), stderr[
      -3000:
  ]
  assert stderr.splitlines()[-1] == (
      f"[launch] stopped by SIGTERM: saved ckpt-{step} at step {step}; rerun the same command to resume from there."
  )
  assert "[launch] killed" not in stderr  # No task needed SIGKILL: the servers served until the chief was done.
  for task in ("worker:0", "worker:1", "ps:0"):
    assert re.search(
        rf"^\[{task}\] .*(is done \(its port closed\)|SIGTERM received: {task} serves until)", stderr, re.M
    ), stderr[-3000:]
  assert "stopped serving at once" not in stderr and "Traceback" not in stderr

  resumed = Launch(workdir, *command, subprocess_env)
  resumed.wait_for_rows(len(stopped.train_rows()) + 3)  # Loops to take the median of.
  frozen_pids = resumed.pids("worker:1")
  assert len(frozen_pids) == 1, resumed.stderr()[-6000:]
  [frozen] = frozen_pids
  os.kill(frozen, signal.SIGSTOP)
  try:
    resumed.wait_for(lambda: "has not finished its steps" in resumed.stderr(), "the stall warning", timeout=60)
  finally:
    os.kill(frozen, signal.SIGCONT)
  address = re.search(r"^\[launch\] worker:1 pid \d+ on (localhost:\d+)$", resumed.stderr(), re.M).group(1)
  warning = re.search(
      rf"^\[chief\] .*\] worker:1 \({address}\) has not finished its steps of the loop from step (\d+) after "
      r"([\d.]+) s \(10 x the median of the last loops, at least 5 s\): it is stalled or far slower than the other "
      r"workers; the loop waits for it\.\n",
      resumed.stderr(),
      re.M,
  )
  assert warning, resumed.stderr()[-3000:]
  loop_after = re.compile(rf"reports.py:\d+\] step (\d+)/{steps}: .* \| ([\d.]+) steps/s")
  resumed.wait_for(lambda: loop_after.search(resumed.stderr()[warning.end() :]), "the loop that waited")
  os.kill(frozen, signal.SIGKILL)
  status, stdout, stderr = resumed.wait()
  assert status == 0, stderr[-3000:]
  # That loop's line came after the warning; its steps/s counts the time it waited (5 s at least) and more. It ran
  # its 20 steps, or up to 20 more when the coordinator gave the frozen worker's function to worker:0 and the thawed
  # worker:1 finished its own copy too (a lost function's steps stay applied).
  loop, steps_per_sec = loop_after.search(stderr[warning.end() :]).groups()
  first = int(warning.group(1))
  assert first + 20 <= int(loop) <= first + 40, stderr[-3000:]
  assert float(steps_per_sec) <= (int(loop) - first) / float(warning.group(2)) + 0.05, stderr[-3000:]
  assert (
      "[launch] worker:1 was killed by SIGKILL; not an error under parameter servers: the chief trains on with "
      "the other workers (it is not started again).\n"
  ) in stderr
  assert re.search(rf"^\[chief\] .*Resuming at step {step}: ", stderr, re.M), stderr[-3000:]
  final = int(re.search(r"^\[chief\] global step: (\d+)$", stdout, re.M).group(1))
  assert final >= steps and _latest_step(workdir) == final  # A lost function's steps stay applied: maybe a few more.
  assert resumed.train_rows()[-1]["loss"] < 1.6  # The bound of test_trainer_parameter_server.py at step 60.
  for task in ("worker:0", "ps:0"):
    assert f"[{task}] serving as {task} of a parameter-server cluster until the coordinator" in stdout
    # Each server ended by itself once the chief was done: no SIGTERM, no SIGKILL from the launcher.
    assert re.search(rf"^\[{task}\] .*is done \(its port closed\): {task} stops serving\.$", stderr, re.M)
  assert "SIGTERM" not in stderr and "[launch] killed" not in stderr


def test_a_launcher_killed_by_sigkill_leaves_no_task_and_its_workers_save_at_one_step(ended_early):
  workdir, job, (status, _, _) = ended_early["sigkill"]
  assert status == -signal.SIGKILL
  deadline = time.monotonic() + 60
  while not all(_ended(pid) for pid in job.workers) and time.monotonic() < deadline:
    time.sleep(0.1)
  running = [pid for pid in job.workers if not _ended(pid)]
  for pid in running:
    os.kill(pid, signal.SIGKILL)
  assert len(job.workers) == 2 and not running, "the tasks outlived their launcher"
  step = _latest_step(workdir)  # Each got SIGTERM as its parent died: they saved at the end of the same loop.
  assert step is not None and job.train_rows()[-1]["step"] == step


def test_a_job_reads_through_a_data_service_beside_it_and_survives_losing_a_data_worker(tmp_path, subprocess_env):
  """--data_workers=2: a dispatcher and 2 workers (`python -m runner.data_service`) on 127.0.0.1 serve the job.

  One data worker is SIGKILLed after the first train loop; the job reads from the other and trains to the end; the
  launcher then stops the dispatcher and the other worker, which exit cleanly.
  """
  workdir, steps = tmp_path / "job", 300
  runner_args = _runner_args(workdir, train_steps=steps, checkpoint_every=None)
  job = Launch(workdir, ["--workers=1", "--data_workers=2"], runner_args, subprocess_env)
  job.wait_for_rows(1)
  servers = dict(re.findall(r"^\[launch\] (data_\w+(?::\d)?) pid (\d+) on 127\.0\.0\.1:\d+$", job.stderr(), re.M))
  assert sorted(servers) == ["data_dispatcher", "data_worker:0", "data_worker:1"], job.stderr()[-3000:]
  os.kill(int(servers["data_worker:1"]), signal.SIGKILL)
  killed_at = job.train_rows()[-1]["step"]
  status, stdout, stderr = job.wait()
  assert status == 0, stderr[-3000:]
  assert killed_at < steps and job.train_rows()[-1]["step"] == steps and f"[worker:0] global step: {steps}\n" in stdout
  assert job.train_rows()[-1]["loss"] < 0.5  # It learned from the batches the service made.
  dispatcher = re.search(r"^\[data_dispatcher\] dispatcher serving at (grpc://127\.0\.0\.1:\d+)$", stdout, re.M).group(
      1
  )
  for worker in (0, 1):
    assert re.search(rf"^\[data_worker:{worker}\] worker serving at 127\.0\.0\.1:\d+ for {dispatcher}$", stdout, re.M)
  assert re.search(
      rf"^\[worker:0\] .*\] Mode train in the workdir {workdir} \(new\); training input on the tf.data service at "
      rf"{dispatcher}, parallel_epochs: every service worker makes the whole stream",
      stderr,
      re.M,
  ), stderr[-3000:]
  assert (
      "[launch] data_worker:1 was killed by SIGKILL; the job reads its input from the other tf.data service workers "
      "(it is not started again).\n"
  ) in stderr
  for server in ("data_dispatcher", "data_worker:0"):  # Stopped after the job, by SIGTERM: a clean exit.
    assert f"[{server}] SIGTERM received: stopped serving.\n" in stderr and _ended(int(servers[server]))
  assert "Traceback" not in stderr and "[launch] killed" not in stderr
