"""Training under ParameterServerStrategy: steps scheduled onto the workers by a ClusterCoordinator.

The coordinator (the chief) runs the Trainer's outer loop; the workers run the
steps, as functions it schedules; the variables live on the ps tasks. Three
parts differ from the synchronous loops of `runner.training.loops`:

- `per_worker_iterator`: each worker reads its own share of the training
  data, disjoint from the others' (the provider's sharding, as for one input
  pipeline per worker: worker `k` of `N` is pipeline `k` of `N`), repeated
  and batched by the global batch size; a function scheduled onto a worker
  trains on that worker's next batches. So the input work per worker does
  not grow with the number of workers, and each example is read once per
  epoch of its worker's share. Which worker runs which steps is the
  coordinator's choice, so the batch of a given step is not fixed (it is,
  with one worker: the single-device run's). A resumed run at global step
  `S` starts every worker at batch `S // N` of its share; a worker that
  failed and came back starts its share again where the `train` call began.
- `ScheduledTrainLoop`: the call contract of `loops.TrainLoop`; a call
  schedules its steps as one function per worker and joins them, so the
  global step (a variable on a ps) is exact when the actions run.
- `evaluation_strategy`: evaluation runs on the coordinator itself, under
  TensorFlow's default strategy, reading the weights from the ps tasks; it
  counts every example exactly once.
"""

import collections
from collections.abc import Callable, Sequence
import math
import re
import statistics
import threading
import time
from typing import Any

from absl import logging
import tensorflow as tf

from runner import interfaces
from runner.data import pipeline as input_pipeline
from runner.training import loops
from strategies import peers
from strategies import sharded_variables
from strategies.errors import ClusterError
from strategies.errors import ConfigError

SUM = tf.distribute.ReduceOp.SUM
# What a scheduled function returns, besides the metric states: its steps and loss sum, then its last step's loss
# and checks (each finite exactly when that part of the step was; see `loops.TrainLoop`).
_RESULT = ("steps_run", "loss_sum", "loss", "gradients", "features", "labels", "label_range")
_PS_TASK = re.compile(r"/job:ps/(?:replica:\d+/)?task:(\d+)")
# A worker whose function has not returned after STALL_FACTOR times the median of the last loops' times (at least
# STALL_MIN_SECONDS; FIRST_LOOP_STALL_SECONDS for the first loop) is named in a warning; the loop waits on.
STALL_FACTOR = 10
STALL_MIN_SECONDS = 5.0
FIRST_LOOP_STALL_SECONDS = 60.0
_TIMED_LOOPS = 20  # How many of the last loops' times the median is taken over.


def is_parameter_server(strategy: tf.distribute.Strategy) -> bool:
  """Whether `strategy` is a ParameterServerStrategy (its steps are scheduled by a ClusterCoordinator)."""
  return isinstance(strategy, tf.distribute.experimental.ParameterServerStrategy)


def coordinator_for(strategy: tf.distribute.Strategy, *, jit_compile: bool) -> Any:
  """Returns the `ClusterCoordinator` that schedules a Trainer's steps under `strategy`, or None for other strategies.

  It enables sharded Keras variables on `strategy` first.

  Raises:
    ConfigError: `jit_compile` under parameter servers.
  """
  if not is_parameter_server(strategy):
    return None
  if jit_compile:
    raise ConfigError(
        "jit_compile=True does not work under parameter_server: a step compiled with XLA on a worker cannot "
        "read the variables, which live on the ps tasks (TensorFlow's XLA known issue "
        "'tf.Variable on a different device'). Set jit_compile=False."
    )
  sharded_variables.enable(strategy)
  return tf.distribute.coordinator.ClusterCoordinator(strategy)


def num_workers(strategy: tf.distribute.Strategy) -> int:
  """The number of worker tasks of a ParameterServerStrategy."""
  return cluster_spec(strategy).num_tasks("worker")


def cluster_spec(strategy: tf.distribute.Strategy) -> tf.train.ClusterSpec:
  """The cluster of a ParameterServerStrategy: its resolver's, or TF_CONFIG's under TensorFlow's own class.

  (TensorFlow's class returns None for `cluster_resolver`; `strategies.ParameterServerStrategy` its resolver.)
  """
  return (strategy.cluster_resolver or tf.distribute.cluster_resolver.TFConfigClusterResolver()).cluster_spec()


def evaluation_strategy(strategy: tf.distribute.Strategy) -> tf.distribute.Strategy:
  """The strategy evaluation runs under: TensorFlow's default one (the coordinator itself) for parameter servers.

  Called outside any strategy's scope (as the Trainer calls it), where `tf.distribute.get_strategy()` is that one.
  """
  return tf.distribute.get_strategy() if is_parameter_server(strategy) else strategy


class _WorkerShare(interfaces.DatasetProvider):
  """Another provider's share for one worker: its input pipeline `index` of `workers` (the worker's index).

  `index` is a Python int or, as the dataset function is traced once for
  every worker, the worker's index as a scalar tensor
  (`experimental_get_current_worker_index`). A provider that cannot take a
  tensor for `input_pipeline_id` (it slices a Python list with it, as
  TFRecordFiles sharding by file does) gets a Python int: the dataset
  function then holds one pipeline per worker, and `tf.switch_case` runs the
  worker's own.
  """

  def __init__(self, provider: interfaces.DatasetProvider, *, index: Any, workers: int) -> None:
    self._provider = provider
    self._index = index
    self._workers = workers

  def _context(self, input_context: tf.distribute.InputContext, index: Any) -> tf.distribute.InputContext:
    return tf.distribute.InputContext(
        num_input_pipelines=self._workers,
        input_pipeline_id=index,
        num_replicas_in_sync=input_context.num_replicas_in_sync,
    )

  def _of_worker(
      self, make: Callable[[tf.distribute.InputContext], tf.data.Dataset], input_context: tf.distribute.InputContext
  ) -> tf.data.Dataset:
    """`make(context of this worker's pipeline)`, by the tensor index if the provider takes it, else by a switch."""
    try:
      return make(self._context(input_context, self._index))
    except TypeError:  # It needs a Python int (OperatorNotAllowedInGraphError is a TypeError too).
      if isinstance(self._index, int):
        raise
      branches = [lambda i=i: make(self._context(input_context, i)) for i in range(self._workers)]
      return tf.switch_case(tf.cast(self._index, tf.int32), branches)

  def get_dataset(self, input_context: tf.distribute.InputContext) -> tf.data.Dataset:
    return self._of_worker(self._provider.get_dataset, input_context)

  def get_repeated_batches(
      self, input_context: tf.distribute.InputContext, batch_size: int, start: int
  ) -> tf.data.Dataset:
    """The provider's own repeated batches of this worker's share, from its example `start` on."""
    return self._of_worker(
        lambda context: self._provider.get_repeated_batches(context, batch_size, start), input_context
    )


def per_worker_iterator(
    coordinator: Any,
    data: interfaces.DatasetProvider,
    global_batch_size: int,
    *,
    start_step: int,
    preprocess: Callable[[Any], Any] | None = None,
) -> Any:
  """Returns the per-worker iterator of the training data from global step `start_step` on (see the module docstring).

  Worker `k` of `N` reads `input_pipeline.for_training` of its share of
  `data` (pipeline `k` of `N`), in batches of `global_batch_size`, from
  batch `start_step // N` of its share on. `preprocess` (the task's) maps
  each batch's features.

  Raises:
    ConfigError: the elements are not of the contract's form.
  """
  input_pipeline.element_spec(data, "training")  # Checked here: errors inside the traced dataset_fn are garbled.
  strategy = coordinator.strategy
  workers = num_workers(strategy)

  def dataset_fn() -> tf.data.Dataset:
    index = 0 if workers == 1 else tf.distribute.coordinator.experimental_get_current_worker_index()
    share = _WorkerShare(data, index=index, workers=workers)
    return input_pipeline.for_training(
        strategy, share, global_batch_size, start_step=start_step // workers, preprocess=preprocess
    )

  return iter(coordinator.create_per_worker_dataset(dataset_fn))


class ScheduledTrainLoop(loops.TrainLoop):
  """A `loops.TrainLoop` whose steps run on the workers, scheduled by a `ClusterCoordinator`.

  A call of `num_steps` steps schedules them as one function of consecutive
  steps per worker (split evenly), then joins them. Each
  function runs its steps in a `tf.range` loop on its worker, advances the
  global step variable (on a ps) with every step, stops early at a step
  whose loss or gradients are not finite, and returns its loss sum and the
  change of every metric's state. Metrics are updated statelessly
  (`stateless_update_state`) in the function and their states summed on the
  coordinator: concurrent workers updating one Keras 3 metric variable would
  lose updates (it adds by a read and a write). Likewise the optimizer's
  `iterations` is set to the global step after each call.

  The result's `steps_run` is the global step's advance (exact after the
  join), `loss` the mean loss of the steps the functions completed, and
  `stop_signal` the coordinator's own: workers and ps tasks only serve.

  A worker that stalls (frozen, swapping, its host overloaded) holds the
  join; when a loop has waited `stall_seconds()`, one warning names the
  workers whose function of the loop has not returned (each function marks
  its worker done in a small variable on a ps as it ends).
  """

  def __init__(self, *, coordinator: Any, **kwargs: Any) -> None:
    """Initializes the `ScheduledTrainLoop`.

    Args:
      coordinator: the `ClusterCoordinator` of the strategy.
      **kwargs: as for `loops.TrainLoop` (`looping` excluded).

    Raises:
      ConfigError: a metric cannot update statelessly (a tf_keras metric).
    """
    super().__init__(looping=False, multi_worker=True, **kwargs)
    stateful = [metric.name for metric in self._metrics if not hasattr(metric, "stateless_update_state")]
    if stateful:
      raise ConfigError(
          f"Under parameter servers the Trainer updates metrics statelessly, which the metric(s) {stateful} of "
          "Task.metrics() cannot (tf_keras metrics cannot); return Keras 3 metrics (keras.metrics), also for a "
          "tf_keras model."
      )
    self._coordinator = coordinator
    self._num_workers = num_workers(coordinator.strategy)
    self.function = loops.own_function(self._scheduled_steps)
    with coordinator.strategy.scope():  # The loop (its first global step) each worker finished last.
      self._finished = tf.Variable(tf.fill([self._num_workers], tf.constant(-1, tf.int64)), trainable=False)
    self._loop_seconds: collections.deque[float] = collections.deque(maxlen=_TIMED_LOOPS)

  def __call__(self, iterator: Any, num_steps: int, stop_signal: int | None) -> loops.TrainLoopResult:
    """Runs `num_steps` steps on the workers from the per-worker `iterator`; returns a `loops.TrainLoopResult`.

    A ps task that is gone raises one of `peers.PEER_ERRORS` (see `lost_ps`);
    a worker that is gone is not an error: the coordinator runs its function
    on another worker.
    """
    first = int(self._step.numpy())
    loop = tf.constant(first, tf.int64)
    scheduled = [
        self._coordinator.schedule(self.function, args=(iterator, tf.constant(size, tf.int32), loop))
        for size in function_sizes(num_steps, self._num_workers)
    ]
    self._join(first)
    outputs = [remote.fetch() for remote in scheduled]
    step = int(self._step.numpy())
    self._optimizer.iterations.assign(step)
    learning_rate = float(tf.cast(self._keras.learning_rate(self._optimizer), tf.float32).numpy())
    values = [dict(zip(_RESULT, vector.tolist())) for vector, _ in outputs]
    steps_run = sum(v["steps_run"] for v in values)
    bad = [v for v in values if not all(math.isfinite(v[name]) for name in _RESULT[2:])]
    return loops.TrainLoopResult(
        steps_run=step - first,
        loss=sum(v["loss_sum"] for v in values) / max(steps_run, 1),
        learning_rate=learning_rate,
        metrics=self._metric_results([states for _, states in outputs]),
        stop_signal=stop_signal,
        bad_step=bad[0] if bad else None,
    )

  def trace(self, iterator: Any) -> bool:
    """Traces the scheduled function on first use by running it for zero steps on a worker; see `TrainLoop.trace`."""
    if self.function.experimental_get_tracing_count():
      return False
    self._coordinator.schedule(self.function, args=(iterator, tf.constant(0, tf.int32), tf.constant(-1, tf.int64)))
    self._coordinator.join()
    return True

  def stall_seconds(self) -> float:
    """How long a loop waits for its functions before the stalled workers are named (see the module constants)."""
    if not self._loop_seconds:
      return FIRST_LOOP_STALL_SECONDS
    return max(STALL_MIN_SECONDS, STALL_FACTOR * statistics.median(self._loop_seconds))

  def _join(self, first: int) -> None:
    """Joins the functions of the loop from step `first`, naming stalled workers once it has waited `stall_seconds`."""
    seconds = self.stall_seconds()
    timer = threading.Timer(seconds, self._warn_stalled, args=(first, seconds))
    timer.daemon = True
    start = time.perf_counter()
    timer.start()
    try:
      self._coordinator.join()
    finally:
      timer.cancel()
    self._loop_seconds.append(time.perf_counter() - start)

  def _warn_stalled(self, first: int, seconds: float) -> None:
    late = [index for index, loop in enumerate(self._finished.numpy().tolist()) if loop != first]
    addresses = cluster_spec(self._coordinator.strategy).job_tasks("worker")
    logging.warning(
        "%s has not finished its steps of the loop from step %d after %.1f s (%d x the median of the last loops, "
        "at least %g s): it is stalled or far slower than the other workers; the loop waits for it.",
        " and ".join(f"worker:{index} ({addresses[index]})" for index in late) or "A worker",
        first,
        seconds,
        STALL_FACTOR,
        STALL_MIN_SECONDS,
    )

  def _metric_results(self, per_function_states: Sequence[Sequence[Any]]) -> dict[str, float]:
    results = {}
    for i, metric in enumerate(self._metrics):
      initial = [v.numpy() for v in metric.stateless_reset_state()]
      changes = [states[i] for states in per_function_states]
      results[metric.name] = float(
          metric.stateless_result([start + sum(change[j] for change in changes) for j, start in enumerate(initial)])
      )
    return results

  def _scheduled_steps(self, iterator: Any, num_steps: tf.Tensor, loop: tf.Tensor) -> tuple[tf.Tensor, list[Any]]:
    """Runs at most `num_steps` steps on this worker's next batches; returns `(_RESULT vector, metric changes)`.

    At its end it marks this worker as done with `loop` (the loop's first global step).
    """
    changes = [[tf.zeros_like(v) for v in metric.stateless_reset_state()] for metric in self._metrics]
    loss_sum = tf.constant(0.0)
    sums = tf.zeros([len(_RESULT) - 2])
    steps_run = tf.constant(0.0)
    for _ in tf.range(num_steps):
      per_replica = self._strategy.run(self._replica_step_with_metric_changes, args=(next(iterator),))
      sums, step_changes = tf.nest.map_structure(
          lambda value: self._strategy.reduce(SUM, value, axis=None), per_replica
      )
      with tf.control_dependencies([sums]):
        self._step.assign_add(1)
      changes = tf.nest.map_structure(tf.add, changes, step_changes)
      loss_sum += sums[0]
      steps_run += 1.0
      if not tf.math.is_finite(tf.reduce_sum(sums)):  # The loss or a check (see `loops.TrainLoop`).
        break
    result = tf.concat([tf.stack([steps_run, loss_sum]), sums], axis=0)
    with tf.control_dependencies([result, *tf.nest.flatten(changes)]):
      worker = 0 if self._num_workers == 1 else tf.distribute.coordinator.experimental_get_current_worker_index()
      self._finished.scatter_nd_update([[worker]], [loop])
    return result, changes

  def _replica_step_with_metric_changes(self, batch: Sequence[Any]) -> tuple[tf.Tensor, list[Any]]:
    loss, outputs, gradients = self._replica_step(batch, tf.zeros([2]), update=False)
    self.apply(gradients)
    sample_weight = batch[2] if len(batch) == 3 else None
    changes = []
    for metric in self._metrics:
      initial = metric.stateless_reset_state()
      updated = metric.stateless_update_state(initial, batch[1], outputs, sample_weight=sample_weight)
      changes.append([new - old for new, old in zip(updated, initial)])
    return tf.stack([loss, *self.checks(batch, gradients)]), changes


def function_sizes(num_steps: int, workers: int) -> list[int]:
  """Splits `num_steps` into the step counts of the functions to schedule: one per worker, as even as possible.

  A loop's size is the per-worker steps per loop times the workers
  (`steps_per_loop.resolve`), so each function has at most the per-worker
  value; with fewer steps than workers, one step each.
  """
  count = min(workers, num_steps)
  base, extra = divmod(num_steps, count)
  return [base + (1 if i < extra else 0) for i in range(count)]


def lost_ps(error: Exception, strategy: tf.distribute.Strategy, *, step: int, saved_step: int | None) -> ClusterError:
  """Returns the ClusterError for `error`, one of `peers.PEER_ERRORS` raised on the coordinator: a ps task is gone.

  The ps tasks whose port no longer answers are named (else those the
  error names). Their variables are lost with them, so the coordinator
  cannot go on; a restart of every task resumes from the last checkpoint.

  Args:
    error: the TensorFlow error.
    strategy: the ParameterServerStrategy.
    step: the last global step the coordinator knew.
    saved_step: the step of the latest checkpoint, or None.
  """
  addresses = cluster_spec(strategy).job_tasks("ps")
  gone = [i for i, address in enumerate(addresses) if not peers.listening(address)]
  gone = gone or sorted({int(i) for i in _PS_TASK.findall(getattr(error, "message", str(error)))})
  named = " and ".join(f"ps:{i} ({addresses[i]})" for i in gone) or "a parameter server"
  resume = f"from its last checkpoint, at step {saved_step}" if saved_step else "from step 0 (no checkpoint yet)"
  return ClusterError(
      f"The coordinator lost {named} after step {step} ({type(error).__name__}); the variables it held are gone, "
      f"so training cannot go on. Restart every task with the same command; the run resumes {resume}."
  )
