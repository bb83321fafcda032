"""Where a multi-process cluster comes from: TF_CONFIG, Vertex AI's CLUSTER_SPEC, a SLURM step, or a host list.

`find(source)` reads the environment once and decides this task's role
before anything of TensorFlow starts: `config.strategy.cluster` is 'auto'
(TF_CONFIG if set, else CLUSTER_SPEC, else a SLURM step of more than one
task, else this process alone), 'tf_config' (TF_CONFIG or CLUSTER_SPEC, one
of them must be set) or 'slurm' (the SLURM step's tasks, see
`strategies.slurm`). The result is a `Cluster`: the jobs that train
('chief', 'worker', 'ps'), this task's role, and a resolver for
TensorFlow. The conventions of the engines that set TF_CONFIG are accepted
as they are: a Kubernetes TFJob's 'master' is the chief, Vertex AI's worker
pools 0-3 are chief, worker, ps and evaluator, and an 'evaluator' task
(TFJob, Vertex, Estimator-style TF_CONFIG) is not part of the training
cluster: it evaluates the checkpoints (`config.mode='continuous_eval'`).
"""

from collections.abc import Mapping
import json
import os
from typing import Any, TYPE_CHECKING

from strategies import checks
from strategies import slurm
from strategies.cluster_view import ALONE
from strategies.cluster_view import Cluster
from strategies.cluster_view import EVALUATOR
from strategies.cluster_view import TRAINING_JOBS
from strategies.errors import ConfigError

if TYPE_CHECKING:  # Building a resolver imports TensorFlow; finding the cluster does not.
  import tensorflow as tf

__all__ = ["ALONE", "Cluster", "SOURCES", "find", "from_json", "from_worker_hosts", "names_an_evaluator"]

SOURCES = ("auto", "tf_config", "slurm")
# Job names of the engines -> ours.
_JOB_NAMES = {"chief": "chief", "master": "chief", "worker": "worker", "ps": "ps", EVALUATOR: EVALUATOR}
VERTEX_POOLS = {"workerpool0": "chief", "workerpool1": "worker", "workerpool2": "ps", "workerpool3": EVALUATOR}
_TF_CONFIG_EXAMPLE = '{"cluster": {"worker": ["host1:port", "host2:port"]}, "task": {"type": "worker", "index": 0}}'


def _json_variable(environ: Mapping[str, str]) -> str | None:
  """TF_CONFIG if set, else CLUSTER_SPEC (Vertex AI) if set, else None."""
  return next((name for name in ("TF_CONFIG", "CLUSTER_SPEC") if environ.get(name)), None)


def find(
    source: str = "auto",
    *,
    parameter_server: bool = False,
    num_ps: int | None = None,
    environ: Mapping[str, str] | None = None,
) -> Cluster:
  """Returns the cluster `source` names, read from the environment.

  Args:
    source: 'auto', 'tf_config' or 'slurm' (see the module docstring).
    parameter_server: whether the job is a parameter-server job (under SLURM
      its tasks are then a chief, `num_ps` ps tasks and workers).
    num_ps: under SLURM, how many tasks after the chief are ps tasks; default
      1 for a parameter-server job. TF_CONFIG names its ps tasks itself, so
      there it must be None.
    environ: the environment to read; default `os.environ`.

  Raises:
    ConfigError: an unknown source, TF_CONFIG or CLUSTER_SPEC that is not
      valid, 'tf_config' where neither is set, 'slurm' outside a SLURM step,
      a SLURM step too small for its roles, or `num_ps` where the cluster is
      not a SLURM step.
  """
  environ = os.environ if environ is None else environ
  checks.one_of(source, SOURCES, "config.strategy.cluster")
  checks.positive_int(num_ps, "config.strategy.num_ps", optional=True)
  variable = _json_variable(environ) if source != "slurm" else None
  if variable is None and source == "tf_config":
    raise ConfigError(
        f"config.strategy.cluster='tf_config' but neither TF_CONFIG nor CLUSTER_SPEC (Vertex AI) is set; set "
        f"TF_CONFIG on every task, e.g. {_TF_CONFIG_EXAMPLE}, or use cluster='auto' or 'slurm'."
    )
  if variable is None and (source == "slurm" or slurm.is_multi_task_step(environ)):
    return slurm.cluster(environ, num_ps=(num_ps or 1) if parameter_server else None)
  found = ALONE if variable is None else from_json(environ[variable], variable)
  if num_ps is not None:
    raise ConfigError(
        f"config.strategy.num_ps={num_ps} sets the ps tasks of a SLURM step, but the cluster comes from "
        f"{found.source if found is not ALONE else 'nowhere (this process alone)'}, which names its own; remove num_ps."
    )
  return found


def names_an_evaluator(environ: Mapping[str, str] | None = None) -> bool:
  """Whether TF_CONFIG (else CLUSTER_SPEC) names this task the evaluator; `find` reads and checks the rest."""
  environ = os.environ if environ is None else environ
  variable = _json_variable(environ)
  try:
    task_type = json.loads(environ[variable])["task"]["type"] if variable else None
  except (ValueError, KeyError, TypeError):
    return False
  return isinstance(task_type, str) and {**_JOB_NAMES, **VERTEX_POOLS}.get(task_type) == EVALUATOR


def from_json(text: str, variable: str = "TF_CONFIG") -> Cluster:
  """Returns the cluster of a TF_CONFIG (or Vertex AI CLUSTER_SPEC) JSON text.

  'master' (a Kubernetes TFJob's chief) becomes 'chief', Vertex's
  'workerpool0'-'workerpool3' become chief, worker, ps and evaluator, and an
  evaluator is left out of the training jobs. A TF_CONFIG with no cluster
  is this process alone, unless it names this task the evaluator.

  Raises:
    ConfigError: the text is not JSON with a "cluster" object, a job name
      is unknown, both 'chief' and 'master' are given, or the "task" is not
      one of the cluster's tasks, or it names this task the evaluator of a
      cluster with no chief or worker.
  """
  names = {**_JOB_NAMES, **VERTEX_POOLS} if variable == "CLUSTER_SPEC" else _JOB_NAMES
  try:
    parsed = json.loads(text)
    cluster, task = parsed.get("cluster", {}), parsed.get("task", {})
  except (ValueError, AttributeError):
    cluster = task = None
  if not isinstance(cluster, dict) or not isinstance(task, dict):
    raise ConfigError(f"{variable}={text!r} is not valid; it must be JSON such as {_TF_CONFIG_EXAMPLE}.")
  jobs: dict[str, tuple[str, ...]] = {}
  for job, tasks in cluster.items():
    if job not in names:
      raise ConfigError(
          f"{variable} names a job {job!r}, which is not one of {', '.join(names)}.{checks.did_you_mean(job, names)}"
      )
    if names[job] in jobs:
      raise ConfigError(f"{variable} names the chief twice ('chief' and 'master'); give one of them.")
    if not isinstance(tasks, list) or not all(isinstance(address, str) and address for address in tasks):
      raise ConfigError(f"{variable}'s job {job!r} must be a list of 'host:port' strings, got {tasks!r}.")
    jobs[names[job]] = tuple(tasks)
  task_type, task_id = names.get(str(task.get("type")), str(task.get("type"))), task.get("index", 0)
  if not any(jobs.get(job) for job in TRAINING_JOBS):
    if task_type == EVALUATOR:
      raise ConfigError(
          f"{variable} names this task the evaluator, but its cluster has no chief or worker for it to follow "
          f"({json.dumps(cluster)}); an evaluator evaluates the checkpoints of a training cluster: give the cluster's "
          f"chief and workers, or drop {variable} to train this process alone."
      )
    return ALONE
  if task_type not in jobs or not checks.is_int(task_id) or not 0 <= task_id < len(jobs[task_type]):
    tasks = ", ".join(f"{job}:0-{len(addresses) - 1}" for job, addresses in jobs.items())
    raise ConfigError(f"{variable}'s task {task!r} is not one of its cluster's tasks ({tasks}).")
  evaluators = jobs.pop(EVALUATOR, ())
  if task_type == EVALUATOR and len(evaluators) != 1:
    raise ConfigError(f"{variable} has {len(evaluators)} evaluator tasks; a cluster has at most one evaluator.")
  return Cluster(source=variable, jobs=jobs, task_type=task_type, task_id=task_id)


def from_worker_hosts(worker_hosts: Any, task_index: Any) -> "tf.distribute.cluster_resolver.SimpleClusterResolver":
  """Returns the cluster resolver for worker `task_index` of `worker_hosts`.

  This is what TF_CONFIG `{"cluster": {"worker": worker_hosts}, "task":
  {"type": "worker", "index": task_index}}` would give, without touching the
  environment.

  Raises:
    ConfigError: a host is not 'host:port', the index is missing or outside
      the list, or TF_CONFIG is set too (two cluster definitions).
  """
  example = ["localhost:12345", "localhost:12346"]
  if worker_hosts is None:
    raise ConfigError(f"task_index={task_index} needs worker_hosts, every worker's host:port, e.g. {example}.")
  hosts = checks.strings(worker_hosts, "worker_hosts", example)
  for host in hosts:
    if not host.rpartition(":")[2].isdigit():
      raise ConfigError(f"worker_hosts entry {host!r} is not 'host:port', e.g. 'localhost:12345'.")
  if task_index is None:
    raise ConfigError(f"worker_hosts needs task_index, this worker's position in it: 0 to {len(hosts) - 1}.")
  if not checks.is_int(task_index) or not 0 <= task_index < len(hosts):
    raise ConfigError(
        f"task_index={task_index!r} is outside worker_hosts ({', '.join(hosts)}); valid: 0 to {len(hosts) - 1}."
    )
  if os.environ.get("TF_CONFIG"):
    raise ConfigError("Both TF_CONFIG and worker_hosts define the cluster; unset TF_CONFIG or drop worker_hosts.")
  return Cluster(
      source="worker_hosts", jobs={"worker": tuple(hosts)}, task_type="worker", task_id=task_index
  ).resolver()
