"""A multi-process job as one task sees it: the jobs that train, this task's role, and TensorFlow's resolver for it.

`strategies.cluster.find` builds one from TF_CONFIG, Vertex AI's
CLUSTER_SPEC or a SLURM step (`strategies.slurm`); nothing here reads the
environment or starts TensorFlow until `resolver` or `use_own_gpu` is called.
"""

from collections.abc import Mapping
import dataclasses
from typing import TYPE_CHECKING

from strategies.errors import ConfigError

if TYPE_CHECKING:  # Building a resolver imports TensorFlow; describing the cluster does not.
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
