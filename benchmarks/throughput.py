"""Steps/s of the Trainer side by side with hand-written loops and Keras fit.

`python -m benchmarks.throughput [--rounds=3] [--strategies=one_device,mirrored2]
[--contenders=trainer_1,...] [--steps=2000] [--workload=mlp|small] [--quick]` runs every contender on
every strategy in a fresh process (`python -m benchmarks.contenders`), the
contenders interleaved within each round and the order rotated from round to
round, then prints the machine, a Markdown table of median steps/s with the
ratio of each contender to its reference, and the targets with PASS or FAIL.
A contender that crashes in any round counts as not working.
"""

import argparse
import dataclasses
import importlib.metadata
import json
import os
import platform
import statistics
import subprocess
import sys
import time

from benchmarks import contenders as contenders_lib
from strategies import checks

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# contender -> the contender it is compared with, on the same strategy. A Keras fit timed around the
# call is compared with the around-fit figure of its reference when that is Keras fit too (`reference_of`).
REFERENCES = {
    "trainer_1": "loop_1",
    "trainer_100": "loop_100",
    "trainer_1000": "loop_100",
    "trainer_auto": "trainer_100",
    "trainer_jit_100": "trainer_100",  # XLA against the graph.
    "trainer_dir_100": "loop_100",
    "trainer_ema_100": "trainer_100",  # With a moving average of the weights against without.
    "loop_1": "loop_100",
    "orbit_100": "loop_100",
    "keras_fit_1": "loop_1",
    "keras_fit_100": "loop_100",
    "keras_fit_jit_100": "keras_fit_100",
}
KERAS_FIT = ("keras_fit_1", "keras_fit_100")  # Keras fit without XLA: the settings of target 2.
AROUND_FIT = " (around fit)"  # The suffix of a Keras fit row timed around the `fit` call.
# The speed targets (docs/benchmarks.md): the Trainer against the hand-written loop with as many steps per call, and
# against Orbit's StandardTrainer (target 1); trainer_100 against Keras fit at 100 steps per execution
# where that works (one_device), and against Keras fit at its best working setting where the multi-step
# fit crashes (mirrored2) (target 2); steps_per_loop="auto" against the best fixed setting (target 3);
# the Trainer with XLA against Keras fit with XLA, a ratio reported with no bound (target 4).
VERSUS_LOOP = {"trainer_100": 0.97, "trainer_1": 0.95}
VERSUS_ORBIT = 1.0
VERSUS_KERAS_FIT_100 = 0.97
VERSUS_KERAS_FIT_BEST_WORKING = 1.5
AUTO_VERSUS_BEST_FIXED = 0.97
FIXED_TRAINERS = ("trainer_1", "trainer_100", "trainer_1000")


@dataclasses.dataclass(frozen=True)
class Result:
  """The rounds of one contender on one strategy."""

  contender: str
  strategy: str
  steps_per_sec: tuple  # one float per round that worked
  cpu_ms_per_step: tuple  # CPU time of the child's threads, one float per round that worked
  errors: tuple  # one message per round that crashed
  unavailable: str = ""  # why it was not run: "not installed: <pip command>"

  @property
  def works(self):
    """Whether it was run, some round measured a rate and none failed."""
    return bool(self.steps_per_sec) and not self.errors and not self.unavailable

  @property
  def median(self):
    """The median steps/s of the rounds, or None when it did not work."""
    return statistics.median(self.steps_per_sec) if self.works else None

  @property
  def median_cpu_ms(self):
    """The median CPU milliseconds per step of the rounds, or None when it did not work."""
    return statistics.median(self.cpu_ms_per_step) if self.works else None


def parse_names(text, valid, flag):
  """Returns the comma-separated names in `text`, each checked against `valid`.

  Raises:
    ValueError: a name is not in `valid` (with a did-you-mean), or none is given.
  """
  names = [name.strip() for name in text.split(",") if name.strip()]
  if not names:
    raise ValueError(f"--{flag} is empty; valid names: {', '.join(valid)}.")
  for name in names:
    if name not in valid:
      raise ValueError(
          f"--{flag}: unknown name {name!r}.{checks.did_you_mean(name, valid)} Valid names: {', '.join(valid)}."
      )
  return names


def timed_steps(contender, args):
  """Returns the number of steps to time for `contender`: fewer for the one-step contenders."""
  _, steps_per_call = contenders_lib.CONTENDERS[contender]
  return args.single_step_steps if steps_per_call == 1 else args.steps


def run_contender(contender, strategy, args, root=REPO_ROOT):
  """Runs one contender in a child process; returns its JSON row, which has "error" if it did not work.

  `root` is the source tree whose `benchmarks`, `runner` and `strategies` the child imports.
  """
  command = [
      sys.executable,
      "-m",
      "benchmarks.contenders",
      f"--contender={contender}",
      f"--strategy={strategy}",
      f"--warmup_steps={args.warmup_steps}",
      f"--steps={timed_steps(contender, args)}",
  ]
  if args.workload != "mlp":  # Only then: a tree from before workloads (benchmarks.commits) knows no --workload.
    command.append(f"--workload={args.workload}")
  env = dict(os.environ)
  env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  return child_row(command, root=root, env=env, timeout=args.timeout, measured="steps_per_sec")


def child_row(command, *, root, env, timeout, measured):
  """Runs a benchmark child importing `root`'s tree; returns the JSON row it printed last.

  The row has `measured` (e.g. "steps_per_sec"), or "error": the child's
  own, a timeout after `timeout` seconds, or its exit code and last stderr line.
  """
  env = {**env, "PYTHONPATH": root + os.pathsep + env.get("PYTHONPATH", "")}
  try:
    child = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, timeout=timeout, check=False)
  except subprocess.TimeoutExpired:
    return {"error": f"timed out after {timeout} s"}
  lines = child.stdout.strip().splitlines()
  row = json.loads(lines[-1]) if lines and lines[-1].startswith("{") else {}
  if measured in row or "error" in row:
    return row
  stderr = [line for line in child.stderr.strip().splitlines() if line.strip()]
  return {"error": f"exit code {child.returncode}: {stderr[-1] if stderr else 'no output'}"}


def schedule(contenders, strategies, rounds):
  """Returns (round, contender, strategy) in run order: interleaved, rotated per round."""
  pairs = [(contender, strategy) for strategy in strategies for contender in contenders]
  order = []
  for round_index in range(rounds):
    shift = round_index * len(pairs) // rounds
    order += [(round_index, *pair) for pair in pairs[shift:] + pairs[:shift]]
  return order


def reference_of(name):
  """Returns the row `name` is compared with: its REFERENCES entry, timed around `fit` if both are Keras fits."""
  base = name.removesuffix(AROUND_FIT)
  reference = REFERENCES.get(base)
  if name != base and reference is not None and reference.startswith("keras_fit"):
    return reference + AROUND_FIT
  return reference


def results_of(contender, strategy, runs):
  """Yields the Results of `runs` (its JSON rows): by its own timing, then around `fit` if it has that too."""
  worked = [run for run in runs if "error" not in run]
  timings = [("", "seconds", "cpu_seconds")]
  if worked and "around_fit_seconds" in worked[0]:
    timings.append((AROUND_FIT, "around_fit_seconds", "around_fit_cpu_seconds"))
  for suffix, seconds, cpu_seconds in timings:
    yield Result(
        contender + suffix,
        strategy,
        steps_per_sec=tuple(run["steps"] / run[seconds] for run in worked),
        cpu_ms_per_step=tuple(1000 * run[cpu_seconds] / run["steps"] for run in worked),
        errors=tuple(run["error"] for run in runs if "error" in run),
    )


def run_all(args):
  """Runs the schedule; returns {(row name, strategy): Result}, Keras fit's around-fit rows after its own."""
  skipped = {c: reason for c in args.contenders if (reason := contenders_lib.unavailable(c))}
  for contender, reason in skipped.items():
    print(f"{contender}: {reason}", file=sys.stderr, flush=True)
  runnable = [c for c in args.contenders if c not in skipped]
  rows = {(c, s): [] for s in args.strategies for c in runnable}
  for round_index, contender, strategy in schedule(runnable, args.strategies, args.rounds):
    start = time.perf_counter()
    row = run_contender(contender, strategy, args)
    rows[contender, strategy].append(row)
    if "error" in row:
      outcome = f"not working: {row['error']}"
    else:
      outcome = f"{row['steps_per_sec']:8.1f} steps/s, {1000 * row['cpu_seconds'] / row['steps']:.2f} CPU ms/step"
    print(
        f"[round {round_index + 1}/{args.rounds}] {contender:>17} on {strategy:<10} "
        f"{outcome} ({time.perf_counter() - start:.0f} s)",
        file=sys.stderr,
        flush=True,
    )
  results = {}
  for strategy in args.strategies:
    for contender in args.contenders:
      if contender in skipped:
        results[contender, strategy] = Result(contender, strategy, (), (), (), unavailable=skipped[contender])
        continue
      for result in results_of(contender, strategy, rows[contender, strategy]):
        results[result.contender, strategy] = result
  return results


def package_version(*distributions):
  """Returns the version of the first of `distributions` that is installed."""
  for distribution in distributions:
    try:
      return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
      pass
  return "not installed"


def machine_lines():
  """Returns Markdown bullet lines naming the CPU, cores, load and versions."""
  cpu_model = platform.processor() or "unknown"
  try:
    with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
      models = [line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")]
    cpu_model = models[0] if models else cpu_model
  except OSError:
    pass
  usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
  load = ", ".join(f"{value:.2f}" for value in os.getloadavg())
  tensorflow = package_version("tensorflow", "tensorflow-cpu", "tensorflow-tpu", "tf-nightly")
  return [
      f"- CPU: {cpu_model}, {os.cpu_count()} logical cores ({usable} usable)",
      f"- load average (1, 5, 15 min): {load}",
      f"- Python {platform.python_version()}, TensorFlow {tensorflow}, "
      f"Keras {package_version('keras')}, {platform.system()} {platform.release()}",
  ]


def print_machine(machine_before):
  """Prints the report's Machine section: `machine_lines()` as taken before the run, and the load after it."""
  print("\n## Machine\n")
  print("\n".join(machine_before))
  print(f"- load average after the run: {', '.join(f'{v:.2f}' for v in os.getloadavg())}")


def results_table(results, args):
  """Returns the Markdown table of medians and ratios, one row per contender and strategy."""
  batch = contenders_lib.WORKLOADS[args.workload].global_batch_size
  lines = [
      "| contender | strategy | steps/s (median) | examples/s | ratio | vs | CPU ms/step | steps/s per round |",
      "|---|---|---:|---:|---:|---|---:|---|",
  ]
  for (contender, strategy), result in results.items():
    rounds = ", ".join(f"{value:.0f}" for value in result.steps_per_sec)
    if result.unavailable:
      lines.append(f"| {contender} | {strategy} | {result.unavailable} | | | | | |")
      continue
    if not result.works:
      error = result.errors[0].replace("|", "/")
      lines.append(
          f"| {contender} | {strategy} | not working | | | | | "
          f"{len(result.errors)}/{args.rounds} crashed: {error} |"
      )
      continue
    reference = results.get((reference_of(contender), strategy))
    ratio, versus = ("—", "(reference)") if reference_of(contender) is None else ("", "")
    if reference is not None and reference.works:
      ratio, versus = f"{result.median / reference.median:.2f}x", reference.contender
    lines.append(
        f"| {contender} | {strategy} | {result.median:.1f} | {result.median * batch:,.0f} "
        f"| {ratio} | {versus} | {result.median_cpu_ms:.2f} | {rounds} |"
    )
  return lines


def target_rows(results, strategy):
  """Yields (target, measured, verdict) for the targets that can be checked on `strategy`."""

  def get(contender):
    return results.get((contender, strategy))

  def versus(contender, reference, least, target):
    """`least` None: a ratio to report, with no bound."""
    if not reference.works:
      return target, reference.unavailable or f"{reference.contender} not working", "n/a"
    if not get(contender).works:
      return target, f"{contender} not working", "FAIL"
    ratio = get(contender).median / reference.median
    verdict = "reported" if least is None else "PASS" if ratio >= least else "FAIL"
    return target, f"{ratio:.2f}x {reference.contender}", verdict

  for trainer, loop in (("trainer_100", "loop_100"), ("trainer_1", "loop_1")):
    if get(trainer) is not None and get(loop) is not None:
      yield versus(trainer, get(loop), VERSUS_LOOP[trainer], f"{trainer} >= {VERSUS_LOOP[trainer]}x {loop}")
  if get("trainer_100") is not None and get("orbit_100") is not None:
    yield versus("trainer_100", get("orbit_100"), VERSUS_ORBIT, f"trainer_100 >= {VERSUS_ORBIT}x orbit_100")
  for suffix, timing in ((AROUND_FIT, "Keras timed around fit, as the Trainer is"), ("", "Keras timed by callback")):
    fits = [get(name + suffix) for name in KERAS_FIT if get(name + suffix) is not None]
    if get("trainer_100") is None or not fits:
      continue
    if get("keras_fit_100" + suffix) is not None and get("keras_fit_100" + suffix).works:
      yield versus(
          "trainer_100",
          get("keras_fit_100" + suffix),
          VERSUS_KERAS_FIT_100,
          f"trainer_100 >= {VERSUS_KERAS_FIT_100}x keras_fit_100 ({timing})",
      )
      continue
    working = [fit for fit in fits if fit.works]
    target = f"trainer_100 >= {VERSUS_KERAS_FIT_BEST_WORKING}x Keras fit's best working setting ({timing})"
    if working:
      yield versus("trainer_100", max(working, key=lambda fit: fit.median), VERSUS_KERAS_FIT_BEST_WORKING, target)
    else:
      yield target, "Keras fit not working at any setting run", "n/a"
  for suffix, timing in ((AROUND_FIT, "Keras timed around fit"), ("", "Keras timed by callback")):
    if get("trainer_jit_100") is not None and get("keras_fit_jit_100" + suffix) is not None:
      yield versus(
          "trainer_jit_100",
          get("keras_fit_jit_100" + suffix),
          None,
          f"trainer_jit_100 against keras_fit_jit_100, both with XLA ({timing})",
      )
  fixed = [get(name) for name in FIXED_TRAINERS if get(name) is not None and get(name).works]
  if get("trainer_auto") is not None and fixed:
    yield versus(
        "trainer_auto",
        max(fixed, key=lambda trainer: trainer.median),
        AUTO_VERSUS_BEST_FIXED,
        f"trainer_auto >= {AUTO_VERSUS_BEST_FIXED}x the best fixed steps_per_loop",
    )


def targets_table(results, args):
  """Returns the Markdown table of the targets, with PASS, FAIL or n/a (reference not working)."""
  lines = ["| target | strategy | measured | result |", "|---|---|---|---|"]
  for strategy in args.strategies:
    lines += [
        f"| {target} | {strategy} | {measured} | {verdict} |"
        for target, measured, verdict in target_rows(results, strategy)
    ]
  return lines


def parse_args(argv=None):
  """Parses and checks the flags (see the module doc); exits with a message on bad input."""
  parser = argparse.ArgumentParser(prog="python -m benchmarks.throughput", description=__doc__.splitlines()[0])
  all_contenders = list(contenders_lib.CONTENDERS)
  parser.add_argument("--rounds", type=int, default=3, help="rounds; the table shows medians")
  parser.add_argument(
      "--strategies",
      default=",".join(contenders_lib.STRATEGIES),
      help="comma-separated, from: " + ", ".join(contenders_lib.STRATEGIES),
  )
  parser.add_argument(
      "--contenders", default=",".join(all_contenders), help="comma-separated, from: " + ", ".join(all_contenders)
  )
  parser.add_argument(
      "--warmup_steps", type=int, default=200, help="untimed steps before the timed ones (a multiple of 100)"
  )
  parser.add_argument("--steps", type=int, default=2000, help="timed steps of the contenders with 100 steps per call")
  parser.add_argument(
      "--single_step_steps", type=int, default=1000, help="timed steps of the contenders with 1 step per call"
  )
  parser.add_argument("--timeout", type=int, default=300, help="seconds allowed per process")
  parser.add_argument(
      "--workload",
      default="mlp",
      choices=sorted(contenders_lib.WORKLOADS),
      help="mlp: the benchmark MLP, global batch 256; small: 64 -> 128 -> 10, batch 64, loss only",
  )
  parser.add_argument("--quick", action="store_true", help="smoke run: 1 round, 100 warm-up, 200 + 100 timed steps")
  args = parser.parse_args(argv)
  if args.quick:
    args.rounds, args.warmup_steps, args.steps, args.single_step_steps = 1, 100, 200, 100
  try:
    args.strategies = parse_names(args.strategies, contenders_lib.STRATEGIES, "strategies")
    args.contenders = parse_names(args.contenders, all_contenders, "contenders")
  except ValueError as error:
    parser.error(str(error))
  for flag in ("rounds", "timeout", "single_step_steps"):
    if getattr(args, flag) < 1:
      parser.error(f"--{flag} must be >= 1, got {getattr(args, flag)}.")
  for flag in ("warmup_steps", "steps"):
    if getattr(args, flag) < 100 or getattr(args, flag) % 100:
      parser.error(
          f"--{flag} must be a positive multiple of 100 (the steps per call of "
          f"the 100-step contenders), got {getattr(args, flag)}."
      )
  return args


def main(argv=None):
  """Runs the benchmark with the command-line arguments `argv` (default: `sys.argv[1:]`)."""
  args = parse_args(argv)
  machine_before = machine_lines()
  start = time.perf_counter()
  results = run_all(args)
  minutes = (time.perf_counter() - start) / 60
  print_machine(machine_before)
  rounds = f"{args.rounds} round{'s' if args.rounds > 1 else ''}"
  batch = contenders_lib.WORKLOADS[args.workload].global_batch_size
  print(
      f"\n## Throughput ({rounds}, {minutes:.1f} min; workload {args.workload}, global batch {batch}; "
      f"{args.warmup_steps} warm-up steps, then {args.steps} "
      f"timed steps at 100 steps per call, {args.single_step_steps} at 1)\n"
  )
  print("\n".join(results_table(results, args)))
  print("\n## Targets\n")
  print("\n".join(targets_table(results, args)))


if __name__ == "__main__":
  main()
