"""How cost grows: the Trainer's steps/s against steps_per_loop and the global batch, and its time to the first step.

`python -m benchmarks.scaling [--rounds=3] [--strategies=one_device,mirrored2]
[--parts=steps_per_loop,batch,first_step] [--timed_examples=128000] [--quick]`
measures, every measurement in a fresh process, interleaved within each round
and the order rotated from round to round, and prints the machine and three
Markdown tables of medians:

- `steps_per_loop`: the Trainer and the hand-written loop of
  `benchmarks.contenders` at 1, 10, 100 and 1000 steps per call, on the
  `small` and `mlp` workloads, with the ratio Trainer/loop per row;
- `batch`: the same two at 100 steps per call on the `small` model, with a
  global batch of 64, 256, 1024 and 4096;
- `first_step`: the time from a process's start to the end of its first
  training step, split into stages, for a Trainer in a script
  (`benchmarks.first_step`) and for `python -m runner --config=configs/digits.py`.
  The driver stamps each child's start and the arrival of each of its output
  lines; the tracing and the first loop come from the Trainer's first progress
  line (`traced in T s, then S steps/s`).

Throughput children run `--warmup_steps` untimed steps, then about
`--timed_examples` examples' worth of timed steps (both rounded up to a
multiple of the steps per call).
"""

import argparse
import dataclasses
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from benchmarks import contenders as contenders_lib
from benchmarks import throughput

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PARTS = ("steps_per_loop", "batch", "first_step")
STEPS_PER_LOOP = (1, 10, 100, 1000)
STEPS_PER_LOOP_WORKLOADS = ("small", "mlp")
BATCHES = (64, 256, 1024, 4096)
BATCH_WORKLOAD = "small"
BATCH_STEPS_PER_LOOP = 100
# A contender of each kind, run with --steps_per_call and --global_batch_size.
CONTENDER_OF_KIND = {"trainer": "trainer_1", "loop": "loop_1"}
CLI_TRAIN_STEPS = 10
CLI_STRATEGY_OVERRIDES = {
    "one_device": ["--config.strategy.name=one_device"],
    "mirrored2": ["--config.strategy.name=mirrored", "--config.strategy.virtual_cpus=2"],
}
# The Trainer's progress line of a first loop: "step 1/10: loss 2.3 | traced in 1.5 s, then 31.3 steps/s, ...".
FIRST_PROGRESS_LINE = re.compile(r"step (\d+)/\d+: .*\| traced in ([\d.]+) s, then ([\d.]+) steps/s")
CLI_WORKDIR_LINE = re.compile(r"Mode \w+ in the workdir ")
SCRIPT_STAGES = (
    "python start",
    "import tensorflow",
    "import runner",
    "strategy",
    "setup",
    "tracing",
    "first loop",
    "first step at",
)
CLI_STAGES = ("to the workdir line", "setup", "tracing", "first loop", "first step at")


@dataclasses.dataclass(frozen=True)
class Throughput:
  """A throughput measurement: a contender kind ("trainer" or "loop") at a steps per call and global batch."""

  kind: str
  workload: str
  steps_per_call: int
  global_batch_size: int

  def __str__(self):
    return f"{self.kind} {self.workload}, {self.steps_per_call} steps per call, batch {self.global_batch_size}"


@dataclasses.dataclass(frozen=True)
class FirstStep:
  """A time-to-first-step measurement: "script" (`benchmarks.first_step`) or "cli" (`python -m runner`)."""

  run: str

  def __str__(self):
    return f"first step, {self.run}"


def round_up(value, multiple):
  """Returns the least multiple of `multiple` that is >= `value` (and >= `multiple`)."""
  return max(multiple, -(-value // multiple) * multiple)


def step_counts(cell, args):
  """Returns (warm-up steps, timed steps) of a `Throughput` cell: multiples of its steps per call."""
  timed = round_up(max(1, args.timed_examples // cell.global_batch_size), cell.steps_per_call)
  return round_up(args.warmup_steps, cell.steps_per_call), timed


def run_child(command, timeout):
  """Runs `command` from the repository root.

  Returns:
    (start, lines, problem): `time.time()` just before the start; a list of
    (arrival `time.time()`, line) of its merged stdout and stderr; None, or
    what went wrong (a time-out or a non-zero exit, with the last line).
  """
  env = dict(os.environ)
  env["PYTHONPATH"] = REPO_ROOT + os.pathsep + env.get("PYTHONPATH", "")
  env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  start = time.time()
  child = subprocess.Popen(
      command, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
  )
  timer = threading.Timer(timeout, child.kill)
  timer.start()
  lines = [(time.time(), line.rstrip("\n")) for line in child.stdout]
  timer.cancel()
  code = child.wait()
  last = next((line for _, line in reversed(lines) if line.strip()), "no output")
  if code and code < 0 and time.time() - start >= timeout:
    return start, lines, f"timed out after {timeout} s"
  return start, lines, (f"exit code {code}: {last}" if code else None)


def json_line(lines, key):
  """Returns the last line of `lines` that is a JSON object with `key`, parsed, or None."""
  for _, line in reversed(lines):
    if line.startswith("{") and f'"{key}"' in line:
      return json.loads(line)
  return None


def first_progress(lines):
  """Returns (arrival, tracing seconds, first loop seconds) from the first loop's progress line, or None."""
  for arrival, line in lines:
    match = FIRST_PROGRESS_LINE.search(line)
    if match:
      steps, tracing, steps_per_sec = int(match.group(1)), float(match.group(2)), float(match.group(3))
      return arrival, tracing, steps / steps_per_sec
  return None


def measure_throughput(cell, strategy, args):
  """Runs a `Throughput` cell in a child; returns {"steps_per_sec", "cpu_ms_per_step"} or {"error"}."""
  warmup, timed = step_counts(cell, args)
  command = [
      sys.executable,
      "-m",
      "benchmarks.contenders",
      f"--contender={CONTENDER_OF_KIND[cell.kind]}",
      f"--strategy={strategy}",
      f"--workload={cell.workload}",
      f"--steps_per_call={cell.steps_per_call}",
      f"--global_batch_size={cell.global_batch_size}",
      f"--warmup_steps={warmup}",
      f"--steps={timed}",
  ]
  _, lines, problem = run_child(command, args.timeout)
  row = json_line(lines, "contender")
  if row is None or "error" in row:
    return {"error": row["error"] if row else problem or "no result line"}
  return {"steps_per_sec": row["steps_per_sec"], "cpu_ms_per_step": 1000 * row["cpu_seconds"] / row["steps"]}


def measure_script_first_step(strategy, args):
  """Runs `benchmarks.first_step`; returns {stage: seconds} (`SCRIPT_STAGES`) or {"error"}."""
  start, lines, problem = run_child(
      [sys.executable, "-m", "benchmarks.first_step", f"--strategy={strategy}"], args.timeout
  )
  stamps, progress = json_line(lines, "started"), first_progress(lines)
  if problem or stamps is None or progress is None:
    return {"error": problem or "no progress line or stamps"}
  arrival, tracing, first_loop = progress
  return {
      "python start": stamps["started"] - start,
      "import tensorflow": stamps["tensorflow_imported"] - stamps["started"],
      "import runner": stamps["strategy_start"] - stamps["tensorflow_imported"],
      "strategy": stamps["strategy_created"] - stamps["strategy_start"],
      "setup": arrival - stamps["strategy_created"] - tracing - first_loop,
      "tracing": tracing,
      "first loop": first_loop,
      "first step at": arrival - start,
  }


def measure_cli_first_step(strategy, args):
  """Runs `python -m runner --config=configs/digits.py` (mode train); returns {stage: seconds} (`CLI_STAGES`)."""
  with tempfile.TemporaryDirectory(prefix="scaling-") as temp:
    command = [
        sys.executable,
        "-m",
        "runner",
        "--config=configs/digits.py",
        "--mode=train",
        f"--config.trainer.train_steps={CLI_TRAIN_STEPS}",
        f"--workdir={os.path.join(temp, 'run')}",
        *CLI_STRATEGY_OVERRIDES[strategy],
    ]
    start, lines, problem = run_child(command, args.timeout)
  workdir_line = next((arrival for arrival, line in lines if CLI_WORKDIR_LINE.search(line)), None)
  progress = first_progress(lines)
  if problem or workdir_line is None or progress is None:
    return {"error": problem or "no workdir or progress line"}
  arrival, tracing, first_loop = progress
  return {
      "to the workdir line": workdir_line - start,
      "setup": arrival - workdir_line - tracing - first_loop,
      "tracing": tracing,
      "first loop": first_loop,
      "first step at": arrival - start,
  }


def measure(cell, strategy, args):
  """Measures one cell on `strategy` in a fresh process; returns its row (a dict; "error" if it failed)."""
  if isinstance(cell, Throughput):
    return measure_throughput(cell, strategy, args)
  if cell.run == "script":
    return measure_script_first_step(strategy, args)
  return measure_cli_first_step(strategy, args)


def throughput_cell(kind, workload, steps_per_call, global_batch_size=None):
  """Returns the `Throughput` cell; the global batch defaults to the workload's."""
  batch = global_batch_size or contenders_lib.WORKLOADS[workload].global_batch_size
  return Throughput(kind=kind, workload=workload, steps_per_call=steps_per_call, global_batch_size=batch)


def cells(parts):
  """Returns the cells that `parts` need, each once (a cell two tables share is measured once)."""
  needed = []
  if "steps_per_loop" in parts:
    needed += [
        throughput_cell(kind, workload, steps)
        for workload in STEPS_PER_LOOP_WORKLOADS
        for steps in STEPS_PER_LOOP
        for kind in CONTENDER_OF_KIND
    ]
  if "batch" in parts:
    needed += [
        throughput_cell(kind, BATCH_WORKLOAD, BATCH_STEPS_PER_LOOP, batch)
        for batch in BATCHES
        for kind in CONTENDER_OF_KIND
    ]
  if "first_step" in parts:
    needed += [FirstStep("script"), FirstStep("cli")]
  return list(dict.fromkeys(needed))


def run_all(args):
  """Runs every cell on every strategy, `args.rounds` times, interleaved; returns {(cell, strategy): [row, ...]}."""
  all_cells = cells(args.parts)
  rows = {(cell, strategy): [] for strategy in args.strategies for cell in all_cells}
  order = throughput.schedule(all_cells, args.strategies, args.rounds)
  for index, (round_index, cell, strategy) in enumerate(order):
    start = time.perf_counter()
    row = measure(cell, strategy, args)
    rows[cell, strategy].append(row)
    if "error" in row:
      outcome = f"failed: {row['error']}"
    elif "steps_per_sec" in row:
      outcome = f"{row['steps_per_sec']:.1f} steps/s, {row['cpu_ms_per_step']:.2f} CPU ms/step"
    else:
      outcome = f"first step at {row['first step at']:.2f} s"
    print(
        f"[{index + 1}/{len(order)}, round {round_index + 1}] {cell} on {strategy}: {outcome} "
        f"({time.perf_counter() - start:.0f} s)",
        file=sys.stderr,
        flush=True,
    )
  return rows


def median(runs, key):
  """Returns the median of `key` over the runs that worked, or None if any failed."""
  if not runs or any("error" in run for run in runs):
    return None
  return statistics.median(run[key] for run in runs)


def errors(runs):
  """Returns a short note of the failed runs, or ''."""
  failed = [run["error"] for run in runs if "error" in run]
  return f"{len(failed)}/{len(runs)} failed: {failed[0]}".replace("|", "/")[:200] if failed else ""


def versus_row(trainer_runs, loop_runs, batch):
  """Returns the cells of a Trainer-against-loop row.

  Steps/s, examples/s and CPU ms/step of each; the ratio Trainer/loop of the
  median steps/s and of the median CPU per step (loop's / Trainer's, so above
  1 is the Trainer ahead either way: CPU time varies less than wall time when
  other processes share the cores); and the steps/s ratio within each round.
  """
  out = []
  for runs in (trainer_runs, loop_runs):
    steps = median(runs, "steps_per_sec")
    out += (
        ["not working", "", ""]
        if steps is None
        else [f"{steps:,.0f}", f"{steps * batch:,.0f}", f"{median(runs, 'cpu_ms_per_step'):.2f}"]
    )
  trainer, loop = median(trainer_runs, "steps_per_sec"), median(loop_runs, "steps_per_sec")
  if trainer is None or loop is None:
    return out + ["", "", errors(trainer_runs) or errors(loop_runs)]
  cpu = median(loop_runs, "cpu_ms_per_step") / median(trainer_runs, "cpu_ms_per_step")
  per_round = ", ".join(
      f"{trainer_run['steps_per_sec'] / loop_run['steps_per_sec']:.2f}"
      for trainer_run, loop_run in zip(trainer_runs, loop_runs)
  )
  return out + [f"{trainer / loop:.2f}x", f"{cpu:.2f}x", per_round]


VERSUS_HEADER = (
    "Trainer steps/s | examples/s | CPU ms/step | loop steps/s | examples/s | CPU ms/step | "
    "Trainer/loop | by CPU | per round |"
)
VERSUS_ALIGN = "---:|---:|---:|---:|---:|---:|---:|---:|---|"


def steps_per_loop_table(rows, args):
  """Returns the Markdown lines of the steps_per_loop table."""
  lines = ["| workload | strategy | steps per call | " + VERSUS_HEADER, "|---|---|---:|" + VERSUS_ALIGN]
  for workload in STEPS_PER_LOOP_WORKLOADS:
    for strategy in args.strategies:
      for steps in STEPS_PER_LOOP:
        trainer, loop = (rows[throughput_cell(kind, workload, steps), strategy] for kind in CONTENDER_OF_KIND)
        batch = contenders_lib.WORKLOADS[workload].global_batch_size
        lines.append(f"| {workload} | {strategy} | {steps} | " + " | ".join(versus_row(trainer, loop, batch)) + " |")
  return lines


def batch_table(rows, args):
  """Returns the Markdown lines of the global batch table."""
  lines = ["| strategy | global batch | " + VERSUS_HEADER, "|---|---:|" + VERSUS_ALIGN]
  for strategy in args.strategies:
    for batch in BATCHES:
      trainer, loop = (
          rows[throughput_cell(kind, BATCH_WORKLOAD, BATCH_STEPS_PER_LOOP, batch), strategy]
          for kind in CONTENDER_OF_KIND
      )
      lines.append(f"| {strategy} | {batch} | " + " | ".join(versus_row(trainer, loop, batch)) + " |")
  return lines


def first_step_table(rows, args, run, stages):
  """Returns the Markdown lines of the first-step table of `run` ("script" or "cli"): median seconds per stage."""
  lines = ["| strategy | " + " | ".join(stages) + " |", "|---|" + "---:|" * len(stages)]
  for strategy in args.strategies:
    runs = rows[FirstStep(run), strategy]
    if errors(runs):
      lines.append(f"| {strategy} | {errors(runs)} |" + " |" * (len(stages) - 1))
      continue
    lines.append(f"| {strategy} | " + " | ".join(f"{median(runs, stage):.2f}" for stage in stages) + " |")
  return lines


def parse_args(argv=None):
  """Parses and checks the flags (see the module doc); exits with a message on bad input."""
  parser = argparse.ArgumentParser(prog="python -m benchmarks.scaling", description=__doc__.splitlines()[0])
  parser.add_argument("--rounds", type=int, default=3, help="rounds; the tables show medians")
  parser.add_argument(
      "--strategies",
      default=",".join(contenders_lib.STRATEGIES),
      help="comma-separated, from: " + ", ".join(contenders_lib.STRATEGIES),
  )
  parser.add_argument("--parts", default=",".join(PARTS), help="comma-separated, from: " + ", ".join(PARTS))
  parser.add_argument(
      "--warmup_steps",
      type=int,
      default=200,
      help="untimed steps before the timed ones (rounded up to a multiple of the steps per call)",
  )
  parser.add_argument(
      "--timed_examples",
      type=int,
      default=128_000,
      help="examples of timed steps per measurement (rounded up to whole calls)",
  )
  parser.add_argument("--timeout", type=int, default=300, help="seconds allowed per process")
  parser.add_argument("--quick", action="store_true", help="smoke run: 1 round, 100 warm-up steps, 12,800 examples")
  args = parser.parse_args(argv)
  if args.quick:
    args.rounds, args.warmup_steps, args.timed_examples = 1, 100, 12_800
  try:
    args.strategies = throughput.parse_names(args.strategies, contenders_lib.STRATEGIES, "strategies")
    args.parts = throughput.parse_names(args.parts, PARTS, "parts")
  except ValueError as error:
    parser.error(str(error))
  for flag in ("rounds", "warmup_steps", "timed_examples", "timeout"):
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
      f"- {args.rounds} round{'s' if args.rounds > 1 else ''}, {minutes:.1f} min; {args.warmup_steps} warm-up "
      f"steps, then about {args.timed_examples:,} examples of timed steps per measurement (whole calls)"
  )
  if "steps_per_loop" in args.parts:
    print("\n## Steps/s against steps per call (median)\n")
    print("\n".join(steps_per_loop_table(rows, args)))
  if "batch" in args.parts:
    print(
        f"\n## Steps/s against the global batch ({BATCH_WORKLOAD} model, {BATCH_STEPS_PER_LOOP} steps per call, "
        "median)\n"
    )
    print("\n".join(batch_table(rows, args)))
  if "first_step" in args.parts:
    print("\n## Time to the first step, seconds (median)\n")
    print("A Trainer in a script (`benchmarks.first_step`, small workload, one step):\n")
    print("\n".join(first_step_table(rows, args, "script", SCRIPT_STAGES)))
    print(
        f"\n`python -m runner --config=configs/digits.py --mode=train "
        f"--config.trainer.train_steps={CLI_TRAIN_STEPS}`:\n"
    )
    print("\n".join(first_step_table(rows, args, "cli", CLI_STAGES)))


if __name__ == "__main__":
  main()
