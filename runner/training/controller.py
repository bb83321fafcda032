"""The outer loop: calls the inner train loop until the target step, and runs the actions after each call."""

from collections.abc import Callable, Sequence
import time
from typing import Any

from runner import actions as actions_lib
from runner import interfaces
from runner.outputs import profiling
from runner.training import loops
from runner.training import steps_per_loop as steps_per_loop_lib
from runner.training import unchecked_loops


class Controller:
  """Runs a train loop (`loops.TrainLoop`, `unchecked_loops.RerunChecked`) in calls of up to `steps_per_loop` steps.

  A call ends early at every step where an action with `every_steps` is due,
  so that action sees exactly that step. The loop's function is traced before
  the first call and timed apart, so the first loop's throughput (and the ETA
  from it) counts only its steps. Python work (actions, reports) stays
  between calls, outside the compiled loop. A loop's throughput counts its
  wall time: from the end of the loop before (so the actions after that one,
  such as a checkpoint, and any stall there, count) to its own end, less the
  time of evaluations (`actions.Evaluate`, reported with their own time).
  """

  def __init__(
      self,
      *,
      train_loop: loops.TrainLoop | unchecked_loops.RerunChecked,
      actions: Sequence[interfaces.Action],
      steps_per_loop: steps_per_loop_lib.FixedStepsPerLoop | steps_per_loop_lib.MeasuredStepsPerLoop,
      global_batch_size: int,
      is_chief: bool,
      single_worker: bool,
      profile: profiling.ProfileWindow | None = None,
  ) -> None:
    """Initializes the `Controller`.

    Args:
      train_loop: the inner loop.
      actions: run after every call, in order, when due.
      steps_per_loop: the loop sizes (`steps_per_loop.resolve`): fixed, or
        chosen from the times this controller records (the loop's function
        must loop then: it is called for zero steps to time a call's own
        cost).
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

  def run(
      self,
      iterator: Any,
      *,
      step: int,
      total_steps: int,
      stop_signal: Callable[[], int | None],
      advance: Callable[[int, dict], None],
  ) -> None:
    """Trains from global step `step` until `total_steps`, or until an action stops training.

    Args:
      iterator: the distributed training iterator.
      step: the global step now.
      total_steps: the step to train to.
      stop_signal: the signal this worker noted (SIGTERM or SIGINT), or None.
      advance: `advance(step, train_results)` records the new global step
        and the loop's results; called after each call, before the loop's
        problems are raised and the actions run.

    Raises:
      What `loops.TrainLoopResult.raise_problems` raises for a loop whose
      batch, loss or gradients were not finite, or whose batch held a label
      outside the valid range.
    """
    end = total_steps
    tracing_seconds = self._ready(iterator) if step < end else None
    previous_end = None
    evaluation_seconds = 0.0  # Of the evaluations since the loop before.
    try:
      while step < end:
        if self._profile is not None:
          self._profile.before_loop(step)
        loop_start = time.perf_counter()
        result = self._train_loop(iterator, self._loop_size(step, end), stop_signal())
        loop_end = time.perf_counter()
        self._steps_per_loop.record_loop(
            steps=result.steps_run,
            seconds=loop_end - loop_start,
            host_seconds=None if previous_end is None else loop_start - previous_end,
        )
        seconds = loop_end - (loop_start if previous_end is None else previous_end + evaluation_seconds)
        previous_end = loop_end
        step += result.steps_run
        advance(step, result.results)
        if self._profile is not None:
          self._profile.after_loop(step)
        result.raise_problems(step=step)
        loop = interfaces.LoopEnd(
            step=step,
            total_steps=total_steps,
            train_results=result.results,
            steps_per_sec=result.steps_run / seconds,
            examples_per_sec=result.steps_run * self._global_batch_size / seconds,
            learning_rate=result.learning_rate,
            stop_signal=result.stop_signal or (stop_signal() if self._single_worker else None),
            is_chief=self._is_chief,
            tracing_seconds=tracing_seconds,
        )
        tracing_seconds = None
        stop_at, evaluation_seconds = self._run_actions(loop)
        if stop_at is not None:
          end = min(end, max(stop_at, step))
    finally:
      if self._profile is not None:
        self._profile.close(step)

  def _ready(self, iterator: Any) -> float | None:
    """Traces the loop's function; returns the seconds tracing took, or None when it was traced before.

    For measured loop sizes, it also times a call's own cost.
    """
    trace_start = time.perf_counter()
    tracing_seconds = time.perf_counter() - trace_start if self._train_loop.trace(iterator) else None
    if self._steps_per_loop.needs_call_overhead:
      self._steps_per_loop.record_call_overhead(min(self._timed_empty_call(iterator) for _ in range(2)))
    return tracing_seconds

  def _run_actions(self, loop: interfaces.LoopEnd) -> tuple[int | None, float]:
    """Runs the actions due at `loop.step`; returns the step they asked to stop at (or None), and evaluations' seconds.

    Each action sees the `LoopEnd` the one before returned.
    """
    evaluation_seconds = 0.0
    for action in self._actions:
      if actions_lib.is_due(action, loop.step):
        start = time.perf_counter()
        loop = action(loop) or loop
        if isinstance(action, actions_lib.Evaluate):
          evaluation_seconds += time.perf_counter() - start
    return loop.stop_at, evaluation_seconds

  def _timed_empty_call(self, iterator: Any) -> float:
    start = time.perf_counter()
    self._train_loop(iterator, 0, None)
    return time.perf_counter() - start

  def _loop_size(self, step: int, end: int) -> int:
    """Steps for the next call: the loop sizes' next one, cut where an action is next due and around profiling."""
    size = self._steps_per_loop.next_size(step, end)
    for action in self._actions:
      if action.every_steps is not None:
        size = min(size, action.every_steps - step % action.every_steps)
    return size if self._profile is None else self._profile.loop_size(step, size, self._steps_per_loop.size)
