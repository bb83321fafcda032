"""Which examples each parameter-server worker reads and trains on, as one process (run by a test, not pytest).

`python tests/testlib/parameter_server_input_main.py OUT_DIR` with TF_CONFIG
naming this process the chief of a localhost cluster (2 workers, 1 ps)
starts every worker and ps task's server in this process
(`parameter_server_script.start_servers`) and writes OUT_DIR/results.json:

- "reads": from `parameter_server_loops.per_worker_iterator` over
  `InMemory` examples numbered 0 .. NUM_EXAMPLES - 1, functions scheduled
  as the Trainer schedules its steps (`next(iterator)` per step), each
  reading one epoch of a worker's share: `[worker index, numbers read]` per
  function, for a run starting at step 0 and one resuming at RESUME_STEP.
- "records": the same over TFRecordFiles of 2 files sharded by file (each
  worker reads one file; the provider needs its pipeline id as a Python int).
- "counts", "global_step": the Trainer trains TRAIN_STEPS steps of a linear
  model whose SGD update of example `n`'s weight is exactly -1 / BATCH, so
  `-BATCH * weight` counts the times each example was trained on.
"""

import json
import os
import sys

from absl import app
import keras
import numpy as np
import tensorflow as tf

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/, for `testlib`
import runner
from runner.training import parameter_server_loops
import strategies
from testlib import parameter_server_script

NUM_EXAMPLES = 24
BATCH = 4
WORKERS = 2
RESUME_STEP = 5
TRAIN_STEPS = 14
SHARE_BATCHES = NUM_EXAMPLES // WORKERS // BATCH  # batches in one epoch of a worker's share


class _SumOfOutputs(runner.interfaces.Task):
  """A loss equal to the output: its gradient does not depend on the weights."""

  def loss(self, labels, outputs):
    del labels
    return outputs[:, 0]


def _numbered_examples():
  numbers = np.arange(NUM_EXAMPLES, dtype=np.int64)
  return np.eye(NUM_EXAMPLES, dtype=np.float32), numbers


def _epoch_reads(coordinator, provider, *, start_step):
  """Schedules WORKERS functions, each reading SHARE_BATCHES batches; returns [[worker, numbers]] per function."""
  iterator = parameter_server_loops.per_worker_iterator(coordinator, provider, BATCH, start_step=start_step)
  strategy = coordinator.strategy

  @tf.function
  def read(iterator):
    numbers = [strategy.experimental_local_results(next(iterator))[0][1] for _ in range(SHARE_BATCHES)]
    return tf.distribute.coordinator.experimental_get_current_worker_index(), tf.concat(numbers, 0)

  scheduled = [coordinator.schedule(read, args=(iterator,)) for _ in range(WORKERS)]
  coordinator.join()
  return [[int(worker), numbers.tolist()] for worker, numbers in (remote.fetch() for remote in scheduled)]


def _record_files(directory):
  """Two TFRecord files of NUM_EXAMPLES // 2 records each: file f holds numbers 100 * f + k."""
  for f in range(2):
    with tf.io.TFRecordWriter(os.path.join(directory, f"part-{f}.tfrecord")) as writer:
      for k in range(NUM_EXAMPLES // 2):
        writer.write(
            tf.train.Example(
                features=tf.train.Features(
                    feature={"n": tf.train.Feature(int64_list=tf.train.Int64List(value=[100 * f + k]))}
                )
            ).SerializeToString()
        )
  return os.path.join(directory, "part-*.tfrecord")


def _parse(record):
  number = tf.io.parse_single_example(record, {"n": tf.io.FixedLenFeature([], tf.int64)})["n"]
  return tf.cast(tf.reshape(number, [1]), tf.float32), number


def main(argv):
  out_dir = argv[1]
  servers = parameter_server_script.start_servers(json.loads(os.environ["TF_CONFIG"])["cluster"])
  strategy = strategies.create({"name": "parameter_server"})
  trainer = runner.Trainer(
      strategy,
      model_fn=lambda: keras.Sequential(
          [keras.Input([NUM_EXAMPLES]), keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros")]
      ),
      optimizer_fn=lambda: keras.optimizers.SGD(learning_rate=1.0),
      task=_SumOfOutputs(),
      steps_per_loop=TRAIN_STEPS // WORKERS,
      quiet=True,
  )
  coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)  # The Trainer's: one per strategy.
  examples = runner.data.InMemory(*_numbered_examples())
  records = runner.data.TFRecordFiles(_record_files(out_dir), _parse, sharding="file")
  results = {
      "reads": {str(start): _epoch_reads(coordinator, examples, start_step=start) for start in (0, RESUME_STEP)},
      "records": _epoch_reads(coordinator, records, start_step=0),
  }
  trainer.train(examples, global_batch_size=BATCH, steps=TRAIN_STEPS)
  kernel = tf.convert_to_tensor(trainer.model.layers[0].kernel).numpy()[:, 0]
  results.update(counts=(-BATCH * kernel).tolist(), global_step=trainer.global_step, servers=len(servers))
  with open(os.path.join(out_dir, "results.json"), "w", encoding="utf-8") as f:
    json.dump(results, f)


if __name__ == "__main__":
  app.run(main)
