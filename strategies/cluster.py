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
Nothing here starts TensorFlow until `Cluster.resolver` or `use_own_gpu` is
called.
"""

from collections.abc import Mapping
import dataclasses
import json
import os
from typing import Any, TYPE_CHECKING

from strategies import checks
from strategies import slurm
from strategies.errors import ConfigError

if TYPE_CHECKING:  # Building a resolver imports TensorFlow; finding the cluster does not.
  import tensorflow as tf

TRAINING_JOBS = ("chief", "worker", "ps")
EVALUATOR = "evaluator"
_TASK_NOUNS = {"chief": "chief", "worker": "worker", "ps": "ps task"}


@dataclasses.dataclass(frozen=True)
class Cluster:
  """A multi-process job as one task sees it; every role is decided, nothing of TensorFlow is started.

  Attributes:
    source: where it was found: 'TF_CONFIG', 'CLUSTER_SPEC' (Vertex AI),
      'SLURM', 'worker_hosts', or 'none' (this process alone).
    jobs: the jobs that train, 'chief', 'worker' and 'ps', each the tasks'
      'host:port' in index order; an evaluator is not among them. Empty when
      alone.
    task_type: this task's role, 'chief', 'worker', 'ps' or 'evaluator';
      None when alone.
    task_id: its index among the tasks of its type; None when alone.
    detail: words on the source for `describe`, e.g. 'job 12, step 0'.
    gpu_index: on a GPU node under SLURM, the one local GPU this task uses
      (one task per GPU); None: every GPU this process sees.
  """

  source: str
  jobs: Mapping[str, tuple[str, ...]]
  task_type: str | None
  task_id: int | None
  detail: str = ""
  gpu_index: int | None = None

  @property
  def is_evaluator(self) -> bool:
    """Whether this task is the evaluator beside the training cluster."""
    return self.task_type == EVALUATOR

  def resolver(self) -> "tf.distribute.cluster_resolver.SimpleClusterResolver":
    """Returns TensorFlow's resolver for the training jobs and this task (for an evaluator: no cluster)."""
    import tensorflow as tf  # noqa: PLC0415  # Only here: finding the cluster imports no TensorFlow.

    jobs = {} if self.is_evaluator else {job: list(tasks) for job, tasks in self.jobs.items() if tasks}
    gpus = 1 if self.gpu_index is not None else len(tf.config.list_physical_devices("GPU"))
    return tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(jobs),
        task_type=None if self.is_evaluator else self.task_type,
        task_id=None if self.is_evaluator else self.task_id,
        rpc_layer="grpc",
        num_accelerators={"GPU": gpus} if gpus else None,
    )

  def describe(self) -> str:
    """One line: where the cluster came from and this task's role in it."""
    if self.source == "none":
      return "cluster: none (no TF_CONFIG, CLUSTER_SPEC or SLURM step of more than one task): this process alone"
    sizes = ", ".join(
        f"{len(tasks)} {_TASK_NOUNS[job]}{'' if len(tasks) == 1 else 's'}" for job, tasks in self.jobs.items() if tasks
    )
    found = f"cluster from {self.source}" + (f" ({self.detail})" if self.detail else "")
    if self.is_evaluator:
      return f"{found}: {sizes}; this task is the evaluator (it trains nothing and evaluates every new checkpoint)"
    me = self.jobs[self.task_type][self.task_id] if self.task_type is not None and self.task_id is not None else "?"
    return f"{found}: {sizes}; this task is {self.task_type}:{self.task_id} at {me}"


ALONE = Cluster(source="none", jobs={}, task_type=None, task_id=None)


def use_own_gpu(found: Cluster) -> None:
  """Makes the GPU `found.gpu_index` the only one TensorFlow uses, when it names one (one task per GPU).

  Raises:
    ConfigError: this process sees no GPU of that index, or TensorFlow's
      devices are already initialized.
  """
  if found.gpu_index is None:
    return
  import tensorflow as tf  # noqa: PLC0415

  gpus = tf.config.list_physical_devices("GPU")
  try:  # IndexError: no such GPU; RuntimeError: TensorFlow already initialized its devices.
    tf.config.set_visible_devices(gpus[found.gpu_index], "GPU")
  except (IndexError, RuntimeError) as e:
    raise ConfigError(
        f"This task should use only GPU {found.gpu_index} of its node ({found.describe()}); it sees {len(gpus)} GPUs "
        f"({e}). Create the strategy before anything else runs on TensorFlow."
    ) from None


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
    environ: Mapping[str, str] = os.environ,
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
  checks.one_of(source, SOURCES, "config.strategy.cluster")
  checks.positive_int(num_ps, "config.strategy.num_ps", optional=True)
  variable = _json_variable(environ) if source != "slurm" else None
  if variable is None and source == "tf_config":
    raise ConfigError(
        f"config.strategy.cluster='tf_config' but neither TF_CONFIG nor CLUSTER_SPEC (Vertex AI) is set; set "
        f"TF_CONFIG on every task, e.g. {_TF_CONFIG_EXAMPLE}, or use cluster='auto' or 'slurm'."
    )
  if variable is None and (source == "slurm" or slurm.is_multi_task_step(environ)):
    return Cluster("SLURM", *slurm.read(environ, num_ps=(num_ps or 1) if parameter_server else None))
  found = ALONE if variable is None else from_json(environ[variable], variable)
  if num_ps is not None:
    raise ConfigError(
        f"config.strategy.num_ps={num_ps} sets the ps tasks of a SLURM step, but the cluster comes from "
        f"{found.source if found is not ALONE else 'nowhere (this process alone)'}, which names its own; remove num_ps."
    )
  return found


def names_an_evaluator(environ: Mapping[str, str] = os.environ) -> bool:
  """Whether TF_CONFIG (else CLUSTER_SPEC) names this task the evaluator; `find` reads and checks the rest."""
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
