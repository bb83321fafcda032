"""The outer loop: calls the inner train loop until the target step, and runs the actions after each call."""

import math
import time
from typing import Callable, Sequence

from runner import actions as actions_lib
from runner import loops


class Controller:
  """Runs a `loops.TrainLoop` in calls of up to `steps_per_loop` steps, with actions between calls.

  A call ends early at every step where an action with `every_steps` is due,
  so that action sees exactly that step. Python work (actions, reports) stays
  between calls, outside the compiled loop.
  """

  def __init__(self, *, train_loop: loops.TrainLoop, actions: Sequence[actions_lib.Action], steps_per_loop: int,
               global_batch_size: int, is_chief: bool):
    """Args:
      train_loop: the inner loop.
      actions: run after every call, in order, when due.
      steps_per_loop: the most steps per call.
      global_batch_size: examples per step, for the throughput.
      is_chief: this worker writes the run's files (passed on to actions).
    """
    self._train_loop = train_loop
    self._actions = tuple(actions)
    self._steps_per_loop = steps_per_loop
    self._global_batch_size = global_batch_size
    self._is_chief = is_chief

  def run(self, iterator, *, step: int, total_steps: int, stop_requested: Callable[[], bool],
          advance: Callable[[int, dict], None]) -> None:
    """Trains from global step `step` until `total_steps`, or until an action stops training.

    Args:
      iterator: the distributed training iterator.
      step: the global step now.
      total_steps: the step to train to.
      stop_requested: whether this worker was asked to stop (read before each call).
      advance: `advance(step, train_results)` records the new global step
        and the loop's results; called after each call, before the
        finiteness check and the actions.

    Raises:
      FloatingPointError: the loss became non-finite (the message names the step).
    """
    end = total_steps
    loop_start = time.perf_counter()
    while step < end:
      result = self._train_loop(iterator, self._loop_size(step, end), stop_requested())
      seconds = time.perf_counter() - loop_start
      step += result.steps_run
      advance(step, result.results)
      if not math.isfinite(result.loss):
        raise FloatingPointError(
            f"The training loss became {result.loss} at step {step}; training stopped there and no "
            f"checkpoint holds weights from that step on. Lower the learning rate, set clipnorm, or check "
            f"the data for NaN or inf values.")
      loop = actions_lib.LoopEnd(
          step=step, total_steps=total_steps, train_results=result.results,
          steps_per_sec=result.steps_run / seconds,
          examples_per_sec=result.steps_run * self._global_batch_size / seconds,
          learning_rate=result.learning_rate, stop_requested=result.stop_requested, is_chief=self._is_chief)
      for action in self._actions:
        if actions_lib.is_due(action, step):
          action(loop)
      if loop.stop_at is not None:
        end = min(end, max(loop.stop_at, step))
      loop_start = time.perf_counter()

  def _loop_size(self, step, end):
    """Steps for the next call: `steps_per_loop`, cut at `end` and where an action is next due."""
    size = min(self._steps_per_loop, end - step)
    for action in self._actions:
      if action.every_steps is not None:
        size = min(size, action.every_steps - step % action.every_steps)
    return size
