"""Synchronous data parallelism across workers: MultiWorkerMirroredStrategy."""

import functools

from absl import logging
import tensorflow as tf

from strategies import checks
from strategies import cluster as cluster_lib
from strategies import peers
from strategies.errors import ConfigError

COMMUNICATIONS = ("auto", "ring", "nccl")  # tf.distribute.experimental.CommunicationImplementation's, lower case.


class MultiWorkerMirroredStrategy(tf.distribute.MultiWorkerMirroredStrategy):
  """`tf.distribute.MultiWorkerMirroredStrategy` from TF_CONFIG, Vertex AI, a SLURM step, or a host list.

  The cluster comes from exactly one of: `cluster_resolver`, `worker_hosts`
  with `task_index`, or the environment as `cluster` says
  (`strategies.cluster.find`: TF_CONFIG, CLUSTER_SPEC, a SLURM step). Without
  any of them the strategy runs as a single worker on this machine, as
  TensorFlow does. `os.environ` is never written; under SLURM on a GPU node
  this task sees only its own GPU (`tf.config.set_visible_devices`).

  Joining the cluster cannot hang (see `strategies.peers`): it waits at most
  `timeout_seconds` for every worker, and SIGTERM or Ctrl-C end a worker
  that is waiting.
  """

  def __init__(
      self,
      *,
      communication: str = "auto",
      timeout_seconds: float | None = peers.DEFAULT_TIMEOUT_SECONDS,
      cluster: str = "auto",
      worker_hosts: list[str] | tuple[str, ...] | None = None,
      task_index: int | None = None,
      cluster_resolver: tf.distribute.cluster_resolver.ClusterResolver | None = None,
  ) -> None:
    """Builds the strategy; every argument is checked first.

    Args:
      communication: collective implementation, 'auto', 'ring' or 'nccl' (GPUs).
      timeout_seconds: the longest wait for the other workers to join at
        start-up; default 300 (5 minutes). None keeps TensorFlow's own
        behaviour: wait forever. A peer that dies later is found by the
        coordination service's heartbeats within about 10 s. (It is not
        passed on as TensorFlow's collective timeout: that starts a
        sleeping thread per collective, and at hundreds of steps per
        second the threads pile up until the process cannot start more.)
      cluster: where the cluster comes from when neither `worker_hosts` nor
        `cluster_resolver` gives it: 'auto', 'tf_config' or 'slurm' (see
        `strategies.cluster`).
      worker_hosts: every worker's 'host:port', the same list on all workers.
      task_index: this worker's index in `worker_hosts`.
      cluster_resolver: a `tf.distribute.cluster_resolver.ClusterResolver`.

    Raises:
      ClusterError: a worker did not join within `timeout_seconds` (the
        message names it).
      ConfigError: an unknown communication, a bad timeout, a host list
        without an index (or the reverse), an index outside the list, two
        cluster sources at once, a TF_CONFIG, CLUSTER_SPEC or SLURM step that
        is not valid, or 'nccl' on a machine without GPUs.
    """
    checks.one_of(communication, COMMUNICATIONS, "communication")
    if communication == "nccl" and not tf.config.list_physical_devices("GPU"):
      raise ConfigError("communication='nccl' needs GPUs and this machine has none; use 'auto' or 'ring'.")
    checks.positive_number(timeout_seconds, "timeout_seconds", optional=True)
    checks.one_of(cluster, cluster_lib.SOURCES, "cluster")
    by_hand = worker_hosts is not None or task_index is not None
    if by_hand and cluster_resolver is not None:
      raise ConfigError("Pass either cluster_resolver or worker_hosts + task_index, not both.")
    if cluster != "auto" and (by_hand or cluster_resolver is not None):
      given = "worker_hosts + task_index" if by_hand else "cluster_resolver"
      raise ConfigError(
          f"cluster={cluster!r} reads the cluster from the environment, and {given} gives it too; give one."
      )
    if by_hand:
      cluster_resolver = cluster_lib.from_worker_hosts(worker_hosts, task_index)
    elif cluster_resolver is None:
      found = cluster_lib.find(cluster)
      logging.info("multi_worker_mirrored: %s.", found.describe())
      if found.jobs.get("ps"):
        raise ConfigError(
            f"multi_worker_mirrored found a cluster with 'ps' tasks ({found.describe()}); a ps job is for "
            "parameter_server: set config.strategy.name='parameter_server', or remove the ps tasks."
        )
      cluster_lib.use_own_gpu(found)
      cluster_resolver = found.resolver()
    implementation = tf.distribute.experimental.CommunicationImplementation[communication.upper()]
    options = tf.distribute.experimental.CommunicationOptions(implementation=implementation)
    build = functools.partial(super().__init__, cluster_resolver=cluster_resolver, communication_options=options)
    cluster_spec = cluster_resolver.cluster_spec()
    if timeout_seconds is None or not cluster_spec.jobs:
      build()  # A single worker has no peer to wait for; None waits as TensorFlow does.
    else:
      peers.join(
          build,
          cluster_spec=cluster_spec,
          task_type=cluster_resolver.task_type,
          task_id=cluster_resolver.task_id,
          timeout_seconds=timeout_seconds,
      )
