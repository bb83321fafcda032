"""One `python -m runner.launch --workers=2` run per test session, shared by the tests that compare a job with it.

A job under a cluster engine (SLURM, Ray Train) must train exactly what the
launcher trains with the same runner arguments. Each such test compares its
final checkpoint with the launcher's; the launcher's run is made once per
pytest run, by whichever pytest-xdist worker asks first (under a file lock),
in a folder keyed by the run (`PYTEST_XDIST_TESTRUNUID`), and only read by
the others.
"""

import fcntl
import hashlib
import json
import os
import sys
import tempfile

from testlib import process_testlib

_ROOT = os.environ.get("PYTEST_DEBUG_TEMPROOT") or tempfile.gettempdir()  # Shared by the xdist workers.


def launched_weights(runner_arguments, env):
  """{variable: value} of the final checkpoint of `runner.launch --workers=2 -- RUNNER_ARGUMENTS --workdir=...`.

  Args:
    runner_arguments: the runner's arguments, without --workdir.
    env: the environment of the launcher (the tests' `subprocess_env`).
  """
  run = os.environ.get("PYTEST_XDIST_TESTRUNUID") or f"pid{os.getpid()}"
  key = hashlib.sha256(json.dumps(list(runner_arguments)).encode()).hexdigest()[:16]
  folder = os.path.join(_ROOT, f"tf-runner-reference-{run}", key)
  os.makedirs(folder, exist_ok=True)
  with open(os.path.join(folder, "lock"), "w", encoding="utf-8") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    workdir = os.path.join(folder, "workdir")
    if not os.path.exists(os.path.join(folder, "done")):
      launch = process_testlib.Process(
          [sys.executable, "-m", "runner.launch", "--workers=2", "--", *runner_arguments, f"--workdir={workdir}"],
          env=env,
          logs=os.path.join(folder, "logs"),
          name="launch",
      )
      status, _, stderr = launch.wait()
      assert status == 0, f"the reference runner.launch run failed: {stderr[-3000:]}"
      open(os.path.join(folder, "done"), "w", encoding="utf-8").close()  # noqa: SIM115
    return process_testlib.final_checkpoint_values(workdir)
