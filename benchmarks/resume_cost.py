"""What exact resume costs: the time to the first batch when a run resumes at step 10^2, 10^4 or 10^6.

`python -m benchmarks.resume_cost [--steps=0,100,10000,1000000] [--rounds=3] [--skip_steps_limit=10000]`
builds the Trainer's training input (`runner.data.pipeline.for_training`) on
one device, global batch 64, resuming at each step, for every kind of data:
in-memory arrays (2,048 examples of 16 floats) and TFRecord files (8 files,
2,048 records, parsed), shuffled or not, the files sharded by file or by
record, and a `FromFunction` with and without a `repeated_dataset_fn`. Each
round makes a new provider, as a new process does (so a TFRecord resume
includes counting the files' records). It prints the median seconds to the
first batch and its ratio to step 100's (step 0 is a fresh start).

A `FromFunction` without `repeated_dataset_fn` reads and discards the
examples before its position; it is measured only up to
`--skip_steps_limit` (at step 10^6 it would read 64 million examples).
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
NUM_FILES = 8
RATIO_TO_STEP = 100  # The ratios are to the time of resuming at this step (to the first step's if it is not run).


def _arrays():
  rng = np.random.default_rng(0)
  return rng.standard_normal((NUM_EXAMPLES, NUM_FEATURES)).astype(np.float32), rng.integers(0, 10, NUM_EXAMPLES)


def _write_records(directory):
  """Writes the arrays' examples to `NUM_FILES` TFRecord files; returns their pattern."""
  features, labels = _arrays()
  for index in range(NUM_FILES):
    with tf.io.TFRecordWriter(os.path.join(directory, f"part-{index}.tfrecord")) as writer:
      for example in range(index, NUM_EXAMPLES, NUM_FILES):
        feature = {
            "x": tf.train.Feature(float_list=tf.train.FloatList(value=features[example])),
            "y": tf.train.Feature(int64_list=tf.train.Int64List(value=[labels[example]])),
        }
        writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
  return os.path.join(directory, "*.tfrecord")


def _parse(record):
  spec = {"x": tf.io.FixedLenFeature([NUM_FEATURES], tf.float32), "y": tf.io.FixedLenFeature([], tf.int64)}
  parsed = tf.io.parse_single_example(record, spec)
  return parsed["x"], parsed["y"]


def _kinds(pattern):
  """Returns `{name: make_provider}` for every kind of data measured."""
  features, labels = _arrays()

  def examples(context):
    return tf.data.Dataset.from_tensor_slices((features, labels))

  def examples_from(context, start):
    return tf.data.Dataset.range(start, 2**62).map(
        lambda i: (tf.gather(features, i % NUM_EXAMPLES), tf.gather(labels, i % NUM_EXAMPLES))
    )

  kinds = {
      "in-memory": lambda: data.InMemory(features, labels),
      "in-memory, shuffled": lambda: data.InMemory(features, labels, shuffle=True, seed=0),
      "FromFunction with repeated_dataset_fn": lambda: data.FromFunction(examples, repeated_dataset_fn=examples_from),
      "FromFunction without (read and skipped)": lambda: data.FromFunction(examples),
  }
  for sharding in ("file", "data"):
    for shuffle in (0, 1024):
      name = f"TFRecord by {'file' if sharding == 'file' else 'record'}" + (
          ", shuffled (blocks of 1,024)" if shuffle else ""
      )
      kinds[name] = lambda sharding=sharding, shuffle=shuffle: data.TFRecordFiles(
          pattern, _parse, shuffle_buffer_size=shuffle, seed=0, sharding=sharding
      )
  return kinds


def _seconds_to_first_batch(strategy, provider, start_step):
  start = time.perf_counter()
  dataset = input_pipeline.for_training(strategy, provider, GLOBAL_BATCH, start_step=start_step)
  next(iter(dataset))
  return time.perf_counter() - start


def main():
  """Runs the benchmark with the command-line arguments of this process."""
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--steps", default="0,100,10000,1000000", help="resume steps, comma-separated")
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--skip_steps_limit", type=int, default=10000, help="largest step for data read and skipped")
  args = parser.parse_args()
  steps = [int(s) for s in args.steps.split(",")]
  strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
  print(
      f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
      f"TensorFlow {tf.__version__}, load average {os.getloadavg()[0]:.2f}; global batch {GLOBAL_BATCH}, "
      f"median of {args.rounds}"
  )
  print("| data | " + " | ".join(f"step {s:,}: seconds (ratio)" for s in steps) + " |")
  print("|---|" + "---|" * len(steps))
  with tempfile.TemporaryDirectory() as directory:
    for name, make_provider in _kinds(_write_records(directory)).items():
      measured_steps = [s for s in steps if s <= args.skip_steps_limit or not name.startswith("FromFunction without")]
      # The steps take turns within each round, so a drift in the process or the host weighs on all of them alike.
      samples = {step: [] for step in measured_steps}
      for _ in range(args.rounds):
        for step in measured_steps:
          samples[step].append(_seconds_to_first_batch(strategy, make_provider(), step))
      seconds = {step: statistics.median(times) for step, times in samples.items()}
      base = seconds.get(RATIO_TO_STEP) or seconds[steps[0]]
      cells = [f"{seconds[s]:.3f} ({seconds[s] / base:.2f}x)" if s in seconds else "not run" for s in steps]
      print(f"| {name} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
  main()
