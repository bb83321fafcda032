"""The Trainer's cost per step and per call against the hand-written loop's (and Orbit's), all in one process.

`python -m benchmarks.step_overhead [--strategy=mirrored2] [--workload=small] [--rounds=5] [--steps=3000]
[--contenders=trainer_100,trainer_1000,loop_100,loop_1000]`

`--strategy` and `--workload` each take a comma-separated list (or `all`):
every pair of them is measured in turn in the same process (mirrored2's
strategy made first, as it splits the CPU before TensorFlow starts), each
with its own table, and a last table sets their ratios side by side.

`benchmarks.throughput` runs each contender in a process of its own, as the
peer harness does; there one contender's rounds can spread by more than the
few percent this compares.
Here the contenders share one process, one strategy and the same workload
(`benchmarks.contenders`), each with its own model and input. A contender is
`KIND_N`: a kind of `benchmarks.contenders` (`trainer`, `loop`, `orbit`,
which needs Orbit installed, see docs/benchmarks.md) at N steps per call
(`trainer_auto`: `steps_per_loop="auto"`; `trainer_ema_N`: the Trainer whose optimizer keeps a
moving average of the weights, against `trainer_N`). After 1000 warm-up steps each,
every round times `--steps` steps of each contender in turn (the order
rotates). The report gives, per contender, the median milliseconds per step
(wall and CPU of the process) and its ratio to `loop_N` at the same steps
per call (the loop's time over the contender's: above 1.0x it is faster);
then `trainer_N` against `orbit_N`, `trainer_auto` against the fastest fixed
`trainer_N`, and each kind's cost of a call, `100 * (ms/step at 100 - ms/step
at 1000)`, where those contenders ran.
"""

import argparse
import contextlib
import io
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import logging as absl_logging

from benchmarks import contenders
from benchmarks import throughput
from runner.cluster import process_exit

KINDS = ("trainer", "loop", "orbit", "trainer_ema")  # trainer_ema: a moving average of the weights.
DEFAULT_CONTENDERS = "trainer_100,trainer_1000,loop_100,loop_1000"
WARMUP_STEPS = 1000


def parse_contender(name):
  """Returns `(kind, steps per call)` for a name `KIND_N` or `trainer_auto`.

  Raises:
    ValueError: another name; the message names the valid forms.
  """
  kind, _, per_call = name.rpartition("_")
  if name == "trainer_auto":
    return kind, "auto"
  if kind in KINDS and per_call.isdigit() and int(per_call) > 0 and WARMUP_STEPS % int(per_call) == 0:
    return kind, int(per_call)
  raise ValueError(
      f"unknown contender {name!r}: use KIND_N with KIND one of {', '.join(KINDS)} and N a divisor "
      f"of {WARMUP_STEPS} (e.g. loop_100), or trainer_auto."
  )


def parse_args(argv=None):
  """Parses and checks the flags (see the module doc); exits with a message on bad input."""
  parser = argparse.ArgumentParser(prog="python -m benchmarks.step_overhead", description=__doc__.splitlines()[0])
  parser.add_argument("--strategy", default="mirrored2", help=f"comma-separated, of {contenders.STRATEGIES}, or all")
  parser.add_argument("--workload", default="small", help=f"comma-separated, of {sorted(contenders.WORKLOADS)}, or all")
  parser.add_argument("--rounds", type=int, default=5, help="rounds; the table shows medians")
  parser.add_argument(
      "--steps", type=int, default=3000, help="timed steps per contender and round (a multiple of 1000)"
  )
  parser.add_argument("--contenders", default=DEFAULT_CONTENDERS, help="comma-separated KIND_N names (see above)")
  args = parser.parse_args(argv)
  try:
    for flag, valid in (("strategy", list(contenders.STRATEGIES)), ("workload", sorted(contenders.WORKLOADS))):
      names = valid if getattr(args, flag) == "all" else throughput.parse_names(getattr(args, flag), valid, flag)
      setattr(args, flag, sorted(set(names), key=valid.index))
    args.contenders = [parse_contender(name) for name in args.contenders.split(",")]
  except ValueError as error:
    parser.error(str(error))
  for kind, _ in args.contenders:
    if kind == "orbit" and contenders.unavailable("orbit_100"):
      parser.error(f"orbit: {contenders.unavailable('orbit_100')}")
  if args.rounds < 1:
    parser.error(f"--rounds must be >= 1, got {args.rounds}.")
  if args.steps < 1000 or args.steps % 1000:
    parser.error(f"--steps must be a positive multiple of 1000 (the longest call), got {args.steps}.")
  return args


def measure(args, strategy, workload):
  """Returns {(kind, steps per call): [(wall ms/step, CPU ms/step) per round]} for one strategy and workload."""
  with contextlib.redirect_stdout(sys.stderr):  # Orbit's progress lines; stdout carries the report only.
    timed_trains = {
        (kind, per_call): contenders.WARM_UPS[kind](strategy, per_call, WARMUP_STEPS, workload)
        for kind, per_call in args.contenders
    }
    order = list(timed_trains)
    rounds = {key: [] for key in order}
    for round_index in range(args.rounds):
      for key in order[round_index % len(order) :] + order[: round_index % len(order)]:
        timing = timed_trains[key](args.steps)
        rounds[key].append((1000 * timing["seconds"] / args.steps, 1000 * timing["cpu_seconds"] / args.steps))
  return rounds


def report(rounds, args, strategy_name, workload_name, minutes):
  """Prints the Markdown report of one strategy and workload: the table, and the costs of a call."""
  print(
      f"\n## Step overhead in one process ({args.rounds} rounds, {minutes:.1f} min; {strategy_name}, workload "
      f"{workload_name}; {WARMUP_STEPS} warm-up steps, then {args.steps} timed steps per contender and round)\n"
  )
  print("| contender | ms/step (median) | ratio | vs | CPU ms/step | ms/step per round |")
  print("|---|---:|---:|---|---:|---|")
  wall = {key: statistics.median(w for w, _ in values) for key, values in rounds.items()}
  for (kind, per_call), values in rounds.items():
    if kind != "loop" and ("loop", per_call) in wall:
      ratio, versus = f"{wall['loop', per_call] / wall[kind, per_call]:.3f}x", f"loop_{per_call}"
    else:
      ratio, versus = "—", "(reference)" if kind == "loop" else "—"
    print(
        f"| {kind}_{per_call} | {wall[kind, per_call]:.4f} | {ratio} | {versus} | "
        f"{statistics.median(c for _, c in values):.3f} | {', '.join(f'{w:.4f}' for w, _ in values)} |"
    )
  print()
  for kind, per_call in wall:
    if kind == "trainer" and ("orbit", per_call) in wall:
      print(f"- trainer_{per_call} against orbit_{per_call}: {wall['orbit', per_call] / wall[kind, per_call]:.3f}x")
    if kind == "trainer_ema" and ("trainer", per_call) in wall:
      ratio = wall["trainer", per_call] / wall[kind, per_call]
      print(f"- trainer_ema_{per_call} against trainer_{per_call}: {ratio:.3f}x")
  fixed = [key for key in wall if key[0] == "trainer" and key[1] != "auto"]
  if ("trainer", "auto") in wall and fixed:
    fastest = min(fixed, key=wall.get)
    print(
        f"- trainer_auto against the fastest fixed size, trainer_{fastest[1]}: "
        f"{wall[fastest] / wall['trainer', 'auto']:.3f}x"
    )
  for kind in KINDS:
    if (kind, 100) in wall and (kind, 1000) in wall:
      print(f"- cost of a call, {kind}: {100 * (wall[kind, 100] - wall[kind, 1000]):.2f} ms")


def summary(ratios):
  """Prints each strategy and workload's `trainer_N` against `loop_N` (and `orbit_N`), side by side."""
  print("\n## Side by side (the loop's or Orbit's ms/step over the Trainer's; above 1.0x the Trainer is faster)\n")
  print("| strategy | workload | contender | vs loop | vs orbit |")
  print("|---|---|---|---:|---:|")
  for (strategy_name, workload_name), wall in ratios.items():
    for kind, per_call in wall:
      if kind != "trainer":
        continue
      versus = [
          f"{wall[other, per_call] / wall[kind, per_call]:.3f}x" if (other, per_call) in wall else "—"
          for other in ("loop", "orbit")
      ]
      print(f"| {strategy_name} | {workload_name} | {kind}_{per_call} | {versus[0]} | {versus[1]} |")


def main(argv=None):
  """Runs the benchmark with the command-line arguments `argv` (default: `sys.argv[1:]`)."""
  args = parse_args(argv)
  absl_logging.set_verbosity(absl_logging.WARNING)  # The Trainer's progress lines are INFO.
  machine_before = throughput.machine_lines()
  # mirrored2 splits the CPU into logical devices, which must come before any other TensorFlow op.
  made = {name: contenders.make_strategy(name) for name in sorted(args.strategy, key="mirrored2".__ne__)}
  ratios, reports = {}, io.StringIO()
  for strategy_name in args.strategy:
    for workload_name in args.workload:
      started = time.perf_counter()
      rounds = measure(args, made[strategy_name], contenders.WORKLOADS[workload_name])
      with contextlib.redirect_stdout(reports):  # Printed after the machine, whose load is taken after the run.
        report(rounds, args, strategy_name, workload_name, (time.perf_counter() - started) / 60)
      ratios[strategy_name, workload_name] = {
          key: statistics.median(w for w, _ in values) for key, values in rounds.items()
      }
  throughput.print_machine(machine_before)
  print(reports.getvalue(), end="")
  if len(ratios) > 1:
    summary(ratios)
  process_exit.exit_now(0)  # Skip tearing down live dataset iterators (see contenders).


if __name__ == "__main__":
  main()
