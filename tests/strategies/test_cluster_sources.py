"""Where the cluster comes from (`strategies.cluster.find`): TF_CONFIG as Kubernetes TFJob and Vertex AI set it.

The engines' environment contracts are tested with the variables set by hand, as each engine sets them:
a TFJob's TF_CONFIG names the chief `master` and may hold an `evaluator`; Vertex AI's CLUSTER_SPEC names
worker pools 0-3. Nothing here starts a server.
"""

import json
import os
import re
import subprocess
import sys

from absl import flags
import pytest

from runner.cluster import roles
from runner.config import run_config
import strategies
from strategies import cluster
from testlib import paths

TFJOB = {
    "cluster": {
        "master": ["tfjob-master-0.ns.svc:2222"],
        "worker": ["tfjob-worker-0.ns.svc:2222", "tfjob-worker-1.ns.svc:2222"],
        "evaluator": ["tfjob-evaluator-0.ns.svc:2222"],
    },
    "task": {"type": "master", "index": 0},
    "environment": "cloud",
}
VERTEX = {
    "cluster": {
        "workerpool0": ["cmle-training-workerpool0-1a-0:2222"],
        "workerpool1": ["cmle-training-workerpool1-1a-0:2222", "cmle-training-workerpool1-1a-1:2222"],
        "workerpool2": ["cmle-training-workerpool2-1a-0:2222"],
        "workerpool3": ["cmle-training-workerpool3-1a-0:2222"],
    },
    "environment": "cloud",
    "task": {"type": "workerpool1", "index": 1},
    "job": '{"python_module":"runner","args":["--config=configs/digits.py"]}',
}
SLURM_STEP = {"SLURM_PROCID": "1", "SLURM_STEP_NUM_TASKS": "2", "SLURM_NTASKS": "2"}


def _with_task(spec, task_type, index=0):
  return json.dumps({**spec, "task": {"type": task_type, "index": index}})


def test_alone_without_any_cluster_variable():
  found = cluster.find(environ={})
  assert found is cluster.ALONE and found.jobs == {} and found.task_type is None
  assert found.describe() == (
      "cluster: none (no TF_CONFIG, CLUSTER_SPEC or SLURM step of more than one task): this process alone"
  )
  assert found.resolver().cluster_spec().as_dict() == {}


def test_a_tfjob_master_is_the_chief_and_its_evaluator_is_not_a_worker():
  found = cluster.find(environ={"TF_CONFIG": json.dumps(TFJOB)})
  assert found.source == "TF_CONFIG"
  assert dict(found.jobs) == {
      "chief": ("tfjob-master-0.ns.svc:2222",),
      "worker": ("tfjob-worker-0.ns.svc:2222", "tfjob-worker-1.ns.svc:2222"),
  }
  assert (found.task_type, found.task_id) == ("chief", 0)
  assert found.describe() == (
      "cluster from TF_CONFIG: 1 chief, 2 workers; this task is chief:0 at tfjob-master-0.ns.svc:2222"
  )
  resolver = found.resolver()
  assert resolver.cluster_spec().as_dict() == {
      "chief": ["tfjob-master-0.ns.svc:2222"],
      "worker": ["tfjob-worker-0.ns.svc:2222", "tfjob-worker-1.ns.svc:2222"],
  }
  assert (resolver.task_type, resolver.task_id, resolver.rpc_layer) == ("chief", 0, "grpc")


def test_the_evaluator_task_gets_no_cluster_to_join():
  found = cluster.find(environ={"TF_CONFIG": _with_task(TFJOB, "evaluator")})
  assert found.is_evaluator and found.task_type == "evaluator" and "evaluator" not in found.jobs
  assert found.describe() == (
      "cluster from TF_CONFIG: 1 chief, 2 workers; this task is the evaluator (it trains nothing and evaluates "
      "every new checkpoint)"
  )
  resolver = found.resolver()
  assert resolver.cluster_spec().as_dict() == {} and resolver.task_type is None


def test_vertex_cluster_spec_pools_are_chief_worker_ps_and_evaluator():
  found = cluster.find("tf_config", environ={"CLUSTER_SPEC": json.dumps(VERTEX)})
  assert found.source == "CLUSTER_SPEC"
  assert {job: len(tasks) for job, tasks in found.jobs.items()} == {"chief": 1, "worker": 2, "ps": 1}
  assert (found.task_type, found.task_id) == ("worker", 1)
  evaluator = cluster.find(environ={"CLUSTER_SPEC": _with_task(VERTEX, "workerpool3")})
  assert evaluator.is_evaluator


def test_tf_config_comes_before_cluster_spec_and_a_slurm_step():
  tf_config = json.dumps(
      {"cluster": {"worker": ["localhost:1", "localhost:2"]}, "task": {"type": "worker", "index": 1}}
  )
  found = cluster.find(environ={"TF_CONFIG": tf_config, "CLUSTER_SPEC": json.dumps(VERTEX), **SLURM_STEP})
  assert (found.source, found.task_type, found.task_id) == ("TF_CONFIG", "worker", 1)


def test_a_tf_config_without_a_cluster_is_this_process_alone():
  assert cluster.find(environ={"TF_CONFIG": json.dumps({"task": {"type": "worker", "index": 0}})}) is cluster.ALONE


@pytest.mark.parametrize(
    "environ, message",
    [
        (
            {"TF_CONFIG": "{not json"},
            'TF_CONFIG=\'{not json\' is not valid; it must be JSON such as {"cluster": {"worker": ["host1:port", '
            '"host2:port"]}, "task": {"type": "worker", "index": 0}}.',
        ),
        (
            {"TF_CONFIG": json.dumps({"cluster": {"wroker": ["a:1"]}, "task": {"type": "worker", "index": 0}})},
            "TF_CONFIG names a job 'wroker', which is not one of chief, master, worker, ps, evaluator. Did you mean "
            "'worker'?",
        ),
        (
            {"CLUSTER_SPEC": json.dumps({"cluster": {"workerpool9": ["a:1"]}, "task": {"type": "workerpool9"}})},
            "CLUSTER_SPEC names a job 'workerpool9', which is not one of chief, master, worker, ps, evaluator, "
            "workerpool0, workerpool1, workerpool2, workerpool3. Did you mean 'workerpool3'?",
        ),
        (
            {"TF_CONFIG": json.dumps({"cluster": {"chief": ["a:1"], "master": ["b:1"]}, "task": {"type": "chief"}})},
            "TF_CONFIG names the chief twice ('chief' and 'master'); give one of them.",
        ),
        (
            {"TF_CONFIG": json.dumps({"cluster": {"worker": "a:1"}, "task": {"type": "worker", "index": 0}})},
            "TF_CONFIG's job 'worker' must be a list of 'host:port' strings, got 'a:1'.",
        ),
        (
            {"TF_CONFIG": json.dumps({"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 2}})},
            "TF_CONFIG's task {'type': 'worker', 'index': 2} is not one of its cluster's tasks (worker:0-1).",
        ),
        (
            {"TF_CONFIG": json.dumps({"cluster": {"worker": ["a:1"]}, "task": {"type": "ps", "index": 0}})},
            "TF_CONFIG's task {'type': 'ps', 'index': 0} is not one of its cluster's tasks (worker:0-0).",
        ),
        (
            {
                "TF_CONFIG": json.dumps(
                    {"cluster": {"worker": ["a:1"], "evaluator": ["e:1", "f:1"]}, "task": {"type": "evaluator"}}
                )
            },
            "TF_CONFIG has 2 evaluator tasks; a cluster has at most one evaluator.",
        ),
    ],
)
def test_a_bad_cluster_variable_is_one_clear_error(environ, message):
  with pytest.raises(strategies.ConfigError) as raised:
    cluster.find(environ=environ)
  assert str(raised.value) == message


def test_tf_config_source_needs_a_variable():
  with pytest.raises(strategies.ConfigError) as raised:
    cluster.find("tf_config", environ=SLURM_STEP)
  assert str(raised.value).startswith(
      "config.strategy.cluster='tf_config' but neither TF_CONFIG nor CLUSTER_SPEC (Vertex AI) is set; set "
      "TF_CONFIG on every task, e.g. "
  )


def test_num_ps_is_only_for_a_slurm_step():
  with pytest.raises(strategies.ConfigError) as raised:
    cluster.find(environ={"TF_CONFIG": json.dumps(TFJOB)}, parameter_server=True, num_ps=2)
  assert str(raised.value) == (
      "config.strategy.num_ps=2 sets the ps tasks of a SLURM step, but the cluster comes from TF_CONFIG, which "
      "names its own; remove num_ps."
  )


@pytest.mark.parametrize(
    "fields, message",
    [
        (
            {"name": "multi_worker_mirrored", "cluster": "slrum"},
            "config.strategy.cluster='slrum' is not valid. Did you mean 'slurm'? Valid: auto, tf_config, slurm.",
        ),
        ({"name": "parameter_server", "num_ps": 0}, "config.strategy.num_ps must be a positive int, got 0."),
        (
            {"name": "mirrored", "cluster": "slurm"},
            "config.strategy.cluster='slurm' is not used by strategy 'mirrored', which reads devices, virtual_cpus, "
            "cross_device_ops, num_packs. Remove it, or choose a strategy that uses it: multi_worker_mirrored, "
            "parameter_server.",
        ),
    ],
)
def test_bad_cluster_fields_fail_before_any_tensorflow_work(fields, message):
  with pytest.raises(strategies.ConfigError) as raised:
    strategies.create(fields)
  assert str(raised.value) == message


def test_the_cluster_flags():
  flag_values = flags.FlagValues()
  strategies.flags.define_flags(flag_values)
  flag_values(["script", "--strategy=parameter_server", "--cluster=slurm", "--num_ps=2"])
  fields = strategies.flags.config_from_flags(flag_values)
  assert (fields["cluster"], fields["num_ps"]) == ("slurm", 2)
  bad = flags.FlagValues()
  strategies.flags.define_flags(bad)
  with pytest.raises(flags.IllegalFlagValueError, match=r"--num_ps=2 is not used by strategy 'multi_worker_mirrored'"):
    bad(["script", "--strategy=multi_worker_mirrored", "--num_ps=2"])


def test_a_strategy_given_its_cluster_twice_is_refused():
  with pytest.raises(strategies.ConfigError) as raised:
    strategies.MultiWorkerMirroredStrategy(cluster="slurm", worker_hosts=["localhost:1"], task_index=0)
  assert str(raised.value) == (
      "cluster='slurm' reads the cluster from the environment, and worker_hosts + task_index gives it too; give one."
  )


@pytest.mark.parametrize(
    "strategy, task, role",
    [
        ("multi_worker_mirrored", "master", roles.TRAIN),
        ("multi_worker_mirrored", "worker", roles.TRAIN),
        ("multi_worker_mirrored", "evaluator", roles.EVALUATE),
        ("parameter_server", "master", roles.TRAIN),
        ("parameter_server", "worker", roles.SERVE),
        ("parameter_server", "ps", roles.SERVE),
        ("parameter_server", "evaluator", roles.EVALUATE),
        ("mirrored", "worker", roles.TRAIN),  # A one-process strategy reads no cluster...
        ("mirrored", "evaluator", roles.EVALUATE),  # ...but its evaluator is the evaluator.
    ],
)
def test_each_task_role_is_decided_before_any_server(monkeypatch, strategy, task, role):
  spec = {**TFJOB, "cluster": {**TFJOB["cluster"], "ps": ["tfjob-ps-0.ns.svc:2222"]}}
  monkeypatch.setenv("TF_CONFIG", _with_task(spec, task))
  config = run_config.validate(run_config.load_config("configs/synthetic.py", [f"strategy.name={strategy}"]))
  assert roles.role(config)[0] == role


# A cluster environment that is half there: one line before TensorFlow loads, nothing written.
_HALF_SET = {
    "slurm_no_step": (
        {"SLURM_PROCID": "1", "SLURM_NTASKS": "2"},
        "multi_worker_mirrored",
        r"error: This process is not a task of a SLURM job step \(a half-set SLURM environment\): SLURM_PROCID=1 is "
        r"set but not SLURM_STEP_ID, SLURM_STEP_NODELIST/SLURM_JOB_NODELIST/SLURM_NODELIST, "
        r"SLURM_STEP_TASKS_PER_NODE/SLURM_TASKS_PER_NODE, SLURM_JOB_ID; start every task with srun",
    ),
    "slurm_no_nodes": (
        {"SLURM_PROCID": "0", "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "3", "SLURM_JOB_ID": "7"},
        "parameter_server",
        r"error: This process is not a task of a SLURM job step \(a half-set SLURM environment\): SLURM_PROCID=0 is "
        r"set but not SLURM_STEP_NODELIST/SLURM_JOB_NODELIST/SLURM_NODELIST, SLURM_STEP_TASKS_PER_NODE"
        r"/SLURM_TASKS_PER_NODE;",
    ),
    "evaluator_alone": (
        {"TF_CONFIG": json.dumps({"cluster": {}, "task": {"type": "evaluator", "index": 0}})},
        "auto",
        r"error: TF_CONFIG names this task the evaluator, but its cluster has no chief or worker for it to follow "
        r"\(\{\}\)",
    ),
    "evaluator_of_nothing": (
        {"TF_CONFIG": json.dumps({"cluster": {"evaluator": ["e:1"]}, "task": {"type": "evaluator", "index": 0}})},
        "multi_worker_mirrored",
        r"error: TF_CONFIG names this task the evaluator, but its cluster has no chief or worker for it to follow",
    ),
}


def test_a_half_set_cluster_environment_is_one_error_line_and_writes_nothing(tmp_path):
  env = {
      name: value
      for name, value in paths.subprocess_environment().items()
      if not name.startswith("SLURM_") and name not in ("TF_CONFIG", "CLUSTER_SPEC")
  }
  processes = {
      case: subprocess.Popen(
          [sys.executable, "-m", "runner", "--config=configs/synthetic.py", f"--workdir={tmp_path / case}"]
          + [f"--config.strategy.name={strategy}", "--config.trainer.train_steps=2"],
          env={**env, **variables},
          cwd=paths.REPO,
          stderr=subprocess.PIPE,
          text=True,
      )
      for case, (variables, strategy, _) in _HALF_SET.items()
  }
  for case, process in processes.items():
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 2, (case, stderr[-3000:])
    assert len(stderr.splitlines()) == 1 and re.match(_HALF_SET[case][2], stderr), (case, stderr[-3000:])
  assert os.listdir(tmp_path) == []
