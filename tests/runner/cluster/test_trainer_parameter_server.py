"""ParameterServerStrategy in the Trainer: real localhost clusters of `python -m runner` processes.

Every task runs the same command with its own TF_CONFIG: the chief trains
(steps scheduled onto the workers), the workers and ps tasks serve until the
chief is done. Tasks start in a shuffled order, as they may on a cluster.
The tf_keras (Keras 2) and input tests run their cluster's servers in the
coordinator's one process, both at once (tests/testlib/tf_keras_parameter_server_main.py,
tests/testlib/parameter_server_input_main.py).
"""

import glob
import json
import os
import random
import re
import signal
import sys

import numpy as np
import portpicker
import pytest
import tensorflow as tf

import runner
from runner import exit_codes
from runner.training import parameter_server_loops
from testlib import paths
from testlib import process_testlib
from testlib import tf_keras_testlib
from testlib import trainer_testlib

REPO = paths.REPO
SYNTHETIC = os.path.join(REPO, "configs", "synthetic.py")
TF_KERAS_SCRIPT = os.path.join(paths.TESTLIB, "tf_keras_parameter_server_main.py")
INPUT_SCRIPT = os.path.join(paths.TESTLIB, "parameter_server_input_main.py")
STEPS = 60
# Measured on a 2-core CPU machine (4 runs of this cluster): the last loop's mean train loss was 1.354 to 1.361 at
# step 60 (2.20 in the first loop, ln 10 = 2.30 untrained); evaluation loss 1.175 to 1.183. Asynchronous training
# varies a little from run to run, hence the margin.
MAX_FINAL_TRAIN_LOSS = 1.6
ARGS = [
    f"--config={SYNTHETIC}",
    "--config.strategy.name=parameter_server",
    f"--config.trainer.train_steps={STEPS}",
    "--config.trainer.steps_per_loop=10",
]


class Task(process_testlib.Process):
  """`python -m runner ARGS` as one task of `cluster`, its output in files under `logs`."""

  def __init__(self, cluster, job, index, args, env, logs):
    env = dict(env, TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": job, "index": index}}))
    super().__init__([sys.executable, "-m", "runner", *args], env=env, logs=logs, name=f"{job}:{index}")


def _cluster(workers, ps):
  hosts = [f"localhost:{portpicker.pick_unused_port()}" for _ in range(1 + workers + ps)]
  return {"chief": hosts[:1], "worker": hosts[1 : 1 + workers], "ps": hosts[1 + workers :]}


def _start(cluster, args, env, logs):
  """Starts every task of `cluster` in a shuffled order; returns {name: Task}."""
  tasks = [(job, index) for job, hosts in cluster.items() for index in range(len(hosts))]
  random.Random(0).shuffle(tasks)
  started = {}
  for job, index in tasks:
    task = Task(cluster, job, index, args, env, logs)
    started[task.name] = task
  return started


def _rows(workdir, split):
  with open(os.path.join(workdir, "metrics.jsonl"), encoding="utf-8") as f:
    return [row for row in map(json.loads, f) if row["split"] == split]


@pytest.mark.parametrize(
    "num_steps, sizes",
    [
        (20, [10, 10]),  # a full loop (steps_per_loop 10 per worker): one function of 10 steps per worker
        (7, [4, 3]),  # cut short at an action: still one function per worker
        (1, [1]),
    ],
)
def test_a_loop_is_split_into_one_function_per_worker(num_steps, sizes):
  assert parameter_server_loops.function_sizes(num_steps, 2) == sizes


def test_a_cluster_of_one_command_trains_shards_checkpoints_and_restores_on_one_device(tmp_path, subprocess_env):
  workdir = str(tmp_path / "run")
  cluster = _cluster(workers=2, ps=2)
  # 1 KiB shards: the hidden layer's kernel (16 x 64 floats, 4 KiB) is split over both ps tasks.
  tasks = _start(
      cluster,
      ARGS + [f"--workdir={workdir}", "--config.strategy.min_shard_bytes=1024"],
      subprocess_env,
      str(tmp_path / "logs"),
  )
  results = {name: task.wait() for name, task in tasks.items()}
  for name, (status, _, stderr) in results.items():
    assert status == 0, f"{name}: {stderr[-3000:]}"
    assert "Traceback" not in stderr, f"{name}: {stderr[-3000:]}"
  for name in ("worker:0", "worker:1", "ps:0", "ps:1"):
    assert results[name][1] == (
        f"serving as {name} of a parameter-server cluster until the coordinator ({cluster['chief'][0]}) is done\n"
    )
  _, stdout, stderr = results["chief:0"]
  assert "strategy: parameter_server: 2 workers, 2 parameter servers\n" in stdout
  assert f"global step: {STEPS}\n" in stdout
  assert "mlp/dense/kernel (16, 64) in 2 shards on ps:" in stderr, stderr[-3000:]
  progress = re.findall(r"reports.py:\d+\] (step \d+/\d+: .*)", stderr)
  assert len(progress) == 3, stderr[-3000:]  # The scheduled function traced first, shown apart on line one.
  assert " | traced in " in progress[0] and not any("traced" in line for line in progress[1:]), progress

  # One report per loop of 10 steps on each of the 2 workers, then the final evaluation.
  train = _rows(workdir, "train")
  assert [row["step"] for row in train] == [20, 40, STEPS]
  assert train[-1]["loss"] < MAX_FINAL_TRAIN_LOSS and train[-1]["loss"] < train[0]["loss"]
  assert 0.0 <= train[-1]["accuracy"] <= 1.0
  [evaluation] = _rows(workdir, "eval")
  assert evaluation["step"] == STEPS and evaluation["num_examples"] == 512
  assert tf.train.latest_checkpoint(os.path.join(workdir, "checkpoints")).endswith(f"ckpt-{STEPS}")
  for split in ("train", "eval"):
    assert glob.glob(os.path.join(workdir, "summaries", split, "events.out.tfevents.*"))

  # The checkpoint holds whole variables, as an unsharded run writes them, and restores under one_device.
  reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(os.path.join(workdir, "checkpoints")))
  config = runner.load_config(SYNTHETIC, ["strategy.name=one_device", "mode=eval"])
  restored = runner.run(config, workdir)
  assert restored.global_step == STEPS
  saved = [
      reader.get_tensor(f"optimizer/_trainable_variables/{i}/.ATTRIBUTES/VARIABLE_VALUE")
      for i in range(len(restored.model.trainable_variables))
  ]
  assert [w.shape for w in saved] == [(16, 64), (64,), (64, 10), (10,)]
  for variable, value in zip(restored.model.trainable_variables, saved):
    np.testing.assert_array_equal(variable.numpy(), value)
  assert restored.eval_metrics["num_examples"] == 512
  assert restored.eval_metrics["accuracy"] == evaluation["accuracy"]
  assert restored.eval_metrics["loss"] == pytest.approx(evaluation["loss"], rel=1e-6)


def test_a_lost_ps_a_signalled_server_and_a_missing_cluster_each_end_with_one_line(tmp_path, subprocess_env):
  # A long run on 1 worker and 1 ps; the ps is stopped once training is under way.
  workdir = str(tmp_path / "run")
  long_run = ARGS + [
      f"--workdir={workdir}",
      "--config.trainer.train_steps=1000000",
      "--config.trainer.checkpoint_every=20",
  ]
  cluster = _cluster(workers=1, ps=1)
  tasks = _start(cluster, long_run, subprocess_env, str(tmp_path / "logs"))
  # A worker whose chief never comes, and a chief (of another cluster) whose tasks never come.
  server = Task(_cluster(workers=1, ps=1), "worker", 0, ARGS, subprocess_env, str(tmp_path / "lonely"))
  lonely = _cluster(workers=1, ps=1)
  chief = Task(
      lonely,
      "chief",
      0,
      ARGS + ["--config.strategy.timeout_seconds=2", f"--workdir={tmp_path / 'alone'}"],
      subprocess_env,
      str(tmp_path / "alone_logs"),
  )

  status, _, stderr = chief.wait()
  errors = [line for line in stderr.splitlines() if line.startswith("error:")]
  assert status == exit_codes.CLUSTER and errors == [
      "error: chief:0 waited 2 s for the other tasks and gave up: nothing listens at "
      f"worker:0 ({lonely['worker'][0]}), ps:0 ({lonely['ps'][0]}). Start every task (the same command with its own "
      "TF_CONFIG or task_index), or raise config.strategy.timeout_seconds."
  ], stderr[-3000:]

  server.wait_for(lambda: "serving as worker:0" in server.stdout(), "serving line")
  server.process.send_signal(signal.SIGINT)
  status, _, stderr = server.wait(timeout=30)
  assert status == 130 and stderr.splitlines()[-1] == (
      "Ctrl-C (SIGINT) received: worker:0 stopped serving at once (the coordinator writes the checkpoints; it fails "
      "if a ps task it needs is gone)."
  ), stderr[-3000:]

  tasks["chief:0"].wait_for(
      lambda: os.path.exists(os.path.join(workdir, "checkpoints", "checkpoint")), "first checkpoint"
  )
  tasks["ps:0"].process.send_signal(signal.SIGKILL)  # A SIGTERM would let it serve until the chief is done.
  assert tasks["ps:0"].wait(timeout=30)[0] == -signal.SIGKILL
  status, _, stderr = tasks["chief:0"].wait()
  errors = [line for line in stderr.splitlines() if line.startswith("error:")]
  assert status == exit_codes.CLUSTER and len(errors) == 1, stderr[-3000:]
  saved = tf.train.latest_checkpoint(os.path.join(workdir, "checkpoints"))
  assert errors[0].startswith(f"error: The coordinator lost ps:0 ({cluster['ps'][0]}) after step ")
  assert errors[0].endswith(
      "; the variables it held are gone, so training cannot go on. Restart every task with the "
      "same command; the run resumes from its last checkpoint, at step "
      f"{saved.rpartition('-')[2]}."
  ), errors[0]
  assert "Traceback" not in stderr
  status, _, stderr = tasks["worker:0"].wait()
  assert status == 0, stderr[-3000:]  # Its coordinator is gone: nothing left to serve.


@pytest.fixture(scope="module")
def one_process_clusters(tmp_path_factory):
  """{name: (OUT_DIR, process)}: `script OUT_DIR` as the chief of its cluster (it serves the other tasks itself).

  The input script's cluster (2 workers, 1 ps) and the tf_keras script's
  (1 worker, 2 ps) start at once; each test waits for its own.
  """
  env = paths.subprocess_environment()
  started = {}
  for name, script, cluster in (
      ("input", INPUT_SCRIPT, _cluster(workers=2, ps=1)),
      ("tf_keras", TF_KERAS_SCRIPT, _cluster(workers=1, ps=2)),
  ):
    out_dir = tmp_path_factory.mktemp(name)
    task_env = dict(env, TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": "chief", "index": 0}}))
    logs = str(tmp_path_factory.mktemp(f"{name}_logs"))
    started[name] = (out_dir, process_testlib.Process([sys.executable, script, str(out_dir)], env=task_env, logs=logs))
  try:
    yield started
  finally:
    for _, process in started.values():
      process.process.kill()  # Ended already unless a test failed.


def _results_of(one_process_clusters, name):
  """(OUT_DIR, its results.json) of the script `name` of `one_process_clusters`, once it exited with status 0."""
  out_dir, process = one_process_clusters[name]
  status, _, stderr = process.wait()
  assert status == 0, stderr[-3000:]
  with open(out_dir / "results.json", encoding="utf-8") as f:
    return out_dir, json.load(f)


def test_each_worker_reads_and_trains_on_its_own_share_once_per_epoch(one_process_clusters):
  """2 workers: worker k reads examples k, k + 2, ... (its share), in order; a resumed run starts it at step // 2."""
  _, results = _results_of(one_process_clusters, "input")
  assert results["servers"] == 3
  shares = [list(range(24))[worker::2] for worker in range(2)]  # InMemory shards by example.
  # Each function read one epoch of its worker's share (3 batches of 4): every example of it once, no other.
  for worker, numbers in results["reads"]["0"]:
    assert numbers == shares[worker]
  # Resumed at step 5: each worker starts at batch 5 // 2 = 2 of its share (example 8 of 12), then wraps around.
  for worker, numbers in results["reads"]["5"]:
    assert numbers == shares[worker][8:] + shares[worker][:8]
  # TFRecordFiles sharded by file: worker k reads file k only.
  for worker, numbers in results["records"]:
    assert numbers == [100 * worker + k for k in range(12)]

  # The Trainer, 14 steps of 4 examples: each example's training count (exact, from the weights). A worker goes
  # through its share in order, so its examples were trained on equally often but for a prefix of one more.
  counts = results["counts"]
  assert results["global_step"] == 14
  assert all(c == int(c) for c in counts) and sum(counts) == 14 * 4
  for share in shares:
    trained = [int(counts[n]) for n in share]
    assert trained == sorted(trained, reverse=True) and trained[0] - trained[-1] <= 1, trained
    assert sum(trained) % 4 == 0  # whole batches of this worker's share


def test_a_tf_keras_model_trains_on_one_worker_and_two_ps_as_the_hand_written_loop(one_process_clusters):
  """One worker runs each loop's 3 steps in order; the kernel is split over both ps tasks; so does gradient accumulation.

  A tf_keras metric, which cannot update statelessly, is one ConfigError before any step.
  """
  out_dir, results = _results_of(one_process_clusters, "tf_keras")
  assert results["servers"] == 3 and results["kernel_shards"] == [[4, 4], [4, 4]]
  with np.load(out_dir / "weights.npz") as saved:
    weights = [saved[f"arr_{i}"] for i in range(len(saved.files))]
  initial, trained = weights[:2], weights[2:]
  features, labels = trainer_testlib.classification_arrays()
  reference, step_results = tf_keras_testlib.hand_written_training(
      initial, features, labels, global_batch_size=trainer_testlib.MULTI_WORKER_BATCH, steps=6
  )
  assert not np.allclose(reference[0], initial[0], atol=1e-2)  # It trained.
  tf_keras_testlib.assert_weights_close(trained, reference)
  with np.load(out_dir / "accumulated.npz") as saved:  # 2 micro-batches per step: the same training.
    tf_keras_testlib.assert_weights_close([saved[f"arr_{i}"] for i in range(len(saved.files))], reference)
  # Each loop's mean loss, and the task's Keras 3 accuracy, updated statelessly on the worker.
  assert [loop["step"] for loop in results["loops"]] == [3, 6]
  for loop, steps in zip(results["loops"], (step_results[:3], step_results[3:])):
    assert loop["loss"] == pytest.approx(np.mean([r["loss"] for r in steps]), rel=1e-5)
    assert loop["accuracy"] == pytest.approx(np.mean([r["accuracy"] for r in steps]), abs=1e-6)
  assert results["tf_keras_metric_error"] == (
      "Under parameter servers the Trainer updates metrics statelessly, which the metric(s) ['accuracy'] of "
      "Task.metrics() cannot (tf_keras metrics cannot); return Keras 3 metrics (keras.metrics), also for a "
      "tf_keras model."
  )
  assert results["step_after_the_error"] == 0
