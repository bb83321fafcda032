"""On a real Cloud TPU VM: the --check_tpu verdict there, then the digits example end to end on the TPU.

Marked `tpu` and skipped where this machine is not a TPU VM. On a TPU VM,
from the repository root (docs/cloud_tpu.md):

    TPU_LOAD_LIBRARY=0 python -m pytest -m tpu -q

`TPU_LOAD_LIBRARY=0` keeps the pytest process itself off the TPU, whose chips
belong to one process at a time; each command here runs in a child process
that uses the TPU, one after the other.
"""

import os
import re
import subprocess
import sys

import pytest

from strategies import tpu as tpu_lib
from testlib import paths

REPO = paths.REPO
DIGITS_TPU = os.path.join(REPO, "configs", "digits.py") + ":tpu"
TIMEOUT_SECONDS = 900

pytestmark = [
    pytest.mark.tpu,
    pytest.mark.skipif(
        not tpu_lib.local_tpu_present(),
        reason="needs a Cloud TPU VM (no /dev/accel* or /dev/vfio/* TPU devices with libtpu here); "
        "on one, run: TPU_LOAD_LIBRARY=0 python -m pytest -m tpu",
    ),
]


@pytest.fixture
def tpu_env(subprocess_env):
  """The children's environment: they load libtpu and use the TPU."""
  return {k: v for k, v in subprocess_env.items() if k != "TPU_LOAD_LIBRARY"}


def _runner(arguments, env):
  return subprocess.run(
      [sys.executable, "-m", "runner", *arguments],
      env=env,
      cwd=REPO,
      capture_output=True,
      text=True,
      timeout=TIMEOUT_SECONDS,
      check=False,
  )


def test_the_check_passes_on_the_vm_and_digits_trains_on_its_tpu(tmp_path, tpu_env):
  check = _runner([f"--config={DIGITS_TPU}", f"--workdir={tmp_path}", "--check_tpu"], tpu_env)
  assert check.returncode == 0, check.stderr[-3000:]
  assert check.stdout.splitlines()[-1].startswith("PASS: 2 training steps (steps_per_loop=500)")
  assert not tmp_path.exists() or not os.listdir(tmp_path)  # the check writes nothing

  run = _runner([f"--config={DIGITS_TPU}", f"--workdir={tmp_path}", "--config.strategy.tpu=local"], tpu_env)
  assert run.returncode == 0, run.stderr[-3000:]
  strategy = re.search(r"^strategy: tpu: (\d+) replicas? on tpu='local'$", run.stdout, re.M)
  assert strategy, run.stdout
  assert "global step: 1000" in run.stdout
  accuracy = re.search(r"^eval: accuracy=([0-9.]+) loss=[0-9.]+ num_examples=360$", run.stdout, re.M)
  assert accuracy and float(accuracy.group(1)) >= 0.95, run.stdout
