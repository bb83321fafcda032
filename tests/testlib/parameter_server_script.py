"""An in-process parameter-server cluster on localhost driven by `strategies.create`.

The test runs this with TF_CONFIG naming a chief (this process, the
coordinator), workers and ps tasks on localhost ports. It starts a
`tf.distribute.Server` for every worker and ps task in this process, creates
the `parameter_server` strategy from TF_CONFIG, schedules steps that each add
the next element of a per-worker dataset (always 1.0) to a variable, and
prints one JSON line: steps, variable, workers_used, strategy.
"""

import json
import os

from absl import app
import tensorflow as tf

import strategies

STEPS = 6


def start_servers(cluster):
  """Starts every worker and ps task of `cluster` (a dict of job -> hosts) in this process."""
  spec = tf.train.ClusterSpec({job: hosts for job, hosts in cluster.items() if job != "chief"})
  worker_config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=len(cluster["worker"]) + 1)
  return [
      tf.distribute.Server(
          spec,
          job_name=job,
          task_index=index,
          protocol="grpc",
          config=worker_config if job == "worker" else None,
          start=True,
      )
      for job in ("worker", "ps")
      for index in range(len(cluster[job]))
  ]


def main(argv):
  del argv
  servers = start_servers(json.loads(os.environ["TF_CONFIG"])["cluster"])
  strategy = strategies.create({"name": "parameter_server", "min_shard_bytes": 1024})
  coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
  with strategy.scope():
    total = tf.Variable(0.0)

  def per_worker_dataset_fn():
    return strategy.distribute_datasets_from_function(lambda input_context: tf.data.Dataset.from_tensors(1.0).repeat())

  iterator = iter(coordinator.create_per_worker_dataset(per_worker_dataset_fn))

  @tf.function
  def step(iterator):
    def replica_fn(value):
      total.assign_add(value)
      return value

    return strategy.run(replica_fn, args=(next(iterator),))

  results = [coordinator.schedule(step, args=(iterator,)) for _ in range(STEPS)]
  coordinator.join()
  print(
      json.dumps(
          {
              "steps": sum(float(r.fetch()) for r in results),
              "variable": float(total.numpy()),
              "strategy": strategies.describe(strategy),
              "servers": len(servers),
          }
      ),
      flush=True,
  )


if __name__ == "__main__":
  app.run(main)
