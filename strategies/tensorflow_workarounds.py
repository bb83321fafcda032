"""Every use of TensorFlow's private API in the project, each with what it works around.

The only module of `strategies/` and `runner/` that reads `tensorflow.python` or a private attribute
(`obj._name`) of a TensorFlow object (Keras's are in `runner/keras_workarounds.py`). Each function says which
TensorFlow behaviour it works around and the version it was checked against (`CHECKED_WITH`);
`tests/project/test_workarounds_*.py` run each one against the installed TensorFlow and fails loudly when
that behaviour changes.
"""

import atexit
import sys
from typing import Any
import weakref

import tensorflow as tf
from tensorflow.python.eager import context  # noqa: TID251
from tensorflow.python.framework import ops  # noqa: TID251

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


# --- loops ---

# The prefix of the names `tf.custom_gradient` registers its gradient functions under (with `ops.uid()`).
_CUSTOM_GRADIENT = "CustomGradient-"


def release_gradients_when_collected(owner: object, strategy: Any) -> None:
  """When `owner` is garbage-collected, removes the custom gradients registered from now on that refer to `strategy`.

  Works around TensorFlow's process-wide gradient registry keeping every
  traced step alive: Keras 3's optimizer sums the gradients over replicas
  with `ReplicaContext.all_reduce` under every strategy, a
  `tf.custom_gradient`, which, traced into a graph, registers its gradient
  function as `CustomGradient-N` in `ops._gradient_registry` and never
  removes it. That function holds the traced graph and a replica context, so
  the strategy and every graph traced for a Trainer's steps would stay until
  the process ends (3.4 MB per `runner.run` of a small config under
  one_device, 7 MB under mirrored). The registry is read only to
  differentiate such a graph again, which nothing does once its Trainer is
  gone; a user function traced under that strategy that calls `all_reduce`
  loses its registration then too. Where the registry is not the dict of
  names checked with `CHECKED_WITH`, nothing is removed.

  Args:
    owner: the object whose life the registrations share (a Trainer).
    strategy: the strategy whose replica contexts the registered functions refer to.
  """
  finalizer = weakref.finalize(owner, _release_gradients, strategy, after=ops.uid())
  finalizer.atexit = False  # At exit, the registry goes with the process.


def _release_gradients(strategy: Any, *, after: int) -> None:
  entries = getattr(getattr(ops, "_gradient_registry", None), "_registry", None)
  if not isinstance(entries, dict):
    return
  for name, entry in list(entries.items()):
    number = name[len(_CUSTOM_GRADIENT) :]
    if name.startswith(_CUSTOM_GRADIENT) and number.isdigit() and int(number) > after:
      if _refers_to(entry.get("type"), strategy, depth=3):  # The function -> the tape's -> all_reduce's -> context.
        entries.pop(name, None)


def _refers_to(function: Any, strategy: Any, depth: int) -> bool:
  """Whether `function`'s closure, or a function's in it (to `depth` levels), holds a replica context of `strategy`."""
  for cell in getattr(function, "__closure__", None) or ():
    try:
      value = cell.cell_contents
    except ValueError:  # An empty cell.
      continue
    if isinstance(value, tf.distribute.ReplicaContext) and value.strategy is strategy:
      return True
    if depth > 1 and _refers_to(value, strategy, depth - 1):
      return True
  return False


# --- trainer ---


def clear_kernel_cache() -> None:
  """Drops TensorFlow's cache of the kernels it instantiated for traced functions (kernels in use are rebuilt).

  Works around: the cache keeps each traced function's executor after the function is gone, so a sweep of
  `runner.run` calls in one process grew by several MB and threads per run. TensorFlow has no public name for it
  (`keras.backend.clear_session` calls it, but also resets the user's global Keras state). Checked with
  `CHECKED_WITH`.
  """
  context.context().clear_kernel_cache()
