"""Synchronous data parallelism across workers: MultiWorkerMirroredStrategy."""

import os

from absl import logging
import tensorflow as tf

from strategies import checks
from strategies import cluster
from strategies.errors import ConfigError

COMMUNICATIONS = {
    "auto": tf.distribute.experimental.CommunicationImplementation.AUTO,
    "ring": tf.distribute.experimental.CommunicationImplementation.RING,
    "nccl": tf.distribute.experimental.CommunicationImplementation.NCCL,
}


class MultiWorkerMirroredStrategy(tf.distribute.MultiWorkerMirroredStrategy):
  """`tf.distribute.MultiWorkerMirroredStrategy` from TF_CONFIG or from a host list.

  The cluster comes from exactly one of: `cluster_resolver`, `worker_hosts`
  with `task_index`, or the `TF_CONFIG` environment variable. Without any of
  them the strategy runs as a single worker on this machine, as TensorFlow
  does. `os.environ` is never written.
  """

  def __init__(self, *, communication="auto", timeout_seconds=None, worker_hosts=None,
               task_index=None, cluster_resolver=None):
    """Builds the strategy; every argument is checked first.

    Args:
      communication: collective implementation, 'auto', 'ring' or 'nccl' (GPUs).
      timeout_seconds: abort a collective that takes longer than this; None
        waits forever.
      worker_hosts: every worker's 'host:port', the same list on all workers.
      task_index: this worker's index in `worker_hosts`.
      cluster_resolver: a `tf.distribute.cluster_resolver.ClusterResolver`.

    Raises:
      ConfigError: an unknown communication, a bad timeout, a host list
        without an index (or the reverse), an index outside the list, two
        cluster sources at once, or 'nccl' on a machine without GPUs.
    """
    implementation = COMMUNICATIONS[checks.one_of(communication, tuple(COMMUNICATIONS), "communication")]
    if communication == "nccl" and not tf.config.list_physical_devices("GPU"):
      raise ConfigError("communication='nccl' needs GPUs and this machine has none; use 'auto' or 'ring'.")
    checks.positive_number(timeout_seconds, "timeout_seconds", optional=True)
    if worker_hosts is not None or task_index is not None:
      if cluster_resolver is not None:
        raise ConfigError("Pass either cluster_resolver or worker_hosts + task_index, not both.")
      cluster_resolver = cluster.from_worker_hosts(worker_hosts, task_index)
    elif cluster_resolver is None:
      if not os.environ.get("TF_CONFIG"):
        logging.info("multi_worker_mirrored: no TF_CONFIG and no worker_hosts, so this is a single worker.")
      cluster_resolver = cluster.from_tf_config()
    super().__init__(
        cluster_resolver=cluster_resolver,
        communication_options=tf.distribute.experimental.CommunicationOptions(
            timeout_seconds=timeout_seconds, implementation=implementation))

