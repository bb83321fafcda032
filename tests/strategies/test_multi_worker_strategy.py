"""MultiWorkerMirroredStrategy: two worker processes on localhost ports all-reduce together."""

import json
import os
import subprocess
import sys

import portpicker

from testlib import paths

TIMEOUT_SECONDS = 120
SCRIPT = os.path.join(paths.TESTLIB, "flags_script.py")


def test_two_workers_from_worker_hosts_flags_agree_on_the_all_reduce(subprocess_env):
  subprocess_env.pop("TF_CONFIG", None)
  hosts = ",".join(f"localhost:{portpicker.pick_unused_port()}" for _ in range(2))
  workers = [
      subprocess.Popen(
          [
              sys.executable,
              SCRIPT,
              "--strategy=multi_worker_mirrored",
              f"--worker_hosts={hosts}",
              f"--task_index={index}",
              "--timeout_seconds=60",
          ],
          env=subprocess_env,
          stdout=subprocess.PIPE,
          stderr=subprocess.PIPE,
          text=True,
      )
      for index in range(2)
  ]
  reports = []
  try:
    for index, worker in enumerate(workers):
      stdout, stderr = worker.communicate(timeout=TIMEOUT_SECONDS)
      assert worker.returncode == 0, f"worker {index} failed:\n{stderr[-3000:]}"
      reports.append(json.loads(stdout.splitlines()[-1]))
  finally:
    for worker in workers:
      worker.kill()
  for index, report in enumerate(reports):
    # Replica ids are global: worker 0 adds 1, worker 1 adds 2.
    assert (report["replicas"], report["all_reduce_sum"], report["variable"]) == (2, 3.0, 3.0)
    assert report["strategy"] == (
        f"multi_worker_mirrored: 2 replicas on 2 workers; this is worker:{index} on "
        f"/job:worker/replica:0/task:{index}/device:CPU:0"
    )
