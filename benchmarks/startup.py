"""How soon `python -m runner` answers when it needs no device, side by side with `python -c "import tensorflow"`.

`python -m benchmarks.startup [--rounds=5] [--before=REV]` runs, in every
round, each command below as a fresh process timed as a whole (wall clock
from start to exit), the commands interleaved and their order rotated from
round to round: the interpreter alone (`python -c pass`), the reference
`python -c "import tensorflow"`, `python -m runner --help`, the dry run of
configs/digits.py with a typo in an override, and three other config errors.
With --before, the runner's commands also run from that commit's tree (a
temporary git worktree) in the same rounds. It prints the machine, a Markdown
table of the median seconds of each command with its ratio to the import, and
target 6 of docs/benchmarks.md: every answer of this tree <= 0.3x the import, PASS or
FAIL. A command that exits with another status than its answer's is a FAIL.
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

from benchmarks import commits
from benchmarks import throughput

TARGET_RATIO = 0.3
REFERENCE = "import tensorflow"
THIS_TREE = "this tree"
_DIGITS = "--config=configs/digits.py"
# Name -> (the arguments after `python`, the exit status of the right answer, whether it runs the runner).
COMMANDS = {
    "python -c pass": (["-c", "pass"], 0, False),
    REFERENCE: (["-c", "import tensorflow"], 0, False),
    "--help": (["-m", "runner", "--help"], 0, True),
    "--dry_run, a typo in an override": (
        ["-m", "runner", _DIGITS, "--dry_run", "--config.trainer.train_stepz=5"],
        2,
        True,
    ),
    "a bad enum value (mode=trian)": (["-m", "runner", _DIGITS, "--config.mode=trian"], 2, True),
    "an unknown strategy (mirored)": (["-m", "runner", _DIGITS, "--config.strategy.name=mirored"], 2, True),
    "a field the strategy does not use": (
        ["-m", "runner", _DIGITS, "--config.strategy.name=one_device", "--config.strategy.num_packs=2"],
        2,
        True,
    ),
}


def run_once(arguments, root, timeout):
  """Runs `python ARGUMENTS` in `root`, its packages first on the path; returns (wall seconds, exit status)."""
  env = dict(os.environ)
  env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
  start = time.perf_counter()
  child = subprocess.run(
      [sys.executable] + arguments, cwd=root, env=env, capture_output=True, timeout=timeout, check=False
  )
  return time.perf_counter() - start, child.returncode


def schedule(trees, rounds):
  """Returns (round, tree, command) in run order: every command of every tree per round, rotated per round.

  The commands that run no runner code (the interpreter, the import) run once per round, from this tree.
  """
  runs = [(tree, name) for tree in trees for name, (_, _, runner) in COMMANDS.items() if runner or tree == THIS_TREE]
  order = []
  for round_index in range(rounds):
    shift = round_index * len(runs) // rounds
    order += [(round_index, *run) for run in runs[shift:] + runs[:shift]]
  return order


def measure(trees, args):
  """Returns {(tree, command): [(seconds, exit status) per round]}."""
  times = {}
  for round_index, tree, name in schedule(trees, args.rounds):
    seconds, status = run_once(COMMANDS[name][0], trees[tree], args.timeout)
    times.setdefault((tree, name), []).append((seconds, status))
    print(
        f"[round {round_index + 1}/{args.rounds}] {tree:>10} {name:<36} {seconds:6.2f} s, exit {status}",
        file=sys.stderr,
        flush=True,
    )
  return times


def table(times, trees):
  """Returns the Markdown lines: per tree and command, the median seconds, the ratio to the import, the status."""
  reference = statistics.median(seconds for seconds, _ in times[THIS_TREE, REFERENCE])
  lines = [
      "| tree | command | seconds (median) | vs import tensorflow | exit status | seconds per round |",
      "|---|---|---:|---:|---|---|",
  ]
  for tree in trees:
    for name, (_, expected, _) in COMMANDS.items():
      if (tree, name) not in times:
        continue
      runs = times[tree, name]
      median = statistics.median(seconds for seconds, _ in runs)
      statuses = sorted({status for _, status in runs})
      status = f"{statuses[0]}" if statuses == [expected] else f"{statuses} (expected {expected})"
      rounds = ", ".join(f"{seconds:.2f}" for seconds, _ in runs)
      lines.append(f"| {tree} | {name} | {median:.2f} | {median / reference:.2f}x | {status} | {rounds} |")
  return lines


def target_line(times):
  """Returns target 6 with PASS or FAIL: every runner answer of this tree <= 0.3x the import."""
  reference = statistics.median(seconds for seconds, _ in times[THIS_TREE, REFERENCE])
  worst, passed = 0.0, True
  for name, (_, expected, runner) in COMMANDS.items():
    if runner:
      runs = times[THIS_TREE, name]
      worst = max(worst, statistics.median(seconds for seconds, _ in runs) / reference)
      passed = passed and all(status == expected for _, status in runs)
  verdict = "PASS" if passed and worst <= TARGET_RATIO else "FAIL"
  return (
      f"--help and the config errors <= {TARGET_RATIO}x import tensorflow: {verdict} "
      f"(the slowest at {worst:.2f}x{'' if passed else '; an answer had the wrong exit status'})"
  )


def main(argv=None):
  """Runs the benchmark with the command-line arguments `argv` (default: `sys.argv[1:]`)."""
  parser = argparse.ArgumentParser(prog="python -m benchmarks.startup", description=__doc__.splitlines()[0])
  parser.add_argument("--rounds", type=int, default=5, help="rounds; the table shows medians")
  parser.add_argument("--before", help="also run the runner's commands from this commit (any git revision)")
  parser.add_argument("--timeout", type=int, default=120, help="seconds allowed per process")
  args = parser.parse_args(argv)
  if args.rounds < 1 or args.timeout < 1:
    parser.error(f"--rounds and --timeout must be >= 1, got {args.rounds} and {args.timeout}.")
  machine = throughput.machine_lines()
  start = time.perf_counter()
  with tempfile.TemporaryDirectory() as before_dir:
    trees = {THIS_TREE: throughput.REPO_ROOT}
    try:
      if args.before:
        trees[commits.worktree(args.before, before_dir)] = before_dir
      times = measure(trees, args)
    finally:
      if args.before:
        subprocess.run(
            ["git", "-C", throughput.REPO_ROOT, "worktree", "remove", "--force", before_dir],
            check=False,
            capture_output=True,
        )
  minutes = (time.perf_counter() - start) / 60
  throughput.print_machine(machine)
  rounds = f"{args.rounds} round{'s' if args.rounds > 1 else ''}"
  print(f"\n## Start-up ({rounds}, {minutes:.1f} min; each command a fresh process, wall clock)\n")
  print("\n".join(table(times, trees)))
  print(f"\n- {target_line(times)}")


if __name__ == "__main__":
  main()
