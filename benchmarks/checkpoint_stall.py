"""What a checkpoint every loop costs the Trainer: steps/s with none, synchronous or asynchronous saves; one process.

`python -m benchmarks.checkpoint_stall [--rounds=3] [--loops=8] [--workloads=large,small]`

Each workload is an MLP on 16 random features, Adam, global batch 64, one
device (`OneDeviceStrategy("/cpu:0")`), trained by `runner.Trainer` into a
fresh model_dir in three ways: no checkpoint until the end (`none`), a
checkpoint every loop written synchronously (`async_checkpoints=False`), and
one every loop written in the background (`async_checkpoints=True`, the
default). `large` is 16 -> 2048 -> 2048 -> 10, whose weights and Adam slots
make a checkpoint of 51 MB; `small` is 16 -> 128 -> 10 (0.03 MB).

A user action notes the time at the end of each loop, before that loop's
checkpoint: the steps/s of a run span the end of its third loop to the end
of its last, so every checkpoint in between is inside, and what happens once
is left out: the tracing of the first loop, the first two saves (the first
asynchronous one makes the host copies of the variables, the second traces
the function that copies into them) and the final save. Each round runs every mode in turn (the
order rotates); the report gives the median steps/s of each mode and the
ratios to `none`.
"""

import argparse
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import logging as absl_logging
import keras
import numpy as np
import tensorflow as tf

from benchmarks import throughput
import runner
from runner.cluster import process_exit

GLOBAL_BATCH = 64
NUM_FEATURES = 16
WORKLOADS = {"large": ((2048, 2048), 10), "small": ((128,), 200)}  # name -> (hidden units, steps per loop)
MODES = ("none", "sync", "async")
WARM_UP_LOOPS = 3  # Loops left out of the timing: the first is traced; the first two saves set up (see `_run`).


class _LoopEnds(runner.actions.Action):
  """Notes `time.perf_counter()` at the end of each loop (the actions before the checkpoint's)."""

  def __init__(self):
    self.times = []

  def __call__(self, loop):
    del loop
    self.times.append(time.perf_counter())


def _data():
  rng = np.random.default_rng(0)
  features = rng.standard_normal((2048, NUM_FEATURES)).astype(np.float32)
  return tf.data.Dataset.from_tensor_slices((features, rng.integers(0, 10, 2048)))


def _model_fn(hidden):
  def model_fn():
    layers = [keras.layers.Dense(units, activation="relu") for units in hidden]
    return keras.Sequential([keras.Input((NUM_FEATURES,)), *layers, keras.layers.Dense(10)])

  return model_fn


def _checkpoint_megabytes(model_dir):
  """The size of the latest checkpoint's data in `model_dir`: the weights and the Adam slots, in MB."""
  latest = tf.train.latest_checkpoint(os.path.join(model_dir, "checkpoints"))
  return sum(os.path.getsize(path) for path in tf.io.gfile.glob(latest + ".data-*")) / 1e6


def _run(mode, hidden, steps_per_loop, loops, data):
  """Trains `loops` loops in `mode`; returns (steps/s past the warm-up loops, the checkpoint's MB)."""
  ends = _LoopEnds()
  with tempfile.TemporaryDirectory() as model_dir:
    trainer = runner.Trainer(
        tf.distribute.OneDeviceStrategy("/cpu:0"),
        model_fn=_model_fn(hidden),
        optimizer_fn=lambda: keras.optimizers.Adam(1e-4),
        task=runner.tasks.Classification(),
        model_dir=model_dir,
        steps_per_loop=steps_per_loop,
        checkpoint_every=None if mode == "none" else steps_per_loop,
        max_to_keep=2,
        async_checkpoints=mode == "async",
        seed=0,
        actions=[ends],
        quiet=True,
    )
    trainer.train(data, global_batch_size=GLOBAL_BATCH, steps=loops * steps_per_loop)
    megabytes = _checkpoint_megabytes(model_dir)
  timed = ends.times[WARM_UP_LOOPS - 1 :]
  return (len(timed) - 1) * steps_per_loop / (timed[-1] - timed[0]), megabytes


def measure(args):
  """Returns {workload: {"megabytes": float, mode: [steps/s of each round]}}."""
  data = _data()
  results = {}
  for name in args.workloads:
    hidden, steps_per_loop = WORKLOADS[name]
    results[name] = {mode: [] for mode in MODES}
    for round_index in range(args.rounds):
      order = MODES[round_index % 3 :] + MODES[: round_index % 3]
      for mode in order:
        rate, results[name]["megabytes"] = _run(mode, hidden, steps_per_loop, args.loops, data)
        results[name][mode].append(rate)
        print(f"{name} round {round_index + 1} {mode}: {rate:.2f} steps/s", file=sys.stderr, flush=True)
  return results


def report(results, args, machine_before, minutes):
  """Prints the Markdown report: the table of medians and ratios, then the machine."""
  print("# Checkpoint stall\n")
  print(
      f"One device, global batch 64, a checkpoint every loop; {args.rounds} rounds of {args.loops} loops each, "
      f"medians ({minutes:.1f} min).\n"
  )
  print("| workload | weights + Adam slots | steps/loop | none (steps/s) | sync | async | sync / none | async / none |")
  print("|---|---|---|---|---|---|---|---|")
  for name, rates in results.items():
    hidden, steps_per_loop = WORKLOADS[name]
    none, sync, background = (statistics.median(rates[mode]) for mode in MODES)
    layers = " -> ".join(str(units) for units in (NUM_FEATURES, *hidden, 10))
    print(
        f"| {name} ({layers}) | {rates['megabytes']:.2f} MB | {steps_per_loop} | {none:.2f} | {sync:.2f} | "
        f"{background:.2f} | {sync / none:.3f}x | {background / none:.3f}x |"
    )
  throughput.print_machine(machine_before)


def parse_args(argv=None):
  """Returns the parsed command line `argv` (default: `sys.argv[1:]`); exits with a usage error on a bad one."""
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--rounds", type=int, default=3, help="rounds of every mode (default 3)")
  parser.add_argument("--loops", type=int, default=8, help="loops per run, each ending in a checkpoint (default 8)")
  parser.add_argument(
      "--workloads", default="large,small", help=f"comma-separated, of {', '.join(WORKLOADS)} (default both)"
  )
  args = parser.parse_args(argv)
  try:
    args.workloads = throughput.parse_names(args.workloads, WORKLOADS, "workloads")
  except ValueError as error:
    parser.error(str(error))
  if args.rounds < 1 or args.loops < WARM_UP_LOOPS + 1:
    parser.error(f"--rounds must be >= 1 and --loops >= {WARM_UP_LOOPS + 1} (the first {WARM_UP_LOOPS} are not timed)")
  return args


def main(argv=None):
  """Runs the benchmark with the command-line arguments `argv` (default: `sys.argv[1:]`)."""
  args = parse_args(argv)
  absl_logging.set_verbosity(absl_logging.WARNING)
  machine_before = throughput.machine_lines()
  started = time.perf_counter()
  results = measure(args)
  report(results, args, machine_before, (time.perf_counter() - started) / 60)
  process_exit.exit_now(0)  # Skip tearing down live dataset iterators.


if __name__ == "__main__":
  main()
