"""The chief of a `benchmarks.ps_input` cluster: trains on records whose parse prints their numbers.

`python benchmarks/ps_input_chief.py --records=PATTERN --steps=N` with
TF_CONFIG naming it the chief, and the tree under test on PYTHONPATH (its
`runner` and `strategies`, not this file's). Its Trainer trains `N` steps
(global batch GLOBAL_BATCH, an MLP 16-64-10, Adam) on `TFRecordFiles`
sharded by file. The parse function prints `READ_MARK` and the record's
number on the stderr of the process that parses it, a worker: a counting
map inside the input pipeline. It prints `{"global_step": ...}` at the end.
"""

import argparse
import json
import sys

import keras
import tensorflow as tf

import runner
import strategies

NUM_FEATURES = 16
GLOBAL_BATCH = 32
STEPS_PER_LOOP = 20
READ_MARK = "ps_input_read"
SPEC = {
    "x": tf.io.FixedLenFeature([NUM_FEATURES], tf.float32),
    "y": tf.io.FixedLenFeature([], tf.int64),
    "n": tf.io.FixedLenFeature([], tf.int64),
}


def counted_parse(record):
  """Parses `record` into `(x, y)`, printing its number `n` (all of them, if vectorized over a batch)."""
  example = tf.io.parse_single_example(record, SPEC)
  with tf.control_dependencies([tf.print(READ_MARK, example["n"], output_stream=sys.stderr, summarize=-1)]):
    return tf.identity(example["x"]), example["y"]


def main(argv=None):
  """Trains as the chief with the command-line arguments `argv` (default: `sys.argv[1:]`)."""
  parser = argparse.ArgumentParser(prog="ps_input_chief.py", description=__doc__.splitlines()[0])
  parser.add_argument("--records", required=True, help="the TFRecord files' pattern")
  parser.add_argument("--steps", type=int, required=True, help="global steps to train")
  args = parser.parse_args(argv)
  strategy = strategies.create({"name": "parameter_server"})
  trainer = runner.Trainer(
      strategy,
      model_fn=lambda: keras.Sequential(
          [keras.Input([NUM_FEATURES]), keras.layers.Dense(64, activation="relu"), keras.layers.Dense(10)]
      ),
      optimizer_fn=lambda: keras.optimizers.Adam(3e-3),
      task=runner.tasks.Classification(),
      steps_per_loop=STEPS_PER_LOOP,
      quiet=True,
  )
  trainer.train(
      runner.data.TFRecordFiles(args.records, counted_parse, sharding="file"),
      global_batch_size=GLOBAL_BATCH,
      steps=args.steps,
  )
  print(json.dumps({"global_step": trainer.global_step}), flush=True)


if __name__ == "__main__":
  main()
