"""ParameterServerStrategy: a localhost cluster (2 workers, 1 ps) runs steps scheduled by a ClusterCoordinator.

Creating the strategy connects the process to the cluster, which changes
TensorFlow's global eager context, so the coordinator runs in a subprocess.
"""

import json
import os
import subprocess
import sys

import portpicker

from testlib import paths

TIMEOUT_SECONDS = 120
SCRIPT = os.path.join(paths.TESTLIB, "parameter_server_script.py")


def test_scheduled_steps_update_the_variable_on_the_ps(subprocess_env):
  hosts = [f"localhost:{portpicker.pick_unused_port()}" for _ in range(4)]
  subprocess_env["TF_CONFIG"] = json.dumps(
      {"cluster": {"chief": hosts[:1], "worker": hosts[1:3], "ps": hosts[3:]}, "task": {"type": "chief", "index": 0}}
  )
  result = subprocess.run(
      [sys.executable, SCRIPT], env=subprocess_env, capture_output=True, text=True, timeout=TIMEOUT_SECONDS, check=False
  )
  assert result.returncode == 0, result.stderr[-3000:]
  report = json.loads(result.stdout.splitlines()[-1])
  # Six scheduled steps, each adding the next element (1.0) of a worker's dataset.
  assert report == {
      "steps": 6.0,
      "variable": 6.0,
      "strategy": "parameter_server: 2 workers, 1 parameter server",
      "servers": 3,
  }
