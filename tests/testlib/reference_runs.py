"""One `python -m runner.launch --workers=2` job per test session, shared by the tests that compare a job with it.

A job under a cluster engine (SLURM, Ray Train) must train exactly what the
launcher trains with the same config. Each such test trains `OVERRIDES` of
the synthetic config under its engine and compares the result with
`launched_workdir()`: the launcher's run of the same, made once per pytest
run by whichever pytest-xdist worker asks first (under a file lock), in a
folder keyed by the run (`PYTEST_XDIST_TESTRUNUID`), and only read by the
others.
"""

import fcntl
import os
import sys
import tempfile

from testlib import paths
from testlib import process_testlib

SYNTHETIC = os.path.join(paths.REPO, "configs", "synthetic.py")
STEPS = 40
# The job: config overrides, as `runner.load_config` takes them.
OVERRIDES = (
    "mode=train",
    "data.num_examples=512",
    f"trainer.train_steps={STEPS}",
    "trainer.steps_per_loop=10",
    "strategy.name=multi_worker_mirrored",
)
_ROOT = os.environ.get("PYTEST_DEBUG_TEMPROOT") or tempfile.gettempdir()  # Shared by the xdist workers.


def runner_arguments():
  """`python -m runner`'s arguments for the job, without --workdir."""
  return [f"--config={SYNTHETIC}", *(f"--config.{override}" for override in OVERRIDES)]


def launched_workdir(env):
  """The workdir of `runner.launch --workers=2 -- RUNNER_ARGUMENTS` run to its end (once per test session).

  Args:
    env: the environment of the launcher (the tests' `subprocess_env`).
  """
  run = os.environ.get("PYTEST_XDIST_TESTRUNUID") or f"pid{os.getpid()}"
  folder = os.path.join(_ROOT, f"tf-runner-reference-{run}")
  os.makedirs(folder, exist_ok=True)
  with open(os.path.join(folder, "lock"), "w", encoding="utf-8") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    workdir = os.path.join(folder, "workdir")
    if not os.path.exists(os.path.join(folder, "done")):
      launch = process_testlib.Process(
          [sys.executable, "-m", "runner.launch", "--workers=2", "--", *runner_arguments(), f"--workdir={workdir}"],
          env=env,
          logs=os.path.join(folder, "logs"),
          name="launch",
      )
      status, _, stderr = launch.wait()
      assert status == 0, f"the reference runner.launch run failed: {stderr[-3000:]}"
      open(os.path.join(folder, "done"), "w", encoding="utf-8").close()  # noqa: SIM115
    return workdir
