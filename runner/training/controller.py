"""The outer loop: calls the inner train loop until the target step, and runs the actions after each call."""

import time
from typing import Callable, Optional, Sequence, Union

from runner import interfaces
from runner import actions as actions_lib
from runner.data import providers as data_lib
from runner.training import loops
from runner.outputs import profiling
from runner.training import steps_per_loop as steps_per_loop_lib


class LabelsOutOfRange(Exception):
  """A step's batch held a label outside the train loop's `valid_labels`; the Trainer says which (`data_checks`).

  Attributes:
    step: the step whose batch held it (None: an evaluation's).
  """

  def __init__(self, step):
    super().__init__(f"a label outside the valid range in the batch of step {step}")
    self.step = step


class Controller:
  """Runs a `loops.TrainLoop` in calls of up to `steps_per_loop` steps, with actions between calls.

  A call ends early at every step where an action with `every_steps` is due,
  so that action sees exactly that step. The loop's function is traced before
  the first call and timed apart, so the first loop's throughput (and the ETA
  from it) counts only its steps. Python work (actions, reports) stays
  between calls, outside the compiled loop.
  """

  def __init__(self, *, train_loop: loops.TrainLoop, actions: Sequence[interfaces.Action],
               steps_per_loop: Union[int, steps_per_loop_lib.MeasuredStepsPerLoop],
               global_batch_size: int, is_chief: bool, single_worker: bool,
               profile: Optional[profiling.ProfileWindow] = None):
    """Args:
      train_loop: the inner loop.
      actions: run after every call, in order, when due.
      steps_per_loop: the most steps per call, or a `MeasuredStepsPerLoop`
        that chooses them from the times this controller records (the
        loop's function must loop: it is called for zero steps to time a
        call's own cost).
      global_batch_size: examples per step, for the throughput.
      is_chief: this worker writes the run's files (passed on to actions).
      single_worker: no other worker takes part, so a signal noted during a
        call stops training after that call; with several workers it stops
        after the next call, which tells every worker.
      profile: None, or the steps to profile: loops end around them, and the
        profiler runs for exactly their loops.
    """
    self._train_loop = train_loop
    self._actions = tuple(actions)
    self._steps_per_loop = steps_per_loop
    self._global_batch_size = global_batch_size
    self._is_chief = is_chief
    self._single_worker = single_worker
    self._profile = profile

  def run(self, iterator, *, step: int, total_steps: int, stop_signal: Callable[[], Optional[int]],
          advance: Callable[[int, dict], None]) -> None:
    """Trains from global step `step` until `total_steps`, or until an action stops training.

    Args:
      iterator: the distributed training iterator.
      step: the global step now.
      total_steps: the step to train to.
      stop_signal: the signal this worker noted (SIGTERM or SIGINT), or None.
      advance: `advance(step, train_results)` records the new global step
        and the loop's results; called after each call, before the
        finiteness check and the actions.

    Raises:
      LabelsOutOfRange: a step's batch held a label outside the loop's
        valid range.
      DataError: a step's batch held NaN or inf values; the message names
        the step and whether the features or the labels held them.
      FloatingPointError: a step's loss or gradients were not finite, its
        batch being finite (the training diverged); the message names the step.
    """
    end = total_steps
    tracing_seconds = None
    measured = None if isinstance(self._steps_per_loop, int) else self._steps_per_loop
    if step < end:
      trace_start = time.perf_counter()
      if self._train_loop.trace(iterator):
        tracing_seconds = time.perf_counter() - trace_start
      if measured is not None and measured.needs_call_overhead:
        measured.record_call_overhead(min(self._timed_empty_call(iterator) for _ in range(2)))
    previous_end = None
    try:
      while step < end:
        size = self._loop_size(step, end)
        if self._profile is not None:
          self._profile.before_loop(step)
        loop_start = time.perf_counter()
        result = self._train_loop(iterator, size, stop_signal())
        seconds = time.perf_counter() - loop_start
        if measured is not None:
          measured.record_loop(steps=result.steps_run, seconds=seconds,
                               host_seconds=None if previous_end is None else loop_start - previous_end)
        previous_end = loop_start + seconds
        step += result.steps_run
        advance(step, result.results)
        if self._profile is not None:
          self._profile.after_loop(step)
        if result.labels_out_of_range:
          raise LabelsOutOfRange(step)
        if result.non_finite_data:
          raise data_lib.DataError(
              f"The training data's {' and '.join(result.non_finite_data)} hold NaN or inf values in the batch of "
              f"step {step}; training stopped there, and no checkpoint holds weights from that step on. Find them "
              "with tf.debugging.check_numerics in the dataset, or leave such examples out (dataset.filter).")
        if result.non_finite:
          raise FloatingPointError(
              f"Training stopped at step {step}: {result.non_finite}. No checkpoint holds weights from that step "
              "on. Lower the learning rate (config.optimizer.learning_rate), set a gradient bound "
              "(config.optimizer.clipnorm), or use float32 precision.")
        loop = interfaces.LoopEnd(
            step=step, total_steps=total_steps, train_results=result.results,
            steps_per_sec=result.steps_run / seconds,
            examples_per_sec=result.steps_run * self._global_batch_size / seconds,
            learning_rate=result.learning_rate,
            stop_signal=result.stop_signal or (stop_signal() if self._single_worker else None),
            is_chief=self._is_chief, tracing_seconds=tracing_seconds)
        tracing_seconds = None
        for action in self._actions:
          if actions_lib.is_due(action, step):
            action(loop)
        if loop.stop_at is not None:
          end = min(end, max(loop.stop_at, step))
    finally:
      if self._profile is not None:
        self._profile.close(step)

  def _timed_empty_call(self, iterator):
    start = time.perf_counter()
    self._train_loop(iterator, 0, None)
    return time.perf_counter() - start

  def _loop_size(self, step, end):
    """Steps for the next call: `steps_per_loop` (measured: to its next multiple), cut at `end`, where an action is
    next due and around profiling."""
    if isinstance(self._steps_per_loop, int):
      steps_per_loop = self._steps_per_loop
      size = min(steps_per_loop, end - step)
    else:  # Measured: loops end at multiples of the size, as fixed sizes do from step 0.
      steps_per_loop = self._steps_per_loop.size
      size = min(steps_per_loop - step % steps_per_loop, end - step)
    for action in self._actions:
      if action.every_steps is not None:
        size = min(size, action.every_steps - step % action.every_steps)
    return size if self._profile is None else self._profile.loop_size(step, size, steps_per_loop)
