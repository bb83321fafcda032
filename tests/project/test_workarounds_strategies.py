"""The private TensorFlow behaviour `strategies/tensorflow_workarounds.py` relies on still holds (section strategies).

Each test runs one workaround against the installed TensorFlow; a failure names the function and the version it
was checked with (`CHECKED_WITH`), to be checked again.
"""

import numpy as np
import tensorflow as tf
from tensorflow.python.eager import context  # noqa: TID251

from strategies import tensorflow_workarounds as workarounds


def _changed(function):
  return f"tensorflow_workarounds.{function} no longer works as with {workarounds.CHECKED_WITH}; check it again"


def test_configure_coordination_service_sets_a_registration_deadline_for_every_task():
  saved = context.context()._coordination_service_config
  context.context()._coordination_service_config = None
  try:
    spec = tf.train.ClusterSpec({"chief": ["localhost:1"], "worker": ["localhost:2", "localhost:3"]})
    workarounds.configure_coordination_service(spec, 2.5)
    config = context.context().coordination_service
    jobs = {job.name: job.num_tasks for job in config.coordinated_job_list}
    assert (config.service_leader, config.cluster_register_timeout_in_ms, config.cluster_register_with_barrier) == (
        "/job:chief/replica:0/task:0",
        2500,
        True,
    ), _changed("configure_coordination_service")
    assert jobs == {"chief": 1, "worker": 2}, _changed("configure_coordination_service")
  finally:
    context.context()._coordination_service_config = saved


def test_whole_sharded_variable_is_saved_whole_and_restored_into_any_sharding():
  value = np.arange(30, dtype=np.float32).reshape(10, 3)
  sharded = workarounds.WholeShardedVariable([tf.Variable(value[:4]), tf.Variable(value[4:7]), tf.Variable(value[7:])])
  saved = sharded._serialize_to_tensors()
  assert sorted(saved) == ["VARIABLE_VALUE"], _changed("WholeShardedVariable")
  other = workarounds.WholeShardedVariable([tf.Variable(np.zeros((5, 3), np.float32)) for _ in range(2)])
  other._restore_from_tensors(saved)
  np.testing.assert_array_equal(other.variables[0].numpy(), value[:5], err_msg=_changed("WholeShardedVariable"))
  np.testing.assert_array_equal(tf.convert_to_tensor(other), value, err_msg=_changed("WholeShardedVariable"))
  # A checkpoint of it restores into a plain variable: the same name and shape as an unsharded run writes.
  checkpoint_dir = tf.io.gfile.join(tf.compat.v1.test.get_temp_dir(), "whole")
  path = tf.train.Checkpoint(v=sharded).write(checkpoint_dir)
  plain = tf.Variable(np.zeros((10, 3), np.float32))
  tf.train.Checkpoint(v=plain).read(path).assert_consumed()
  np.testing.assert_array_equal(plain.numpy(), value, err_msg=_changed("WholeShardedVariable"))


def test_called_function_graph_finds_the_body_of_a_called_function():
  @tf.function
  def inner(x):
    return tf.unique(x).y

  @tf.function
  def outer(x):
    return inner(x) * 2

  graph = outer.get_concrete_function(tf.TensorSpec([None], tf.int32)).graph
  bodies = [
      workarounds.called_function_graph(graph, value.func.name)
      for op in graph.get_operations()
      for value in op.node_def.attr.values()
      if value.HasField("func")
  ]
  types = {op.type for body in bodies if body is not None for op in body.get_operations()}
  assert "Unique" in types, _changed("called_function_graph")
