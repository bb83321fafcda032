"""This task's part in a job, decided from `config.strategy` and the environment before TensorFlow opens a server.

A task trains (the chief or a worker of `multi_worker_mirrored`, the chief
of `parameter_server`, or a process alone), serves (a worker or ps task of a
parameter-server cluster: `runner.cluster.task_server`), or evaluates (the
`evaluator` task of a TFJob, Vertex AI or TF_CONFIG cluster: it runs
`continuous_eval` beside the training cluster and is not one of its workers).
"""

from typing import Any

from strategies import cluster as cluster_lib

CLUSTER_STRATEGIES = ("multi_worker_mirrored", "parameter_server")
TRAIN, SERVE, EVALUATE = "train", "serve", "evaluate"


def cluster_of(config: Any) -> cluster_lib.Cluster:
  """Returns the cluster `config.strategy` reads (`strategies.cluster.find`).

  The one-process strategies and `worker_hosts` read none (alone), except
  that a TF_CONFIG or CLUSTER_SPEC naming this task the evaluator makes it
  the evaluator under every strategy.

  Raises:
    ConfigError: the environment's cluster is not valid (see `find`), e.g. an
      evaluator with no chief or worker to follow.
  """
  strategy = config.strategy
  if strategy.name not in CLUSTER_STRATEGIES or strategy.get("worker_hosts") is not None:
    return cluster_lib.find("tf_config") if cluster_lib.names_an_evaluator() else cluster_lib.ALONE
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
