"""What exact resume costs: the time to the first batch when a run resumes at a later step.

`python -m benchmarks.resume_cost [--steps=0,1000,10000,100000] [--rounds=3]`
builds the Trainer's training input (`runner.data.pipeline.for_training`) on
one device, global batch 64, for in-memory arrays (2,048 examples of 16
floats, shuffled) and for TFRecord files (8 files, 2,048 records, parsed,
shuffled), resuming at each step, and prints the median seconds to the first
batch and the cost per skipped example. A checkpoint holds no input state,
so its size does not change.
"""

import argparse
import os
import platform
import statistics
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf

from runner.data import pipeline as input_pipeline
from runner.data import providers as data

GLOBAL_BATCH = 64
NUM_EXAMPLES = 2048
NUM_FEATURES = 16


def _arrays():
  rng = np.random.default_rng(0)
  return rng.standard_normal((NUM_EXAMPLES, NUM_FEATURES)).astype(np.float32), rng.integers(0, 10, NUM_EXAMPLES)


def _records(directory):
  features, labels = _arrays()
  for index in range(8):
    with tf.io.TFRecordWriter(os.path.join(directory, f"part-{index}.tfrecord")) as writer:
      for example in range(index, NUM_EXAMPLES, 8):
        writer.write(
            tf.train.Example(
                features=tf.train.Features(
                    feature={
                        "x": tf.train.Feature(float_list=tf.train.FloatList(value=features[example])),
                        "y": tf.train.Feature(int64_list=tf.train.Int64List(value=[labels[example]])),
                    }
                )
            ).SerializeToString()
        )
  spec = {"x": tf.io.FixedLenFeature([NUM_FEATURES], tf.float32), "y": tf.io.FixedLenFeature([], tf.int64)}

  def parse(record):
    parsed = tf.io.parse_single_example(record, spec)
    return parsed["x"], parsed["y"]

  return data.TFRecordFiles(os.path.join(directory, "*.tfrecord"), parse, shuffle_buffer_size=1024, seed=0)


def _seconds_to_first_batch(strategy, provider, start_step):
  start = time.perf_counter()
  dataset = input_pipeline.for_training(strategy, provider, GLOBAL_BATCH, start_step=start_step)
  next(iter(dataset))
  return time.perf_counter() - start


def main():
  """Runs the benchmark with the command-line arguments of this process."""
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--steps", default="0,1000,10000,100000", help="resume steps, comma-separated")
  parser.add_argument("--rounds", type=int, default=3)
  args = parser.parse_args()
  steps = [int(s) for s in args.steps.split(",")]
  strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
  print(
      f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
      f"TensorFlow {tf.__version__}"
  )
  print(
      "| data | resume step | examples skipped | seconds to first batch (median) "
      "| microseconds per skipped example |"
  )
  print("|---|---|---|---|---|")
  with tempfile.TemporaryDirectory() as directory:
    features, labels = _arrays()
    providers = {"in-memory": data.InMemory(features, labels, shuffle=True, seed=0), "TFRecord": _records(directory)}
    for name, provider in providers.items():
      baseline = None
      for step in steps:
        seconds = statistics.median(_seconds_to_first_batch(strategy, provider, step) for _ in range(args.rounds))
        baseline = seconds if baseline is None else baseline
        skipped = step * GLOBAL_BATCH
        per_example = f"{1e6 * (seconds - baseline) / skipped:.2f}" if skipped else "-"
        print(f"| {name} | {step:,} | {skipped:,} | {seconds:.3f} | {per_example} |", flush=True)


if __name__ == "__main__":
  main()
