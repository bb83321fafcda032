"""MultiWorkerMirroredStrategy: two worker processes on localhost train like one process.

The same two processes then train a tf_keras (Keras 2) model, compared with a
hand-written tf_keras loop (the multi-process part of test_trainer_tf_keras.py).
"""

import json
import os
import sys

import numpy as np
import portpicker
import pytest
import tensorflow as tf

from testlib import paths
from testlib import process_testlib
from testlib import tf_keras_testlib
from testlib import trainer_testlib

WORKER_SCRIPT = os.path.join(paths.TESTLIB, "trainer_multi_worker_main.py")


def test_two_workers_end_with_the_weights_of_one_process(tmp_path, subprocess_env):
  hosts = [f"localhost:{portpicker.pick_unused_port()}" for _ in range(2)]
  workers = []
  for index in range(2):
    env = dict(
        subprocess_env, TF_CONFIG=json.dumps({"cluster": {"worker": hosts}, "task": {"type": "worker", "index": index}})
    )
    workers.append(  # Output to files: a full pipe would stop a worker while this process trains.
        process_testlib.Process(
            [sys.executable, WORKER_SCRIPT, str(tmp_path)], env=env, logs=str(tmp_path / "logs"), name=f"worker{index}"
        )
    )
  try:  # The same training and evaluation in one process, here while the workers run.
    single = trainer_testlib.make_trainer(tf.distribute.OneDeviceStrategy("/cpu:0"))
    single.train(
        trainer_testlib.classification_data(),
        global_batch_size=trainer_testlib.MULTI_WORKER_BATCH,
        steps=trainer_testlib.MULTI_WORKER_STEPS,
    )
    expected = single.model.get_weights()
    expected_eval = single.evaluate(
        trainer_testlib.classification_data(1001, seed=2), global_batch_size=trainer_testlib.MULTI_WORKER_BATCH
    )
    ended = [worker.wait(timeout=150) for worker in workers]
  finally:
    for worker in workers:
      worker.process.kill()
  for status, stdout, stderr in ended:
    output = stdout + stderr
    assert status == 0, output[-3000:]
    # Not in the background under several workers: said once, at the first save.
    assert output.count("Checkpoints are written synchronously: under several workers every worker takes part") == 1

  per_worker = _equal_weights_of_both_workers(tmp_path, "weights")
  assert len(per_worker[0]) == len(expected)
  for got, want in zip(per_worker[0], expected):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  # Actions run on every worker, after the same loops, with the same (reduced) results; one is the chief.
  seen = [json.loads((tmp_path / f"actions_{index}.json").read_text()) for index in range(2)]
  assert [row[0] for row in seen[0]] == list(range(1, trainer_testlib.MULTI_WORKER_STEPS + 1))
  assert [row[1] for row in seen[0]] == [True] * 6 and [row[1] for row in seen[1]] == [False] * 6
  assert [row[2] for row in seen[0]] == [row[2] for row in seen[1]]
  # Evaluation over two input pipelines of 700 and 301 examples (88 and 38 steps) counts each example once.
  for index in range(2):
    with open(tmp_path / f"eval_{index}.json", encoding="utf-8") as f:
      results = json.load(f)
    assert results["num_examples"] == 1001
    assert results["accuracy"] == pytest.approx(expected_eval["accuracy"], abs=1e-6)
    assert results["loss"] == pytest.approx(expected_eval["loss"], rel=1e-5)
  # Only the chief wrote checkpoints: every 2 steps, numbered by step.
  checkpoints = tf.train.get_checkpoint_state(str(tmp_path / "model_dir" / "checkpoints"))
  assert [os.path.basename(p) for p in checkpoints.all_model_checkpoint_paths] == ["ckpt-2", "ckpt-4", "ckpt-6"]
  _assert_the_tf_keras_model_trained_as_the_hand_written_loop(tmp_path)


def _equal_weights_of_both_workers(out_dir, stem):
  """Reads `{stem}_0.npz` and `{stem}_1.npz`, asserts the two workers saved equal arrays; returns both lists."""
  per_worker = []
  for index in range(2):
    with np.load(out_dir / f"{stem}_{index}.npz") as saved:
      per_worker.append([saved[f"arr_{i}"] for i in range(len(saved.files))])
  for first, second in zip(*per_worker):
    np.testing.assert_array_equal(first, second)
  return per_worker


def _assert_the_tf_keras_model_trained_as_the_hand_written_loop(out_dir):
  per_worker = _equal_weights_of_both_workers(out_dir, "tf_keras_weights")
  initial, trained = per_worker[0][:2], per_worker[0][2:]
  features, labels = trainer_testlib.classification_arrays()
  reference, _ = tf_keras_testlib.hand_written_training(
      initial,
      features,
      labels,
      global_batch_size=trainer_testlib.MULTI_WORKER_BATCH,
      steps=trainer_testlib.MULTI_WORKER_STEPS,
  )
  assert not np.allclose(reference[0], initial[0], atol=1e-2)  # It trained.
  tf_keras_testlib.assert_weights_close(trained, reference)
