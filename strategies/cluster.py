"""Where a multi-process cluster comes from: TF_CONFIG or a list of worker hosts."""

import json
import os

import tensorflow as tf

from strategies import checks
from strategies.errors import ConfigError


def from_tf_config() -> tf.distribute.cluster_resolver.TFConfigClusterResolver:
  """Returns a TFConfigClusterResolver for the `TF_CONFIG` environment variable.

  Raises:
    ConfigError: TF_CONFIG is set but is not JSON with a "cluster" object.
  """
  text = os.environ.get("TF_CONFIG")
  if text:
    try:
      cluster = json.loads(text).get("cluster", {})
    except (ValueError, AttributeError):
      cluster = None
    if not isinstance(cluster, dict):
      raise ConfigError(
          f"TF_CONFIG={text!r} is not valid; it must be JSON such as "
          '{"cluster": {"worker": ["host1:port", "host2:port"]}, "task": {"type": "worker", "index": 0}}.'
      )
  return tf.distribute.cluster_resolver.TFConfigClusterResolver()


def from_worker_hosts(
    worker_hosts: list[str] | tuple[str, ...] | None, task_index: int | None
) -> tf.distribute.cluster_resolver.SimpleClusterResolver:
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
    _, _, port = host.rpartition(":")
    if not port.isdigit():
      raise ConfigError(f"worker_hosts entry {host!r} is not 'host:port', e.g. 'localhost:12345'.")
  if task_index is None:
    raise ConfigError(f"worker_hosts needs task_index, this worker's position in it: 0 to {len(hosts) - 1}.")
  if not checks.is_int(task_index) or not 0 <= task_index < len(hosts):
    raise ConfigError(
        f"task_index={task_index!r} is outside worker_hosts ({len(hosts)} hosts: {', '.join(hosts)}); "
        f"valid: 0 to {len(hosts) - 1}."
    )
  if os.environ.get("TF_CONFIG"):
    raise ConfigError(
        "Both TF_CONFIG and worker_hosts define the cluster; unset TF_CONFIG or drop worker_hosts/task_index."
    )
  gpus = len(tf.config.list_physical_devices("GPU"))
  return tf.distribute.cluster_resolver.SimpleClusterResolver(
      tf.train.ClusterSpec({"worker": hosts}),
      task_type="worker",
      task_id=task_index,
      rpc_layer="grpc",
      num_accelerators={"GPU": gpus} if gpus else None,
  )
