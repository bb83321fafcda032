"""In one run: the Trainer's steps/s and peak memory against the hand-written loop and Keras.

`python -m benchmarks.thin_core [--rounds=3] [--steps=2000] [--memory_rounds=2]` measures

- steps/s on the `small` workload (`benchmarks.contenders`) at 100 steps per call, in this process, the
  contenders of a strategy interleaved and their order rotated per round (`benchmarks.step_overhead.measure`):
  `trainer_100` (no model_dir: every step checked) and `trainer_dir_100` (a model_dir: loops unchecked once it
  holds a checkpoint) against `loop_100`, on one_device and on mirrored2 (2 logical CPUs); `trainer_jit_100`
  against `keras_fit_jit_100` (`fit(jit_compile=True, steps_per_execution=100)`, timed by callback: the steps
  only) on one_device;
- peak memory growth on the `wide` workload (205 MB of variables and Adam slots), a fresh process per
  contender, those of a round at the same time (`benchmarks.memory.measure`): `trainer_100` and
  `trainer_dir_100` against `loop_100`.

It prints the machine (with the load average before and after), then one table: each ratio, its target
(steps/s: at least 1.0x; memory: at most 1.15x), PASS or FAIL, and the medians it is made of.
"""

import argparse
import os
import statistics
import time
import types

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import logging as absl_logging

from benchmarks import contenders
from benchmarks import memory
from benchmarks import step_overhead
from benchmarks import throughput
from runner.cluster import process_exit

SPEED = {  # strategy -> the contenders timed on it, (kind, steps per call)
    "one_device": [("trainer", 100), ("trainer_dir", 100), ("loop", 100), ("trainer_jit", 100), ("keras_fit_jit", 100)],
    "mirrored2": [("trainer", 100), ("trainer_dir", 100), ("loop", 100)],
}
SPEED_RATIOS = [("trainer", "loop"), ("trainer_dir", "loop"), ("trainer_jit", "keras_fit_jit")]
MEMORY = ["trainer_100", "trainer_dir_100", "loop_100"]
LEAST_SPEED, MOST_MEMORY = 1.0, 1.15


def main(argv=None):
  """Runs the benchmark with the command-line arguments `argv` (default: `sys.argv[1:]`)."""
  parser = argparse.ArgumentParser(prog="python -m benchmarks.thin_core", description=__doc__.splitlines()[0])
  parser.add_argument("--rounds", type=int, default=3, help="speed rounds; the table shows medians")
  parser.add_argument("--steps", type=int, default=2000, help="timed steps per contender and round")
  parser.add_argument("--memory_rounds", type=int, default=2, help="memory rounds (0: no memory figure)")
  args = parser.parse_args(argv)
  if args.rounds < 1 or args.steps < 100 or args.steps % 100:
    parser.error("--rounds must be >= 1 and --steps a positive multiple of 100.")
  absl_logging.set_verbosity(absl_logging.WARNING)  # The Trainer's progress lines are INFO.
  machine = throughput.machine_lines()
  start = time.perf_counter()
  rows = []
  if args.memory_rounds:  # First: its processes start before this one's TensorFlow takes memory.
    growth = memory.measure(MEMORY, ["one_device"], rounds=args.memory_rounds, parallel=True)
    reference = statistics.median(growth["loop_100", "one_device"] or [float("nan")])
    for name in MEMORY[:-1]:
      median = statistics.median(growth[name, "one_device"] or [float("nan")])
      ratio = median / reference
      verdict = "PASS" if ratio <= MOST_MEMORY else "FAIL"
      rows.append(
          f"| peak memory growth, wide | one_device | {name} vs loop_100 | {ratio:.3f}x | <= {MOST_MEMORY}x | "
          f"{verdict} | {median:.0f} vs {reference:.0f} MB |"
      )
  made = {name: contenders.make_strategy(name) for name in ("mirrored2", "one_device")}  # mirrored2 first.
  measured = types.SimpleNamespace(rounds=args.rounds, steps=args.steps)
  for strategy, kinds in SPEED.items():
    measured.contenders = kinds
    ms_per_step = step_overhead.measure(measured, made[strategy], contenders.WORKLOADS["small"])
    wall = {kind: statistics.median(w for w, _ in rounds) for (kind, _), rounds in ms_per_step.items()}
    for kind, versus in SPEED_RATIOS:
      if kind in wall and versus in wall:
        ratio = wall[versus] / wall[kind]
        verdict = "PASS" if ratio >= LEAST_SPEED else "FAIL"
        rows.append(
            f"| steps/s, small | {strategy} | {kind}_100 vs {versus}_100 | {ratio:.3f}x | >= {LEAST_SPEED}x | "
            f"{verdict} | {wall[kind]:.4f} vs {wall[versus]:.4f} ms/step |"
        )
  throughput.print_machine(machine)
  print(
      f"\n## Thin core ({(time.perf_counter() - start) / 60:.1f} min; speed: {args.rounds} rounds of {args.steps} "
      f"steps after {step_overhead.WARMUP_STEPS} warm-up steps; memory: {args.memory_rounds} rounds)\n"
  )
  print("| figure | strategy | contenders | ratio | target | result | medians |\n|---|---|---|---:|---|---|---|")
  print("\n".join(rows))
  contenders.remove_model_dirs()
  process_exit.exit_now(0)  # Skip tearing down live dataset iterators (see contenders).


if __name__ == "__main__":
  main()
