"""A Kubernetes TFJob's cluster on localhost: a `master`, a `worker` and an `evaluator`, each `python -m runner`.

The training operator gives every replica the same command and its own TF_CONFIG; here the three are set by
hand as the operator sets them. The master is the chief of a 2-replica multi_worker_mirrored job, and the
evaluator trains nothing: it evaluates each checkpoint the chief writes, once, and ends at `train_steps`.
"""

import json
import os
import re
import sys

import portpicker

from testlib import paths
from testlib import process_testlib

SYNTHETIC = os.path.join(paths.REPO, "configs", "synthetic.py")
STEPS = 60


def _replica(cluster, job, workdir, env, *extra):
  tf_config = {"cluster": cluster, "task": {"type": job, "index": 0}, "environment": "cloud"}
  return process_testlib.Process(
      [
          sys.executable,
          "-m",
          "runner",
          f"--config={SYNTHETIC}",
          f"--workdir={workdir}",
          "--config.strategy.name=multi_worker_mirrored",
          f"--config.trainer.train_steps={STEPS}",
          "--config.trainer.steps_per_loop=10",
          "--config.trainer.checkpoint_every=20",
          *extra,
      ],
      env=dict(env, TF_CONFIG=json.dumps(tf_config)),
      logs=f"{workdir}.logs",
      name=job,
  )


def test_a_master_is_the_chief_and_the_evaluator_evaluates_each_checkpoint_once(tmp_path, subprocess_env):
  hosts = [f"localhost:{portpicker.pick_unused_port()}" for _ in range(3)]
  cluster = {"master": hosts[:1], "worker": hosts[1:2], "evaluator": hosts[2:]}
  workdir = tmp_path / "job"
  evaluator = _replica(cluster, "evaluator", workdir, subprocess_env)  # The same command; only TF_CONFIG differs.
  trainers = {job: _replica(cluster, job, workdir, subprocess_env, "--mode=train") for job in ("master", "worker")}
  outcomes = {job: task.wait() for job, task in {**trainers, "evaluator": evaluator}.items()}
  for job, (status, _, stderr) in outcomes.items():
    assert status == 0, f"{job}: {stderr[-3000:]}"

  master_out, master_err = outcomes["master"][1:]
  assert "strategy: multi_worker_mirrored: 2 replicas on 2 workers; this is chief:0 on " in master_out
  assert f"multi_worker_mirrored: cluster from TF_CONFIG: 1 chief, 1 worker; this task is chief:0 at {hosts[0]}." in (
      master_err
  )
  assert "global step: 60" in outcomes["worker"][1]

  evaluator_out, evaluator_err = outcomes["evaluator"][1:]
  assert (
      "cluster from TF_CONFIG: 1 chief, 1 worker; this task is the evaluator (it trains nothing and evaluates every "
      "new checkpoint): mode 'continuous_eval' under strategy auto (the trainers: mode 'train_and_eval' under "
      "multi_worker_mirrored)." in evaluator_err
  )
  assert "strategy: one_device: 1 replica on CPU:0" in evaluator_out
  rows = process_testlib.metrics_rows(workdir)
  eval_rows = [row for row in rows if row["split"] == "eval"]
  assert [row["step"] for row in eval_rows] == [20, 40, 60]  # Every checkpoint (max_to_keep 3) once, in order.
  assert all(row["num_examples"] == 512 for row in eval_rows)
  assert [row["step"] for row in rows if row["split"] == "train"] == list(range(10, STEPS + 1, 10))  # The chief's.
  printed = re.search(r"^eval: accuracy=([\d.]+) loss=([\d.]+) num_examples=512$", evaluator_out, re.M)
  assert printed is not None, evaluator_out
  assert float(printed.group(2)) == round(eval_rows[-1]["loss"], 4)
  assert eval_rows[-1]["loss"] < eval_rows[0]["loss"]
