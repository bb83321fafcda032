"""Synchronous data parallelism across workers: MultiWorkerMirroredStrategy."""

import functools
import os

from absl import logging
import tensorflow as tf

from strategies import checks
from strategies import cluster
from strategies import peers
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

  Joining the cluster cannot hang (see `strategies.peers`): it waits at most
  `timeout_seconds` for every worker, and SIGTERM or Ctrl-C end a worker
  that is waiting.
  """

  def __init__(
      self,
      *,
      communication: str = "auto",
      timeout_seconds: float | None = peers.DEFAULT_TIMEOUT_SECONDS,
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
      worker_hosts: every worker's 'host:port', the same list on all workers.
      task_index: this worker's index in `worker_hosts`.
      cluster_resolver: a `tf.distribute.cluster_resolver.ClusterResolver`.

    Raises:
      ClusterError: a worker did not join within `timeout_seconds` (the
        message names it).
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
