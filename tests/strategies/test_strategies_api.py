"""The real Strategy API through the local wrappers, on 1, 2 and 4 logical CPUs."""

import numpy as np
import pytest
import tensorflow as tf

import strategies

SUM = tf.distribute.ReduceOp.SUM
MEAN = tf.distribute.ReduceOp.MEAN
GLOBAL_BATCH = 8


def build(kind, cpu_devices):
  if kind == "one_device":
    return strategies.OneDeviceStrategy(cpu_devices(1)[0])
  return strategies.MirroredStrategy(cpu_devices(int(kind.split("_")[1])))


@pytest.fixture(params=["one_device", "mirrored_1", "mirrored_2", "mirrored_4"])
def strategy(request, cpu_devices):
  return build(request.param, cpu_devices)


def replica_number():
  """Returns this replica's id + 1 as a float scalar (1, 2, ...)."""
  return tf.cast(tf.distribute.get_replica_context().replica_id_in_sync_group + 1, tf.float32)


def local_values(strategy, value):
  return [t.numpy().tolist() for t in strategy.experimental_local_results(value)]


def test_replicas_are_the_requested_devices(strategy, cpu_devices):
  n = strategy.num_replicas_in_sync
  assert isinstance(strategy, (tf.distribute.OneDeviceStrategy, tf.distribute.MirroredStrategy))
  assert [tf.DeviceSpec.from_string(d).device_index for d in strategy.extended.worker_devices] == list(range(n))
  assert strategies.describe(strategy).endswith(
      f"{n} replica{'s' if n > 1 else ''} on {', '.join(f'CPU:{i}' for i in range(n))}"
  )


def test_run_and_local_results(strategy):
  n = strategy.num_replicas_in_sync
  per_replica = tf.function(lambda: strategy.run(replica_number))()
  assert local_values(strategy, per_replica) == [float(i + 1) for i in range(n)]


@pytest.mark.parametrize("op", [SUM, MEAN])
def test_reduce_without_axis(strategy, op):
  n = strategy.num_replicas_in_sync
  per_replica = strategy.run(replica_number)
  total = n * (n + 1) / 2
  assert strategy.reduce(op, per_replica, axis=None).numpy() == pytest.approx(total if op == SUM else total / n)


@pytest.mark.parametrize("op", [SUM, MEAN])
def test_reduce_with_axis(strategy, op):
  n = strategy.num_replicas_in_sync
  # Replica r holds [r + 1, 10 * (r + 1), 100 * (r + 1)]; axis 0 is reduced too.
  per_replica = strategy.run(lambda: replica_number() * tf.constant([1.0, 10.0, 100.0]))
  total = 111 * n * (n + 1) / 2
  assert strategy.reduce(op, per_replica, axis=0).numpy() == pytest.approx(total if op == SUM else total / (3 * n))


def test_gather(strategy):
  n = strategy.num_replicas_in_sync
  per_replica = strategy.run(lambda: tf.fill([2, 1], replica_number()))
  gathered = strategy.gather(per_replica, axis=0)
  np.testing.assert_array_equal(gathered.numpy(), np.repeat(np.arange(1.0, n + 1), 2).reshape(-1, 1))


def test_values_from_function(strategy):
  n = strategy.num_replicas_in_sync
  values = strategy.experimental_distribute_values_from_function(
      lambda context: tf.constant(10 * context.replica_id_in_sync_group + context.num_replicas_in_sync)
  )
  assert local_values(strategy, values) == [10 * i + n for i in range(n)]


def test_distribute_datasets_from_function_batches_per_replica(strategy):
  n = strategy.num_replicas_in_sync
  contexts = []

  def dataset_fn(input_context):
    contexts.append(input_context)
    return tf.data.Dataset.range(4 * GLOBAL_BATCH).batch(input_context.get_per_replica_batch_size(GLOBAL_BATCH))

  first = next(iter(strategy.distribute_datasets_from_function(dataset_fn)))
  assert [(c.num_input_pipelines, c.input_pipeline_id, c.num_replicas_in_sync) for c in contexts] == [(1, 0, n)]
  batches = local_values(strategy, first)
  assert [len(b) for b in batches] == [GLOBAL_BATCH // n] * n
  assert sorted(sum(batches, [])) == list(range(GLOBAL_BATCH))


def test_experimental_distribute_dataset_splits_the_global_batch(strategy):
  n = strategy.num_replicas_in_sync
  dataset = tf.data.Dataset.range(4 * GLOBAL_BATCH).batch(GLOBAL_BATCH)
  first = next(iter(strategy.experimental_distribute_dataset(dataset)))
  batches = local_values(strategy, first)
  assert [len(b) for b in batches] == [GLOBAL_BATCH // n] * n
  assert sum(batches, []) == list(range(GLOBAL_BATCH))


def test_variables_in_scope_are_mirrored_and_stay_in_sync(strategy):
  n = strategy.num_replicas_in_sync
  with strategy.scope():
    total = tf.Variable(0.0, aggregation=tf.VariableAggregation.SUM)
  copies = strategy.experimental_local_results(total)
  assert [tf.DeviceSpec.from_string(v.device).device_index for v in copies] == list(range(n))
  if isinstance(strategy, tf.distribute.MirroredStrategy):
    assert isinstance(total, tf.distribute.DistributedValues)
  tf.function(lambda: strategy.run(lambda: total.assign_add(replica_number())))()
  assert [v.numpy() for v in strategy.experimental_local_results(total)] == [n * (n + 1) / 2] * n


@pytest.mark.parametrize("cross_device_ops, num_packs", [("reduce_to_one", 1), ("hierarchical_copy", 2)])
def test_named_cross_device_ops_all_reduce(cpu_devices, cross_device_ops, num_packs):
  strategy = strategies.MirroredStrategy(cpu_devices(2), cross_device_ops=cross_device_ops, num_packs=num_packs)
  per_replica = tf.function(
      lambda: strategy.run(lambda: tf.distribute.get_replica_context().all_reduce(SUM, replica_number() * tf.ones([3])))
  )()
  assert local_values(strategy, per_replica) == [[3.0, 3.0, 3.0]] * 2


def test_default_strategy_is_tensorflows_default():
  strategy = strategies.DefaultStrategy()
  assert strategy is tf.distribute.get_strategy()
  assert isinstance(strategy, strategies.DefaultStrategy)
  assert not isinstance(strategies.MirroredStrategy(), strategies.DefaultStrategy)
  with strategy.scope():
    variable = tf.Variable(2.0)
  assert strategy.reduce(SUM, strategy.run(lambda: variable * 3), axis=None).numpy() == 6.0
  assert strategies.describe(strategy) == "default: 1 replica on the current device (no distribution)"


def test_strategies_over_different_devices_coexist_in_one_process(cpu_devices):
  # TensorFlow's MirroredStrategy would reuse collective group key 1 for both.
  first, second = strategies.MirroredStrategy(cpu_devices(2)), strategies.MirroredStrategy(cpu_devices(4))
  for strategy in (first, second, first):
    n = strategy.num_replicas_in_sync
    gathered = tf.function(
        lambda s=strategy: s.run(
            lambda: tf.distribute.get_replica_context().all_gather(tf.reshape(replica_number(), [1]), axis=0)
        )
    )()
    assert local_values(strategy, gathered) == [[float(i + 1) for i in range(n)]] * n
