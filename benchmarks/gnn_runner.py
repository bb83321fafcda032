"""Steps/s of our Trainer against TF-GNN's runner (`tensorflow_gnn.runner.run`) on configs/graphs.py.

`python -m benchmarks.gnn_runner [--rounds=3] [--strategies=one_device,mirrored2]
[--batches=32,256] [--contenders=ours_auto,theirs_default,ours_fixed,theirs_fixed]
[--steps_per_call=20] [--warmup_examples=3200] [--timed_examples=6400] [--quick]` runs every contender
(`benchmarks.gnn_contenders`) on every strategy and global batch in a fresh
process, interleaved within each round and the order rotated from round to
round, then prints the machine and a Markdown table of median steps/s, ours
against theirs as a ratio (the goal: ours >= 1.0x theirs), per pair (`PAIRS`):

- `defaults`: `ours_auto` (`runner.run`'s default, steps_per_loop auto) against
  `theirs_default` (TF-GNN's default off TPU: `steps_per_execution=None`, one
  step per `tf.function` call): what each runner's user gets unless they tune it;
- `N per call`: `ours_fixed` (`steps_per_loop=N`) against `theirs_fixed`
  (`steps_per_execution=N`), N = `--steps_per_call`: like with like.

Each measurement runs about `--warmup_examples` graphs' worth of untimed steps
(tracing, the first calls), rounded up to a multiple of N, then about
`--timed_examples` graphs' worth of timed steps, rounded up to a multiple of
the warm-up steps (TF-GNN's side times whole epochs of that many steps).
"""

import argparse
import dataclasses
import os
import statistics
import sys
import time

from benchmarks import gnn_contenders
from benchmarks import scaling
from benchmarks import throughput

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_BATCHES = (32, 256)
# (what the pair compares, ours, theirs); "N" is --steps_per_call.
PAIRS = (("defaults", "ours_auto", "theirs_default"), ("N per call", "ours_fixed", "theirs_fixed"))
GOAL = 1.0  # ours >= GOAL x theirs (issue 25).


@dataclasses.dataclass(frozen=True)
class Cell:
  """One measurement: a contender at a global batch (on a strategy, given apart)."""

  contender: str
  global_batch_size: int

  def __str__(self):
    return f"{self.contender}, batch {self.global_batch_size}"


def step_counts(global_batch_size, args):
  """Returns (warm-up steps, timed steps) at `global_batch_size` (see the module doc)."""
  warmup = scaling.round_up(max(1, args.warmup_examples // global_batch_size), args.steps_per_call)
  return warmup, scaling.round_up(max(1, args.timed_examples // global_batch_size), warmup)


def measure(cell, strategy, args):
  """Runs `cell` on `strategy` in a child process; returns its JSON row, which has "error" if it did not work."""
  warmup, timed = step_counts(cell.global_batch_size, args)
  command = [
      sys.executable,
      "-m",
      "benchmarks.gnn_contenders",
      f"--contender={cell.contender}",
      f"--strategy={strategy}",
      f"--global_batch_size={cell.global_batch_size}",
      f"--warmup_steps={warmup}",
      f"--steps={timed}",
      f"--steps_per_call={args.steps_per_call}",
  ]
  env = dict(os.environ)
  env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  return throughput.child_row(command, root=REPO_ROOT, env=env, timeout=args.timeout, measured="steps_per_sec")


def run_all(args):
  """Runs every cell on every strategy, `args.rounds` times, interleaved; returns {(cell, strategy): [row, ...]}."""
  cells = [Cell(contender, batch) for batch in args.batches for contender in args.contenders]
  rows = {(cell, strategy): [] for strategy in args.strategies for cell in cells}
  order = throughput.schedule(cells, args.strategies, args.rounds)
  for index, (round_index, cell, strategy) in enumerate(order):
    start = time.perf_counter()
    row = measure(cell, strategy, args)
    rows[cell, strategy].append(row)
    if "error" in row:
      outcome = f"not working: {row['error']}"
    else:
      outcome = f"{row['steps_per_sec']:.1f} steps/s, {1000 * row['cpu_seconds'] / row['steps']:.2f} CPU ms/step"
    print(
        f"[{index + 1}/{len(order)}, round {round_index + 1}] {cell} on {strategy}: {outcome} "
        f"({time.perf_counter() - start:.0f} s)",
        file=sys.stderr,
        flush=True,
    )
  return rows


def median(runs, key):
  """Returns the median over `runs` of `key` ("steps_per_sec" or "cpu_ms"), or None if any run failed."""
  if not runs or any("error" in run for run in runs):
    return None
  if key == "steps_per_sec":
    return statistics.median(run["steps_per_sec"] for run in runs)
  return statistics.median(1000 * run["cpu_seconds"] / run["steps"] for run in runs)


def pair_row(ours_runs, theirs_runs):
  """Returns the cells of an ours-against-theirs row.

  Steps/s and CPU ms/step of each; the ratio ours/theirs of the median steps/s,
  and by CPU per step (theirs' / ours', so above 1 is ours ahead either way);
  whether the steps/s ratio meets `GOAL`; and the steps/s ratio within each round.
  """
  out = []
  for runs in (ours_runs, theirs_runs):
    steps = median(runs, "steps_per_sec")
    out += ["not working", ""] if steps is None else [f"{steps:.1f}", f"{median(runs, 'cpu_ms'):.2f}"]
  ours, theirs = median(ours_runs, "steps_per_sec"), median(theirs_runs, "steps_per_sec")
  if ours is None or theirs is None:
    return out + ["", "", "n/a", scaling.errors(ours_runs) or scaling.errors(theirs_runs)]
  by_cpu = median(theirs_runs, "cpu_ms") / median(ours_runs, "cpu_ms")
  per_round = ", ".join(
      f"{mine['steps_per_sec'] / other['steps_per_sec']:.2f}" for mine, other in zip(ours_runs, theirs_runs)
  )
  verdict = "met" if ours / theirs >= GOAL else "not met"
  return out + [f"{ours / theirs:.2f}x", f"{by_cpu:.2f}x", verdict, per_round]


def results_table(rows, args):
  """Returns the Markdown lines of the table: one row per pair run, strategy and global batch."""
  lines = [
      "| pair | strategy | global batch | ours | steps/s | CPU ms/step | theirs | steps/s | CPU ms/step "
      f"| ours/theirs | by CPU | >= {GOAL}x | per round |",
      "|---|---|---:|---|---:|---:|---|---:|---:|---:|---:|---|---|",
  ]
  for pair, ours, theirs in PAIRS:
    if ours not in args.contenders or theirs not in args.contenders:
      continue
    name = pair.replace("N", str(args.steps_per_call))
    for strategy in args.strategies:
      for batch in args.batches:
        cells = pair_row(rows[Cell(ours, batch), strategy], rows[Cell(theirs, batch), strategy])
        cells[2:2] = [theirs]
        lines.append(f"| {name} | {strategy} | {batch} | {ours} | " + " | ".join(cells) + " |")
  return lines


def parse_batches(text):
  """Returns the comma-separated global batches in `text`.

  Raises:
    ValueError: one is not an even positive int (mirrored2 splits it over 2 replicas), or none is given.
  """
  batches = []
  for item in (item.strip() for item in text.split(",") if item.strip()):
    if not item.isdigit() or int(item) < 2 or int(item) % 2:
      raise ValueError(f"--batches: {item!r} is not an even int >= 2 (mirrored2 splits a batch over 2 replicas).")
    batches.append(int(item))
  if not batches:
    raise ValueError("--batches is empty; give global batches such as 32,256.")
  return batches


def parse_args(argv=None):
  """Parses and checks the flags (see the module doc); exits with a message on bad input."""
  parser = argparse.ArgumentParser(prog="python -m benchmarks.gnn_runner", description=__doc__.splitlines()[0])
  all_contenders = list(gnn_contenders.CONTENDERS)
  parser.add_argument("--rounds", type=int, default=3, help="rounds; the table shows medians")
  parser.add_argument(
      "--strategies",
      default=",".join(gnn_contenders.STRATEGIES),
      help="comma-separated, from: " + ", ".join(gnn_contenders.STRATEGIES),
  )
  parser.add_argument(
      "--contenders",
      default=",".join(all_contenders),
      help="comma-separated, from: " + ", ".join(all_contenders),
  )
  parser.add_argument(
      "--batches", default=",".join(map(str, DEFAULT_BATCHES)), help="comma-separated global batches (graphs)"
  )
  parser.add_argument("--steps_per_call", type=int, default=20, help="steps per call of ours_fixed and theirs_fixed")
  parser.add_argument(
      "--warmup_examples",
      type=int,
      default=3_200,
      help="graphs of untimed steps per measurement (rounded up to whole calls)",
  )
  parser.add_argument(
      "--timed_examples",
      type=int,
      default=6_400,
      help="graphs of timed steps per measurement (rounded up to a multiple of the warm-up steps)",
  )
  parser.add_argument("--timeout", type=int, default=300, help="seconds allowed per process")
  parser.add_argument("--quick", action="store_true", help="smoke run: 1 round, 640 graphs warm-up, 640 timed")
  args = parser.parse_args(argv)
  if args.quick:
    args.rounds, args.warmup_examples, args.timed_examples = 1, 640, 640
  try:
    args.strategies = throughput.parse_names(args.strategies, gnn_contenders.STRATEGIES, "strategies")
    args.contenders = throughput.parse_names(args.contenders, all_contenders, "contenders")
    args.batches = parse_batches(args.batches)
  except ValueError as error:
    parser.error(str(error))
  for flag in ("rounds", "steps_per_call", "warmup_examples", "timed_examples", "timeout"):
    if getattr(args, flag) < 1:
      parser.error(f"--{flag} must be >= 1, got {getattr(args, flag)}.")
  return args


def main(argv=None):
  """Runs the benchmark with the command-line arguments `argv` (default: `sys.argv[1:]`)."""
  args = parse_args(argv)
  machine_before = throughput.machine_lines()
  start = time.perf_counter()
  rows = run_all(args)
  minutes = (time.perf_counter() - start) / 60
  throughput.print_machine(machine_before)
  print(
      f"- tf-keras {throughput.package_version('tf-keras', 'tf_keras')}, "
      f"tensorflow-gnn {throughput.package_version('tensorflow-gnn')}"
  )
  steps = "; ".join(
      "batch {}: {} warm-up, then {} timed".format(batch, *step_counts(batch, args)) for batch in args.batches
  )
  print(f"- {args.rounds} round{'s' if args.rounds > 1 else ''}, {minutes:.1f} min; steps per measurement: {steps}")
  print("\n## Ours (`runner.Trainer`) against theirs (`tensorflow_gnn.runner.run`), median\n")
  print("\n".join(results_table(rows, args)))


if __name__ == "__main__":
  main()
