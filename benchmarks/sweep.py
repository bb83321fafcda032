"""A sweep: `runner.run` called again and again in one process, and the memory and threads each call leaves.

`python -m benchmarks.sweep [--calls=30] [--strategy=one_device|mirrored]` runs two fresh processes, one after the
other, each calling `runner.run` `--calls` times on a small synthetic config (train_and_eval, 8 steps, a checkpoint
every 4, quiet): one collects garbage (`gc.collect()`) after every call, one leaves it to Python's own collector and
`runner.run` (which collects the cycles of earlier runs when the next starts), as a plain sweep script does. After
each call it reads the process's resident memory (VmRSS in /proc/self/status) and its threads (/proc/self/task). It
prints the machine, a Markdown table per process (RSS and threads per call) and the summary: MB per call from call 5
to the last (the slope of RSS), the thread growth from call 3 to the last, and the peaks; with the goals of
docs/benchmarks.md#sweeps-in-one-process (at most 0.5 MB per call after call 5, no thread
growth) as PASS or FAIL.
"""

import argparse
import gc
import json
import os
import subprocess
import sys

from benchmarks import throughput

MAX_MB_PER_CALL = 0.5
FIRST_MEMORY_CALL = 5
FIRST_THREAD_CALL = 3
_MODES = {"gc.collect() after each call": True, "Python's collector alone": False}


def _rss_mb():
  with open("/proc/self/status", encoding="utf-8") as status:
    for line in status:
      if line.startswith("VmRSS:"):
        return int(line.split()[1]) / 1024
  raise RuntimeError("no VmRSS in /proc/self/status")


def child(calls, strategy, collect):
  """Runs the sweep in this process; prints one JSON list of `[rss_mb, threads]`, one per call."""
  import runner  # noqa: PLC0415  (TensorFlow only in the child)

  config = {
      "mode": "train_and_eval",
      "strategy": {"name": strategy, **({"virtual_cpus": 2} if strategy == "mirrored" else {})},
      "data": {"name": "synthetic", "global_batch_size": 32, "num_examples": 256, "num_eval_examples": 64},
      "model": {"hidden_units": (64,)},
      "trainer": {"train_steps": 8, "steps_per_loop": 4, "checkpoint_every": 4},
  }
  rows = []
  for _ in range(calls):
    runner.run(config, quiet=True)
    if collect:
      gc.collect()
    rows.append([_rss_mb(), len(os.listdir("/proc/self/task"))])
  print(json.dumps(rows))


def summary(rows):
  """Returns (MB per call after call 5, thread growth after call 3, peak MB, peak threads) of one sweep's rows."""
  last = len(rows)
  mb_per_call = (rows[-1][0] - rows[FIRST_MEMORY_CALL - 1][0]) / max(last - FIRST_MEMORY_CALL, 1)
  return mb_per_call, rows[-1][1] - rows[FIRST_THREAD_CALL - 1][1], max(r[0] for r in rows), max(r[1] for r in rows)


def main():
  """Runs the two sweeps in fresh processes (or, with --child, one sweep here) and prints the report."""
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--calls", type=int, default=30)
  parser.add_argument("--strategy", choices=("one_device", "mirrored"), default="one_device")
  parser.add_argument("--child", choices=("collect", "no_collect"), help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.child:
    child(args.calls, args.strategy, args.child == "collect")
    return
  machine = throughput.machine_lines()
  results = {}
  for name, collect in _MODES.items():
    command = [sys.executable, "-m", "benchmarks.sweep", f"--calls={args.calls}", f"--strategy={args.strategy}"]
    command.append("--child=" + ("collect" if collect else "no_collect"))
    done = subprocess.run(command, capture_output=True, text=True, timeout=60 * 60, check=False)
    if done.returncode != 0:
      sys.exit(f"{name}: exit {done.returncode}\n{done.stderr[-3000:]}")
    results[name] = json.loads(done.stdout.strip().splitlines()[-1])
  print(f"# A sweep of {args.calls} runner.run calls in one process, strategy {args.strategy}")
  throughput.print_machine(machine)
  for name, rows in results.items():
    print(f"\n## {name}\n\n| call | RSS MB | threads |\n|---:|---:|---:|")
    for call, (rss, threads) in enumerate(rows, 1):
      print(f"| {call} | {rss:.1f} | {threads} |")
  print("\n## Summary\n")
  print(
      f"| collection | MB/call after call {FIRST_MEMORY_CALL} | threads added after call {FIRST_THREAD_CALL} "
      "| peak RSS MB | peak threads | goal |"
  )
  print("|---|---:|---:|---:|---:|---|")
  for name, rows in results.items():
    mb, threads, peak, peak_threads = summary(rows)
    verdict = "PASS" if mb <= MAX_MB_PER_CALL and threads <= 0 else "FAIL"
    print(f"| {name} | {mb:.2f} | {threads:+d} | {peak:.0f} | {peak_threads} | {verdict} |")


if __name__ == "__main__":
  main()
