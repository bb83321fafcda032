"""The outer loop: calls the inner train loop until the target step, and runs the actions after each call.

And the loops of one Trainer, assembled from its parts and options (`InnerLoops`).
"""

from collections.abc import Callable, Mapping, Sequence
import dataclasses
import functools
import time
from typing import Any

import tensorflow as tf

from runner import actions as actions_lib
from runner import interfaces
from runner import tasks
from runner.data import checks as data_checks
from runner.data import pipeline as input_pipeline
from runner.outputs import exports
from runner.outputs import profiling
from runner.training import export
from runner.training import loops
from runner.training import model_parts
from runner.training import parameter_server_loops
from runner.training import steps_per_loop as steps_per_loop_lib
from strategies import description

_ALL_STEPS = 2**62


@dataclasses.dataclass(frozen=True, kw_only=True)
class Controller:
  """Runs a train loop (`loops.TrainLoop`, `loops.RerunChecked`) in calls of up to `steps_per_loop` steps.

  A call ends early at every step where an action with `every_steps` is due,
  so that action sees exactly that step. The loop's function is traced before
  the first call and timed apart, so the first loop's throughput (and the ETA
  from it) counts only its steps. Python work (actions, reports) stays
  between calls, outside the compiled loop. A loop's throughput counts its
  wall time: from the end of the loop before (so the actions after that one,
  such as a checkpoint, and any stall there, count) to its own end, less the
  time of evaluations (`actions.Evaluate`, reported with their own time).

  Attributes:
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
    on_final_evaluation: actions that also see the evaluation `train` runs
      after the last loop (`evaluated`), which the other actions do not.
  """

  train_loop: loops.TrainLoop | loops.RerunChecked
  actions: Sequence[interfaces.Action]
  steps_per_loop: steps_per_loop_lib.FixedStepsPerLoop | steps_per_loop_lib.MeasuredStepsPerLoop
  global_batch_size: int
  is_chief: bool
  single_worker: bool
  profile: profiling.ProfileWindow | None = None
  on_final_evaluation: Sequence[interfaces.Action] = ()

  def run(
      self,
      iterator: Any,
      *,
      step: int,
      total_steps: int,
      stop_signal: Callable[[], int | None],
      advance: Callable[[int, dict], None],
  ) -> interfaces.LoopEnd | None:
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
    previous_end, loop = None, None
    evaluation_seconds = 0.0  # Of the evaluations since the loop before.
    try:
      while step < end:
        if self.profile is not None:
          self.profile.before_loop(step)
        loop_start = time.perf_counter()
        result = self.train_loop(iterator, self._loop_size(step, end), stop_signal())
        loop_end = time.perf_counter()
        self.steps_per_loop.record_loop(
            steps=result.steps_run,
            seconds=loop_end - loop_start,
            host_seconds=None if previous_end is None else loop_start - previous_end,
        )
        seconds = loop_end - (loop_start if previous_end is None else previous_end + evaluation_seconds)
        previous_end = loop_end
        step += result.steps_run
        advance(step, result.results)
        if self.profile is not None:
          self.profile.after_loop(step)
        result.raise_problems(step=step)
        loop = interfaces.LoopEnd(
            step=step,
            total_steps=total_steps,
            train_results=result.results,
            steps_per_sec=result.steps_run / seconds,
            examples_per_sec=result.steps_run * self.global_batch_size / seconds,
            learning_rate=result.learning_rate,
            stop_signal=result.stop_signal or (stop_signal() if self.single_worker else None),
            is_chief=self.is_chief,
            tracing_seconds=tracing_seconds,
        )
        tracing_seconds = None
        stop_at, evaluation_seconds = self._run_actions(loop)
        if stop_at is not None:
          end = min(end, max(stop_at, step))
    finally:
      if self.profile is not None:
        self.profile.close(step)
    return loop

  def evaluated(self, last: interfaces.LoopEnd | None, results: Mapping[str, float]) -> None:
    """Runs `on_final_evaluation` for the evaluation `train` ran after its last loop, whose `LoopEnd` is `last`."""
    for action in self.on_final_evaluation:
      if last is not None:
        action(last.with_eval_results(results))

  def _ready(self, iterator: Any) -> float | None:
    """Traces the loop's function; returns the seconds tracing took, or None when it was traced before.

    For measured loop sizes, it also times a call's own cost.
    """
    trace_start = time.perf_counter()
    tracing_seconds = time.perf_counter() - trace_start if self.train_loop.trace(iterator) else None
    if self.steps_per_loop.needs_call_overhead:
      self.steps_per_loop.record_call_overhead(min(self._timed_empty_call(iterator) for _ in range(2)))
    return tracing_seconds

  def _run_actions(self, loop: interfaces.LoopEnd) -> tuple[int | None, float]:
    """Runs the actions due at `loop.step`; returns the step they asked to stop at (or None), and evaluations' seconds.

    Each action sees the `LoopEnd` the one before returned.
    """
    evaluation_seconds = 0.0
    for action in self.actions:
      if actions_lib.is_due(action, loop.step):
        start = time.perf_counter()
        loop = action(loop) or loop
        if isinstance(action, actions_lib.Evaluate):
          evaluation_seconds += time.perf_counter() - start
    return loop.stop_at, evaluation_seconds

  def _timed_empty_call(self, iterator: Any) -> float:
    start = time.perf_counter()
    self.train_loop(iterator, 0, None)
    return time.perf_counter() - start

  def _loop_size(self, step: int, end: int) -> int:
    """Steps for the next call: the loop sizes' next one, cut where an action is next due and around profiling."""
    size = self.steps_per_loop.next_size(step, end)
    for action in self.actions:
      if action.every_steps is not None:
        size = min(size, action.every_steps - step % action.every_steps)
    return size if self.profile is None else self.profile.loop_size(step, size, self.steps_per_loop.size)


class InnerLoops:
  """The loops of one Trainer, assembled from its parts and options, each made once and kept with its traces.

  Where one process runs every replica, a call runs many steps (not on a
  TPU, whose compiled step checks nearly for free) and there is a
  `model_dir`, loops run unchecked once it holds a checkpoint, and the steps
  of a loop that is not finite run again from that checkpoint with the
  checks (`loops.RerunChecked`). Under parameter servers a loop is
  one scheduled function of `steps_per_loop` steps per worker.

  Attributes:
    train_loops: the train loops made, by batch size, label range and kind.
    eval_loop: `(the LabelRange it checks, the loops.EvalLoop)` of the last evaluation, or None.
  """

  def __init__(self, strategy: Any, parts: Any, task: interfaces.Task, options: Any, *, coordinator: Any, state: Any):
    """Initializes the `InnerLoops` of a Trainer's parts, options, coordinator (or None) and `RunState`."""
    self._strategy = strategy
    self._parts = parts
    self._task = task
    self._options = options
    self._coordinator = coordinator
    self._state = state
    self._xla = options.jit_compile and not model_parts.is_tpu(strategy)  # TPU steps are compiled with XLA anyway.
    self._single_worker = description.is_single_worker(strategy)
    self._measured: dict[Any, Any] = {}  # cadences -> the MeasuredStepsPerLoop "auto" keeps across train calls
    self.train_loops: dict[Any, Any] = {}
    self.eval_loop: tuple[Any, loops.EvalLoop] | None = None

  def controller(
      self,
      global_batch_size: int,
      label_range: Any,
      *,
      evaluate: Callable[[], Mapping[str, float]],
      eval_every: int | None,
      rewind: Callable[[int], Any],
  ) -> Controller:
    """Returns the outer loop of one `train` call, with the built-in actions around the user's.

    Order: report, exit on a stop request, evaluate (when due; at the last
    step after a checkpoint), checkpoint (when due: the actions after it see
    a step whose checkpoint is written, or being written with
    `async_checkpoints`), the best checkpoint, the metric's report for
    Vertex AI (`report_metric`), the user's actions, export (when due).
    `rewind(step)` gives the iterator from the batch of `step` (`TrainInput.iterator`).
    """
    state, every = self._state, self._options.checkpoint_every
    actions: list[interfaces.Action] = [
        actions_lib.ReportProgress(state.reporter),
        actions_lib.ExitOnStopSignal(save=state.save_for_exit),
    ]
    if eval_every is not None:
      actions.append(actions_lib.Evaluate(evaluate, every_steps=eval_every, save=state.save))
    if every is not None:
      actions.append(actions_lib.SaveCheckpoint(functools.partial(state.save, in_background=True), every_steps=every))
    evaluated = tuple(action for action in (state.best, state.report) if action is not None)  # Also the final one.
    actions += [*evaluated, *self._options.actions]
    if self._options.export_every is not None:
      export_to = functools.partial(export.export_saved_model, self._strategy, self._parts)
      actions.append(
          exports.ExportEvery(
              self._strategy,
              self._options.model_dir,
              every_steps=self._options.export_every,
              max_to_keep=self._options.max_to_keep,
              export=export_to,
          )
      )
    sizes = steps_per_loop_lib.resolve(
        self._options.steps_per_loop,
        strategy=self._strategy,
        cadences=(eval_every, every, self._options.export_every),
        measured=self._measured,
    )
    return Controller(
        train_loop=self._train_loop(global_batch_size, label_range, sizes.looping, rewind),
        steps_per_loop=sizes,
        actions=tuple(actions),
        global_batch_size=global_batch_size,
        is_chief=self._strategy.extended.should_checkpoint,
        single_worker=self._single_worker,
        profile=state.profile,
        on_final_evaluation=evaluated,
    )

  def evaluate(
      self, data: Any, label_range: Any, global_batch_size: int, *, steps: int | None, preprocess: Any
  ) -> dict[str, float]:
    """Evaluates `data` (a `PreparedData`) in one compiled call (`loops.EvalLoop`); returns the results.

    Raises:
      DataError: the data cannot be read, holds a label outside
        `label_range`, NaN or inf (`data_checks.step_error`), or no examples.
    """
    strategy = parameter_server_loops.evaluation_strategy(self._strategy)
    try:
      dataset, num_pipelines = input_pipeline.for_evaluation(
          strategy, data.provider, global_batch_size, bounded=steps is not None, preprocess=preprocess
      )
      if self.eval_loop is None or self.eval_loop[0] != label_range:
        loop = loops.EvalLoop(
            strategy=strategy,
            model=self._parts.model,
            task_loss=self._task.loss,
            metrics=self._parts.metrics,
            num_input_pipelines=num_pipelines,
            xla=self._xla,
            valid_labels=label_range,
        )
        self.eval_loop = (label_range, loop)
      results = self.eval_loop[1](iter(dataset), steps or _ALL_STEPS)
    except (tf.errors.InvalidArgumentError, tf.errors.DataLossError, data_checks.LabelsOutOfRangeError) as e:
      raise data_checks.step_error(e, data.provider, label_range, step=None, purpose="evaluation") from None
    if not results["num_examples"]:
      raise data_checks.no_evaluation_examples_error()
    return results

  def _train_loop(
      self, global_batch_size: int, label_range: Any, looping: bool, rewind: Callable[[int], Any]
  ) -> loops.TrainLoop | loops.RerunChecked:
    """The inner loop for this batch size, label range and looping: unchecked where it can be (see the class doc)."""
    saves = self._state.checkpoints
    one_process = self._coordinator is None and self._single_worker and not model_parts.is_tpu(self._strategy)
    if not (looping and saves is not None and one_process):
      return self._loop(global_batch_size, label_range, looping=looping)
    return loops.RerunChecked(
        unchecked=self._loop(global_batch_size, label_range, looping=True, unchecked=True),
        checked=functools.partial(self._loop, global_batch_size, label_range, looping=True),
        step=self._parts.step,
        rewind=rewind,
        saved_step=lambda: saves.saved_step,
        restore_saved=saves.restore_saved,
    )

  def _loop(self, global_batch_size: int, label_range: Any, *, looping: bool, unchecked: bool = False) -> Any:
    """The loop for this batch size, label range, looping and kind, made once and kept.

    Steps check the label range only where the task's loss does not fail by
    itself on a label out of range, as the built-in `Classification`'s does
    on a CPU (an op error): checked steps there where one process runs every
    replica on CPUs, unchecked ones everywhere (on a GPU its loss is NaN, so the rerun
    checks it).
    """
    key = (global_batch_size, label_range, looping, unchecked)
    if key not in self.train_loops:
      parts, task = self._parts, self._task
      own_check = isinstance(task, tasks.Classification) and type(task).loss is tasks.Classification.loss
      # One process on CPUs: a replica's op error ends the step on every replica (on several workers, one
      # worker's would leave the others waiting).
      alone_on_cpus = (
          self._coordinator is None
          and self._single_worker
          and not tf.config.list_logical_devices("GPU")
          and not model_parts.is_tpu(self._strategy)
      )
      arguments = dict(
          strategy=self._strategy,
          model=parts.model,
          optimizer=parts.optimizer,
          task_loss=task.loss,
          metrics=parts.metrics,
          step=parts.step,
          global_batch_size=global_batch_size,
          xla=self._xla,
          clipnorm=self._options.clipnorm,
          micro_batches=self._options.gradient_accumulation_steps,
          loss_scale=parts.loss_scaled,
          keras_version=parts.keras_version,
          valid_labels=None if own_check and (unchecked or alone_on_cpus) else label_range,
      )
      if self._coordinator is not None:
        self.train_loops[key] = parameter_server_loops.ScheduledTrainLoop(coordinator=self._coordinator, **arguments)
      elif unchecked:
        state = list(parts.model.variables) + list(parts.keras_version.optimizer_variables(parts.optimizer))
        self.train_loops[key] = loops.TrainLoop(looping=True, state=state, **arguments)
      else:
        self.train_loops[key] = loops.TrainLoop(looping=looping, multi_worker=not self._single_worker, **arguments)
    return self.train_loops[key]
