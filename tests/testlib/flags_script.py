"""A user's script that picks its strategy by flag, with the two lines of `strategies.flags`.

  python tests/testlib/flags_script.py --strategy=mirrored --virtual_cpus=2
  python tests/testlib/flags_script.py --strategy=multi_worker_mirrored --worker_hosts=localhost:2222,localhost:2223 --task_index=0

Runs one step in which every replica all-reduces its number (replica id + 1)
and adds it to a SUM-aggregated variable, then prints one JSON line:
replicas, all_reduce_sum, variable (both 1 + ... + replicas), strategy.
"""

import json

from absl import app
import tensorflow as tf

import strategies

strategies.flags.define_flags()


def main(argv):
  del argv
  strategy = strategies.flags.create_from_flags()
  with strategy.scope():
    counter = tf.Variable(0.0, aggregation=tf.VariableAggregation.SUM)

  @tf.function
  def step():
    def replica_fn():
      context = tf.distribute.get_replica_context()
      replica_number = tf.cast(context.replica_id_in_sync_group + 1, tf.float32)
      counter.assign_add(replica_number)
      return context.all_reduce(tf.distribute.ReduceOp.SUM, replica_number)

    return strategy.run(replica_fn)

  summed = strategy.experimental_local_results(step())[0]
  print(
      json.dumps(
          {
              "replicas": strategy.num_replicas_in_sync,
              "all_reduce_sum": float(summed),
              "variable": float(counter.read_value()),
              "strategy": strategies.describe(strategy),
          }
      ),
      flush=True,
  )


if __name__ == "__main__":
  app.run(main)
