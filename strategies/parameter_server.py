"""Asynchronous training with parameter servers: ParameterServerStrategy."""

from absl import logging
import tensorflow as tf

from strategies import checks
from strategies import cluster as cluster_lib
from strategies import peers
from strategies import sharded_variables
from strategies.errors import ConfigError

# TensorFlow's recommended shard size for MinSizePartitioner.
DEFAULT_MIN_SHARD_BYTES = 256 << 10
_EXAMPLE = '{"cluster": {"chief": ["h0:2222"], "worker": ["h1:2222"], "ps": ["h2:2222"]}, "task": {"type": "chief"}}'


class ParameterServerStrategy(sharded_variables.KerasShardedVariables):
  """`tf.distribute.experimental.ParameterServerStrategy` with variables sharded over the ps tasks.

  Create it on the coordinator (the `chief` task); workers and parameter
  servers run a `tf.distribute.Server` (`python -m runner` does, on those
  tasks). Variables are split by `MinSizePartitioner(min_shard_bytes,
  max_shards=<number of ps tasks>)`, and Keras 3 models train with sharded
  variables (see `sharded_variables`). Creating it first waits, at most
  `timeout_seconds`, until every worker and ps task accepts connections (the
  tasks may start in any order; TensorFlow itself would wait forever), then
  connects this process to the cluster (TensorFlow's global eager context),
  so do it once per process and drive steps with a
  `tf.distribute.experimental.coordinator.ClusterCoordinator`.
  """

  def __init__(
      self,
      *,
      min_shard_bytes: int | None = None,
      timeout_seconds: float | None = peers.DEFAULT_TIMEOUT_SECONDS,
      cluster: str = "auto",
      num_ps: int | None = None,
      cluster_resolver: tf.distribute.cluster_resolver.ClusterResolver | None = None,
  ) -> None:
    """Builds the strategy; every argument is checked first.

    Args:
      min_shard_bytes: the smallest variable shard, in bytes; by default
        256 KiB, TensorFlow's recommendation.
      timeout_seconds: the longest wait for every worker and ps task to
        accept connections; default 300 (5 minutes). None waits forever.
      cluster: where the cluster comes from without `cluster_resolver`:
        'auto', 'tf_config' or 'slurm' (see `strategies.cluster`).
      num_ps: under SLURM, how many tasks after the chief (task 0) are ps
        tasks; the rest are workers. Default 1.
      cluster_resolver: a `tf.distribute.cluster_resolver.ClusterResolver`;
        by default the cluster `cluster` finds.

    Raises:
      ConfigError: `min_shard_bytes` or `timeout_seconds` is invalid, the
        cluster has no `ps` or no `worker` job, or this process is a worker
        or ps task.
      ClusterError: a worker or ps task did not come within
        `timeout_seconds` (the message names it).
    """
    min_shard_bytes = checks.positive_int(min_shard_bytes, "min_shard_bytes", optional=True)
    checks.positive_number(timeout_seconds, "timeout_seconds", optional=True)
    if cluster_resolver is not None and (cluster != "auto" or num_ps is not None):
      raise ConfigError(
          "cluster_resolver gives the cluster; drop cluster and num_ps, which find it in the environment."
      )
    if cluster_resolver is None:
      found = cluster_lib.find(cluster, num_ps=num_ps, parameter_server=True)
      logging.info("parameter_server: %s.", found.describe())
    resolver = cluster_resolver or found.resolver()
    jobs = resolver.cluster_spec().as_dict()
    for job in ("ps", "worker"):
      if not jobs.get(job):
        source = "the cluster_resolver's cluster" if cluster_resolver else f"the cluster ({found.describe()})"
        raise ConfigError(
            f"parameter_server needs a {job!r} job in {source}, which has {', '.join(sorted(jobs)) or 'no jobs'}. "
            f"Example TF_CONFIG: {_EXAMPLE}."
        )
    if resolver.task_type in ("worker", "ps"):
      raise ConfigError(
          f"This process is task {resolver.task_type}:{resolver.task_id} of a parameter-server cluster; only the "
          "coordinator (task type 'chief') creates the strategy; workers and ps tasks run a tf.distribute.Server."
      )
    if timeout_seconds is not None and resolver.task_type is not None:
      peers.rendezvous(resolver.cluster_spec(), resolver.task_type, resolver.task_id, timeout_seconds)
    partitioner = tf.distribute.experimental.partitioners.MinSizePartitioner(
        min_shard_bytes=min_shard_bytes or DEFAULT_MIN_SHARD_BYTES, max_shards=len(jobs["ps"])
    )
    super().__init__(resolver, variable_partitioner=partitioner)
    sharded_variables.enable(self)
    self._resolver = resolver

  @property
  def cluster_resolver(self) -> tf.distribute.cluster_resolver.ClusterResolver:
    """The cluster resolver of this strategy (TensorFlow's class returns None)."""
    return self._resolver
