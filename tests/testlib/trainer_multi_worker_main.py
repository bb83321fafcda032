"""One worker of the multi-worker Trainer test (run by test_trainer_multi_worker.py, not by pytest).

`python tests/testlib/trainer_multi_worker_main.py OUT_DIR` with TF_CONFIG set trains
the shared test model with MultiWorkerMirroredStrategy, writes this worker's
final weights to OUT_DIR/weights_<task index>.npz, the steps and chief flag its
action saw to OUT_DIR/actions_<task index>.json, evaluates 1001 examples split
unevenly between the workers and writes the results to
OUT_DIR/eval_<task index>.json. Then, in the same processes and strategy,
it trains the tiny tf_keras (Keras 2) model of `tf_keras_testlib` the same
way and writes its initial and final weights to
OUT_DIR/tf_keras_weights_<task index>.npz.
"""

import json
import os
import sys

import numpy as np
import tensorflow as tf

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/, for `testlib`
import runner
from testlib import tf_keras_testlib
from testlib import trainer_testlib


class SeenLoops(runner.actions.Action):

  def __init__(self):
    self.seen = []

  def __call__(self, loop):
    self.seen.append([loop.step, loop.is_chief, loop.train_results["loss"]])


def main(out_dir):
  task_index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
  strategy = tf.distribute.MultiWorkerMirroredStrategy()
  seen = SeenLoops()
  trainer = trainer_testlib.make_trainer(
      strategy, model_dir=os.path.join(out_dir, "model_dir"), checkpoint_every=2, actions=[seen]
  )
  trainer.train(
      trainer_testlib.classification_data(),
      global_batch_size=trainer_testlib.MULTI_WORKER_BATCH,
      steps=trainer_testlib.MULTI_WORKER_STEPS,
  )
  np.savez(os.path.join(out_dir, f"weights_{task_index}.npz"), *trainer.model.get_weights())
  with open(os.path.join(out_dir, f"actions_{task_index}.json"), "w", encoding="utf-8") as f:
    json.dump(seen.seen, f)
  results = trainer.evaluate(
      trainer_testlib.UnevenShards(trainer_testlib.classification_data(1001, seed=2)),
      global_batch_size=trainer_testlib.MULTI_WORKER_BATCH,
  )
  with open(os.path.join(out_dir, f"eval_{task_index}.json"), "w", encoding="utf-8") as f:
    json.dump(results, f)
  train_tf_keras(strategy, os.path.join(out_dir, f"tf_keras_weights_{task_index}.npz"))


def train_tf_keras(strategy, path):
  """Trains the tf_keras model as the Keras 3 one, in loops of 3 steps; saves its initial and final weights."""
  trainer = tf_keras_testlib.make_trainer(strategy, steps_per_loop=3)
  initial = trainer.model.get_weights()
  trainer.train(
      trainer_testlib.classification_data(),
      global_batch_size=trainer_testlib.MULTI_WORKER_BATCH,
      steps=trainer_testlib.MULTI_WORKER_STEPS,
  )
  np.savez(path, *initial, *trainer.model.get_weights())


if __name__ == "__main__":
  main(sys.argv[1])
