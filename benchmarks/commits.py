"""The Trainer's ratio to the hand-written loop at two commits, measured side by side in one run.

`python -m benchmarks.commits --before=REV [--after=REV] [--rounds=4]
[--strategies=one_device,mirrored2] [--workload=mlp|small]` checks both commits out into temporary
git worktrees and runs, in every round, trainer_100, loop_100, trainer_1 and
loop_1 of each commit on each strategy (`python -m benchmarks.contenders`,
one process each, from that commit's tree), the commits' order alternating
from round to round. It prints the machine and a Markdown table: per commit
and contender, the median ratio to the loop with as many steps per call (the
ratios are taken within a round, where both ran under the same load) and the
median CPU ms per step. A change that costs the Trainer per-step work shows as
a lower ratio and more CPU per step after it than before.
"""

import argparse
import statistics
import subprocess
import sys
import tempfile

from benchmarks import contenders as contenders_lib
from benchmarks import throughput

PAIRS = (("trainer_100", "loop_100"), ("trainer_1", "loop_1"))


def worktree(revision, directory):
  """Checks `revision` out into `directory` (a detached git worktree of this repository); returns its hash."""
  subprocess.run(
      ["git", "-C", throughput.REPO_ROOT, "worktree", "add", "--detach", "--force", directory, revision],
      check=True,
      capture_output=True,
      text=True,
  )
  return subprocess.run(
      ["git", "-C", directory, "rev-parse", "--short", "HEAD"], check=True, capture_output=True, text=True
  ).stdout.strip()


def measure(trees, args):
  """Returns {(commit, contender, strategy): [row per round]}, the commits' order alternating per round."""
  rows = {}
  for round_index in range(args.rounds):
    order = list(trees.items()) if round_index % 2 == 0 else list(trees.items())[::-1]
    for strategy in args.strategies:
      for pair in PAIRS:
        for commit, root in order:
          for contender in pair:
            row = throughput.run_contender(contender, strategy, args, root=root)
            if "error" in row:
              raise RuntimeError(f"{contender} on {strategy} at {commit}: {row['error']}")
            rows.setdefault((commit, contender, strategy), []).append(row)
            print(
                f"[round {round_index + 1}/{args.rounds}] {commit} {contender:>11} on {strategy:<10} "
                f"{row['steps_per_sec']:8.1f} steps/s",
                file=sys.stderr,
                flush=True,
            )
  return rows


def table(rows, commits, strategies):
  """Returns the Markdown lines: per contender and strategy, each commit's ratio (CPU ms/step)."""

  def cpu_ms(runs):
    return statistics.median(1000 * run["cpu_seconds"] / run["steps"] for run in runs)

  lines = [
      "| contender | strategy | "
      + " | ".join(f"{c}: ratio (CPU ms/step)" for c in commits)
      + " | vs (CPU ms/step at each commit) |",
      "|---|---|" + "---:|" * len(commits) + "---|",
  ]
  for strategy in strategies:
    for trainer, loop in PAIRS:
      cells = []
      for commit in commits:
        ratios = [
            trainer_run["steps_per_sec"] / loop_run["steps_per_sec"]
            for trainer_run, loop_run in zip(rows[commit, trainer, strategy], rows[commit, loop, strategy])
        ]
        cells.append(f"{statistics.median(ratios):.2f}x ({cpu_ms(rows[commit, trainer, strategy]):.2f})")
      loops = ", ".join(f"{cpu_ms(rows[commit, loop, strategy]):.2f}" for commit in commits)
      lines.append(f"| {trainer} | {strategy} | {' | '.join(cells)} | {loop} ({loops}) |")
  return lines


def main(argv=None):
  """Runs the benchmark with the command-line arguments `argv` (default: `sys.argv[1:]`)."""
  parser = argparse.ArgumentParser(prog="python -m benchmarks.commits", description=__doc__.splitlines()[0])
  parser.add_argument("--before", required=True, help="the commit before the change (any git revision)")
  parser.add_argument("--after", default="HEAD", help="the commit after it (default: HEAD)")
  parser.add_argument("--rounds", type=int, default=4)
  parser.add_argument("--strategies", default=",".join(contenders_lib.STRATEGIES))
  parser.add_argument("--warmup_steps", type=int, default=200)
  parser.add_argument("--steps", type=int, default=2000, help="timed steps of every contender")
  parser.add_argument("--timeout", type=int, default=300, help="seconds allowed per process")
  parser.add_argument("--workload", default="mlp", choices=sorted(contenders_lib.WORKLOADS))
  args = parser.parse_args(argv)
  try:
    args.strategies = throughput.parse_names(args.strategies, contenders_lib.STRATEGIES, "strategies")
  except ValueError as error:
    parser.error(str(error))
  if args.rounds < 1 or args.steps < 100 or args.steps % 100 or args.warmup_steps < 100 or args.warmup_steps % 100:
    parser.error("--rounds must be >= 1, and --steps and --warmup_steps positive multiples of 100.")
  args.single_step_steps = args.steps
  machine = throughput.machine_lines()
  with tempfile.TemporaryDirectory() as before_dir, tempfile.TemporaryDirectory() as after_dir:
    trees = {}
    try:
      for revision, directory in ((args.before, before_dir), (args.after, after_dir)):
        trees.setdefault(worktree(revision, directory), directory)
      if len(trees) == 1:
        parser.error(f"--before and --after are the same commit, {next(iter(trees))}.")
      rows = measure(trees, args)
    finally:
      for directory in (before_dir, after_dir):
        subprocess.run(
            ["git", "-C", throughput.REPO_ROOT, "worktree", "remove", "--force", directory],
            check=False,
            capture_output=True,
        )
  print("\n## Machine\n")
  print("\n".join(machine))
  print(
      f"\n## Trainer vs hand-written loop at two commits ({args.rounds} rounds, medians; workload {args.workload}; "
      f"{args.warmup_steps} warm-up steps, then {args.steps} timed)\n"
  )
  print("\n".join(table(rows, list(trees), args.strategies)))


if __name__ == "__main__":
  main()
