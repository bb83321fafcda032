"""A Kubernetes TFJob's cluster on localhost: a `master`, a `worker` and an `evaluator`, each `python -m runner`.

The training operator gives every replica the same command and its own TF_CONFIG; here the three are set by
hand as the operator sets them. The master is the chief of a 2-replica multi_worker_mirrored job, and the
evaluator trains nothing: beside the live trainers, keeping one checkpoint (max_to_keep=1), it evaluates each
checkpoint it sees once, at that checkpoint's step, and ends at `train_steps`.
"""

import json
import os
import re
import sys

import portpicker
import pytest
from tensorboard.backend.event_processing import event_accumulator

import runner
from runner.outputs import reports
from testlib import paths
from testlib import process_testlib

SYNTHETIC = os.path.join(paths.REPO, "configs", "synthetic.py")
STEPS = 200
OVERRIDES = [
    "strategy.name=multi_worker_mirrored",
    "data.num_examples=512",
    "data.num_eval_examples=128",
    "model.hidden_units=(16,)",
    f"trainer.train_steps={STEPS}",
    "trainer.steps_per_loop=10",
    "trainer.checkpoint_every=20",
    "trainer.max_to_keep=1",
]


def _replica(cluster, job, workdir, env, *extra):
  tf_config = {"cluster": cluster, "task": {"type": job, "index": 0}, "environment": "cloud"}
  return process_testlib.Process(
      [sys.executable, "-m", "runner", f"--config={SYNTHETIC}", f"--workdir={workdir}"]
      + [f"--config.{override}" for override in OVERRIDES]
      + list(extra),
      env=dict(env, TF_CONFIG=json.dumps(tf_config)),
      logs=f"{workdir}.logs",
      name=job,
  )


def _eval_scalar_steps(workdir, tag="loss"):
  """The steps of the `tag` scalars in `workdir/summaries/eval`, read with TensorBoard's event_accumulator."""
  accumulator = event_accumulator.EventAccumulator(
      reports.summary_dir(workdir, "eval"), size_guidance={event_accumulator.TENSORS: 0}
  )
  accumulator.Reload()
  return sorted(event.step for event in accumulator.Tensors(tag))


def test_a_master_is_the_chief_and_the_evaluator_beside_it_evaluates_each_checkpoint_it_sees_once(
    tmp_path, subprocess_env
):
  hosts = [f"localhost:{portpicker.pick_unused_port()}" for _ in range(3)]
  cluster = {"master": hosts[:1], "worker": hosts[1:2], "evaluator": hosts[2:]}
  workdir = tmp_path / "job"
  evaluator = _replica(cluster, "evaluator", workdir, subprocess_env)  # The same command; only TF_CONFIG differs.
  trainers = {job: _replica(cluster, job, workdir, subprocess_env, "--mode=train") for job in ("master", "worker")}
  tasks = {**trainers, "evaluator": evaluator}
  try:
    outcomes = {job: task.wait() for job, task in tasks.items()}
  finally:
    for task in tasks.values():
      task.process.kill()
  for job, (status, _, stderr) in outcomes.items():
    assert status == 0, f"{job}: {stderr[-3000:]}"

  master_out, master_err = outcomes["master"][1:]
  assert "strategy: multi_worker_mirrored: 2 replicas on 2 workers; this is chief:0 on " in master_out
  assert f"multi_worker_mirrored: cluster from TF_CONFIG: 1 chief, 1 worker; this task is chief:0 at {hosts[0]}." in (
      master_err
  )
  assert f"global step: {STEPS}" in outcomes["worker"][1]
  rows = process_testlib.metrics_rows(workdir)
  assert [row["step"] for row in rows if row["split"] == "train"] == list(range(10, STEPS + 1, 10))  # None lost.

  stdout, stderr = outcomes["evaluator"][1:]
  assert (
      "cluster from TF_CONFIG: 1 chief, 1 worker; this task is the evaluator (it trains nothing and evaluates every "
      "new checkpoint): mode 'continuous_eval' under strategy auto (the trainers: mode 'train_and_eval' under "
      "multi_worker_mirrored)." in stderr
  )
  assert "strategy: one_device: 1 replica on CPU:0" in stdout
  evaluated = [row["step"] for row in rows if row["split"] == "eval"]
  assert len(evaluated) == len(set(evaluated)), evaluated  # No checkpoint twice.
  assert set(evaluated) <= set(range(20, STEPS + 1, 20)) and evaluated == sorted(evaluated), evaluated
  assert evaluated[-1] == STEPS  # It ended after the checkpoint of train_steps.
  assert re.findall(r"eval at step (\d+):", stderr) == [str(step) for step in evaluated]
  skipped = re.findall(r"Skipped \S+/ckpt-(\d+): it was deleted while it was read", stderr)
  assert not set(map(int, skipped)) & set(evaluated)
  assert _eval_scalar_steps(str(workdir)) == evaluated
  final = rows[-1]
  assert final["split"] == "eval" and final["step"] == STEPS and final["num_examples"] == 128
  assert f"eval: accuracy={final['accuracy']:.4f} loss={final['loss']:.4f} num_examples=128" in stdout

  plain = runner.run(  # A plain evaluation of that checkpoint, in this process, on one device.
      runner.load_config(SYNTHETIC, OVERRIDES + ["mode=eval", "strategy.name=one_device"]), str(workdir), quiet=True
  )
  assert plain.global_step == STEPS
  assert plain.eval_metrics == pytest.approx({name: final[name] for name in ("loss", "accuracy", "num_examples")})
