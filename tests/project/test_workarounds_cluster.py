"""The private TensorFlow API the cluster code keeps (`strategies.tensorflow_workarounds`, section cluster).

Each test runs the workaround against the installed TensorFlow and fails, naming the function and the version it
was checked with (`CHECKED_WITH`), when that TensorFlow behaves otherwise.
"""

import json
import subprocess
import sys

import portpicker

from strategies import tensorflow_workarounds
from testlib import paths

JOINED = """
import tensorflow as tf
from strategies import tensorflow_workarounds
before = tensorflow_workarounds.joined_a_cluster()
tf.distribute.MultiWorkerMirroredStrategy()
print(before, tensorflow_workarounds.joined_a_cluster())
"""


def test_joined_a_cluster_is_false_alone_and_true_once_multi_worker_mirrored_joined_its_cluster():
  changed = (
      f"strategies.tensorflow_workarounds.joined_a_cluster no longer reads whether TensorFlow joined a cluster: "
      f"checked with {tensorflow_workarounds.CHECKED_WITH}, this is another TensorFlow"
  )
  cluster = {"worker": [f"localhost:{portpicker.pick_unused_port()}"]}
  env = dict(
      paths.subprocess_environment(), TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": "worker", "index": 0}})
  )
  finished = subprocess.run(
      [sys.executable, "-c", JOINED], env=env, cwd=paths.REPO, capture_output=True, text=True, timeout=120, check=False
  )
  assert finished.returncode == 0, f"{changed}:\n{finished.stderr[-3000:]}"
  assert finished.stdout.split() == ["False", "True"], changed
