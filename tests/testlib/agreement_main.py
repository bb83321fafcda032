"""One worker of tests/runner/cluster/test_cluster.py's agreement tests (run as a process, not by pytest).

Usage: agreement_main.py WEIGHTS_FILE WORKDIR OVERRIDE... : runs `runner.run` on
configs/synthetic.py with the overrides (which name the cluster), then saves
this worker's own final weights to WEIGHTS_FILE (.npz) and prints the step.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/, for `testlib`

from testlib import paths

sys.path.insert(0, paths.REPO)

import numpy as np

import runner
from runner.cluster import process_exit


def main(weights_file, workdir, *overrides):
  config = runner.load_config(os.path.join(paths.REPO, "configs", "synthetic.py"), list(overrides))
  result = runner.run(config, workdir)
  np.savez(weights_file, *result.model.get_weights())
  print(f"global step: {result.global_step}", flush=True)


if __name__ == "__main__":
  main(*sys.argv[1:])
  process_exit.exit_now(0)  # See runner.__main__.run_main: no tf.data teardown.
