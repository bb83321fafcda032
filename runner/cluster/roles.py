"""This task's part in a job, decided from `config.strategy` and the environment before TensorFlow opens a server.

A task trains (the chief or a worker of `multi_worker_mirrored`, the chief
of `parameter_server`, or a process alone), serves (a worker or ps task of a
parameter-server cluster: `runner.cluster.task_server`), or evaluates (the
`evaluator` task of a TFJob, Vertex AI or TF_CONFIG cluster: it runs
`continuous_eval` beside the training cluster and is not one of its workers).
"""

import os
from typing import Any

from strategies import cluster as cluster_lib
from strategies.errors import ConfigError

CLUSTER_STRATEGIES = ("multi_worker_mirrored", "parameter_server")
TRAIN, SERVE, EVALUATE = "train", "serve", "evaluate"


def cluster_of(config: Any) -> cluster_lib.Cluster:
  """Returns the cluster `config.strategy` reads (`strategies.cluster.find`).

  A cluster strategy given `worker_hosts` reads none here. A one-process
  strategy trains this process alone: a TF_CONFIG or CLUSTER_SPEC naming
  this task the evaluator makes it the evaluator, one naming a cluster of
  several training tasks is refused (each would train alone).

  Raises:
    ConfigError: the environment's cluster is not valid (see `find`), e.g. an
      evaluator with no chief or worker to follow, or it has several
      training tasks under a one-process strategy.
  """
  strategy = config.strategy
  if strategy.name not in CLUSTER_STRATEGIES:
    if not any(os.environ.get(name) for name in ("TF_CONFIG", "CLUSTER_SPEC")):
      return cluster_lib.ALONE
    found = cluster_lib.find("tf_config")
    tasks = sum(len(addresses) for addresses in found.jobs.values())
    if not found.is_evaluator and tasks > 1:
      raise ConfigError(
          f"{found.source} names a cluster of {tasks} training tasks ({found.describe()}), but "
          f"config.strategy.name={strategy.name!r} trains one process alone, so each task would train by itself: "
          f"set config.strategy.name='multi_worker_mirrored' (or 'parameter_server' for a cluster with ps tasks), "
          f"or unset {found.source}."
      )
    return found if found.is_evaluator else cluster_lib.ALONE
  if strategy.get("worker_hosts") is not None:
    return cluster_lib.ALONE
  parameter_server = strategy.name == "parameter_server"
  return cluster_lib.find(
      strategy.cluster, parameter_server=parameter_server, num_ps=strategy.num_ps if parameter_server else None
  )


def role(config: Any) -> tuple[str, cluster_lib.Cluster]:
  """Returns this task's part, `TRAIN`, `SERVE` or `EVALUATE`, and the cluster it was decided from."""
  found = cluster_of(config)
  if found.is_evaluator:
    return EVALUATE, found
  if config.strategy.name == "parameter_server" and found.jobs.get("ps") and found.task_type in ("worker", "ps"):
    return SERVE, found
  return TRAIN, found
