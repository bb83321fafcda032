"""`check_tpu(config)`: on a CPU, before paying for a TPU, prove what a CPU can about running a config there.

The check builds the run's train and evaluation steps the way a TPU run
does: `jit_compile`, static shapes (training batches with `drop_remainder`,
evaluation batches padded with zero-weight examples) and `steps_per_loop`
as configured (auto resolves as on a TPU). Then, stopping at the first
problem:

1. both global batch sizes must split over the TPU's replicas;
2. every tensor reaching the device (each part of a training and an
   evaluation element) must be dense, of static shape and of a TPU dtype
   (`tpu_rules.element_problem`);
3. `TRAIN_STEPS` training steps and `EVAL_STEPS` evaluation batches are
   compiled with XLA and run on mirrored logical CPUs;
4. every op of both replica steps (what a TPU compiles: the model, the
   loss, the metrics and the optimizer update) is checked against
   `tpu_rules.op_problem`, which names the layer an op came from. This comes
   before XLA's own verdict, since XLA on a CPU still compiles ops a TPU
   does not.

It writes nothing (no checkpoint, summary or workdir) and changes no global
state but the logical CPU split. What a CPU cannot prove is in `NOT_PROVEN`.
"""

from collections.abc import Callable, Sequence
import copy
import dataclasses
import functools
from typing import Any

from absl import logging
import ml_collections
import tensorflow as tf

from runner import from_config
from runner.config import run_config as config_lib
from runner.data import pipeline as input_pipeline
from runner.tpu import rules as tpu_rules
from runner.training import steps_per_loop as steps_per_loop_lib
import strategies
from strategies import checks

# A TPU v2-8 or v3-8 (8 cores), a v5e-8 or v6e-8 (8 chips); a multiple of a v4-8's or v5p-8's 4 chips.
DEFAULT_NUM_REPLICAS = 8
# The most logical CPUs the steps run on: each compiles its own copy of the step.
MAX_LOGICAL_CPUS = 8
TRAIN_STEPS = 2
EVAL_STEPS = 2
NOT_PROVEN = (
    "that the model, optimizer state and batches fit in TPU memory (HBM), and that every op XLA "
    "compiled for the CPU has a TPU kernel"
)


@dataclasses.dataclass(frozen=True)
class TPUCheckResult:
  """The verdict of `check_tpu`.

  Attributes:
    problem: None, or the first op, shape or dtype a TPU would reject and
      where it came from (a layer of the model, or a part of a dataset
      element), with the fix.
    num_replicas: the TPU replicas both global batch sizes were checked to
      split over.
    devices: the logical CPUs the steps ran on, one replica each.
    steps_per_loop: the training steps per loop the train step was built for.
    train_steps: the training steps compiled and run (0 when it failed before).
    eval_examples: the evaluation examples run through the padded evaluation
      step (0 when it failed before).
  """

  problem: str | None
  num_replicas: int
  devices: tuple[str, ...]
  steps_per_loop: int
  train_steps: int = 0
  eval_examples: int = 0

  @property
  def passed(self) -> bool:
    """Whether everything a CPU can prove held (no `problem`)."""
    return self.problem is None

  @property
  def summary(self) -> str:
    """One line: `PASS: ...` (what was proven, and what a CPU cannot prove) or `FAIL: <problem>`."""
    if not self.passed:
      return f"FAIL: {self.problem}"
    return (
        f"PASS: {self.train_steps} training steps (steps_per_loop={self.steps_per_loop}) and "
        f"{self.eval_examples} evaluation examples in padded batches compiled with XLA and ran on "
        f"{len(self.devices)} mirrored logical CPUs; both batch sizes split over {self.num_replicas} TPU "
        "replicas; every tensor reaching the device is dense, of static shape and a TPU dtype; no op runs "
        f"Python, has a data-dependent shape or a non-TPU dtype. Not provable on a CPU: {NOT_PROVEN}."
    )


class RecordingMirroredStrategy(strategies.MirroredStrategy):
  """A MirroredStrategy that remembers the ops each `run` adds to a graph being traced.

  Those ops are the replica step, what a TPU compiles into one program: the
  ops of `fn` on every replica and of the cross-replica work it asks for
  (all-reduces, variable updates). A `run` outside a trace records nothing.
  """

  def __init__(self, devices: Sequence[str]) -> None:
    """Initializes the `RecordingMirroredStrategy`.

    Args:
      devices: local device names, one replica each.
    """
    super().__init__(devices)
    self._traced: list[tuple[tf.Graph, list[tf.Operation]]] = []

  def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """As `tf.distribute.Strategy.run`; inside a trace, it also records the ops the call added."""
    if tf.executing_eagerly():
      return super().run(fn, *args, **kwargs)
    graph = tf.compat.v1.get_default_graph()
    first = len(graph.get_operations())
    result = super().run(fn, *args, **kwargs)
    self._traced.append((graph, graph.get_operations()[first:]))
    return result

  def take_traced(self) -> list[tuple[tf.Graph, list[tf.Operation]]]:
    """Returns the `(graph, ops)` recorded since the last call, and forgets them."""
    traced, self._traced = self._traced, []
    return traced


def check_tpu(
    config: ml_collections.ConfigDict, *, num_replicas: int | None = None, kept: list[Any] | None = None
) -> TPUCheckResult:
  """Checks on this CPU what a CPU can prove about running `config` on a TPU (see the module doc).

  The steps run on as many logical CPUs as there are replicas, at most
  `MAX_LOGICAL_CPUS` (the largest divisor of `num_replicas` up to it), split
  with `strategies.virtual_cpus` if TensorFlow has not initialized its
  devices yet (as in `python -m runner --check_tpu`); otherwise on the
  logical CPUs this process has (the result's `devices`). `config.strategy`
  is not built.

  Args:
    config: a run config, as for `runner.run`.
    num_replicas: the TPU's replicas; default `config.strategy.num_replicas`
      when set, else `DEFAULT_NUM_REPLICAS`.
    kept: None, or a list that receives the check's Trainer, which holds its
      training iterator. The command line keeps it until the process exits:
      in TensorFlow 2.21, deleting that iterator can block for minutes (each
      replica's tf.data iterator waits for its autotuning thread's timer).

  Returns:
    A `TPUCheckResult`; `passed` is False, with the `problem`, for anything
    a TPU would reject.

  Raises:
    ConfigError: the config is invalid, or the data or model functions
      return unusable objects (as `runner.run` would raise).
    FloatingPointError: a step's loss or gradients were not finite.
  """
  config = config_lib.validate(config)
  checks.positive_int(num_replicas, "num_replicas", optional=True)
  num_replicas = num_replicas or config.strategy.num_replicas or DEFAULT_NUM_REPLICAS
  devices = _logical_cpus(max(n for n in range(1, MAX_LOGICAL_CPUS + 1) if num_replicas % n == 0))
  config = copy.deepcopy(config)  # Built as for a TPU: jit_compile on, steps_per_loop resolved as on a TPU.
  config.trainer.jit_compile = True
  if config.trainer.steps_per_loop is None:
    config.trainer.steps_per_loop = steps_per_loop_lib.fixed_auto(
        (config.trainer.eval_every, config.trainer.checkpoint_every), tpu=True
    )
  verdict = functools.partial(
      TPUCheckResult, num_replicas=num_replicas, devices=tuple(devices), steps_per_loop=config.trainer.steps_per_loop
  )
  for field in ("global_batch_size", "eval_global_batch_size"):
    size = config.data[field]
    if size % num_replicas:
      nearest = [n for n in (size // num_replicas * num_replicas, (size // num_replicas + 1) * num_replicas) if n]
      return verdict(
          f"config.data.{field}={size} does not split over the {num_replicas} replicas of the TPU; "
          f"use a multiple of {num_replicas}, e.g. {' or '.join(map(str, nearest))}."
      )
  strategy = RecordingMirroredStrategy(devices)
  train_data, eval_data = (from_config.dataset(config, split) for split in ("train", "eval"))
  for data, purpose in ((train_data, "training"), (eval_data, "evaluation")):
    problem = tpu_rules.element_problem(input_pipeline.element_spec(data, purpose), f"the {purpose} data")
    if problem:
      return verdict(problem)
  trainer = from_config.create_trainer(config, strategy, None)
  if kept is not None:
    kept.append(trainer)
  problem = _run_step(
      strategy,
      trainer,
      "the train step",
      lambda: trainer.train(train_data, global_batch_size=config.data.global_batch_size, steps=TRAIN_STEPS),
  )
  if problem:
    return verdict(problem, train_steps=trainer.global_step)
  evaluated: dict[str, Any] = {}
  problem = _run_step(
      strategy,
      trainer,
      "the evaluation step",
      lambda: evaluated.update(
          trainer.evaluate(eval_data, global_batch_size=config.data.eval_global_batch_size, steps=EVAL_STEPS)
      ),
  )
  return verdict(problem, train_steps=trainer.global_step, eval_examples=evaluated.get("num_examples", 0))


def _logical_cpus(n: int) -> list[str]:
  """Returns the names of n logical CPUs, or of those this process has if TensorFlow already made its devices."""
  try:
    return [device.name for device in strategies.virtual_cpus(n)]
  except RuntimeError:
    existing = [device.name for device in tf.config.list_logical_devices("CPU")]
    logging.info("TensorFlow already initialized its devices; checking on the %d logical CPU(s) it has.", len(existing))
    return existing


def _run_step(
    strategy: RecordingMirroredStrategy, trainer: Any, step_name: str, run: Callable[[], object]
) -> str | None:
  """Traces, compiles and runs a step with `run()`; returns what a TPU would reject in it, or None.

  The rules are applied to the traced replica step before XLA's verdict is
  looked at, so a problem a TPU has and the CPU's XLA has not is named.
  """
  failure = None
  try:
    run()
  except (tf.errors.InvalidArgumentError, tf.errors.UnimplementedError, tf.errors.InternalError) as e:
    failure = e
  problem = tpu_rules.op_problem(strategy.take_traced(), trainer.model, step_name)
  if problem is None and failure is not None:
    first_line = (failure.message or str(failure)).strip().splitlines()[0]
    problem = f"{step_name} does not compile or run with XLA: {type(failure).__name__}: {first_line}"
  return problem
