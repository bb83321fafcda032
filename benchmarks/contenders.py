"""One throughput contender, measured in a process of its own.

`python -m benchmarks.contenders --contender=loop_100 --strategy=mirrored2
--warmup_steps=200 --steps=2000 [--workload=mlp] [--steps_per_call=N] [--global_batch_size=B]`
trains a workload's MLP with that contender,
first for `warmup_steps` (tracing and the first loops, not timed), then for
`steps` more, timed with `time.perf_counter` (wall) and `time.process_time`
(CPU of all the process's threads), and prints one JSON line:
`{"contender": ..., "strategy": ..., "workload": ..., "steps": ..., "seconds": ...,
"cpu_seconds": ..., "steps_per_sec": ...}` (Keras `fit` also with `"around_fit_seconds"` and
`"around_fit_cpu_seconds"`, see `warm_keras_fit`), or `{"contender": ..., "strategy": ..., "workload": ...,
"error": ...}` when the contender raised or needs a package that is not installed (`unavailable`). Every
contender does the same work per step: the
same MLP, synthetic data, global batch, optimizer, loss (averaged over the
global batch) and, in the `mlp` workload, accuracy metric, with variables made
in `strategy.scope()` and input from `distribute_datasets_from_function`
batched per replica. Workloads (`WORKLOADS`): `mlp`, the benchmark MLP
(64 -> 256 -> 256 -> 10, global batch 256, accuracy); `small`, a step where
per-step overhead shows (64 -> 128 -> 10, global batch 64, loss only); `wide`, where memory
is mostly the training state (64 -> 4096 -> 4096 -> 10 with Adam, global batch 16, loss only).
`--steps_per_call` runs the contender's kind (trainer, loop, keras_fit) with
that many steps per call instead of its own, `--global_batch_size` the workload
with that global batch (and 64 batches of data); the row then names both.
"""

import argparse
import contextlib
import dataclasses
import functools
import importlib.util
import json
import os
import re
import shutil
import sys
import tempfile
import time
import traceback

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import logging as absl_logging
import keras
import numpy as np
import tensorflow as tf

import runner
from runner.cluster import process_exit
import strategies

NUM_FEATURES = 64
NUM_CLASSES = 10
LEARNING_RATE = 0.05
SEED = 0


@dataclasses.dataclass(frozen=True)
class Workload:
  """What every contender trains: the MLP's hidden layers, the global batch, and whether accuracy is tracked."""

  hidden_units: tuple
  global_batch_size: int
  accuracy: bool
  optimizer: str = "sgd"  # "sgd" (with momentum) or "adam"

  @property
  def num_examples(self):
    """The examples of one pass over the data: 64 global batches."""
    return 64 * self.global_batch_size


WORKLOADS = {
    "mlp": Workload(hidden_units=(256, 256), global_batch_size=256, accuracy=True),
    "small": Workload(hidden_units=(128,), global_batch_size=64, accuracy=False),
    # 205 MB of variables and Adam slots, a small batch: what memory holds is mostly the training state.
    "wide": Workload(hidden_units=(4096, 4096), global_batch_size=16, accuracy=False, optimizer="adam"),
}

# name -> (kind, steps per tf.function call); a kind ending in "_jit" compiles its step with XLA.
CONTENDERS = {
    "trainer_1": ("trainer", 1),
    "trainer_100": ("trainer", 100),
    "trainer_1000": ("trainer", 1000),
    "trainer_auto": ("trainer", "auto"),  # steps_per_loop="auto": chosen from the measured step time.
    "trainer_jit_100": ("trainer_jit", 100),
    "trainer_dir_100": ("trainer_dir", 100),  # With a model_dir: its loops run unchecked once it holds a checkpoint.
    "trainer_ema_100": ("trainer_ema", 100),  # Its optimizer keeps a moving average of the weights (0.999).
    "loop_1": ("loop", 1),
    "loop_100": ("loop", 100),
    "orbit_100": ("orbit", 100),
    "keras_fit_1": ("keras_fit", 1),
    "keras_fit_100": ("keras_fit", 100),
    "keras_fit_jit_100": ("keras_fit_jit", 100),
}
STRATEGIES = ("one_device", "mirrored2")
# kind -> the module it needs beyond the project's requirements, and how to install it. Orbit ships in
# tf-models-official, whose requirements pin an older TensorFlow: hence --no-deps, and tf-keras (which
# Orbit imports) at the installed TensorFlow's version. Neither changes what `import keras` gives (Keras 3).
OPTIONAL_MODULES = {
    "orbit": (
        "orbit",
        "pip install --no-deps tf-models-official tf-keras=={}.*".format(".".join(tf.__version__.split(".")[:2])),
    ),
}


def unavailable(contender):
  """Returns why `contender` cannot run here ("not installed: <pip command>"), or None when it can."""
  module, install = OPTIONAL_MODULES.get(CONTENDERS[contender][0], (None, None))
  if module is None or importlib.util.find_spec(module) is not None:
    return None
  return f"not installed: {install}"


def make_strategy(name):
  """Returns the tf.distribute strategy called `name` (one of STRATEGIES).

  `mirrored2` splits the CPU into two logical devices first, so it must run
  before any other TensorFlow op in the process.
  """
  if name == "one_device":
    return tf.distribute.OneDeviceStrategy("/cpu:0")
  devices = strategies.virtual_cpus(2)
  return tf.distribute.MirroredStrategy([device.name for device in devices])


def make_examples(workload):
  """Returns the unbatched synthetic dataset: seeded Gaussian features, linear labels."""
  rng = np.random.default_rng(SEED)
  features = rng.standard_normal((workload.num_examples, NUM_FEATURES)).astype(np.float32)
  labels = np.argmax(features @ rng.standard_normal((NUM_FEATURES, NUM_CLASSES)), axis=1)
  return tf.data.Dataset.from_tensor_slices((features, labels.astype(np.int32)))


def make_distributed_dataset(strategy, workload):
  """Returns the repeated examples batched per replica and distributed over `strategy`."""

  def dataset_fn(input_context):
    batch_size = input_context.get_per_replica_batch_size(workload.global_batch_size)
    return make_examples(workload).repeat().batch(batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE)

  return strategy.distribute_datasets_from_function(dataset_fn)


def make_model(workload):
  """Returns the workload's MLP: 64 -> hidden units -> 10 logits, ReLU Dense layers."""
  layers = [keras.Input((NUM_FEATURES,))]
  layers += [keras.layers.Dense(units, activation="relu") for units in workload.hidden_units]
  layers.append(keras.layers.Dense(NUM_CLASSES))
  return keras.Sequential(layers)


def make_optimizer(name="sgd", ema_momentum=None):
  """Returns the benchmark optimizer: SGD with momentum, or Adam (`name="adam"`, learning rate 1e-4).

  With `ema_momentum`, it keeps a moving average of the weights (`use_ema=True`).
  """
  ema = {} if ema_momentum is None else {"use_ema": True, "ema_momentum": ema_momentum}
  if name == "adam":
    return keras.optimizers.Adam(learning_rate=1e-4, **ema)
  return keras.optimizers.SGD(learning_rate=LEARNING_RATE, momentum=0.9, **ema)


def timed(train):
  """Returns `train` timed: a function `steps -> {"seconds": wall, "cpu_seconds": CPU}` of `train(steps)`."""

  def timed_train(num_steps):
    wall, cpu = time.perf_counter(), time.process_time()
    train(num_steps)
    return {"seconds": time.perf_counter() - wall, "cpu_seconds": time.process_time() - cpu}

  return timed_train


class FitStopwatch(keras.callbacks.Callback):
  """Times `fit` from `on_train_begin` to `on_train_end`: the steps, not fit's set-up and tear-down.

  The tear-down matters: as `fit` returns, TensorFlow deletes the epoch's
  dataset iterator, which can block for as long again as the steps took
  (see the benchmarks section of the README).
  """

  def on_train_begin(self, logs=None):
    """Starts the wall and CPU clocks."""
    self.start = time.perf_counter(), time.process_time()

  def on_train_end(self, logs=None):
    """Stops the clocks into `self.timing`: `{"seconds", "cpu_seconds"}`."""
    self.timing = {"seconds": time.perf_counter() - self.start[0], "cpu_seconds": time.process_time() - self.start[1]}


def make_replica_step(strategy, workload):
  """Returns `step_fn(inputs) -> loss`: one replica's hand-written training step, for `strategy.run`.

  The model, optimizer and (in the `mlp` workload) accuracy metric are made in
  `strategy.scope()`; the loss is averaged over the global batch.
  """
  with strategy.scope():
    model = make_model(workload)
    optimizer = make_optimizer(workload.optimizer)
    optimizer.build(model.trainable_variables)  # Slots made in a tf.function fail under mirrored.
    accuracy = keras.metrics.SparseCategoricalAccuracy() if workload.accuracy else None

  def step_fn(inputs):
    features, labels = inputs
    with tf.GradientTape() as tape:
      logits = model(features, training=True)
      per_example_loss = keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)
      loss = tf.nn.compute_average_loss(per_example_loss, global_batch_size=workload.global_batch_size)
    gradients = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(gradients, model.trainable_variables))
    if accuracy is not None:
      accuracy.update_state(labels, logits)
    return loss

  return step_fn


def warm_loop(strategy, steps_per_call, warmup_steps, workload):
  """Warms up a hand-written tf.distribute loop; returns it timed (see `timed`).

  Each `tf.function` call runs `steps_per_call` steps (all but the last in a
  `tf.range` loop) and returns the last step's loss, which the host fetches
  once per call, as a practical loop that watches for NaN would.
  """
  step_fn = make_replica_step(strategy, workload)
  iterator = iter(make_distributed_dataset(strategy, workload))

  @tf.function
  def train_loop(iterator):
    if steps_per_call > 1:  # Python: the one-step function has no loop at all.
      for _ in tf.range(steps_per_call - 1):
        strategy.run(step_fn, args=(next(iterator),))
    loss = strategy.run(step_fn, args=(next(iterator),))
    return strategy.reduce(tf.distribute.ReduceOp.SUM, loss, axis=None)

  def train(num_steps):
    for _ in range(num_steps // steps_per_call):
      loss = float(train_loop(iterator))
      if loss != loss:  # noqa: PLR0124
        raise FloatingPointError("the loss is NaN")

  train(warmup_steps)
  return timed(train)


def warm_orbit(strategy, steps_per_call, warmup_steps, workload):
  """Warms up Orbit's `StandardTrainer` driven by `orbit.Controller`, as Orbit's users run it; returns it timed.

  The trainer runs `steps_per_call` steps per loop in a `tf.while_loop`
  (`StandardTrainerOptions(use_tf_while_loop=True)`) over the distributed
  dataset's iterator, which it keeps between `Controller.train` calls. Each
  step is `make_replica_step`'s, plus what Orbit asks of a trainer and its
  examples do: the loss's running mean in a Keras `Mean` metric (reset at each
  loop's start and returned at its end, which the Controller fetches and logs)
  and the global step advanced by one (`orbit.utils.create_global_step`, as
  Model Garden's trainer does). Timed around `Controller.train`, up to
  `steps` more steps.
  """
  import orbit  # noqa: PLC0415  # Optional: see OPTIONAL_MODULES.

  step_fn = make_replica_step(strategy, workload)
  with strategy.scope():
    global_step = orbit.utils.create_global_step()
    mean_loss = keras.metrics.Mean()
  replicas = strategy.num_replicas_in_sync

  class BenchmarkTrainer(orbit.StandardTrainer):
    """The workload's steps for `orbit.Controller`."""

    def train_loop_begin(self):
      mean_loss.reset_state()

    def train_step(self, iterator):
      def replica_step(inputs):
        mean_loss.update_state(step_fn(inputs) * replicas)  # A replica's loss is its share of the global mean.
        global_step.assign_add(1)

      strategy.run(replica_step, args=(next(iterator),))

    def train_loop_end(self):
      return {"loss": mean_loss.result()}

  trainer = BenchmarkTrainer(
      make_distributed_dataset(strategy, workload), options=orbit.StandardTrainerOptions(use_tf_while_loop=True)
  )
  controller = orbit.Controller(
      strategy=strategy, trainer=trainer, global_step=global_step, steps_per_loop=steps_per_call
  )

  def train(num_steps):
    controller.train(steps=int(global_step.numpy()) + num_steps)

  train(warmup_steps)
  return timed(train)


def warm_keras_fit(strategy, steps_per_call, warmup_steps, workload, jit_compile=False):
  """Warms up Keras `fit` with `steps_per_execution=steps_per_call`; returns it timed both ways.

  `seconds` and `cpu_seconds` are `FitStopwatch`'s (the steps only);
  `around_fit_seconds` and `around_fit_cpu_seconds` are timed around the
  `fit` call, what its caller waits for: set-up, steps and tear-down.
  """
  with strategy.scope():
    model = make_model(workload)
    model.compile(
        optimizer=make_optimizer(workload.optimizer),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=[keras.metrics.SparseCategoricalAccuracy()] if workload.accuracy else [],
        steps_per_execution=steps_per_call,
        jit_compile=jit_compile,
    )
  dataset = make_distributed_dataset(strategy, workload)

  def timed_train(num_steps):
    stopwatch = FitStopwatch()
    around_fit = timed(
        lambda steps: model.fit(dataset, steps_per_epoch=steps, epochs=1, verbose=0, callbacks=[stopwatch])
    )(num_steps)
    return {
        **stopwatch.timing,
        "around_fit_seconds": around_fit["seconds"],
        "around_fit_cpu_seconds": around_fit["cpu_seconds"],
    }

  timed_train(warmup_steps)
  return timed_train


class _LossOnly(runner.tasks.Classification):
  """Classification without the accuracy metric: the `small` workload's task."""

  def metrics(self):
    return []


def warm_trainer(
    strategy, steps_per_call, warmup_steps, workload, jit_compile=False, model_dir=None, ema_momentum=None
):
  """Warms up `runner.Trainer` with `steps_per_loop=steps_per_call`; returns it timed (see `timed`).

  With `ema_momentum`, its optimizer keeps a moving average of the weights.

  `Trainer.train` takes a total step count, so each call continues the last.
  """
  trainer = runner.Trainer(
      strategy,
      model_fn=lambda: make_model(workload),
      optimizer_fn=lambda: make_optimizer(workload.optimizer, ema_momentum),
      task=runner.tasks.Classification(from_logits=True) if workload.accuracy else _LossOnly(from_logits=True),
      steps_per_loop=steps_per_call,
      jit_compile=jit_compile,
      model_dir=model_dir,
  )
  examples = make_examples(workload).repeat()

  def train(num_steps):
    trainer.train(examples, global_batch_size=workload.global_batch_size, steps=trainer.global_step + num_steps)

  if model_dir is not None:  # After the first call's checkpoint, the loops run unchecked: traced in the warm-up too.
    train(steps_per_call)
  train(warmup_steps)
  return timed(train)


WARM_UPS = {
    "trainer": warm_trainer,
    "trainer_jit": functools.partial(warm_trainer, jit_compile=True),
    "trainer_ema": functools.partial(warm_trainer, ema_momentum=0.999),
    "trainer_dir": lambda *args: warm_trainer(*args, model_dir=tempfile.mkdtemp(prefix=f"trainer_dir-{os.getpid()}-")),
    "loop": warm_loop,
    "orbit": warm_orbit,
    "keras_fit": warm_keras_fit,
    "keras_fit_jit": functools.partial(warm_keras_fit, jit_compile=True),
}


def remove_model_dirs():
  """Removes the model_dirs this process made for "trainer_dir" contenders."""
  for path in os.listdir(tempfile.gettempdir()):
    if path.startswith(f"trainer_dir-{os.getpid()}-"):
      shutil.rmtree(os.path.join(tempfile.gettempdir(), path), ignore_errors=True)


def describe_error(error):
  """Returns one line naming `error`: its type and the root cause of a TensorFlow op error."""
  lines = [line.strip() for line in str(error).splitlines() if line.strip()]
  # An op error starts with "Graph execution error:"; its cause reads "(0) INVALID_ARGUMENT: ...".
  causes = [line for line in lines if re.match(r"(\(\d+\) )?[A-Z_]+: ", line)]
  return f"{type(error).__name__}: {(causes or lines or [''])[0]}"[:300]


def measure(contender, strategy_name, warmup_steps, steps, workload="mlp", steps_per_call=None, global_batch_size=None):
  """Runs one contender and returns its result row (a dict, see the module doc).

  `steps_per_call` and `global_batch_size`, where given, replace the
  contender's steps per call and the workload's global batch.

  Raises:
    ValueError: a step count is not a positive multiple of the contender's
      steps per call.
  """
  kind, own_steps_per_call = CONTENDERS[contender]
  steps_per_call = steps_per_call or own_steps_per_call
  sized = WORKLOADS[workload]
  if global_batch_size is not None:
    sized = dataclasses.replace(sized, global_batch_size=global_batch_size)
  for flag, value in (("warmup_steps", warmup_steps), ("steps", steps)):
    if not kind.startswith("trainer") and (value < steps_per_call or value % steps_per_call):  # Any total.
      raise ValueError(
          f"--{flag}={value} must be a positive multiple of {steps_per_call}, the steps per call of {contender}."
      )
  row = {"contender": contender, "strategy": strategy_name, "workload": workload}
  if steps_per_call != own_steps_per_call or sized != WORKLOADS[workload]:
    row.update(steps_per_call=steps_per_call, global_batch_size=sized.global_batch_size)
  if unavailable(contender):
    return {**row, "error": unavailable(contender)}
  try:
    strategy = make_strategy(strategy_name)
    # Progress lines of the contender go to stderr; stdout carries the result only.
    with contextlib.redirect_stdout(sys.stderr):
      timed_train = WARM_UPS[kind](strategy, steps_per_call, warmup_steps, sized)
      timing = timed_train(steps)
  except Exception as error:  # noqa: BLE001
    traceback.print_exc()
    return {**row, "error": describe_error(error)}
  return {**row, "steps": steps, **timing, "steps_per_sec": steps / timing["seconds"]}


def main(argv=None):
  """Runs the benchmark with the command-line arguments `argv` (default: `sys.argv[1:]`)."""
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--contender", required=True, choices=sorted(CONTENDERS))
  parser.add_argument("--strategy", required=True, choices=STRATEGIES)
  parser.add_argument("--warmup_steps", type=int, required=True, help="untimed steps first (tracing, first loops)")
  parser.add_argument("--steps", type=int, required=True, help="timed steps after the warm-up")
  parser.add_argument("--workload", default="mlp", choices=sorted(WORKLOADS))
  parser.add_argument("--steps_per_call", type=int, help="run the contender's kind with this many steps per call")
  parser.add_argument("--global_batch_size", type=int, help="train the workload with this global batch")
  args = parser.parse_args(argv)
  for flag in ("steps_per_call", "global_batch_size"):
    if getattr(args, flag) is not None and getattr(args, flag) < 1:
      parser.error(f"--{flag} must be >= 1, got {getattr(args, flag)}.")
  absl_logging.set_verbosity(absl_logging.WARNING)  # The Trainer's progress lines are INFO.
  try:
    row = measure(
        args.contender,
        args.strategy,
        args.warmup_steps,
        args.steps,
        args.workload,
        args.steps_per_call,
        args.global_batch_size,
    )
  except ValueError as error:
    parser.error(str(error))
  print(json.dumps(row), flush=True)
  remove_model_dirs()
  # Skip the interpreter's tear-down: deleting a live, autotuned dataset iterator can block for seconds.
  process_exit.exit_now(0)


if __name__ == "__main__":
  main()
