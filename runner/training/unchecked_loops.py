"""Loops that run their steps unchecked, and run steps again with the checks when a loop's result is not finite.

A `loops.TrainLoop` checks every step (the batch's finiteness, the labels'
range, the gradients' finiteness): on a small step over two CPU replicas
that is 4 to 5% of the step (docs/benchmarks.md#what-the-per-step-checks-cost).
`UncheckedTrainLoop` adds to the hand-written step only its loss and a step
count, summed per replica without a cross-replica reduction, and checks once
per loop: the summed loss and every variable of the model and optimizer
finite. `RerunChecked` calls it once a checkpoint exists to fall back to;
when a loop is not finite (or raised part-way with a state that is not), it
restores the checkpoint saved last and runs the steps from there to the
loop's end again from the same batches with the checked `loops.TrainLoop`, which
stops at the first bad step and names it as it always does. No copy of the
variables is kept.
"""

from collections.abc import Callable, Sequence
import dataclasses
import math
from typing import Any

import tensorflow as tf

from runner.training import loops


class UncheckedTrainLoop(loops.TrainLoop):
  """A looping `loops.TrainLoop` whose steps carry no per-step check; the loop tells whether it stayed finite.

  Each replica adds its share of the loss and 1 (and, with `valid_labels`,
  the log of whether its labels were in range) to a variable of its own
  (`ON_READ`, summed when read), so a step has no cross-replica reduction
  beyond the optimizer's. The function runs `num_steps` steps (all of them:
  it does not stop at a bad one), and advances the global step by the steps
  run. Its vector holds the sums, the sum of every floating variable of
  `state` (finite exactly when they all are, see `loops.finite_sum`), the
  learning rate and the metrics.
  """

  def __init__(self, *, state: Sequence[Any], **arguments: Any) -> None:
    """Initializes the `UncheckedTrainLoop`.

    Args:
      state: the variables checked finite at each loop's end.
      **arguments: as for `loops.TrainLoop`, without `looping` (always on)
        and `multi_worker` (one worker). `valid_labels` is checked per step
        only when given: pass None where the task's loss fails by itself on
        a label out of range (an op error, or a NaN loss).
    """
    self._state = [v for v in state if tf.as_dtype(v.dtype).is_floating]
    super().__init__(looping=True, multi_worker=False, **arguments)
    self._unchecked_update = loops.maybe_xla(self._apply_update, self._whole_step_xla)
    self.function = loops.own_function(self._unchecked_steps)
    self._finite_sums = loops.own_function(lambda: tf.concat([self._totals.read_value(), [self._state_sum()]], axis=0))

  def run(self, iterator: Any, num_steps: int) -> tuple[loops.TrainLoopResult, bool]:
    """Runs `num_steps` steps; returns the `TrainLoopResult` and whether the loss and every variable stayed finite.

    Raises:
      tf.errors.OpError: as a step raised it; the global step counts the
        steps before it (see `finite_so_far`).
    """
    vector = self._vector(iterator, num_steps, self._stop_values[None])
    steps_run = self._steps_in(vector)
    result = loops.TrainLoopResult(
        steps_run=steps_run,
        loss=float(vector[0]) / steps_run if steps_run else math.nan,
        learning_rate=float(vector[4]),
        metrics={metric.name: value for metric, value in zip(self._metrics, vector[5:].tolist())},
    )
    return result, bool(math.isfinite(float(vector[:4].sum())))

  def finite_so_far(self) -> bool:
    """Whether the loss summed so far and every variable are finite (after a call raised part-way)."""
    return bool(math.isfinite(float(self._finite_sums().numpy().sum())))

  def _make_totals(self) -> None:
    with self._strategy.scope():  # [loss, replicas, label range], summed over the replicas when read.
      self._totals = tf.Variable(
          tf.zeros([3]),
          trainable=False,
          synchronization=tf.VariableSynchronization.ON_READ,
          aggregation=tf.VariableAggregation.SUM,
          name="unchecked_loop_sums",
      )

  def _state_sum(self) -> tf.Tensor:
    return loops.finite_sum([tf.convert_to_tensor(v) for v in self._state])

  def _unchecked_steps(self, iterator: Any, num_steps: tf.Tensor, stop: tf.Tensor) -> tf.Tensor:
    del stop  # One worker: its own signal is read between loops.
    for metric in self._metrics:
      metric.reset_state()
    self._totals.assign(tf.zeros_like(self._totals))

    def step(i: tf.Tensor) -> tf.Tensor:
      self._strategy.run(self._unchecked_replica_step, args=(next(iterator),))
      return i + 1

    tf.while_loop(lambda i: i < num_steps, step, [tf.constant(0)])
    sums = self._totals.read_value()
    replicas = self._strategy.num_replicas_in_sync
    self._step.assign_add(tf.cast(tf.math.floor(sums[1] / replicas + 1e-6), self._step.dtype))
    return self._results(tf.concat([sums, [self._state_sum()]], axis=0), tf.zeros([0]))

  def _unchecked_replica_step(self, batch: Sequence[Any]) -> None:
    sample_weight = batch[2] if len(batch) == 3 else None
    loss, outputs, _ = self._unchecked_update(batch[0], batch[1], sample_weight)
    for metric in self._metrics:
      metric.update_state(batch[1], outputs, sample_weight=sample_weight)
    in_range = tf.constant(0.0)
    if self._valid_labels is not None:
      in_range = tf.math.log(tf.cast(loops.labels_in(batch[1], self._valid_labels), tf.float32))
    self._totals.assign_add(tf.stack([loss, 1.0, in_range]))


class RerunChecked:
  """The call contract of `loops.TrainLoop`: loops run unchecked; steps of one that is not finite run again, checked.

  Loops run checked while `saved_step()` is None (no checkpoint to fall back
  to). After that, a loop whose summed loss or final variables are not
  finite, or that raised part-way with a state that was not finite, is run
  again: `restore_saved` restores the checkpoint saved last (waiting for one
  being written), and the checked loop runs from its step to the loop's end
  on the same batches (a new iterator from `rewind`, which is used from then
  on), stopping at the first bad step with its usual result. A loop that
  raised with a finite state raises as it did: the global step counts the
  steps before the error, as a checked loop's would.
  """

  def __init__(
      self,
      *,
      unchecked: UncheckedTrainLoop,
      checked: Callable[[], loops.TrainLoop],
      step: tf.Variable,
      rewind: Callable[[int], Any],
      saved_step: Callable[[], int | None],
      restore_saved: Callable[[], int],
  ) -> None:
    """Initializes the `RerunChecked`.

    Args:
      unchecked: the loop that runs every call once a checkpoint exists.
      checked: returns the checked loop.
      step: the global step variable.
      rewind: `rewind(step)` returns a distributed iterator whose first batch
        is that of global step `step` (`train_input.training_iterator`).
      saved_step: returns the step of the checkpoint saved last, or None.
      restore_saved: restores that checkpoint; returns its step.
    """
    self._unchecked = unchecked
    self._checked = checked
    self._step = step
    self._rewind = rewind
    self._saved_step = saved_step
    self._restore_saved = restore_saved
    self._rewound: tuple[Any, Any] | None = None  # (an iterator, the rewound one used in its place)

  def __call__(self, iterator: Any, num_steps: int, stop_signal: int | None) -> loops.TrainLoopResult:
    """Runs `num_steps` steps from `iterator`; returns a `loops.TrainLoopResult` (see the class doc).

    Its `steps_run` counts from the global step before the call.

    Args:
      iterator: the distributed training iterator.
      num_steps: the steps to run.
      stop_signal: None, or the signal this worker noted (one worker: the
        controller reads it itself).

    Raises:
      tf.errors.OpError: as a step raised it; the global step counts the
        steps before it.
    """
    given = iterator
    if self._rewound is not None and self._rewound[0] is given:
      iterator = self._rewound[1]
    if self._saved_step() is None:
      return self._checked()(iterator, num_steps, stop_signal)
    end = int(self._step.numpy()) + num_steps
    try:
      result, finite = self._unchecked.run(iterator, num_steps)
    except tf.errors.OpError:
      if self._unchecked.finite_so_far():
        raise
      finite = False
    if finite:
      return result
    restored = self._restore_saved()
    self._rewound = (given, self._rewind(restored))
    result = self._checked()(self._rewound[1], end - restored, stop_signal)
    return dataclasses.replace(result, steps_run=restored + result.steps_run - (end - num_steps))

  def trace(self, iterator: Any) -> bool:
    """Traces the loop's function that the next call runs (see `loops.TrainLoop.trace`); whether it was traced now."""
    return (self._checked() if self._saved_step() is None else self._unchecked).trace(iterator)
