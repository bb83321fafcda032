"""The Trainer's cost per step and per call against the hand-written loop's, all in one process.

`python -m benchmarks.step_overhead [--strategy=mirrored2] [--workload=small] [--rounds=5] [--steps=3000]`

`benchmarks.throughput` runs each contender in a process of its own, as the
issue's peer harness does; on a shared 2-core host the same contender's
rounds there spread by 10 to 40%, more than the few percent this compares.
Here the four contenders share one process, one strategy and the same
workload (`benchmarks.contenders`): the Trainer and the hand-written loop
(`loop`), each at 100 and at 1000 steps per call, each with its own model
and input. After 1000 warm-up steps each, every round times `--steps` steps
of each contender in turn (the order rotates). The report gives, per
contender, the median milliseconds per step (wall and CPU of the process),
the Trainer's ratio to the loop at the same steps per call (the loop's time
over the Trainer's: above 1.0x the Trainer is faster), and each kind's cost
of a call, `100 * (ms/step at 100 - ms/step at 1000)`.
"""

import argparse
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import logging as absl_logging  # pylint: disable=g-import-not-at-top

from benchmarks import contenders  # pylint: disable=g-import-not-at-top
from benchmarks import throughput  # pylint: disable=g-import-not-at-top
from runner import process_exit  # pylint: disable=g-import-not-at-top

KINDS = ("trainer", "loop")
STEPS_PER_CALL = (100, 1000)
WARMUP_STEPS = 1000


def parse_args(argv=None):
  """Parses and checks the flags (see the module doc); exits with a message on bad input."""
  parser = argparse.ArgumentParser(prog="python -m benchmarks.step_overhead", description=__doc__.splitlines()[0])
  parser.add_argument("--strategy", default="mirrored2", choices=contenders.STRATEGIES)
  parser.add_argument("--workload", default="small", choices=sorted(contenders.WORKLOADS))
  parser.add_argument("--rounds", type=int, default=5, help="rounds; the table shows medians")
  parser.add_argument("--steps", type=int, default=3000, help="timed steps per contender and round (a multiple of 1000)")
  args = parser.parse_args(argv)
  if args.rounds < 1:
    parser.error(f"--rounds must be >= 1, got {args.rounds}.")
  if args.steps < 1000 or args.steps % 1000:
    parser.error(f"--steps must be a positive multiple of 1000 (the longest call), got {args.steps}.")
  return args


def measure(args):
  """Returns {(kind, steps per call): [(wall ms/step, CPU ms/step) per round]}."""
  strategy = contenders.make_strategy(args.strategy)
  workload = contenders.WORKLOADS[args.workload]
  timed_trains = {(kind, per_call): contenders.WARM_UPS[kind](strategy, per_call, WARMUP_STEPS, workload)
                  for kind in KINDS for per_call in STEPS_PER_CALL}
  order = list(timed_trains)
  rounds = {key: [] for key in order}
  for round_index in range(args.rounds):
    for key in order[round_index % len(order):] + order[:round_index % len(order)]:
      timing = timed_trains[key](args.steps)
      rounds[key].append((1000 * timing["seconds"] / args.steps, 1000 * timing["cpu_seconds"] / args.steps))
  return rounds


def report(rounds, args, machine_before, minutes):
  """Prints the Markdown report: the machine, the table, and the costs of a call."""
  throughput.print_machine(machine_before)
  print(f"\n## Step overhead in one process ({args.rounds} rounds, {minutes:.1f} min; {args.strategy}, workload "
        f"{args.workload}; {WARMUP_STEPS} warm-up steps, then {args.steps} timed steps per contender and round)\n")
  print("| contender | ms/step (median) | ratio | vs | CPU ms/step | ms/step per round |")
  print("|---|---:|---:|---|---:|---|")
  wall = {key: statistics.median(w for w, _ in values) for key, values in rounds.items()}
  for (kind, per_call), values in rounds.items():
    ratio, versus = ("—", "(reference)") if kind == "loop" else (
        f"{wall['loop', per_call] / wall[kind, per_call]:.3f}x", f"loop_{per_call}")
    print(f"| {kind}_{per_call} | {wall[kind, per_call]:.4f} | {ratio} | {versus} | "
          f"{statistics.median(c for _, c in values):.3f} | {', '.join(f'{w:.4f}' for w, _ in values)} |")
  print()
  for kind in KINDS:
    print(f"- cost of a call, {kind}: {100 * (wall[kind, 100] - wall[kind, 1000]):.2f} ms")


def main(argv=None):
  args = parse_args(argv)
  absl_logging.set_verbosity(absl_logging.WARNING)  # The Trainer's progress lines are INFO.
  machine_before = throughput.machine_lines()
  started = time.perf_counter()
  rounds = measure(args)
  report(rounds, args, machine_before, (time.perf_counter() - started) / 60)
  process_exit.exit_now(0)  # Skip tearing down live dataset iterators (see contenders).


if __name__ == "__main__":
  main()
