"""Peak memory of the Trainer side by side with the hand-written tf.distribute loop.

`python -m benchmarks.memory [--rounds=3] [--strategies=one_device]
[--contenders=trainer_100,trainer_dir_100,loop_100] [--warmup_steps=100] [--steps=100]` trains the
`wide` workload of `benchmarks.contenders`
(64 -> 4096 -> 4096 -> 10 with Adam: 205 MB of variables and slots) with each contender in a fresh
process, the contenders interleaved and rotated per round as in `benchmarks.throughput`. A process
measures how far its peak resident memory (`ru_maxrss`) grew from after TensorFlow made its devices
to after training. It prints the machine, then a Markdown table of the median growth per contender
with its ratio to the hand-written loop with as many steps per call (`throughput.REFERENCES`).
`trainer_dir_100` is the Trainer with a model_dir (a checkpoint at the end of each `train` call, so
the loops after the first call's run unchecked). `benchmarks.thin_core` runs it too (`measure`).
"""

import argparse
import concurrent.futures
import json
import os
import resource
import statistics
import sys

import tensorflow as tf

from benchmarks import contenders as contenders_lib
from benchmarks import throughput

WORKLOAD = "wide"


def peak_mb():
  """The peak resident memory of this process so far, in MB (`ru_maxrss` is in kB on Linux)."""
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child(contender, strategy_name, warmup_steps, steps):
  """Trains `contender` in this process; returns its row: `{"contender", "strategy", "peak_growth_mb"}`."""
  kind, steps_per_call = contenders_lib.CONTENDERS[contender]
  strategy = contenders_lib.make_strategy(strategy_name)
  tf.constant(0.0)  # Devices and the runtime made before the baseline.
  start = peak_mb()
  contenders_lib.WARM_UPS[kind](strategy, steps_per_call, warmup_steps, contenders_lib.WORKLOADS[WORKLOAD])(steps)
  contenders_lib.remove_model_dirs()
  return {"contender": contender, "strategy": strategy_name, "peak_growth_mb": peak_mb() - start}


def measure(names, strategies, *, rounds, warmup_steps=100, steps=100, timeout=900, parallel=False):
  """Runs each contender of `names` on each strategy in fresh processes, interleaved; returns {(c, s): [MB]}.

  With `parallel`, the processes of a round run at the same time (a process's peak memory does not depend on
  the others; its time does).
  """
  growth = {(c, s): [] for s in strategies for c in names}

  def run(round_index, contender, strategy):
    command = [sys.executable, "-m", "benchmarks.memory", f"--child={contender}", f"--strategies={strategy}"]
    command += [f"--warmup_steps={warmup_steps}", f"--steps={steps}"]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    row = throughput.child_row(command, root=throughput.REPO_ROOT, env=env, timeout=timeout, measured="peak_growth_mb")
    print(f"[round {round_index + 1}/{rounds}] {contender} on {strategy}: {row}", file=sys.stderr, flush=True)
    if "error" not in row:
      growth[contender, strategy].append(row["peak_growth_mb"])

  with concurrent.futures.ThreadPoolExecutor(max_workers=len(names) * len(strategies) if parallel else 1) as pool:
    list(pool.map(lambda task: run(*task), throughput.schedule(names, strategies, rounds)))
  return growth


def main(argv=None):
  """Runs the benchmark (or, with `--child`, one contender) with the command-line arguments `argv`."""
  parser = argparse.ArgumentParser(prog="python -m benchmarks.memory", description=__doc__.splitlines()[0])
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--strategies", default="one_device")
  parser.add_argument("--contenders", default="trainer_100,trainer_dir_100,loop_100")
  parser.add_argument("--warmup_steps", type=int, default=100)
  parser.add_argument("--steps", type=int, default=100)
  parser.add_argument("--timeout", type=int, default=900, help="seconds allowed per process")
  parser.add_argument("--child", help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.child:
    row = child(args.child, args.strategies, args.warmup_steps, args.steps)
    print(json.dumps(row), flush=True)
    os._exit(0)  # As benchmarks.contenders: no wait for the input's tear-down.
  names = throughput.parse_names(args.contenders, list(contenders_lib.CONTENDERS), "contenders")
  strategies = throughput.parse_names(args.strategies, contenders_lib.STRATEGIES, "strategies")
  machine = throughput.machine_lines()
  growth = measure(
      names, strategies, rounds=args.rounds, warmup_steps=args.warmup_steps, steps=args.steps, timeout=args.timeout
  )
  throughput.print_machine(machine)
  print(f"\n## Peak memory growth ({WORKLOAD} workload, {args.rounds} rounds)\n")
  print("| contender | strategy | MB (median) | ratio | vs | MB per round |\n|---|---|---:|---:|---|---|")
  for (contender, strategy), values in growth.items():
    if not values:
      print(f"| {contender} | {strategy} | not working | | | |")
      continue
    versus = throughput.REFERENCES.get(contender)
    reference = growth.get((versus, strategy))
    ratio = f"{statistics.median(values) / statistics.median(reference):.2f}x" if reference else "—"
    versus = versus if reference else "(reference)"
    rounds = ", ".join(f"{value:.0f}" for value in values)
    print(f"| {contender} | {strategy} | {statistics.median(values):.0f} | {ratio} | {versus} | {rounds} |")


if __name__ == "__main__":
  main()
