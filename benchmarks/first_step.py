"""A Trainer's way to its first step, in a process of its own: the times it reaches each stage.

`python -m benchmarks.first_step --strategy=one_device` imports TensorFlow,
then `runner.Trainer` (runner's modules load on first use), creates the
strategy (`benchmarks.contenders.make_strategy`) and trains the `small`
workload's Trainer (`steps_per_loop=100`) for one step, with its progress
line on stderr (`step 1/1: ... | traced in T s, then S steps/s, ...`: the
tracing apart from the first loop). It then prints one JSON line on stdout of
`time.time()` stamps: `started` (this module's first line runs),
`tensorflow_imported`, `runner_imported`, `strategy_start` (the benchmark's
helpers imported), `strategy_created`, `trained` (the first `train` call
returned). The driver (`benchmarks.scaling`) stamps
the process's start and the progress line's arrival itself.
"""

import time

STARTED = time.time()

import argparse
import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: F401  # Timed: the import alone.

TENSORFLOW_IMPORTED = time.time()

from runner import Trainer  # noqa: F401  # runner's names load on first use: this loads them
from runner.cluster import process_exit

RUNNER_IMPORTED = time.time()

from absl import logging as absl_logging

from benchmarks import contenders


def main(argv=None):
  """Runs the benchmark with the command-line arguments `argv` (default: `sys.argv[1:]`)."""
  parser = argparse.ArgumentParser(prog="python -m benchmarks.first_step", description=__doc__.splitlines()[0])
  parser.add_argument("--strategy", required=True, choices=contenders.STRATEGIES)
  args = parser.parse_args(argv)
  absl_logging.set_verbosity(absl_logging.INFO)  # The progress line, which shows the tracing apart.
  strategy_start = time.time()
  strategy = contenders.make_strategy(args.strategy)
  strategy_created = time.time()
  contenders.warm_trainer(strategy, 100, 1, contenders.WORKLOADS["small"])
  stamps = {
      "started": STARTED,
      "tensorflow_imported": TENSORFLOW_IMPORTED,
      "runner_imported": RUNNER_IMPORTED,
      "strategy_start": strategy_start,
      "strategy_created": strategy_created,
      "trained": time.time(),
  }
  print(json.dumps(stamps), flush=True)
  # Skip the interpreter's tear-down: deleting a live dataset iterator can block for seconds.
  process_exit.exit_now(0)


if __name__ == "__main__":
  main()
