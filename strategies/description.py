"""One line about a strategy: its kind, replica count and devices."""

import tensorflow as tf

from strategies import local

_KINDS = (
    (local.DefaultStrategy, "default"),
    (tf.distribute.TPUStrategy, "tpu"),
    (tf.distribute.MultiWorkerMirroredStrategy, "multi_worker_mirrored"),
    (tf.distribute.experimental.ParameterServerStrategy, "parameter_server"),
    (tf.distribute.MirroredStrategy, "mirrored"),
    (tf.distribute.OneDeviceStrategy, "one_device"),
)


def kind(strategy: tf.distribute.Strategy) -> str:
  """Returns the `strategies.names()` name of `strategy`'s class, or its class name."""
  return next((name for cls, name in _KINDS if isinstance(strategy, cls)), type(strategy).__name__)


def is_single_worker(strategy: tf.distribute.Strategy) -> bool:
  """Whether this process runs every replica of `strategy` (no other worker takes part)."""
  try:
    return len(strategy.extended.worker_devices) == strategy.num_replicas_in_sync
  except RuntimeError:  # The default strategy lists no worker devices: it is this process alone.
    return True


def describe(strategy: tf.distribute.Strategy) -> str:
  """Returns one line, e.g. 'mirrored: 2 replicas on CPU:0, CPU:1'.

  Args:
    strategy: any `tf.distribute.Strategy`.
  """
  name = kind(strategy)
  if name == "default":
    return "default: 1 replica on the current device (no distribution)"
  if name == "parameter_server":
    if strategy.cluster_resolver is None:  # TensorFlow's own class does not keep it.
      return "parameter_server"
    jobs = strategy.cluster_resolver.cluster_spec().as_dict()
    workers, ps = len(jobs.get("worker", ())), len(jobs.get("ps", ()))
    return f"parameter_server: {_count(workers, 'worker')}, {_count(ps, 'parameter server')}"
  replicas = _count(strategy.num_replicas_in_sync, "replica")
  devices = ", ".join(local.short_name(d) or d for d in strategy.extended.worker_devices)
  if name == "tpu":
    tpu = getattr(strategy, "tpu", None)
    return f"tpu: {replicas}" + (f" on tpu={tpu!r}" if tpu else "")
  if name == "multi_worker_mirrored":
    resolver = strategy.cluster_resolver
    jobs = resolver.cluster_spec().as_dict()
    workers = len(jobs.get("chief", ())) + len(jobs.get("worker", ()))
    if workers > 1:
      return (
          f"multi_worker_mirrored: {replicas} on {workers} workers; this is "
          f"{resolver.task_type}:{resolver.task_id} on {', '.join(strategy.extended.worker_devices)}"
      )
  return f"{name}: {replicas} on {devices}"


def _count(n: int, noun: str) -> str:
  return f"{n} {noun}{'' if n == 1 else 's'}"
