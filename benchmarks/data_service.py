"""An input-bound Trainer, its input made locally or by a tf.data service on this machine: steps/s and ratios.

`python -m benchmarks.data_service [--rounds=2] [--steps=60] [--map_cost=8]`

The job: a 64 -> 10 linear model on one device, global batch 256, 20 steps
per loop, whose input is a costly map: each example is a seeded random 64 x 64
matrix multiplied by itself `--map_cost` times (tanh between), so the model's
step is a small part of a step's time. Contenders:
- `local`: the Trainer's own input pipeline (the map in parallel, as many calls as cores);
- `service_1`, `service_2`: the same pipeline run by a tf.data service
  (`Trainer(data_service=...)`, parallel_epochs) of 1 or 2 workers, each
  `python -m runner.data_service` in a process of its own with its
  dispatcher, started for the contender and stopped after it.
Each contender trains 20 steps to warm up (tracing, the service's first
batches), then `--steps` steps timed; the rounds rotate the order. Besides
steps/s it reports the CPU time per step of the trainer and the servers
together (`/proc`). On a machine whose cores the trainer already uses, the
service adds no CPU: its CPU per step over local input's is what moving the
input into other processes costs (transfer, serialization), not what it
gains on other machines; on a machine other work shares, more processes also
get more of the cores, which shows in steps/s, not in CPU per step.
"""

import argparse
import gc
import os
import statistics
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import logging as absl_logging
import keras
import portpicker
import tensorflow as tf

from benchmarks import throughput
import runner
from runner.cluster import process_exit
from runner.data import service as service_lib

CONTENDERS = {"local": 0, "service_1": 1, "service_2": 2}  # name -> service workers
GLOBAL_BATCH_SIZE = 256
STEPS_PER_LOOP = 20
WARMUP_STEPS = 20
SERVING_TIMEOUT_SECONDS = 120


def costly_data(map_cost):
  """A provider of endless examples, each made by `map_cost` 64 x 64 matrix products: input-bound by design."""

  def examples(input_context, start):
    del input_context

    def example(index):
      x = tf.random.stateless_normal([64, 64], seed=tf.stack([index, 0])) / 8.0
      for _ in range(map_cost):
        x = tf.tanh(x @ x)
      return x[0], tf.cast(index % 10, tf.int32)

    return tf.data.Dataset.range(start, 2**62).map(example, num_parallel_calls=tf.data.AUTOTUNE)

  return runner.data.FromFunction(lambda context: examples(context, 0).take(1024), repeated_dataset_fn=examples)


class Service:
  """A dispatcher and `workers` workers, each `python -m runner.data_service` in its own process, on 127.0.0.1."""

  def __init__(self, workers):
    port = portpicker.pick_unused_port()
    self.address = f"grpc://127.0.0.1:{port}"
    commands = [[f"--dispatcher=127.0.0.1:{port}"]]
    commands += [[f"--worker=127.0.0.1:{port}", "--host=127.0.0.1"] for _ in range(workers)]
    env = dict(os.environ, PYTHONPATH=throughput.REPO_ROOT)
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)  # The servers quiet TensorFlow's start-up themselves, unless a level is set.
    self.processes = [
        subprocess.Popen(
            [sys.executable, "-m", "runner.data_service", *command], env=env, stdout=subprocess.PIPE, text=True
        )
        for command in commands
    ]
    for process in self.processes:  # Each prints one line once it serves.
      if "serving at" not in process.stdout.readline():
        raise RuntimeError(f"a tf.data service server did not start: {process.args}")

  def cpu_seconds(self):
    """The CPU seconds (user + system) the servers have used so far."""
    return sum(_process_cpu_seconds(process.pid) for process in self.processes)

  def stop(self):
    """SIGTERM to each server; returns once all have exited."""
    for process in self.processes:
      process.terminate()
      process.wait(SERVING_TIMEOUT_SECONDS)


def _process_cpu_seconds(pid):
  """The CPU seconds (user + system) of process `pid`, from /proc (Linux)."""
  with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
    fields = f.read().rpartition(")")[2].split()
  return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(contender, args):
  """Trains the contender's Trainer `WARMUP_STEPS`, then `args.steps` more; returns (steps/s, CPU ms per step)."""
  service = Service(CONTENDERS[contender]) if CONTENDERS[contender] else None
  try:
    trainer = runner.Trainer(
        tf.distribute.OneDeviceStrategy("/cpu:0"),
        model_fn=lambda: keras.Sequential([keras.Input([64]), keras.layers.Dense(10)]),
        optimizer_fn=lambda: keras.optimizers.SGD(0.01),
        task=runner.tasks.Classification(),
        steps_per_loop=STEPS_PER_LOOP,
        data_service=None if service is None else service_lib.DataService(address=service.address),
        quiet=True,
    )
    data = costly_data(args.map_cost)
    trainer.train(data, global_batch_size=GLOBAL_BATCH_SIZE, steps=WARMUP_STEPS)
    cpu = time.process_time() + (service.cpu_seconds() if service else 0)
    start = time.perf_counter()
    trainer.train(data, global_batch_size=GLOBAL_BATCH_SIZE, steps=WARMUP_STEPS + args.steps)
    seconds = time.perf_counter() - start
    cpu = time.process_time() + (service.cpu_seconds() if service else 0) - cpu
    trainer.close()  # Its iterator ends while the service is up: once the dispatcher is gone, ending it waits for it.
    del trainer
    gc.collect()
    return args.steps / seconds, 1000 * cpu / args.steps
  finally:
    if service is not None:
      service.stop()


def main(argv=None):
  """Measures every contender in each round and prints the Markdown report."""
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--rounds", type=int, default=2)
  parser.add_argument("--steps", type=int, default=60, help="timed steps per contender and round")
  parser.add_argument("--map_cost", type=int, default=8, help="64 x 64 matrix products per example")
  args = parser.parse_args(argv)
  absl_logging.set_verbosity(absl_logging.WARNING)
  machine_before = throughput.machine_lines()
  started = time.perf_counter()
  rates, cpu = {name: [] for name in CONTENDERS}, {name: [] for name in CONTENDERS}
  names = list(CONTENDERS)
  for round_index in range(args.rounds):
    for name in names[round_index % len(names) :] + names[: round_index % len(names)]:
      rate, milliseconds = measure(name, args)
      rates[name].append(rate)
      cpu[name].append(milliseconds)
      print(f"round {round_index + 1} {name}: {rate:.2f} steps/s, {milliseconds:.0f} CPU ms/step", file=sys.stderr)
  local, local_cpu = statistics.median(rates["local"]), statistics.median(cpu["local"])
  print("# The tf.data service on this machine\n")
  print(
      f"An input-bound job (map_cost {args.map_cost}, global batch {GLOBAL_BATCH_SIZE}, {args.steps} steps timed), "
      f"{args.rounds} rounds, {(time.perf_counter() - started) / 60:.1f} min.\n"
  )
  print("| contender | steps/s (median) | vs local | CPU ms/step (median) | vs local | steps/s per round |")
  print("|---|---:|---:|---:|---:|---|")
  for name, values in rates.items():
    median, milliseconds = statistics.median(values), statistics.median(cpu[name])
    print(
        f"| {name} | {median:.2f} | {median / local:.2f}x | {milliseconds:.0f} | {milliseconds / local_cpu:.2f}x | "
        f"{', '.join(f'{v:.2f}' for v in values)} |"
    )
  throughput.print_machine(machine_before)
  process_exit.exit_now(0)  # Skip tearing down live dataset iterators.


if __name__ == "__main__":
  main()
