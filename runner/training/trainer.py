"""The Trainer: a generic custom training loop for any `tf.distribute.Strategy` and any Keras model.

It is assembled from small parts: `options` (the options and their checks), `model_parts` (the model, optimizer,
metrics and step made in scope, and the checks of the data against them), `train_input` (the distributed training
input), `controller` (the outer loop, and the inner loops of `loops` it assembles), `run_state` (the global step,
the checkpoints and the reports), `train_errors` (what stops training, as the user reads it) and `actions` (the
periodic work after each loop).
"""

from collections.abc import Callable, Sequence
import functools
import signal
import time
from typing import Any, TypeAlias

from absl import logging
import tensorflow as tf

from runner import actions as actions_lib
from runner import interfaces
from runner.cluster import maintenance_events
from runner.cluster import stop_signals
from runner.data import checks as data_checks
from runner.data import pipeline as input_pipeline
from runner.data import providers as data_lib
from runner.data import service as service_lib
from runner.outputs import progress_output
from runner.training import controller as controller_lib
from runner.training import ema
from runner.training import export
from runner.training import model_parts
from runner.training import options as trainer_options
from runner.training import parameter_server_loops
from runner.training import predict
from runner.training import run_state
from runner.training import train_errors
from runner.training import train_input
from strategies import checks
from strategies import tensorflow_workarounds
from strategies.errors import ConfigError

# What the methods take as data.
Data: TypeAlias = tf.data.Dataset | interfaces.DatasetProvider | input_pipeline.PreparedData


class Trainer:
  """Trains, evaluates and exports a Keras model under a `tf.distribute.Strategy`.

  The model, optimizer and metrics are made inside `strategy.scope()`; input
  is batched per replica and distributed with
  `distribute_datasets_from_function`; `steps_per_loop` steps run inside one
  `tf.function`; the loss is averaged over the global batch, so results do not
  depend on the replica count. After each loop the actions run (see
  `runner.actions`). With a `model_dir`, the Trainer keeps checkpoints in
  `model_dir/checkpoints` (restoring the latest before its first train,
  evaluate or export), TensorBoard scalars in `model_dir/summaries/{train,eval}`
  (with a profiler trace of `profile_steps` in `summaries/train`) and one JSON
  row per report in `model_dir/metrics.jsonl`.
  """

  def __init__(  # noqa: D417  (the options are documented once, in TrainerOptions)
      self,
      strategy: tf.distribute.Strategy,
      *,
      model_fn: Callable[[], Any],
      optimizer_fn: Callable[[], Any],
      task: interfaces.Task,
      model_dir: str | None = None,
      steps_per_loop: int | str = 1,
      checkpoint_every: int | None = None,
      max_to_keep: int | None = 3,
      async_checkpoints: bool = True,
      jit_compile: bool = False,
      precision: str = "float32",
      clipnorm: float | None = None,
      gradient_accumulation_steps: int = 1,
      seed: int | None = None,
      actions: Sequence[interfaces.Action] = (),
      profile_steps: tuple[int, int] | None = None,
      best_metric: str | None = None,
      best_mode: str | None = None,
      export_every: int | None = None,
      data_service: service_lib.DataService | None = None,
      report_metric: str | None = None,
      summary_dir: str | None = None,
      quiet: bool = False,
  ) -> None:
    """Makes the model, optimizer and metrics in `strategy.scope()`.

    Args:
      strategy: any `tf.distribute.Strategy`. Under a ParameterServerStrategy
        this process is the coordinator: the steps are scheduled onto the
        workers by a `ClusterCoordinator` (see `parameter_server_loops`).
      model_fn: `() -> keras.Model`, called in scope under the `precision`
        dtype policy. The model may build lazily on its first batch.
      optimizer_fn: `() -> keras.optimizers.Optimizer`, called in scope.
      task: a `runner.Task`: the per-example loss and the metrics.
      The others (model_dir, ..., quiet): the options, made once into one
        `runner.training.options.TrainerOptions`, whose doc says what each does.

    Raises:
      ConfigError: an argument is invalid (`jit_compile` under parameter
        servers included), or `model_fn`, `optimizer_fn` or `task.metrics()`
        returned something unusable.
    """
    trainer_options.check_components(strategy=strategy, model_fn=model_fn, optimizer_fn=optimizer_fn, task=task)
    self._options = trainer_options.TrainerOptions.of(locals())
    self._strategy = strategy
    tensorflow_workarounds.release_gradients_when_collected(self, strategy)  # What tracing its steps leaves.
    self._coordinator = parameter_server_loops.coordinator_for(strategy, jit_compile=jit_compile)
    self._task = task
    # The task's preprocess, when it has its own (None: the model takes the features as batched).
    self._preprocess = task.preprocess if type(task).preprocess is not interfaces.Task.preprocess else None
    self._parts = model_parts.make(
        strategy, model_fn=model_fn, optimizer_fn=optimizer_fn, task=task, precision=precision, seed=seed
    )
    self._state = run_state.RunState(strategy, self._parts, self._options)
    self._loops = controller_lib.InnerLoops(
        strategy, self._parts, task, self._options, coordinator=self._coordinator, state=self._state
    )
    self._input = train_input.TrainInput(
        strategy,
        coordinator=self._coordinator,
        preprocess=self._preprocess,
        checkpoints=self._state.checkpoints,
        service=data_service,
    )
    self._checked: dict[str, tuple[input_pipeline.PreparedData, Any]] = {}  # purpose -> (data, its LabelRange)
    with progress_output.shown(quiet=quiet):  # It may restore a checkpoint, and say so.
      if self._parts.build(strategy, None):  # A model with a declared input: restored at once.
        self._state.restore_latest()

  @property
  def strategy(self) -> tf.distribute.Strategy:
    """The `tf.distribute.Strategy` everything runs under."""
    return self._strategy

  @property
  def model(self) -> Any:
    """The Keras model (its variables are the strategy's distributed variables)."""
    return self._parts.model

  @property
  def model_dir(self) -> str | None:
    """Where checkpoints, summaries and metrics.jsonl go, or None."""
    return self._options.model_dir

  @property
  def last_eval_metrics(self) -> dict[str, float] | None:
    """The results of the latest evaluation (those inside `train` included), or None."""
    return None if self._state.eval_results is None else dict(self._state.eval_results)

  @property
  def global_step(self) -> int:
    """The number of training steps taken so far, restored checkpoints included (an int)."""
    return self._state.step

  def train(
      self,
      data: Data,
      *,
      global_batch_size: int,
      steps: int,
      eval_data: Data | None = None,
      eval_every: int | None = None,
      eval_global_batch_size: int | None = None,
      eval_steps: int | None = None,
  ) -> dict[str, float]:
    """Trains until the global step reaches `steps`.

    `steps` is a total: calling `train` again with the same arguments (in
    this or a new process with the same `model_dir`) resumes where the run
    stopped, on the batches an uninterrupted run would see (for data whose
    order is deterministic); consecutive calls on the same data continue its
    stream. After each loop the actions run (report, stop signal,
    evaluation, checkpoint, the user's actions, export; a loop ends where
    one is due); a checkpoint is always written at the end, before the final
    evaluation. SIGTERM, a first Ctrl-C, or on a GCE VM a maintenance event
    or preemption notice (`maintenance_events`) end the process after the
    current loop (or the final evaluation) with a checkpoint, status 143 or
    130; a second Ctrl-C exits at once with 130, without saving.

    Args:
      data: an unbatched `tf.data.Dataset` of `(features, labels)` or
        `(features, labels, sample_weight)`, a `runner.data.DatasetProvider`
        of such datasets, or a `pipeline.PreparedData` of either (as
        `runner.run` makes once per split). It is repeated as needed.
      global_batch_size: examples per step over all replicas; a multiple of
        the replica count times `gradient_accumulation_steps`.
      steps: the global step to train to.
      eval_data: like `data` but finite: evaluated every `eval_every` steps and at the end.
      eval_every: None (evaluate at the end only) or a positive int.
      eval_global_batch_size: the evaluations' global batch size (None: `global_batch_size`).
      eval_steps: None (all of `eval_data`) or at most this many global batches per evaluation.

    Returns:
      The last loop's `loss` and metrics, a dict of floats; when the step is
      at `steps` already, those of the loop that reached it, said in one
      logged line (`RunState.nothing_to_train`).

    Raises:
      ConfigError: an argument is invalid, or the data ran out (the steps
        taken are checkpointed first).
      DataError: the data does not fit the model or the task, cannot be
        read, or a step's batch held NaN or inf (`data_checks`; no
        checkpoint holds non-finite weights); for `eval_data`, at the final
        evaluation, or before any step where it is known to be empty.
      FloatingPointError: a step's loss or gradients were not finite while
        its batch was (the training diverged; the message names the step).
      ClusterError: another worker, or under parameter servers a ps task, is
        gone; the message names it and the step the job resumes from.
    """
    input_pipeline.check_global_batch_size(self._strategy, global_batch_size, self._options.gradient_accumulation_steps)
    if not checks.is_int(steps) or steps < 0:
      raise ConfigError(f"steps (the global step to train to) must be an int >= 0, got {steps!r}.")
    if checks.positive_int(eval_every, "eval_every", optional=True) and eval_data is None:
      raise ConfigError(f"eval_every={eval_every} needs eval_data to evaluate.")
    eval_data = None if eval_data is None else self._prepared(eval_data, "evaluation")
    if eval_data is not None and data_lib.holds_no_examples(eval_data.provider):
      raise data_checks.no_evaluation_examples_error()
    with progress_output.shown(quiet=self._options.quiet):
      data, label_range = self._checked_data(data, "training")
      input_pipeline.check_micro_batches(data, self._preprocess, self._options.gradient_accumulation_steps)
      if self._state.step >= steps:
        return self._state.nothing_to_train(steps)
      evaluate = functools.partial(
          self.evaluate, eval_data, global_batch_size=eval_global_batch_size or global_batch_size, steps=eval_steps
      )
      rewind = functools.partial(self._input.iterator, data, global_batch_size, rewound=True)
      controller = self._loops.controller(
          global_batch_size, label_range, evaluate=evaluate, eval_every=eval_every, rewind=rewind
      )
      with (
          train_errors.user_errors(
              self._state, self._strategy, self._coordinator, data, label_range, steps, global_batch_size
          ),
          stop_signals.StopSignals() as signals,
          maintenance_events.watching(on_notice=functools.partial(signals.note, signal.SIGTERM)),
      ):
        iterator = self._input.iterator(data, global_batch_size, self._state.step)  # It may read the data.
        self._state.start_training()
        try:
          last = controller.run(
              iterator,
              step=self._state.step,
              total_steps=steps,
              stop_signal=lambda: signals.received,
              advance=self._state.advance,
          )
          self._state.save()  # Before the final evaluation: one that fails or is stopped loses no step.
          if eval_data is not None and self._state.evaluated_step != self._state.step:
            controller.evaluated(last, evaluate())
          if signals.received is not None:  # It came after the last loop's check: during the final evaluation, say.
            actions_lib.ExitOnStopSignal(save=self._state.save_for_exit).exit(signals.received, step=self._state.step)
        except BaseException:
          self._state.wait_quietly()
          raise
        finally:
          self._state.reporter.flush()
      return dict(self._state.train_results)

  def evaluate(self, data: Data, *, global_batch_size: int, steps: int | None = None) -> dict[str, float]:
    """Evaluates the model on `data`, counting every example exactly once.

    Each input pipeline is padded with zero-weight examples to full batches
    (static shapes, as TPUs and XLA need); the padding counts nowhere.
    An optimizer made with `use_ema=True` has its moving average of the
    weights evaluated (`runner.training.ema`).

    Args:
      data: as for `train`, finite unless `steps` is given.
      global_batch_size: examples per step over all replicas; a multiple of
        the replica count.
      steps: None for all of `data`, or at most this many global batches.

    Returns:
      `loss` (the sample-weighted per-example loss over the number of examples,
      without regularization), every metric by its name, and `num_examples`.

    Raises:
      ConfigError: an argument or the data is invalid (e.g. infinite data
        without `steps`).
      DataError: the data does not fit the model or the task, cannot be
        read, or holds no examples (see `data_checks`); nothing is reported.
    """
    input_pipeline.check_global_batch_size(self._strategy, global_batch_size)
    checks.positive_int(steps, "steps", optional=True)
    with progress_output.shown(quiet=self._options.quiet):
      data, label_range = self._checked_data(data, "evaluation")
      start = time.perf_counter()
      with ema.averaged_weights(self._strategy, self._parts):  # The optimizer's moving average, if it keeps one.
        results = self._loops.evaluate(data, label_range, global_batch_size, steps=steps, preprocess=self._preprocess)
      self._state.evaluated(results, seconds=time.perf_counter() - start)
      return dict(results)

  def restore(self, *, data: Data | None = None, checkpoint: str | None = None) -> int:
    """Builds the variables and restores the latest checkpoint of `model_dir`, once; returns the global step.

    The Trainer does this by itself before its first train, evaluate or
    export; with `checkpoint`, it restores that one of `model_dir` now (as
    `runner.training.continuous_eval` does for each one it evaluates).

    Args:
      data: optional, as for `train`: its features give the input shape of
        a model that builds lazily.
      checkpoint: None, or the checkpoint to restore after that (a path
        prefix, `model_dir/checkpoints/ckpt-100`): its step becomes the global step.

    Returns:
      The global step: the restored checkpoint's, or 0 without one.

    Raises:
      ConfigError: the model builds lazily and no `data` was given, the
        checkpoint does not match the model and optimizer, or there is no
        `model_dir` to restore `checkpoint` from.
      checkpoints.UnreadableCheckpointError: `checkpoint` cannot be read
        (`CheckpointGoneError`: it was deleted); no variable changed.
    """
    if checkpoint is not None and self._state.checkpoints is None:
      raise ConfigError(f"restore(checkpoint={checkpoint!r}) needs a Trainer with a model_dir; this one has none.")
    if data is not None:
      self._checked_data(data, "training")
    if not self._parts.ready:
      raise ConfigError(
          "restore needs the model's input shape, which this model does not know yet: pass restore(data=...), "
          "or give the model an input in model_fn (keras.Input)."
      )
    if checkpoint is not None:
      self._state.restore(checkpoint)
      self._input.current = None  # A train call after this starts the data where an uninterrupted run is now.
    return self._state.step

  def export(self, path: str, *, data: Data | None = None) -> str:
    """Writes the model as a SavedModel with a `serving_default` signature (see `export.export_saved_model`).

    Args:
      path: the SavedModel directory.
      data: optional, as for `evaluate`: its features give the input shape
        of a model that builds lazily and has not seen a batch yet.

    Returns:
      `path`.

    Raises:
      ConfigError: the model's input shape is unknown (a lazy model before any data).
    """
    with progress_output.shown(quiet=self._options.quiet):
      if data is not None:
        self._checked_data(data, "export")
      export.export_saved_model(self._strategy, self._parts, path)
      logging.info("Exported a SavedModel at step %d to %s.", self._state.step, path)
      return path

  def predict(self, data: Data, *, global_batch_size: int, path: str) -> str:
    """Writes the model's outputs for every example of `data` (as for `evaluate`) to `path`; see `predict.write`."""
    with progress_output.shown(quiet=self._options.quiet):
      provider = self._checked_data(data, "prediction")[0].provider
      with ema.averaged_weights(self._strategy, self._parts):  # As `evaluate`: the moving average, if kept.
        return predict.write(self._strategy, self.model, provider, global_batch_size, path, preprocess=self._preprocess)

  def close(self) -> None:
    """Releases what the Trainer keeps open between calls; it stays usable.

    That is the training iterator (its input threads and buffers), and
    `metrics.jsonl` and the event files, flushed first; a later call opens
    them again, a later `train` starts its input at the global step.
    `runner.run` closes its Trainer before it returns.
    """
    self._input.current = None
    self._state.reporter.close()

  def _prepared(self, data: Data, purpose: str) -> input_pipeline.PreparedData:
    """`data` as a `PreparedData`: itself, the one last checked for `purpose` when it holds `data`, else a new one."""
    last = self._checked.get(purpose, (None, None))[0]
    if isinstance(data, input_pipeline.PreparedData):
      return data
    return last if last is not None and last.data is data else input_pipeline.PreparedData(data, purpose)

  def _checked_data(self, data: Data, purpose: str) -> tuple[input_pipeline.PreparedData, Any]:
    """Returns `data` prepared and checked against the model and task (once), and its `LabelRange` (or None).

    The first data's features build the variables (`ModelParts.build`); the latest checkpoint is restored then.

    Raises:
      DataError: `data` does not fit the model or the task.
    """
    prepared = self._prepared(data, purpose)
    checked = self._checked.get(purpose)
    if checked is None or checked[0] is not prepared:
      features_spec = self._parts.features_of(prepared, self._preprocess)
      if self._parts.build(self._strategy, features_spec):  # The first data's features built the variables.
        self._state.restore_latest()
      self._checked[purpose] = checked = (prepared, self._parts.label_range(prepared, features_spec, self._task))
    return checked
