"""One contender of `benchmarks.gnn_runner`, measured in a process of its own.

`python -m benchmarks.gnn_contenders --contender=ours_auto --strategy=mirrored2
--global_batch_size=32 --warmup_steps=100 --steps=200 [--steps_per_call=20]` trains configs/graphs.py's
GNN on its training data (the config with `config.data.global_batch_size` set)
with one contender, first for `warmup_steps` (tracing and the first calls, not
timed), then for `steps` more, timed with `time.perf_counter` (wall) and
`time.process_time` (CPU of all the process's threads), and prints one JSON line:
`{"contender": ..., "strategy": ..., "global_batch_size": ..., "steps": ...,
"seconds": ..., "cpu_seconds": ..., "steps_per_sec": ...}`, or the first three with
`"error"` when the contender raised.

The contenders (`CONTENDERS`):

- `ours_*`: `runner.Trainer` as `runner.run` makes it from the config
  (`runner.from_config.create_trainer`, no workdir: tf_keras Adam at the config's
  learning rate, the Classification task, the config's seed), trained on the
  config's training data by `Trainer.train`; `ours_auto` with
  `config.trainer.steps_per_loop=None` (auto, `runner.run`'s default),
  `ours_fixed` with `--steps_per_call` steps per loop. Two `train` calls: the warm-up, then the timed one (the
  second continues the first's input iterator and its auto measurements).
- `theirs_*`: `tensorflow_gnn.runner.run` with its `KerasTrainer` (tf_keras
  `fit`) through `benchmarks.tfgnn_runner_side.train`, one `fit`: its first epoch
  is the warm-up, the epochs after it are timed (`log_every=warmup_steps`);
  `theirs_default` with `steps_per_execution=None` (TF-GNN's default off TPU: 1
  step per call), `theirs_fixed` with `steps_per_execution=--steps_per_call`.

Both sides build the same model from the same seed on the same strategy object
(`benchmarks.contenders.make_strategy`: the real tf.distribute classes). TF-GNN's
input maps with `deterministic=False` and op determinism stays off, as a user's
run has it.
"""

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
import traceback

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # Before anything touches tf.keras: TF-GNN needs tf_keras there.

from absl import logging as absl_logging  # noqa: E402

from benchmarks import contenders as contenders_lib  # noqa: E402
from runner import from_config  # noqa: E402
from runner.cluster import process_exit  # noqa: E402
from runner.config import run_config  # noqa: E402

CONFIG = "configs/graphs.py"
# name -> (side, whether it runs --steps_per_call steps per tf.function call or the side's default).
CONTENDERS = {
    "ours_auto": ("ours", False),
    "ours_fixed": ("ours", True),
    "theirs_default": ("theirs", False),
    "theirs_fixed": ("theirs", True),
}
STRATEGIES = contenders_lib.STRATEGIES


def load_config(steps_per_call, global_batch_size):
  """Returns configs/graphs.py's config with the global batch and `config.trainer.steps_per_loop` (None: auto)."""
  return run_config.load_config(
      CONFIG, {"data.global_batch_size": global_batch_size, "trainer.steps_per_loop": steps_per_call}
  )


def measure_ours(strategy, config, warmup_steps, steps):
  """Returns {"seconds", "cpu_seconds"} of `steps` Trainer steps after `warmup_steps` untimed ones."""
  trainer = from_config.create_trainer(config, strategy, None)
  data = from_config.dataset(config, "train")
  batch = config.data.global_batch_size
  trainer.train(data, global_batch_size=batch, steps=warmup_steps)
  wall, cpu = time.perf_counter(), time.process_time()
  trainer.train(data, global_batch_size=batch, steps=warmup_steps + steps)
  return {"seconds": time.perf_counter() - wall, "cpu_seconds": time.process_time() - cpu}


def measure_theirs(strategy, config, warmup_steps, steps, steps_per_execution):
  """Returns {"seconds", "cpu_seconds"} of `steps` steps of TF-GNN's runner after a first epoch of `warmup_steps`."""
  from benchmarks import tfgnn_runner_side  # noqa: PLC0415  Imports TF-GNN: only in this side's process.

  with tempfile.TemporaryDirectory(prefix="gnn-runner-") as model_dir:
    run = tfgnn_runner_side.train(
        config,
        strategy,
        model_dir=model_dir,
        steps=warmup_steps + steps,
        log_every=warmup_steps,
        steps_per_execution=steps_per_execution,
    )
  return {"seconds": steps / run.steps_per_sec, "cpu_seconds": steps * run.cpu_ms_per_step / 1000}


def steps_per_call_of(contender, steps_per_call):
  """Returns the steps per call `contender` runs with `--steps_per_call`: that, or None for its side's default."""
  _, fixed = CONTENDERS[contender]
  return steps_per_call if fixed else None


def check_steps(contender, warmup_steps, steps, steps_per_call):
  """Raises ValueError when the step counts do not suit `contender`.

  Every count must be a positive multiple of the contender's steps per call; TF-GNN's side times whole epochs
  of `warmup_steps`, so its `steps` must be a multiple of `warmup_steps`.
  """
  side, _ = CONTENDERS[contender]
  multiple = steps_per_call_of(contender, steps_per_call) or 1
  for flag, value in (("warmup_steps", warmup_steps), ("steps", steps)):
    if value < 1 or value % multiple:
      raise ValueError(f"--{flag}={value} must be a positive multiple of {multiple}, for {contender}.")
  if side == "theirs" and steps % warmup_steps:
    raise ValueError(
        f"--steps={steps} must be a multiple of --warmup_steps={warmup_steps}: {contender} times whole epochs."
    )


def measure(contender, strategy_name, global_batch_size, warmup_steps, steps, steps_per_call):
  """Runs one contender; returns its result row (a dict, see the module doc).

  Raises:
    ValueError: see `check_steps`.
  """
  check_steps(contender, warmup_steps, steps, steps_per_call)
  side, _ = CONTENDERS[contender]
  own_steps_per_call = steps_per_call_of(contender, steps_per_call)
  row = {"contender": contender, "strategy": strategy_name, "global_batch_size": global_batch_size}
  if own_steps_per_call is not None:
    row["steps_per_call"] = own_steps_per_call
  try:
    strategy = contenders_lib.make_strategy(strategy_name)
    config = load_config(own_steps_per_call if side == "ours" else None, global_batch_size)
    with contextlib.redirect_stdout(sys.stderr):  # stdout carries the result only.
      if side == "ours":
        timing = measure_ours(strategy, config, warmup_steps, steps)
      else:
        timing = measure_theirs(strategy, config, warmup_steps, steps, own_steps_per_call)
  except Exception as error:  # noqa: BLE001
    traceback.print_exc()
    return {**row, "error": contenders_lib.describe_error(error)}
  return {**row, "steps": steps, **timing, "steps_per_sec": steps / timing["seconds"]}


def main(argv=None):
  """Runs one contender with the command-line arguments `argv` (default: `sys.argv[1:]`)."""
  parser = argparse.ArgumentParser(prog="python -m benchmarks.gnn_contenders", description=__doc__.splitlines()[0])
  parser.add_argument("--contender", required=True, choices=sorted(CONTENDERS))
  parser.add_argument("--strategy", required=True, choices=STRATEGIES)
  parser.add_argument("--global_batch_size", type=int, required=True, help="graphs per step over all replicas")
  parser.add_argument("--warmup_steps", type=int, required=True, help="untimed steps first (tracing, first calls)")
  parser.add_argument("--steps", type=int, required=True, help="timed steps after the warm-up")
  parser.add_argument("--steps_per_call", type=int, default=20, help="steps per call of ours_fixed and theirs_fixed")
  args = parser.parse_args(argv)
  for flag in ("global_batch_size", "steps_per_call"):
    if getattr(args, flag) < 1:
      parser.error(f"--{flag} must be >= 1, got {getattr(args, flag)}.")
  absl_logging.set_verbosity(absl_logging.WARNING)  # The Trainer's progress lines are INFO.
  try:
    row = measure(
        args.contender, args.strategy, args.global_batch_size, args.warmup_steps, args.steps, args.steps_per_call
    )
  except ValueError as error:
    parser.error(str(error))
  print(json.dumps(row), flush=True)
  # Skip the interpreter's tear-down: deleting a live, autotuned dataset iterator can block for seconds.
  process_exit.exit_now(0)


if __name__ == "__main__":
  main()
