"""Gradient accumulation: peak memory and steps/s at k micro-batches per step against k = 1, same global batch.

`python -m benchmarks.accumulation [--rounds=2] [--steps=10] [--accumulation=1,4]` trains an MLP whose
memory is mostly activations (64 -> 12 x 128 ReLU -> 10, 0.2 M weights, global batch 32768: each layer's
activations are 16 MB a copy) with `runner.Trainer(gradient_accumulation_steps=k)` on one_device, a fresh
process per k and round, the k interleaved and rotated per round (`throughput.schedule`). A process
trains 2 steps (tracing, not timed), then `--steps` steps in one loop, timed; it reports how far its peak
resident memory (`ru_maxrss`) grew from after TensorFlow made its devices, and its steps/s. It prints the
machine (with the load before and after), then a Markdown table of the medians per k and their ratios to
the first k given.
"""

import argparse
import json
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import logging as absl_logging
import keras
import numpy as np
import tensorflow as tf

from benchmarks import memory
from benchmarks import throughput
import runner
from runner.cluster import process_exit

NUM_FEATURES, NUM_CLASSES = 64, 10
HIDDEN = (128,) * 12
GLOBAL_BATCH = 32768
WARMUP_STEPS = 2


def make_model():
  """The activation-heavy MLP: 64 -> 12 ReLU Dense layers of 128 -> 10 logits."""
  layers = [keras.Input((NUM_FEATURES,))] + [keras.layers.Dense(units, activation="relu") for units in HIDDEN]
  return keras.Sequential(layers + [keras.layers.Dense(NUM_CLASSES)])


def child(accumulation, steps):
  """Trains with `gradient_accumulation_steps=accumulation` in this process; returns its JSON row."""
  strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
  tf.constant(0.0)  # Devices and the runtime made before the baseline.
  start = memory.peak_mb()
  rng = np.random.default_rng(0)
  features = rng.standard_normal((GLOBAL_BATCH, NUM_FEATURES)).astype(np.float32)
  labels = rng.integers(0, NUM_CLASSES, GLOBAL_BATCH).astype(np.int32)
  trainer = runner.Trainer(
      strategy,
      model_fn=make_model,
      optimizer_fn=lambda: keras.optimizers.SGD(0.01, momentum=0.9),
      task=runner.tasks.Classification(),
      steps_per_loop=steps,
      gradient_accumulation_steps=accumulation,
      seed=0,
      quiet=True,
  )
  data = runner.data.InMemory(features, labels)
  trainer.train(data, global_batch_size=GLOBAL_BATCH, steps=WARMUP_STEPS)
  wall = time.perf_counter()
  trainer.train(data, global_batch_size=GLOBAL_BATCH, steps=WARMUP_STEPS + steps)
  seconds = time.perf_counter() - wall
  return {"k": accumulation, "peak_growth_mb": memory.peak_mb() - start, "steps_per_sec": steps / seconds}


def main(argv=None):
  """Runs the benchmark (or, with `--child`, one k) with the command-line arguments `argv`."""
  parser = argparse.ArgumentParser(prog="python -m benchmarks.accumulation", description=__doc__.splitlines()[0])
  parser.add_argument("--rounds", type=int, default=2)
  parser.add_argument("--steps", type=int, default=10, help="timed steps per process")
  parser.add_argument("--accumulation", default="1,4", help="the k to compare, the first the reference")
  parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.child:
    absl_logging.set_verbosity(absl_logging.WARNING)
    print(json.dumps(child(args.child, args.steps)), flush=True)
    process_exit.exit_now(0)  # Skip tearing down the live dataset iterator (see benchmarks.contenders).
  ks = [int(k) for k in args.accumulation.split(",")]
  machine = throughput.machine_lines()
  start = time.perf_counter()
  rows = {k: [] for k in ks}
  for round_index, k, _ in throughput.schedule(ks, ["one_device"], args.rounds):
    command = [sys.executable, "-m", "benchmarks.accumulation", f"--child={k}", f"--steps={args.steps}"]
    row = throughput.child_row(command, root=throughput.REPO_ROOT, env=dict(os.environ), timeout=600, measured="k")
    print(f"[round {round_index + 1}/{args.rounds}] k={k}: {row}", file=sys.stderr, flush=True)
    if "error" not in row:
      rows[k].append(row)
  throughput.print_machine(machine)
  print(
      f"\n## Gradient accumulation ({(time.perf_counter() - start) / 60:.1f} min; global batch {GLOBAL_BATCH}, "
      f"{args.rounds} rounds of {args.steps} steps)\n"
  )
  print("| k | micro-batch | peak memory growth, MB | ratio | steps/s | ratio |\n|---:|---:|---:|---:|---:|---:|")
  medians = {
      k: (statistics.median(r["peak_growth_mb"] for r in got), statistics.median(r["steps_per_sec"] for r in got))
      for k, got in rows.items()
      if got
  }
  for k in ks:
    if k not in medians:
      print(f"| {k} | {GLOBAL_BATCH // k} | not working | | | |")
      continue
    (mb, speed), (mb_1, speed_1) = medians[k], medians.get(ks[0], (float("nan"),) * 2)
    print(f"| {k} | {GLOBAL_BATCH // k} | {mb:.0f} | {mb / mb_1:.2f}x | {speed:.3f} | {speed / speed_1:.2f}x |")


if __name__ == "__main__":
  main()
