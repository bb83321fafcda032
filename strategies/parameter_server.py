"""Asynchronous training with parameter servers: ParameterServerStrategy."""

import tensorflow as tf

from strategies import checks
from strategies import cluster
from strategies.errors import ConfigError

# TensorFlow's recommended shard size for MinSizePartitioner.
DEFAULT_MIN_SHARD_BYTES = 256 << 10


class ParameterServerStrategy(tf.distribute.experimental.ParameterServerStrategy):
  """`tf.distribute.experimental.ParameterServerStrategy` with variables sharded over the ps tasks.

  Create it on the coordinator (the `chief` task); workers and parameter
  servers run a `tf.distribute.Server`. Variables are split by
  `MinSizePartitioner(min_shard_bytes, max_shards=<number of ps tasks>)`.
  Creating it connects this process to the cluster (TensorFlow's global eager
  context), so do it once per process and drive steps with a
  `tf.distribute.experimental.coordinator.ClusterCoordinator`.
  """

  def __init__(self, *, min_shard_bytes=None, cluster_resolver=None):
    """Builds the strategy; every argument is checked first.

    Args:
      min_shard_bytes: the smallest variable shard, in bytes; by default
        256 KiB, TensorFlow's recommendation.
      cluster_resolver: a `tf.distribute.cluster_resolver.ClusterResolver`;
        by default the cluster in `TF_CONFIG`.

    Raises:
      ConfigError: `min_shard_bytes` is not a positive int, the cluster has
        no `ps` or no `worker` job, or this process is a worker or ps task.
    """
    min_shard_bytes = checks.positive_int(min_shard_bytes, "min_shard_bytes", optional=True)
    resolver = cluster_resolver or cluster.from_tf_config()
    jobs = resolver.cluster_spec().as_dict()
    for job in ("ps", "worker"):
      if not jobs.get(job):
        source = "the cluster_resolver" if cluster_resolver else "TF_CONFIG"
        raise ConfigError(
            f"parameter_server needs a {job!r} job in {source}'s cluster, which has "
            f"{', '.join(sorted(jobs)) or 'no jobs'}. Example TF_CONFIG: "
            '{"cluster": {"chief": ["host0:2222"], "worker": ["host1:2222", "host2:2222"], '
            '"ps": ["host3:2222"]}, "task": {"type": "chief", "index": 0}}.')
    if resolver.task_type in ("worker", "ps"):
      raise ConfigError(
          f"This process is task {resolver.task_type}:{resolver.task_id} of a parameter-server cluster; only the "
          "coordinator (task type 'chief') creates the parameter_server strategy. Workers and ps tasks run "
          "tf.distribute.Server(cluster_spec, job_name=..., task_index=..., protocol='grpc').join().")
    partitioner = tf.distribute.experimental.partitioners.MinSizePartitioner(
        min_shard_bytes=min_shard_bytes or DEFAULT_MIN_SHARD_BYTES, max_shards=len(jobs["ps"]))
    super().__init__(resolver, variable_partitioner=partitioner)
    self._resolver = resolver

  @property
  def cluster_resolver(self):
    """The cluster resolver of this strategy (TensorFlow's class returns None)."""
    return self._resolver
