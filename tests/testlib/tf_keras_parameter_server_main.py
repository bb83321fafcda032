"""The Trainer with a tf_keras (Keras 2) model under parameter servers, as one process (run by a test, not pytest).

`python tests/testlib/tf_keras_parameter_server_main.py OUT_DIR` with TF_CONFIG
naming this process the chief of a localhost cluster starts every worker and
ps task's server in this process (`parameter_server_script.start_servers`),
creates the `parameter_server` strategy with shards small enough to split the
kernel over the ps tasks, and trains `tf_keras_testlib`'s model with the
Trainer in loops of 3 steps. With one worker a loop's steps run one after
another, as in the hand-written loop the test compares with. It writes the
initial and final weights to OUT_DIR/weights.npz and, to
OUT_DIR/results.json, every loop's train results (loss and the task's
Keras 3 accuracy) and the kernel's shards, and to OUT_DIR/accumulated.npz the
final weights of the same training in 2 micro-batches per step
(`gradient_accumulation_steps=2`). Then a task whose metric is a
tf_keras one: the error its train raises, and the global step after it.
"""

import json
import os
import sys

from absl import app
import numpy as np
import tensorflow as tf
import tf_keras

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/, for `testlib`
import runner
import strategies
from testlib import parameter_server_script
from testlib import tf_keras_testlib
from testlib import trainer_testlib

STEPS = 6
STEPS_PER_LOOP = 3


class _TfKerasAccuracy(runner.tasks.Classification):
  """Classification with a tf_keras metric, which has no stateless update."""

  def metrics(self):
    return [tf_keras.metrics.SparseCategoricalAccuracy(name="accuracy")]


class _SeenLoops(runner.actions.Action):

  def __init__(self):
    self.seen = []

  def __call__(self, loop):
    self.seen.append({"step": loop.step, **loop.train_results})


def _weights(model):
  """The Dense layer's kernel and bias, each whole (tf_keras's `get_weights` gives a sharded kernel's shards)."""
  dense = model.layers[0]
  return [tf.convert_to_tensor(dense.kernel).numpy(), dense.bias.numpy()]


def main(argv):
  out_dir = argv[1]
  servers = parameter_server_script.start_servers(json.loads(os.environ["TF_CONFIG"])["cluster"])
  strategy = strategies.create({"name": "parameter_server", "min_shard_bytes": 64})
  data = runner.data.InMemory(*trainer_testlib.classification_arrays())
  seen = _SeenLoops()
  trainer = tf_keras_testlib.make_trainer(strategy, steps_per_loop=STEPS_PER_LOOP, actions=[seen], quiet=True)
  initial = _weights(trainer.model)
  trainer.train(data, global_batch_size=trainer_testlib.MULTI_WORKER_BATCH, steps=STEPS)
  np.savez(os.path.join(out_dir, "weights.npz"), *initial, *_weights(trainer.model))
  kernel = trainer.model.layers[0].kernel
  accumulated = tf_keras_testlib.make_trainer(
      strategy, steps_per_loop=STEPS_PER_LOOP, gradient_accumulation_steps=2, quiet=True
  )
  accumulated.train(data, global_batch_size=trainer_testlib.MULTI_WORKER_BATCH, steps=STEPS)
  np.savez(os.path.join(out_dir, "accumulated.npz"), *_weights(accumulated.model))

  refused = tf_keras_testlib.make_trainer(strategy, task=_TfKerasAccuracy(), quiet=True)
  error = None
  try:
    refused.train(data, global_batch_size=trainer_testlib.MULTI_WORKER_BATCH, steps=1)
  except strategies.ConfigError as e:
    error = str(e)
  with open(os.path.join(out_dir, "results.json"), "w", encoding="utf-8") as f:
    json.dump(
        {
            "loops": seen.seen,
            "kernel_shards": [v.shape.as_list() for v in getattr(kernel, "variables", [kernel])],
            "tf_keras_metric_error": error,
            "step_after_the_error": refused.global_step,
            "servers": len(servers),
        },
        f,
    )


if __name__ == "__main__":
  app.run(main)
