"""Training under ParameterServerStrategy: steps scheduled onto the workers by a ClusterCoordinator.

The coordinator (the chief) runs the Trainer's outer loop; the workers run the
steps, as functions it schedules; the variables live on the ps tasks. Three
parts differ from the synchronous loops of `runner.training.loops`:

- `per_worker_iterator`: every worker reads the whole training stream (the
  strategy gives each worker one input pipeline, the same on all), numbered
  by step, so that the function scheduled for steps `s .. s+n-1` trains on
  the batches of exactly those steps, whichever worker runs it: a worker
  skips the batches the others took. The batch of step `s` is the one a
  single-device run trains on at step `s`, and a resumed run goes on from
  the batch of its step. (Every worker reads, but trains on its own steps
  only; a function re-run after a worker failed trains on the batches its
  new worker is at.)
- `ScheduledTrainLoop`: the call contract of `loops.TrainLoop`; a call
  schedules its steps as one function per worker and joins them, so the
  global step (a variable on a ps) is exact when the actions run.
- `evaluation_strategy`: evaluation runs on the coordinator itself, under
  TensorFlow's default strategy, reading the weights from the ps tasks; it
  counts every example exactly once.
"""

from collections.abc import Callable, Sequence
import math
import re
from typing import Any

import tensorflow as tf
from tensorflow.python.distribute import distribute_lib  # noqa: TID251

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
  return strategy.extended._num_workers  # noqa: SLF001


def evaluation_strategy(strategy: tf.distribute.Strategy) -> tf.distribute.Strategy:
  """The strategy evaluation runs under: TensorFlow's default one (the coordinator itself) for parameter servers."""
  if is_parameter_server(strategy):
    return distribute_lib._get_default_strategy()  # noqa: SLF001
  return strategy


class _StepNumbered(interfaces.DatasetProvider):
  """Another provider's examples, each with its number in the stream: `((number, features), labels[, weight])`."""

  def __init__(self, provider: interfaces.DatasetProvider) -> None:
    self._provider = provider

  def get_dataset(self, input_context: tf.distribute.InputContext) -> tf.data.Dataset:
    return _numbered(self._provider.get_dataset(input_context), 0)

  def get_repeated_dataset(self, input_context: tf.distribute.InputContext, start: int) -> tf.data.Dataset:
    return _numbered(self._provider.get_repeated_dataset(input_context, start), start)

  def get_repeated_batches(
      self, input_context: tf.distribute.InputContext, batch_size: int, start: int
  ) -> tf.data.Dataset:
    """The provider's own batches (e.g. TFRecordFiles' parsed at once), their examples numbered as one by one."""
    batches = self._provider.get_repeated_batches(input_context, batch_size, start)
    return tf.data.Dataset.zip((tf.data.Dataset.counter(start, batch_size), batches)).map(
        lambda first, batch: ((first + tf.range(batch_size, dtype=tf.int64), batch[0]),) + tuple(batch[1:])
    )


def _numbered(dataset: tf.data.Dataset, start: int) -> tf.data.Dataset:
  """`dataset`'s elements `(features, labels[, weight])` as `((number, features), labels[, weight])`, from `start`."""
  return tf.data.Dataset.zip((tf.data.Dataset.counter(start), dataset)).map(
      lambda number, element: ((number, element[0]),) + tuple(element[1:])
  )


def per_worker_iterator(
    coordinator: Any,
    data: interfaces.DatasetProvider,
    global_batch_size: int,
    *,
    start_step: int,
    preprocess: Callable[[Any], Any] | None = None,
) -> Any:
  """Returns the per-worker iterator of the training stream from `start_step` on (see the module docstring).

  Each worker's dataset is `input_pipeline.for_training` of `data`, its
  examples numbered; a batch's first number over `global_batch_size` is its
  step. `preprocess` (the task's) maps each batch's features, not their numbers.

  Raises:
    ConfigError: the elements are not of the contract's form.
  """
  input_pipeline.element_spec(data, "training")  # Checked here: errors inside the traced dataset_fn are garbled.
  numbered = _StepNumbered(data)
  strategy = coordinator.strategy

  def dataset_fn() -> tf.data.Dataset:
    return input_pipeline.for_training(
        strategy,
        numbered,
        global_batch_size,
        start_step=start_step,
        preprocess=None if preprocess is None else lambda numbered: (numbered[0], preprocess(numbered[1])),
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
    self.function = tf.function(self._scheduled_steps)

  def __call__(self, iterator: Any, num_steps: int, stop_signal: int | None) -> loops.TrainLoopResult:
    """Runs `num_steps` steps on the workers from the per-worker `iterator`; returns a `loops.TrainLoopResult`.

    A ps task that is gone raises one of `peers.PEER_ERRORS` (see `lost_ps`);
    a worker that is gone is not an error: the coordinator runs its function
    on another worker.
    """
    first = int(self._step.numpy())
    scheduled, start = [], first
    for size in function_sizes(num_steps, self._num_workers):
      scheduled.append(
          self._coordinator.schedule(
              self.function, args=(iterator, tf.constant(start, tf.int64), tf.constant(size, tf.int32))
          )
      )
      start += size
    self._coordinator.join()
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
        non_finite=loops.non_finite_cause(bad[0]) if bad else None,
        non_finite_data=loops.non_finite_data(bad[0]) if bad else (),
        labels_out_of_range=bool(bad) and not math.isfinite(bad[0]["label_range"]),
    )

  def trace(self, iterator: Any) -> bool:
    """Traces the scheduled function on first use by running it for zero steps on a worker; see `TrainLoop.trace`."""
    if self.function.experimental_get_tracing_count():
      return False
    step = tf.constant(int(self._step.numpy()), tf.int64)
    self._coordinator.schedule(self.function, args=(iterator, step, tf.constant(0, tf.int32)))
    self._coordinator.join()
    return True

  def _metric_results(self, per_function_states: Sequence[Sequence[Any]]) -> dict[str, float]:
    results = {}
    for i, metric in enumerate(self._metrics):
      initial = [v.numpy() for v in metric.stateless_reset_state()]
      changes = [states[i] for states in per_function_states]
      results[metric.name] = float(
          metric.stateless_result([start + sum(change[j] for change in changes) for j, start in enumerate(initial)])
      )
    return results

  def _scheduled_steps(self, iterator: Any, first_step: tf.Tensor, num_steps: tf.Tensor) -> tuple[tf.Tensor, list[Any]]:
    """Runs steps `first_step ..` (at most `num_steps`) on this worker; returns `(_RESULT vector, metric changes)`."""
    changes = [[tf.zeros_like(v) for v in metric.stateless_reset_state()] for metric in self._metrics]
    loss_sum = tf.constant(0.0)
    sums = tf.zeros([len(_RESULT) - 2])
    steps_run = tf.constant(0.0)
    for i in tf.range(num_steps):
      batch = self._batch_of_step(iterator, first_step + tf.cast(i, tf.int64))
      per_replica = self._strategy.run(self._replica_step_with_metric_changes, args=(batch,))
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
    return tf.concat([tf.stack([steps_run, loss_sum]), sums], axis=0), changes

  def _batch_of_step(self, iterator: Any, step: tf.Tensor) -> Any:
    """The next batch of the worker's stream whose step is at least `step` (the batches before are skipped)."""
    batch = next(iterator)
    while self._step_of(batch) < step:
      batch = next(iterator)
    return batch

  def _step_of(self, batch: Any) -> tf.Tensor:
    numbers = self._strategy.experimental_local_results(batch[0][0])[0]
    return numbers[0] // self._global_batch_size

  def _replica_step_with_metric_changes(self, batch: Sequence[Any]) -> tuple[tf.Tensor, list[Any]]:
    batch = (batch[0][1],) + tuple(batch[1:])
    sample_weight = batch[2] if len(batch) == 3 else None
    loss, outputs, checks = self._update(batch[0], batch[1], sample_weight)
    changes = []
    for metric in self._metrics:
      initial = metric.stateless_reset_state()
      updated = metric.stateless_update_state(initial, batch[1], outputs, sample_weight=sample_weight)
      changes.append([new - old for new, old in zip(updated, initial)])
    return tf.stack([loss, *checks]), changes


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
  addresses = strategy._cluster_resolver.cluster_spec().job_tasks("ps")  # noqa: SLF001
  gone = [i for i, address in enumerate(addresses) if not peers.listening(address)]
  gone = gone or sorted({int(i) for i in _PS_TASK.findall(getattr(error, "message", str(error)))})
  named = " and ".join(f"ps:{i} ({addresses[i]})" for i in gone) or "a parameter server"
  resume = f"from its last checkpoint, at step {saved_step}" if saved_step else "from step 0 (no checkpoint yet)"
  return ClusterError(
      f"The coordinator lost {named} after step {step} ({type(error).__name__}); the variables it held are gone, "
      f"so training cannot go on. Restart every task with the same command; the run resumes {resume}."
  )
