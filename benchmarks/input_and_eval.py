"""Examples/s of the Trainer's input and evaluation, side by side with hand-tuned tf.data and Keras evaluate.

`python -m benchmarks.input_and_eval [--rounds=2] [--strategies=one_device,mirrored2]
[--contenders=raw,...] [--quick]` writes TFRecord files of serialized `tf.train.Example`s
(a float feature vector of 64 and an int label), then runs every contender in a
fresh process (`python -m benchmarks.input_and_eval --contender=... --strategy=...
--workload=... --data_dir=...`, which prints one JSON line), the contenders
interleaved within each round and the order rotated from round to round, and
prints the machine, Markdown tables of median examples/s with ratios, and the
targets with PASS or FAIL. A contender that crashes in any round counts as not working.

Input contenders (`INPUT`) read the files once to warm up, then twice timed,
each batch of `GLOBAL_BATCH_SIZE` consumed inside TensorFlow (`Dataset.reduce`,
as the Trainer's steps read their iterator), no Python per batch:
- `raw`: `tf.data.TFRecordDataset` over the files, batched, no parsing, the
  files read one after the other: the limit;
- `hand_map`: parallel interleave over all the files at once
  (non-deterministic), parallel map of `parse_single_example`, batch,
  AUTOTUNE prefetch;
- `hand_vectorized`: the same, batching the serialized records first and
  parsing a batch with one `parse_example` (the tf.data guide's vectorized map);
- `provider`: `runner.data.TFRecordFiles` as the Trainer reads it
  (`get_repeated_batches`, then prefetch, without the autotuning model, as `input_pipeline.for_training`);
- `provider_get_dataset`: `TFRecordFiles.get_dataset` batched: records parsed one by one.

Evaluation contenders (`EVALUATION`) evaluate a workload's MLP (see
`benchmarks.contenders`) on `EVAL_EXAMPLES` examples (a final partial batch
included) at global batch `GLOBAL_BATCH_SIZE`: `first` is the first call (what a
user waits for: tracing included), `steady` the median of the calls after one
more warm-up call:
- `keras_evaluate`: Keras `model.evaluate` of the batched dataset (default
  `steps_per_execution=1`); `keras_evaluate_100`: with `steps_per_execution=100`;
- `trainer_evaluate`: `runner.Trainer.evaluate` of the unbatched dataset.
"""

import argparse
import dataclasses
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import logging as absl_logging
import keras
import numpy as np
import tensorflow as tf

from benchmarks import contenders as contenders_lib
from benchmarks import throughput
import runner
from runner.cluster import process_exit
from runner.data import pipeline as input_pipeline

REPO_ROOT = throughput.REPO_ROOT
GLOBAL_BATCH_SIZE = 256
NUM_FILES = 16
RECORDS_PER_FILE = 8192
EVAL_EXAMPLES = 16_400  # 64 full batches of 256 and one of 16.
TIMED_PASSES = 2
TIMED_EVALUATIONS = 3
INPUT = ("raw", "hand_map", "hand_vectorized", "provider", "provider_get_dataset")
EVALUATION = ("keras_evaluate", "keras_evaluate_100", "trainer_evaluate")
DEFAULT_CONTENDERS = (
    "raw",
    "hand_map",
    "hand_vectorized",
    "provider",
    "provider_get_dataset",
    "keras_evaluate",
    "trainer_evaluate",
)
WORKLOADS = ("mlp", "small")
HAND_TUNED = ("hand_map", "hand_vectorized")  # What the target compares with.
# Target 5 (docs/benchmarks.md): the provider against the best hand-tuned pipeline, the Trainer against Keras.
PROVIDER_VERSUS_HAND_TUNED = 0.95
TRAINER_VERSUS_KERAS_EVALUATE = 1.0
FEATURES = {
    "x": tf.io.FixedLenFeature([contenders_lib.NUM_FEATURES], tf.float32),
    "y": tf.io.FixedLenFeature([], tf.int64),
}


def write_records(directory):
  """Writes `NUM_FILES` files of `RECORDS_PER_FILE` seeded examples each; returns their glob pattern."""
  rng = np.random.default_rng(contenders_lib.SEED)
  for index in range(NUM_FILES):
    features = rng.standard_normal((RECORDS_PER_FILE, contenders_lib.NUM_FEATURES)).astype(np.float32)
    labels = rng.integers(0, contenders_lib.NUM_CLASSES, RECORDS_PER_FILE)
    with tf.io.TFRecordWriter(os.path.join(directory, f"part-{index:02d}.tfrecord")) as writer:
      for x, y in zip(features, labels):
        writer.write(
            tf.train.Example(
                features=tf.train.Features(
                    feature={
                        "x": tf.train.Feature(float_list=tf.train.FloatList(value=x)),
                        "y": tf.train.Feature(int64_list=tf.train.Int64List(value=[y])),
                    }
                )
            ).SerializeToString()
        )
  return os.path.join(directory, "part-*.tfrecord")


def parse_record(record):
  """One serialized example -> (features [64], label)."""
  example = tf.io.parse_single_example(record, FEATURES)
  return example["x"], example["y"]


def parse_batch(records):
  """A batch of serialized examples -> (features [batch, 64], labels [batch]), in one op."""
  examples = tf.io.parse_example(records, FEATURES)
  return examples["x"], examples["y"]


def input_dataset(contender, pattern):
  """Returns the contender's dataset of batches of `GLOBAL_BATCH_SIZE` (one input pipeline, one replica)."""
  files = sorted(tf.io.gfile.glob(pattern))
  autotune = tf.data.AUTOTUNE
  if contender == "raw":  # One file after the other: reading only, no parsing.
    return tf.data.TFRecordDataset(files).batch(GLOBAL_BATCH_SIZE).prefetch(autotune)
  if contender in HAND_TUNED:  # Every file at once, not cycle_length=AUTOTUNE (as many files as cores).
    records = tf.data.Dataset.from_tensor_slices(files).interleave(
        tf.data.TFRecordDataset, cycle_length=len(files), num_parallel_calls=autotune, deterministic=False
    )
    if contender == "hand_map":
      parsed = records.map(parse_record, num_parallel_calls=autotune, deterministic=False)
      return parsed.batch(GLOBAL_BATCH_SIZE, drop_remainder=True).prefetch(autotune)
    batches = records.batch(GLOBAL_BATCH_SIZE, drop_remainder=True)
    return batches.map(parse_batch, num_parallel_calls=autotune, deterministic=False).prefetch(autotune)
  provider = runner.data.TFRecordFiles(pattern, parse_record)
  context = tf.distribute.InputContext()
  if contender == "provider":  # As the Trainer reads it (input_pipeline.for_training).
    return input_pipeline.without_autotune_model(
        provider.get_repeated_batches(context, GLOBAL_BATCH_SIZE, 0).prefetch(autotune)
    )
  return provider.get_dataset(context).batch(GLOBAL_BATCH_SIZE, drop_remainder=True).prefetch(autotune)


def measure_input(contender, pattern):
  """Returns (examples/s, seconds) of the contender's timed passes over the files."""
  num_batches = NUM_FILES * RECORDS_PER_FILE // GLOBAL_BATCH_SIZE
  dataset = input_dataset(contender, pattern).take(num_batches)
  count = tf.function(lambda: dataset.reduce(tf.constant(0, tf.int64), lambda n, batch: n + 1))
  if int(count()) != num_batches:  # The warm-up pass, checked.
    raise RuntimeError(f"{contender} gave {int(count())} batches, expected {num_batches}")
  start = time.perf_counter()
  for _ in range(TIMED_PASSES):
    count()
  seconds = time.perf_counter() - start
  return TIMED_PASSES * num_batches * GLOBAL_BATCH_SIZE / seconds, seconds


def eval_arrays():
  """Returns the seeded evaluation features and labels (`EVAL_EXAMPLES` of them)."""
  rng = np.random.default_rng(contenders_lib.SEED + 1)
  features = rng.standard_normal((EVAL_EXAMPLES, contenders_lib.NUM_FEATURES)).astype(np.float32)
  labels = rng.integers(0, contenders_lib.NUM_CLASSES, EVAL_EXAMPLES).astype(np.int32)
  return features, labels


def evaluator(contender, strategy, workload):
  """Returns a function that evaluates the workload's model once with the contender; the model is made now."""
  examples = tf.data.Dataset.from_tensor_slices(eval_arrays())
  if contender == "trainer_evaluate":
    trainer = runner.Trainer(
        strategy,
        model_fn=lambda: contenders_lib.make_model(workload),
        optimizer_fn=contenders_lib.make_optimizer,
        task=(
            runner.tasks.Classification(from_logits=True)
            if workload.accuracy
            else contenders_lib._LossOnly(from_logits=True)  # noqa: SLF001
        ),
    )

    def evaluate():
      results = trainer.evaluate(examples, global_batch_size=GLOBAL_BATCH_SIZE)
      if results["num_examples"] != EVAL_EXAMPLES:
        raise RuntimeError(f"Trainer.evaluate counted {results['num_examples']} examples, not {EVAL_EXAMPLES}")

    return evaluate
  with strategy.scope():
    model = contenders_lib.make_model(workload)
    model.compile(
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=[keras.metrics.SparseCategoricalAccuracy()] if workload.accuracy else [],
        steps_per_execution=100 if contender == "keras_evaluate_100" else 1,
        jit_compile=False,
    )
  batches = examples.batch(GLOBAL_BATCH_SIZE)
  return lambda: model.evaluate(batches, verbose=0)


def measure_evaluation(contender, strategy, workload):
  """Returns (first examples/s, steady examples/s, steady seconds per evaluation)."""
  evaluate = evaluator(contender, strategy, workload)
  start = time.perf_counter()
  evaluate()
  first = time.perf_counter() - start
  evaluate()  # Warm-up.
  seconds = []
  for _ in range(TIMED_EVALUATIONS):
    start = time.perf_counter()
    evaluate()
    seconds.append(time.perf_counter() - start)
  steady = statistics.median(seconds)
  return EVAL_EXAMPLES / first, EVAL_EXAMPLES / steady, steady


def measure(contender, strategy_name, workload_name, data_dir):
  """Runs one contender in this process; returns its JSON row (with "error" if it raised)."""
  row = {"contender": contender, "strategy": strategy_name, "workload": workload_name}
  try:
    strategy = contenders_lib.make_strategy(strategy_name)
    if contender in INPUT:
      examples_per_sec, seconds = measure_input(contender, os.path.join(data_dir, "part-*.tfrecord"))
      return {**row, "examples_per_sec": examples_per_sec, "seconds": seconds}
    first, steady, seconds = measure_evaluation(contender, strategy, contenders_lib.WORKLOADS[workload_name])
    return {**row, "first_examples_per_sec": first, "examples_per_sec": steady, "seconds": seconds}
  except Exception as error:  # noqa: BLE001
    return {**row, "error": contenders_lib.describe_error(error)}


@dataclasses.dataclass(frozen=True)
class Result:
  """The rounds of one contender on one strategy and workload."""

  contender: str
  strategy: str
  workload: str
  examples_per_sec: tuple  # steady (evaluation) or timed passes (input), one per round that worked
  first_examples_per_sec: tuple  # evaluation only: the first call
  errors: tuple

  @property
  def works(self):
    """Whether some round measured a rate and none failed."""
    return bool(self.examples_per_sec) and not self.errors

  @property
  def median(self):
    """The median examples/s of the rounds, or None when it did not work."""
    return statistics.median(self.examples_per_sec) if self.works else None

  @property
  def median_first(self):
    """The median examples/s of the first evaluation call, or None (input contenders, or it did not work)."""
    return statistics.median(self.first_examples_per_sec) if self.works and self.first_examples_per_sec else None


def runs(args):
  """Returns the (contender, strategy, workload) runs of one round: input on one_device only."""
  pairs = []
  for contender in args.contenders:
    if contender in INPUT:
      pairs.append((contender, "one_device", "input"))
    else:
      pairs += [(contender, strategy, workload) for strategy in args.strategies for workload in WORKLOADS]
  return pairs


def run_child(run, args):
  """Runs one contender in a child process; returns its JSON row, which has "error" if it did not work."""
  contender, strategy, workload = run
  command = [
      sys.executable,
      "-m",
      "benchmarks.input_and_eval",
      f"--contender={contender}",
      f"--strategy={strategy}",
      f"--workload={workload}",
      f"--data_dir={args.data_dir}",
  ]
  return throughput.child_row(
      command, root=REPO_ROOT, env=dict(os.environ), timeout=args.timeout, measured="examples_per_sec"
  )


def run_all(args):
  """Runs every round, interleaved and rotated; returns {(contender, strategy, workload): Result}."""
  pairs = runs(args)
  rows = {pair: [] for pair in pairs}
  for round_index in range(args.rounds):
    shift = round_index * len(pairs) // args.rounds
    for run in pairs[shift:] + pairs[:shift]:
      start = time.perf_counter()
      row = run_child(run, args)
      rows[run].append(row)
      outcome = (
          f"not working: {row['error']}"
          if "error" in row
          else f"{row['examples_per_sec']:10,.0f} examples/s"
          + (f" (first {row['first_examples_per_sec']:,.0f})" if "first_examples_per_sec" in row else "")
      )
      print(
          f"[round {round_index + 1}/{args.rounds}] {run[0]:>20} {run[1]:<10} {run[2]:<5} {outcome} "
          f"({time.perf_counter() - start:.0f} s)",
          file=sys.stderr,
          flush=True,
      )
  return {
      run: Result(
          *run,
          examples_per_sec=tuple(r["examples_per_sec"] for r in found if "error" not in r),
          first_examples_per_sec=tuple(r["first_examples_per_sec"] for r in found if "first_examples_per_sec" in r),
          errors=tuple(r["error"] for r in found if "error" in r),
      )
      for run, found in rows.items()
  }


def _per_round(values):
  return ", ".join(f"{value:,.0f}" for value in values)


def input_table(results):
  """Returns the Markdown table of the input contenders.

  Each row: median examples/s, against raw reading and the best hand-tuned.
  """
  lines = [
      "| contender | examples/s (median) | vs raw | vs best hand-tuned | examples/s per round |",
      "|---|---:|---:|---:|---|",
  ]
  raw = results.get(("raw", "one_device", "input"))
  best = _best_hand_tuned(results)
  for (contender, _, workload), result in results.items():
    if workload != "input":
      continue
    if not result.works:
      lines.append(f"| {contender} | not working | | | {result.errors[0].replace('|', '/')} |")
      continue
    versus_raw = f"{result.median / raw.median:.2f}x" if raw is not None and raw.works else "—"
    versus_best = f"{result.median / best.median:.2f}x" if best is not None else "—"
    lines.append(
        f"| {contender} | {result.median:,.0f} | {versus_raw} | {versus_best} | "
        f"{_per_round(result.examples_per_sec)} |"
    )
  return lines


def evaluation_table(results):
  """Returns the Markdown table of the evaluation contenders: first and steady examples/s, against Keras evaluate."""
  lines = [
      "| contender | strategy | workload | steady examples/s | vs keras_evaluate | first examples/s "
      "| vs keras_evaluate | steady per round |",
      "|---|---|---|---:|---:|---:|---:|---|",
  ]
  for (contender, strategy, workload), result in results.items():
    if workload == "input":
      continue
    if not result.works:
      lines.append(
          f"| {contender} | {strategy} | {workload} | not working | | | | "
          f"{len(result.errors)} crashed: {result.errors[0].replace('|', '/')} |"
      )
      continue
    keras_result = results.get(("keras_evaluate", strategy, workload))
    steady = first = "—"
    if keras_result is not None and keras_result.works:
      steady = f"{result.median / keras_result.median:.2f}x"
      first = f"{result.median_first / keras_result.median_first:.2f}x"
    lines.append(
        f"| {contender} | {strategy} | {workload} | {result.median:,.0f} | {steady} | "
        f"{result.median_first:,.0f} | {first} | {_per_round(result.examples_per_sec)} |"
    )
  return lines


def _best_hand_tuned(results):
  working = [results[key] for key in results if key[0] in HAND_TUNED and results[key].works]
  return max(working, key=lambda result: result.median) if working else None


def target_rows(results, args):
  """Yields (target, measured, verdict): the provider against the best hand-tuned pipeline; Trainer against Keras."""
  provider, best = results.get(("provider", "one_device", "input")), _best_hand_tuned(results)
  if provider is not None and best is not None:
    target = f"provider >= {PROVIDER_VERSUS_HAND_TUNED}x the best hand-tuned pipeline"
    if not provider.works:
      yield target, "provider not working", "FAIL"
    else:
      ratio = provider.median / best.median
      yield target, f"{ratio:.2f}x {best.contender}", "PASS" if ratio >= PROVIDER_VERSUS_HAND_TUNED else "FAIL"
  for strategy in args.strategies:
    for workload in WORKLOADS:
      trainer, keras_result = (
          results.get((name, strategy, workload)) for name in ("trainer_evaluate", "keras_evaluate")
      )
      if trainer is None or keras_result is None:
        continue
      for what, value in (("steady", lambda r: r.median), ("first call", lambda r: r.median_first)):
        target = f"trainer_evaluate >= {TRAINER_VERSUS_KERAS_EVALUATE}x keras_evaluate, {what}, {strategy}, {workload}"
        if not keras_result.works:
          yield target, "keras_evaluate not working", "n/a"
        elif not trainer.works:
          yield target, "trainer_evaluate not working", "FAIL"
        else:
          ratio = value(trainer) / value(keras_result)
          yield target, f"{ratio:.2f}x", "PASS" if ratio >= TRAINER_VERSUS_KERAS_EVALUATE else "FAIL"


def parse_args(argv=None):
  """Parses and checks the flags (see the module doc); exits with a message on bad input."""
  parser = argparse.ArgumentParser(prog="python -m benchmarks.input_and_eval", description=__doc__.splitlines()[0])
  parser.add_argument("--rounds", type=int, default=2, help="rounds; the tables show medians")
  parser.add_argument(
      "--strategies",
      default=",".join(contenders_lib.STRATEGIES),
      help="evaluation's strategies, comma-separated, from: " + ", ".join(contenders_lib.STRATEGIES),
  )
  parser.add_argument(
      "--contenders",
      default=",".join(DEFAULT_CONTENDERS),
      help="comma-separated, from: " + ", ".join(INPUT + EVALUATION),
  )
  parser.add_argument("--timeout", type=int, default=180, help="seconds allowed per process")
  parser.add_argument("--quick", action="store_true", help="smoke run: 1 round")
  # One contender in this process (how the run calls each):
  parser.add_argument("--contender", help=argparse.SUPPRESS)
  parser.add_argument("--strategy", help=argparse.SUPPRESS)
  parser.add_argument("--workload", help=argparse.SUPPRESS)
  parser.add_argument("--data_dir", help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.contender is not None:
    return args
  if args.quick:
    args.rounds = 1
  try:
    args.strategies = throughput.parse_names(args.strategies, contenders_lib.STRATEGIES, "strategies")
    args.contenders = throughput.parse_names(args.contenders, INPUT + EVALUATION, "contenders")
  except ValueError as error:
    parser.error(str(error))
  for flag in ("rounds", "timeout"):
    if getattr(args, flag) < 1:
      parser.error(f"--{flag} must be >= 1, got {getattr(args, flag)}.")
  return args


def main(argv=None):
  """Runs the benchmark with the command-line arguments `argv` (default: `sys.argv[1:]`)."""
  args = parse_args(argv)
  if args.contender is not None:
    absl_logging.set_verbosity(absl_logging.WARNING)  # The Trainer's progress lines are INFO.
    print(json.dumps(measure(args.contender, args.strategy, args.workload, args.data_dir)), flush=True)
    process_exit.exit_now(0)  # Skip tearing down live dataset iterators (see contenders).
  args.data_dir = tempfile.mkdtemp(prefix="input_and_eval-")
  try:
    write_records(args.data_dir)
    machine_before = throughput.machine_lines()
    start = time.perf_counter()
    results = run_all(args)
    minutes = (time.perf_counter() - start) / 60
  finally:
    shutil.rmtree(args.data_dir, ignore_errors=True)
  print("\n## Machine\n")
  print("\n".join(machine_before))
  print(f"- load average after the run: {', '.join(f'{v:.2f}' for v in os.getloadavg())}")
  rounds = f"{args.rounds} round{'s' if args.rounds > 1 else ''}"
  print(
      f"\n## Input ({rounds}, {minutes:.1f} min in all; {NUM_FILES} files of {RECORDS_PER_FILE:,} records, "
      f"batches of {GLOBAL_BATCH_SIZE}, {TIMED_PASSES} timed passes after one warm-up pass)\n"
  )
  print("\n".join(input_table(results)))
  print(
      f"\n## Evaluation ({EVAL_EXAMPLES:,} examples, global batch {GLOBAL_BATCH_SIZE}; steady: median of "
      f"{TIMED_EVALUATIONS} calls after a warm-up call)\n"
  )
  print("\n".join(evaluation_table(results)))
  print("\n## Targets\n")
  print(
      "\n".join(
          ["| target | measured | result |", "|---|---|---|"]
          + [f"| {target} | {measured} | {verdict} |" for target, measured, verdict in target_rows(results, args)]
      )
  )


if __name__ == "__main__":
  main()
