"""Every use of TensorFlow's private API in the project, each with what it works around.

The only module of `strategies/` and `runner/` that reads `tensorflow.python` or a private attribute
(`obj._name`) of a TensorFlow object (Keras's are in `runner/keras_workarounds.py`). Each function says which
TensorFlow behaviour it works around and the version it was checked against (`CHECKED_WITH`);
`tests/project/test_workarounds.py` runs each one against the installed TensorFlow and fails loudly when
that behaviour changes.
"""

import atexit
import sys
from typing import Any

import tensorflow as tf
from tensorflow.python.eager import context  # noqa: TID251

CHECKED_WITH = "tensorflow 2.21.0"

# --- strategies ---


def configure_coordination_service(cluster_spec: tf.train.ClusterSpec, timeout_seconds: float) -> None:
  """Configures TensorFlow's coordination service as MultiWorkerMirroredStrategy would, plus a registration deadline.

  Works around: `tf.distribute.MultiWorkerMirroredStrategy` starts the coordination service with no
  deadline for the tasks to register, and TensorFlow has no public API to set one. The eager context's
  `configure_coordination_service` (`tensorflow.python.eager.context`) takes
  `cluster_register_timeout_in_ms`, and the config it keeps (`coordination_service`, a
  `CoordinationServiceConfig` proto) takes `cluster_register_with_barrier`, which makes that deadline
  hold for every task, and the coordinated jobs (chief and worker, as the strategy names them). Left
  alone if the process configured a service already (the strategy then uses that one, as TensorFlow
  does). Checked with `CHECKED_WITH`.
  """
  if context.context().coordination_service is not None:
    return
  leader = "chief" if "chief" in cluster_spec.jobs else "worker"
  context.context().configure_coordination_service(
      service_type="standalone",
      service_leader=f"/job:{leader}/replica:0/task:0",
      cluster_register_timeout_in_ms=int(timeout_seconds * 1000),
  )
  config = context.context().coordination_service
  config.cluster_register_with_barrier = True
  for job in ("chief", "worker"):
    if job in cluster_spec.jobs:
      config.coordinated_job_list.add(name=job, num_tasks=cluster_spec.num_tasks(job))


class WholeShardedVariable(tf.__internal__.distribute.ShardedVariable):
  """A `ShardedVariable` saved and restored as one whole tensor.

  Works around: TensorFlow saves each shard of a `ShardedVariable` as a slice of the whole, and a
  Keras 3 variable asks its value for its tensors through the private checkpoint protocol
  (`_serialize_to_tensors`, `_restore_from_tensors`), which TensorFlow's class does not implement.
  This class gives the concatenated value under the key an unsharded variable uses, so a checkpoint
  has the same names and shapes with or without sharding, and restores into any number of shards.
  Checked with `CHECKED_WITH`.
  """

  def _serialize_to_tensors(self) -> dict[str, tf.Tensor]:
    return {"VARIABLE_VALUE": tf.convert_to_tensor(self)}

  def _restore_from_tensors(self, restored_tensors: dict[str, tf.Tensor]) -> Any:
    return self.assign(restored_tensors["VARIABLE_VALUE"])


def called_function_graph(graph: tf.Graph, name: str) -> tf.Graph | None:
  """Returns the graph of the function `name` that an op of `graph` calls, or None when it has none.

  Works around: a `tf.Graph` has no public lookup of the functions its ops call (an XLA cluster, a loop's
  body and condition, a branch); the private `Graph._get_function(name)` finds them. Checked with
  `CHECKED_WITH`.
  """
  return getattr(graph._get_function(name), "graph", None)  # noqa: SLF001


# --- outputs ---


def end_async_checkpoint_writer(checkpoint: Any) -> None:
  """Waits for the asynchronous write of `checkpoint` (a `tf.train.Checkpoint`) in flight, then ends its writer.

  Works around TensorFlow 2.21 (`CHECKED_WITH`): the writer that
  `tf.train.CheckpointOptions(enable_async=True)` starts for a checkpoint runs
  a thread that only an `atexit` hook ends, and that hook holds the
  checkpointed objects (a model, its optimizer) and their host copies until
  the process exits, so a sweep of runs in one process would keep every run's;
  and the error of a failed write is raised only at the next asynchronous
  save or by that hook (`Checkpoint.sync()` waits, but neither ends the
  thread nor raises). Drop `checkpoint` afterwards: a later asynchronous save
  through it would start another writer.

  Raises:
    Exception: the error of the write in flight (as TensorFlow raised it in its writer's thread).
  """
  writer = getattr(checkpoint, "_async_checkpointer_impl", None)
  if writer is not None:
    join = writer._join_async_save_thread  # noqa: SLF001
    atexit.unregister(join)
    join()


# --- cluster ---


def joined_a_cluster() -> bool:
  """Whether this process's TensorFlow has joined a multi-worker cluster (collective ops or a remote server set up).

  Works around: TensorFlow has no public call that says so. Its eager context holds the server def that
  `MultiWorkerMirroredStrategy` (collective ops, `_collective_ops_server_def`) or `connect_to_cluster`
  (`get_server_def()`) set. A signal handler asks (`runner.cluster.stop_signals`), maybe while TensorFlow is being
  imported, so this imports nothing: it reads the context module if `sys.modules` holds it, half loaded or not.
  Checked with `CHECKED_WITH`.
  """
  context = sys.modules.get("tensorflow.python.eager.context")
  context_safe = getattr(context, "context_safe", None)  # Not there yet in a module half loaded: not joined.
  current = context_safe() if context_safe is not None else None
  return bool(current and (current.get_server_def() or current._collective_ops_server_def))  # noqa: SLF001
