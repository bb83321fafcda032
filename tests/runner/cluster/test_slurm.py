"""`python -m runner` under a real one-node SLURM cluster on 127.0.0.1: srun, the docs' sbatch script, requeue, ps.

The cluster (tests/testlib/slurm_cluster.py: munged, slurmctld and slurmd
started here, stopped by their PIDs at the end) is shared by the module's
tests. Their three jobs and the reference `runner.launch` run start together
(`jobs`, sharing the node's CPUs with `--oversubscribe`), so one job's waits
(a requeued job's start, a task waiting for its peers) overlap the others'
work; each test then checks its job. No TF_CONFIG anywhere: every task finds
its role in SLURM's environment (strategies/slurm.py). Skipped only where
Debian's slurm-wlm and munge are not installed (.ci/run installs them).
"""

from concurrent import futures
import os
import re
import subprocess
import sys
import time
import types

import numpy as np
import pytest

import runner
from testlib import paths
from testlib import process_testlib
from testlib import reference_runs
from testlib import slurm_cluster

pytestmark = pytest.mark.slurm

REPO = paths.REPO
SYNTHETIC = os.path.join(REPO, "configs", "synthetic.py")
STEPS = reference_runs.STEPS  # The srun job is the shared reference job (`reference_runs`).
JOB_TIMEOUT_SECONDS = 400  # The sbatch job runs twice: two starts of two TensorFlow processes on a loaded machine.
SBATCH_STEPS = 500  # Some seconds of training after the first row: SIGTERM comes before the end.


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
  yield from slurm_cluster.fixture(tmp_path_factory.mktemp("slurm"))


@pytest.fixture(scope="module")
def env(slurm):
  """The clients' environment: SLURM_CONF, and this Python first on PATH (as in an activated virtualenv)."""
  subprocess_env = paths.subprocess_environment()
  path = os.path.dirname(sys.executable) + os.pathsep + subprocess_env.get("PATH", "")
  return {**subprocess_env, "SLURM_CONF": slurm.conf, "PATH": path}


def _runner_args(*more, steps=STEPS):
  """The runner's arguments, but --workdir, for a short synthetic run; `more` appended."""
  return [
      f"--config={SYNTHETIC}",
      "--mode=train",
      "--config.data.num_examples=512",
      f"--config.trainer.train_steps={steps}",
      "--config.trainer.steps_per_loop=10",
      *more,
  ]


def _srun(tasks, runner_args, env, logs, *options):
  """`srun -n TASKS python -m runner RUNNER_ARGS` in a child process; each output line starts with 'RANK: '."""
  command = ["srun", f"--ntasks={tasks}", "--overcommit", "--oversubscribe", "--time=5", "--label", *options]
  return process_testlib.Process(
      [*command, sys.executable, "-m", "runner", *runner_args], env=env, logs=str(logs), name="srun"
  )


def _assert_same_weights(workdir, expected):
  values = process_testlib.final_checkpoint_values(workdir)
  assert values and values.keys() == expected.keys()
  for name, value in values.items():
    np.testing.assert_array_equal(value, expected[name], err_msg=name)


def _cluster_line(stderr, rank, found):
  """The match of task `rank`'s line `cluster from SLURM (job J, step 0, PORTS): FOUND<port>.`: J, PORTS, port."""
  pattern = rf"^{rank}: .*[]:] cluster from SLURM \(job (\d+), step 0, (.*?)\): {re.escape(found)}(\d+)\.$"
  match = re.search(pattern, stderr, re.M)
  assert match, f"no line of task {rank} matching {pattern!r} in:\n{stderr[-3000:]}"
  return match


def _job(job_id, env):
  """{field: value} of `scontrol show job JOB_ID`."""
  shown = subprocess.run(
      ["scontrol", "show", "job", "--oneliner", job_id], env=env, capture_output=True, text=True, timeout=30, check=True
  )
  return dict(field.split("=", 1) for field in shown.stdout.split() if "=" in field)


def _wait_for_job_end(job_id, env):
  deadline = time.monotonic() + JOB_TIMEOUT_SECONDS
  while (job := _job(job_id, env))["JobState"] in ("PENDING", "RUNNING", "REQUEUED", "COMPLETING", "CONFIGURING"):
    assert time.monotonic() < deadline, f"job {job_id} still {job['JobState']} after {JOB_TIMEOUT_SECONDS} s"
    time.sleep(0.5)
  return job


def _submit_the_docs_sbatch_script(folder, env):
  """Submits the docs' script from `folder`, where `configs/` is the repository's, as from a clone; returns the job id.

  The arguments after its name go to every task. `--oversubscribe` lets the
  job share the node's CPUs with the module's other jobs (the script's
  directives are as written).
  """
  (folder / "train.sbatch").write_text(_docs_sbatch_script())
  os.symlink(os.path.join(REPO, "configs"), folder / "configs")
  extra = _runner_args(steps=SBATCH_STEPS)[1:]  # The script names the config.
  submitted = subprocess.run(
      ["sbatch", "--parsable", "--oversubscribe", "train.sbatch", *extra],
      cwd=folder,
      env=env,
      capture_output=True,
      text=True,
      timeout=30,
      check=True,
  )
  return submitted.stdout.strip()


def _scancel_term_after_the_first_row(job_id, workdir, env):
  """Waits for the job's first train row, then `scancel --signal=TERM` (mid-run: SBATCH_STEPS are far off)."""
  deadline = time.monotonic() + JOB_TIMEOUT_SECONDS
  checked = 0.0
  while not process_testlib.train_rows(workdir):
    if time.monotonic() - checked > 1:
      assert _job(job_id, env)["JobState"] in ("PENDING", "RUNNING", "CONFIGURING"), _job(job_id, env)
      checked = time.monotonic()
    assert time.monotonic() < deadline, "no train row in time"
    time.sleep(0.05)
  subprocess.run(["scancel", "--signal=TERM", job_id], env=env, timeout=30, check=True)


@pytest.fixture(scope="module")
def jobs(env, tmp_path_factory):
  """The module's jobs, started at once: they run side by side on the node while the tests check them in turn.

  `srun_workers`: `srun -N1 -n2` of the reference job (`reference_runs`), with
  `reference` the `runner.launch` run of it; `srun_ps`: `srun -n3` with
  `num_ps=1`; `sbatch`: the docs' script, sent SIGTERM after its first row
  (`signalled`, by a thread, whichever test runs first).
  """
  root = tmp_path_factory.mktemp("jobs")
  srun_workers = _srun(
      2,
      [*reference_runs.runner_arguments(), f"--workdir={root / 'srun'}"],
      env,
      root / "srun_logs",
      "--nodes=1",
      "--resv-ports=0",
  )
  ps_args = _runner_args("--config.strategy.name=parameter_server", "--config.strategy.num_ps=1")
  srun_ps = _srun(3, [*ps_args, f"--workdir={root / 'srun_ps'}"], env, root / "srun_ps_logs")
  sbatch_folder = root / "sbatch"
  sbatch_folder.mkdir()
  job_id = _submit_the_docs_sbatch_script(sbatch_folder, env)
  threads = futures.ThreadPoolExecutor(max_workers=2)
  try:
    yield types.SimpleNamespace(
        root=root,
        srun_workers=srun_workers,
        srun_ps=srun_ps,
        reference=threads.submit(reference_runs.launched_workdir, env),
        sbatch_folder=sbatch_folder,
        job_id=job_id,
        signalled=threads.submit(_scancel_term_after_the_first_row, job_id, sbatch_folder / "runs" / "synthetic", env),
    )
  finally:
    for srun in (srun_workers, srun_ps):
      srun.process.kill()  # Ended already unless a test failed.
    threads.shutdown(wait=True)


def test_srun_parameter_servers_take_their_roles_from_the_rank_and_num_ps(tmp_path, jobs):
  """`srun -n3` with `num_ps=1`: chief, ps:0, worker:0; the job trains what one process on one device trains.

  One worker runs the steps one after another on the batches one process
  would take: the same weights, bit for bit. The ports are those SLURM
  reserved for the step (MpiParams=ports in slurm.conf).
  """
  try:  # The same run on one device, in this process while the jobs run (this test runs first).
    overrides = [arg.removeprefix("--").removeprefix("config.") for arg in _runner_args()[1:]]
    alone = runner.run(runner.load_config(SYNTHETIC, [*overrides, "strategy.name=one_device"]), str(tmp_path / "one"))
  finally:
    status, stdout, stderr = jobs.srun_ps.wait()
  assert status == 0, stderr[-3000:]
  assert alone.global_step == STEPS
  sizes = "1 chief, 1 ps task, 1 worker"
  chief = _cluster_line(stderr, 0, f"{sizes}; this task is chief:0 at localhost:")
  assert chief.group(2).startswith("ports reserved by SLURM (")
  _cluster_line(stderr, 1, f"{sizes}; this task is ps:0 at localhost:")
  _cluster_line(stderr, 2, f"{sizes}; this task is worker:0 at localhost:")
  assert f"0: global step: {STEPS}\n" in stdout
  for rank, task in ((1, "ps:0"), (2, "worker:0")):
    assert f"{rank}: serving as {task} of a parameter-server cluster until the coordinator" in stdout
  workdir = jobs.root / "srun_ps"
  assert [row["step"] for row in process_testlib.train_rows(workdir)] == list(range(10, STEPS + 1, 10))
  _assert_same_weights(workdir, process_testlib.final_checkpoint_values(tmp_path / "one"))


def test_srun_trains_one_two_replica_job_with_the_weights_of_runner_launch(jobs):
  """`srun -N1 -n2 python -m runner ...` with no TF_CONFIG: one job of 2 workers, bit for bit `runner.launch --workers=2`.

  No ports reserved for this step (`--resv-ports=0`): the ports come from the job id.
  """
  workdir = jobs.root / "srun"
  try:
    launched = process_testlib.final_checkpoint_values(jobs.reference.result())  # Or another test's.
  finally:
    status, stdout, stderr = jobs.srun_workers.wait()
  assert status == 0, stderr[-3000:]
  ports = []
  for rank in (0, 1):
    match = _cluster_line(stderr, rank, f"2 workers; this task is worker:{rank} at localhost:")
    ports.append(int(match.group(3)))
    assert match.group(2) == f"ports {ports[0]}-{ports[0] + 1} from the job id"
    assert f"{rank}: strategy: multi_worker_mirrored: 2 replicas on 2 workers; this is worker:{rank} on " in stdout
    assert f"{rank}: global step: {STEPS}\n" in stdout
  assert ports[1] == ports[0] + 1
  assert [row["step"] for row in process_testlib.train_rows(workdir)] == list(range(10, STEPS + 1, 10))
  _assert_same_weights(workdir, launched)


def _docs_sbatch_script():
  """The sbatch script of docs/clusters.md's SLURM section, as written there."""
  with open(os.path.join(REPO, "docs", "clusters.md"), encoding="utf-8") as f:
    section = f.read().split("\n## SLURM\n", 1)[1].split("\n## ", 1)[0]
  (script,) = re.findall(r"```bash\n(#!/bin/bash\n.*?)```", section, re.S)
  return script


def test_the_docs_sbatch_script_saves_on_scancel_signal_term_requeues_itself_and_resumes_to_the_end(jobs, env):
  """The docs' script, submitted as written: SIGTERM mid-run saves, the job requeues itself and ends at train_steps."""
  steps, job_id = SBATCH_STEPS, jobs.job_id
  jobs.signalled.result()
  job = _wait_for_job_end(job_id, env)
  output = (jobs.sbatch_folder / f"synthetic-{job_id}.out").read_text()
  assert (job["JobState"], job["Restarts"], job["ExitCode"]) == ("COMPLETED", "1", "0:0"), output[-3000:]
  saved = {int(step) for step in re.findall(r"Stopped by SIGTERM: saved a checkpoint at step (\d+)", output)}
  assert len(saved) == 1, output[-3000:]  # Both workers, at one step.
  assert f"run ended with transient status 143: requeueing job {job_id}\n" in output
  assert output.count("requeueing job") == 1
  # The second run went on from the saved step: every loop's row once, the last at train_steps.
  workdir = jobs.sbatch_folder / "runs" / "synthetic"
  assert [row["step"] for row in process_testlib.train_rows(workdir)] == list(range(10, steps + 1, 10))
  assert len(process_testlib.config_history(workdir)) == 2
  assert re.search(rf"^global step: {steps}$", output, re.M), output[-3000:]  # The chief's last lines.
  assert (workdir / "checkpoints" / f"ckpt-{steps}.index").exists()
  assert min(saved) < steps
