"""The Trainer: a generic custom training loop for any `tf.distribute.Strategy` and any Keras model.

It is assembled from small parts: `options` (the options and their checks), `model_parts` (the model, optimizer,
metrics and step made in scope), `train_input` (the distributed training input), `loops` (the inner loops, in
`tf.function`), `controller` (the outer loop) and `actions` (the periodic work after each loop: reports, the stop
request, evaluation, the user's actions, checkpoints).
"""

from collections.abc import Callable, Iterator, Mapping, Sequence
import contextlib
import functools
import signal
import time
from typing import Any, Concatenate, ParamSpec, TypeVar

from absl import logging
import tensorflow as tf

from runner import actions as actions_lib
from runner import interfaces
from runner import tasks
from runner.cluster import maintenance_events
from runner.cluster import stop_signals
from runner.data import checks as data_checks
from runner.data import pipeline as input_pipeline
from runner.data import providers as data_lib
from runner.outputs import checkpoints
from runner.outputs import profiling
from runner.outputs import progress_output
from runner.outputs import reports
from runner.training import controller as controller_lib
from runner.training import export
from runner.training import loops
from runner.training import model_parts
from runner.training import options as trainer_options
from runner.training import parameter_server_loops
from runner.training import steps_per_loop as steps_per_loop_lib
from runner.training import train_input
from runner.training import unchecked_loops
from strategies import checks
from strategies import description
from strategies import peers
from strategies import sharded_variables
from strategies import tensorflow_workarounds
from strategies.errors import ConfigError

_ALL_STEPS = 2**62


def _loss_fails_on_labels_out_of_range(task: interfaces.Task) -> bool:
  """Whether `task`'s loss is the built-in `Classification`'s, whose op fails on a class id out of range."""
  return isinstance(task, tasks.Classification) and type(task).loss is tasks.Classification.loss


_P = ParamSpec("_P")
_R = TypeVar("_R")


def _showing_progress(method: Callable[Concatenate["Trainer", _P], _R]) -> Callable[Concatenate["Trainer", _P], _R]:
  """Runs a public Trainer method inside `progress_output.shown(quiet=self._quiet)` (its progress lines)."""

  @functools.wraps(method)
  def with_progress_shown(self: "Trainer", *args: _P.args, **kwargs: _P.kwargs) -> _R:
    with progress_output.shown(quiet=self._quiet):
      return method(self, *args, **kwargs)

  return with_progress_shown


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

  def __init__(
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
      seed: int | None = None,
      actions: Sequence[interfaces.Action] = (),
      profile_steps: tuple[int, int] | None = None,
      quiet: bool = False,
  ) -> None:
    """Makes the model, optimizer and metrics in `strategy.scope()`.

    The options from `model_dir` to `profile_steps` are documented in full in
    `runner.training.options.TrainerOptions`.

    Args:
      strategy: any `tf.distribute.Strategy`. Under a ParameterServerStrategy
        this process is the coordinator: the steps are scheduled onto the
        workers by a `ClusterCoordinator` (see `parameter_server_loops`).
      model_fn: `() -> keras.Model`, called in scope under the `precision`
        dtype policy. The model may build lazily on its first batch.
      optimizer_fn: `() -> keras.optimizers.Optimizer`, called in scope.
      task: a `runner.Task`: the per-example loss and the metrics.
      model_dir: where checkpoints, summaries and metrics.jsonl go; None keeps
        nothing on disk.
      steps_per_loop: steps per `tf.function` call (and per report), or "auto".
      checkpoint_every: save every this many steps (needs `model_dir`).
      max_to_keep: how many recent checkpoints to keep (None: all).
      async_checkpoints: write the checkpoints of `checkpoint_every` in the
        background while training goes on (where TensorFlow's asynchronous
        checkpointing is used; the final one is always waited for).
      jit_compile: compile with XLA; evaluation then pads to full batches
        (static shapes).
      precision: 'float32', 'mixed_bfloat16' or 'mixed_float16' (which adds
        dynamic loss scaling).
      clipnorm: None, or the bound on the global norm of the summed gradient.
      seed: None, or an int that fixes the initial weights; it works as
        `scoped_settings.random_seed`.
      actions: `runner.actions.Action`s run after every train loop.
      profile_steps: None, or `(first, last)`: the global steps to trace with
        TensorFlow's profiler (needs `model_dir`).
      quiet: False (the default) shows the progress lines of `train`,
        `evaluate` and `export` on stderr as `python -m runner` does, also in
        a plain Python program (see `progress_output`); True shows only
        warnings and errors. Under `runner.run`, its own `quiet` decides.

    Raises:
      ConfigError: an argument is invalid (`jit_compile` under parameter
        servers included), or `model_fn`, `optimizer_fn` or `task.metrics()`
        returned something unusable.
    """
    trainer_options.check_components(strategy=strategy, model_fn=model_fn, optimizer_fn=optimizer_fn, task=task)
    self._quiet = checks.boolean(quiet, "quiet")
    self._options = trainer_options.TrainerOptions(
        model_dir=model_dir,
        steps_per_loop=steps_per_loop,
        checkpoint_every=checkpoint_every,
        max_to_keep=max_to_keep,
        async_checkpoints=async_checkpoints,
        jit_compile=jit_compile,
        precision=precision,
        clipnorm=clipnorm,
        seed=seed,
        actions=actions,
        profile_steps=profile_steps,
    )
    self._strategy = strategy
    tensorflow_workarounds.release_gradients_when_collected(self, strategy)  # What tracing its steps leaves.
    self._coordinator = parameter_server_loops.coordinator_for(strategy, jit_compile=jit_compile)
    self._task = task
    # The task's preprocess, when it has its own (None: the model takes the features as batched).
    self._preprocess = task.preprocess if type(task).preprocess is not interfaces.Task.preprocess else None
    self._xla = jit_compile and not model_parts.is_tpu(strategy)  # TPU steps are compiled with XLA anyway.
    self._parts = model_parts.make(
        strategy, model_fn=model_fn, optimizer_fn=optimizer_fn, task=task, precision=precision, seed=seed
    )
    self._checkpoints = None
    if model_dir is not None:
      self._checkpoints = checkpoints.Checkpoints(
          strategy,
          model_dir,
          model=self._parts.model,
          optimizer=self._parts.optimizer,
          step=self._parts.step,
          max_to_keep=max_to_keep,
          asynchronous=async_checkpoints,
      )
    self._reporter = reports.Reporter(model_dir, is_chief=strategy.extended.should_checkpoint)
    self._profile = None  # Only the chief profiles (itself: the host where it runs, and its devices).
    if self._options.profile_steps is not None and strategy.extended.should_checkpoint:
      first, last = self._options.profile_steps
      assert model_dir is not None  # TrainerOptions: profile_steps needs a model_dir.
      self._profile = profiling.ProfileWindow(first=first, last=last, logdir=reports.summary_dir(model_dir, "train"))
    self._features_spec = None
    self._outputs_spec = None  # The spec of the model's outputs for a batch, once it is built.
    self._checked_data: dict[str, tuple[Any, Any]] = {}  # purpose -> (the data last checked for it, its LabelRange)
    self._ready = False
    self._global_step = 0
    self._evaluated_step: int | None = None
    self._train_loops: dict[Any, Any] = {}
    # cadences -> the MeasuredStepsPerLoop that "auto" keeps across train calls
    self._measured_steps_per_loop: dict[Any, Any] = {}
    self._train_input: tuple[tuple[int, int], Any, Any] | None = None  # ((id(data), global_batch_size), data, iterator)
    self._eval_loop: tuple[Any, loops.EvalLoop] | None = None  # (the LabelRange it checks, the EvalLoop)
    self._last_train_results: Mapping[str, float] = {}
    self._last_eval_results: dict[str, float] | None = None
    self._exit_on_stop = actions_lib.ExitOnStopSignal(save=self._save_for_exit)
    with progress_output.shown(quiet=self._quiet):  # It may restore a checkpoint, and say so.
      self._prepare(None)

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
    return None if self._last_eval_results is None else dict(self._last_eval_results)

  @property
  def global_step(self) -> int:
    """The number of training steps taken so far, restored checkpoints included (an int)."""
    return self._global_step

  @_showing_progress
  def train(
      self,
      data: tf.data.Dataset | interfaces.DatasetProvider,
      *,
      global_batch_size: int,
      steps: int,
      eval_data: tf.data.Dataset | interfaces.DatasetProvider | None = None,
      eval_every: int | None = None,
      eval_global_batch_size: int | None = None,
      eval_steps: int | None = None,
  ) -> dict[str, float]:
    """Trains until the global step reaches `steps`.

    `steps` is a total, so calling `train` again with the same arguments (in
    this or a new process with the same `model_dir`) resumes where the run
    stopped, on the batches an uninterrupted run would see (for data whose
    order is deterministic: unshuffled or a seeded shuffle). After each loop
    of `steps_per_loop` steps the actions run (report, stop signal,
    evaluation, the user's actions, checkpoint); loops end early where an
    action is due, and a checkpoint is always written at the end, before the
    final evaluation (so an evaluation that fails or is stopped loses no
    trained step). On SIGTERM or a first Ctrl-C (SIGINT) the Trainer finishes
    the current loop, saves a checkpoint and exits the process with status
    143 or 130; one that arrives during the final evaluation (a single
    compiled call) lets it finish and write its report, then exits with that
    status. A second Ctrl-C exits at once with 130, without saving. On a
    GCE VM, a maintenance event that stops the VM or a preemption notice
    (from the metadata server, see `runner.cluster.maintenance_events`) does
    what SIGTERM does.

    Args:
      data: an unbatched `tf.data.Dataset` of `(features, labels)` or
        `(features, labels, sample_weight)`, or a `runner.data.DatasetProvider`
        of such datasets. It is repeated as needed.
      global_batch_size: examples per step over all replicas; a multiple of
        the replica count.
      steps: the global step to train to.
      eval_data: like `data` but finite: evaluated every `eval_every` steps
        and at the end.
      eval_every: None (evaluate at the end only) or a positive int.
      eval_global_batch_size: the evaluations' global batch size; None means
        `global_batch_size`.
      eval_steps: None to evaluate all of `eval_data`, or at most this many
        global batches per evaluation.

    Returns:
      The last loop's `loss` and metrics, a dict of floats. When the global
      step is already at `steps` or past it (a rerun of a finished run), it
      says so in one logged line and returns the results of the last loop
      that reached that step: this Trainer's, else the train row of that step
      in `model_dir/metrics.jsonl` (without its throughput), else {} (no
      `model_dir`, or no such row).

    Raises:
      ConfigError: an argument is invalid, or the data ran out (the steps
        taken are checkpointed first).
      DataError: the data does not fit the model or the task, cannot be
        read, or a step's batch held NaN or inf (see `data_checks`); no
        checkpoint is written with non-finite weights. From the final
        evaluation's data, after the checkpoint of the last step; before
        any step where `eval_data` is known to hold no examples.
      FloatingPointError: a step's loss or gradients were not finite while
        its batch was (the training diverged; the message names the step).
      ClusterError: another worker died or stopped answering (found by the
        coordination service's heartbeats within about 10 s), or under
        parameter servers a ps task is gone; the message names it and the
        step the job resumes from.
    """
    input_pipeline.check_global_batch_size(self._strategy, global_batch_size)
    if not checks.is_int(steps) or steps < 0:
      raise ConfigError(f"steps (the global step to train to) must be an int >= 0, got {steps!r}.")
    checks.positive_int(eval_every, "eval_every", optional=True)
    if eval_every is not None and eval_data is None:
      raise ConfigError(f"eval_every={eval_every} needs eval_data to evaluate.")
    if eval_data is not None and data_lib.holds_no_examples(eval_data):
      raise data_checks.no_evaluation_examples_error()
    provider = data_lib.as_provider(data)
    label_range = self._prepare_for(data, provider, "training")
    if self._global_step >= steps:
      return self._nothing_to_train(steps)
    with self._user_errors(provider, label_range, steps=steps, global_batch_size=global_batch_size):
      iterator = self._train_iterator(data, provider, global_batch_size)  # It may read the data (record counts).
    evaluate = functools.partial(
        self.evaluate, eval_data, global_batch_size=eval_global_batch_size or global_batch_size, steps=eval_steps
    )
    rewind = functools.partial(self._train_iterator, data, provider, global_batch_size)
    controller = self._controller(global_batch_size, evaluate, eval_every, label_range, rewind)
    if self._checkpoints is not None:
      self._checkpoints.remove_interrupted_saves()
    self._reporter.resume_at(self._global_step)
    with (
        stop_signals.StopSignals() as signals,
        maintenance_events.watching(on_notice=functools.partial(signals.note, signal.SIGTERM)),
    ):
      try:
        with self._user_errors(provider, label_range, steps=steps, global_batch_size=global_batch_size):
          controller.run(
              iterator,
              step=self._global_step,
              total_steps=steps,
              stop_signal=lambda: signals.received,
              advance=self._advance,
          )
        self._save_unless_saved()  # Before the final evaluation: one that fails or is stopped loses no step.
        if eval_data is not None and self._evaluated_step != self._global_step:
          evaluate()
        if signals.received is not None:  # It came after the last loop's check: during the final evaluation, say.
          self._exit_on_stop.exit(signals.received, step=self._global_step)
      except BaseException:
        self._wait_for_background_save()
        raise
      finally:
        self._reporter.flush()
    return dict(self._last_train_results)

  @_showing_progress
  def evaluate(
      self, data: tf.data.Dataset | interfaces.DatasetProvider, *, global_batch_size: int, steps: int | None = None
  ) -> dict[str, float]:
    """Evaluates the model on `data`, counting every example exactly once.

    Each input pipeline is padded with zero-weight examples to full batches
    (static shapes, as TPUs and XLA need), so a final partial batch and a
    dataset smaller than the replica count are handled; the padding counts
    nowhere.

    Args:
      data: as for `train`, finite unless `steps` is given.
      global_batch_size: examples per step over all replicas; a multiple of
        the replica count.
      steps: None for all of `data`, or at most this many global batches.

    Returns:
      A dict: `loss` (the sample-weighted per-example loss summed, over the
      number of examples; regularization not included), every metric by its
      name (floats), and `num_examples` (an int).

    Raises:
      ConfigError: an argument or the data is invalid (e.g. infinite data
        without `steps`).
      DataError: the data does not fit the model or the task, cannot be
        read, or holds no examples (see `data_checks`); nothing is reported.
    """
    input_pipeline.check_global_batch_size(self._strategy, global_batch_size)
    checks.positive_int(steps, "steps", optional=True)
    strategy = parameter_server_loops.evaluation_strategy(self._strategy)
    provider = data_lib.as_provider(data)
    label_range = self._prepare_for(data, provider, "evaluation")
    start = time.perf_counter()
    try:
      dataset, num_pipelines = input_pipeline.for_evaluation(
          strategy, provider, global_batch_size, bounded=steps is not None, preprocess=self._preprocess
      )
      if self._eval_loop is None or self._eval_loop[0] != label_range:
        self._eval_loop = (
            label_range,
            loops.EvalLoop(
                strategy=strategy,
                model=self._parts.model,
                task_loss=self._task.loss,
                metrics=self._parts.metrics,
                num_input_pipelines=num_pipelines,
                xla=self._xla,
                valid_labels=label_range,
            ),
        )
      evaluated = self._eval_loop[1](iter(dataset), steps or _ALL_STEPS)
      evaluated.raise_problems()
    except (tf.errors.InvalidArgumentError, tf.errors.DataLossError, data_checks.LabelsOutOfRangeError) as e:
      raise data_checks.step_error(e, provider, label_range, step=None, purpose="evaluation") from None
    results = evaluated.results
    if not results["num_examples"]:
      raise data_checks.no_evaluation_examples_error()
    self._reporter.evaluation(step=self._global_step, results=results, seconds=time.perf_counter() - start)
    self._reporter.flush()
    self._last_eval_results = results
    self._evaluated_step = self._global_step
    return dict(results)

  def restore(
      self, *, data: tf.data.Dataset | interfaces.DatasetProvider | None = None, checkpoint: str | None = None
  ) -> int:
    """Builds the variables and restores the latest checkpoint of `model_dir`, once; returns the global step.

    The Trainer does this by itself before its first train, evaluate or
    export. Call it to learn the step a run resumes from, or to find a
    checkpoint that does not match before any work; or, with `checkpoint`,
    to restore a given checkpoint of `model_dir` now, as
    `runner.training.continuous_eval` does for each checkpoint it evaluates.

    Args:
      data: optional, as for `train`: its features give the input shape of
        a model that builds lazily.
      checkpoint: None, or the path of a checkpoint to restore after that
        (a path prefix, e.g. `model_dir/checkpoints/ckpt-100`); its step
        becomes the global step.

    Returns:
      The global step: the restored checkpoint's, or 0 without one.

    Raises:
      ConfigError: the model builds lazily and no `data` was given, or the
        checkpoint does not match the model and optimizer, or `checkpoint`
        is given to a Trainer without a `model_dir`.
      checkpoints.UnreadableCheckpointError: `checkpoint` cannot be read;
        `checkpoints.CheckpointGoneError` (a subclass) when its files were
        deleted, e.g. by the `max_to_keep` of the trainer that wrote it. No
        variable changed.
    """
    if checkpoint is not None and self._checkpoints is None:
      raise ConfigError(f"restore(checkpoint={checkpoint!r}) needs a Trainer with a model_dir; this one has none.")
    if data is not None:
      self._prepare_for(data, data_lib.as_provider(data), "training")
    if not self._ready:
      raise ConfigError(
          "restore needs the model's input shape, which this model does not know yet: pass restore(data=...), "
          "or give the model an input in model_fn (keras.Input)."
      )
    if checkpoint is not None:
      assert self._checkpoints is not None  # Checked above.
      self._global_step = self._checkpoints.restore(checkpoint)
      self._train_input = None  # A train call after this starts the data where an uninterrupted run is at this step.
      self._last_train_results = {}
    return self._global_step

  @_showing_progress
  def export(self, path: str, *, data: tf.data.Dataset | interfaces.DatasetProvider | None = None) -> str:
    """Writes the model as a SavedModel with a `serving_default` signature (see `export`).

    Args:
      path: the SavedModel directory.
      data: optional, as for `evaluate`: its features give the input shape
        of a model that builds lazily and has not seen a batch yet.

    Returns:
      `path`.

    Raises:
      ConfigError: the model's input shape is unknown (a model that builds
        lazily, before any train or evaluate, and no `data`).
    """
    if data is not None:
      self._prepare_for(data, data_lib.as_provider(data), "export")
    declared = data_checks.declared_features_spec(self._parts.model)
    features_spec = self._features_spec or (None if declared is None else input_pipeline.batch_spec(declared))
    if not self._ready or features_spec is None:
      raise ConfigError(
          "export needs the model's input shape, which this model does not know yet: call train or evaluate "
          "first, pass export(path, data=...), or give the model an input in model_fn (keras.Input)."
      )
    export.export_saved_model(self._strategy, self._parts.model, features_spec, path)
    logging.info("Exported a SavedModel at step %d to %s.", self._global_step, path)
    return path

  def close(self) -> None:
    """Releases what the Trainer keeps open between calls; it stays usable.

    That is the training iterator, with its input threads and buffers, and
    `metrics.jsonl` and the TensorBoard event files, flushed first. A later
    call opens them again; a later `train` starts its input where an
    uninterrupted run is at the global step (as after `restore(checkpoint=...)`).
    `runner.run` closes its Trainer before it returns, so a sweep of runs in
    one process does not keep each run's input threads and open files.
    """
    self._train_input = None
    self._reporter.close()

  def _prepare_for(
      self, data: tf.data.Dataset | interfaces.DatasetProvider, provider: interfaces.DatasetProvider, purpose: str
  ) -> interfaces.LabelRange | None:
    """Checks `provider`'s elements against the model and task, and builds the variables from them (once).

    The data last checked for a purpose (`data`, as the user gave it) is not
    checked again.

    Returns:
      The `LabelRange` the labels of `data`'s batches are checked against
      (see `data_checks`), or None.

    Raises:
      DataError: `data` does not fit the model or the task.
    """
    checked = self._checked_data.get(purpose)
    if checked is not None and checked[0] is data:
      return checked[1]
    element_spec = input_pipeline.element_spec(provider, purpose)
    features_spec = input_pipeline.batch_spec(element_spec[0])
    if self._preprocess is None:
      data_checks.check_features(
          element_spec, data_checks.features_expected(self._parts.model, self._features_spec), purpose=purpose
      )
      data_checks.check_one_tensor_for_sequential(element_spec, self._parts.model, purpose=purpose)
    else:  # The model takes the preprocessed features: checked against its input when it is called.
      features_spec = input_pipeline.preprocessed_spec(self._preprocess, features_spec)
    self._prepare(features_spec)
    if self._outputs_spec is None and self._ready:
      self._outputs_spec = self._parts.keras_version.outputs_spec(self._parts.model, features_spec)
    label_range = data_checks.label_range(element_spec, self._outputs_spec, self._task, purpose=purpose)
    self._checked_data[purpose] = (data, label_range)
    return label_range

  def _prepare(self, features_spec: Any) -> None:
    """Builds the model and optimizer variables (once, see `ModelParts.build`), then restores the latest checkpoint."""
    if features_spec is not None and self._features_spec is None:
      self._features_spec = features_spec
    if self._ready or not self._parts.build(self._strategy, features_spec):
      return
    self._ready = True
    if self._coordinator is not None:
      logging.info("parameter_server: %s.", sharded_variables.describe(self._parts.model.weights))
    if self._checkpoints is not None and self._checkpoints.restore_latest():
      self._global_step = int(self._parts.step.numpy())

  def _train_iterator(
      self,
      data: tf.data.Dataset | interfaces.DatasetProvider,
      provider: interfaces.DatasetProvider,
      global_batch_size: int,
      rewound_to: int | None = None,
  ) -> Any:
    """Returns the distributed iterator over `provider`; the same one again when `train` gets the same `data`.

    So consecutive `train` calls in one process continue the data stream
    where the last one stopped (and skip rebuilding the input pipeline). A
    new iterator starts where an uninterrupted run would be at the current
    global step (see `train_input.training_iterator`), or, with `rewound_to`,
    at that step (steps run again with the checks, `unchecked_loops.RerunChecked`);
    it is kept for the `train` calls after this. A new one (not rewound) notes
    what the data is in the checkpoints (`Checkpoints.swap_training_data`),
    and a resume on other data than the checkpoint's says so.
    """
    key = (id(data), global_batch_size)
    if rewound_to is not None or self._train_input is None or self._train_input[0] != key:
      data_change = None  # (what the checkpoint says the run trained on, the data now) where they differ.
      if rewound_to is None and self._checkpoints is not None:
        now = data_lib.description(provider)
        was = self._checkpoints.swap_training_data(now)
        data_change = (was, now) if was not in ("", now) else None
      iterator = train_input.training_iterator(
          self._strategy,
          provider,
          global_batch_size,
          start_step=self._global_step if rewound_to is None else rewound_to,
          coordinator=self._coordinator,
          preprocess=self._preprocess,
          data_change=data_change,
      )
      self._train_input = (key, data, iterator)
    return self._train_input[2]

  @contextlib.contextmanager
  def _user_errors(
      self,
      provider: interfaces.DatasetProvider,
      label_range: interfaces.LabelRange | None,
      *,
      steps: int,
      global_batch_size: int,
  ) -> Iterator[None]:
    """Inside, what stops training early becomes the error a user reads.

    Raises:
      ConfigError: the data ran out (the steps taken are saved first).
      DataError: a batch could not be read or parsed, or held a label
        outside `label_range`, NaN or inf (see `data_checks.step_error`).
      FloatingPointError: the training diverged.
      ClusterError: a peer (or under parameter servers a ps task) is gone.
    """
    first_step = self._global_step
    try:
      yield
    except tf.errors.OutOfRangeError:
      raise self._data_ran_out(global_batch_size, steps, first_step) from None
    except data_checks.LabelsOutOfRangeError as e:
      raise data_checks.step_error(e, provider, label_range, step=e.step, purpose="training") from None
    except (tf.errors.InvalidArgumentError, tf.errors.DataLossError) as e:
      step = int(self._parts.step.numpy()) + 1
      raise data_checks.step_error(e, provider, label_range, step=step, purpose="training") from None
    except peers.PEER_ERRORS as e:
      saved_step = None if self._checkpoints is None else self._checkpoints.saved_step
      if self._coordinator is not None:
        raise parameter_server_loops.lost_ps(e, self._strategy, step=self._global_step, saved_step=saved_step) from None
      if description.is_single_worker(self._strategy):
        raise
      raise peers.lost(
          e, cluster_resolver=self._strategy.cluster_resolver, step=self._global_step, saved_step=saved_step
      ) from None

  def _controller(
      self,
      global_batch_size: int,
      evaluate: Callable[[], Mapping[str, float]],
      eval_every: int | None,
      label_range: interfaces.LabelRange | None,
      rewind: Callable[[int], Any],
  ) -> controller_lib.Controller:
    """Returns the outer loop for one `train` call, with the built-in actions around the user's.

    Order: report, exit on a stop request, evaluate (when due; at the last
    step after a checkpoint), the user's actions, checkpoint (when due).
    Under parameter servers a loop is one scheduled function of
    `steps_per_loop` steps per worker.
    """
    builtin_before: list[actions_lib.Action] = [actions_lib.ReportProgress(self._reporter), self._exit_on_stop]
    if eval_every is not None:
      builtin_before.append(actions_lib.Evaluate(evaluate, every_steps=eval_every, save=self._save_unless_saved))
    builtin_after: list[actions_lib.Action] = []
    if self._options.checkpoint_every is not None:
      builtin_after.append(
          actions_lib.SaveCheckpoint(self._save_in_background, every_steps=self._options.checkpoint_every)
      )
    steps_per_loop = steps_per_loop_lib.resolve(
        self._options.steps_per_loop,
        strategy=self._strategy,
        cadences=(eval_every, self._options.checkpoint_every),
        measured=self._measured_steps_per_loop,
    )
    return controller_lib.Controller(
        train_loop=self._train_loop(global_batch_size, label_range, steps_per_loop, rewind),
        steps_per_loop=steps_per_loop,
        actions=builtin_before + list(self._options.actions) + builtin_after,
        global_batch_size=global_batch_size,
        is_chief=self._strategy.extended.should_checkpoint,
        single_worker=description.is_single_worker(self._strategy),
        profile=self._profile,
    )

  def _train_loop(
      self,
      global_batch_size: int,
      label_range: interfaces.LabelRange | None,
      steps_per_loop: Any,
      rewind: Callable[[int], Any],
  ) -> loops.TrainLoop | unchecked_loops.RerunChecked:
    """The inner loop for this batch size, label range and loop sizes (its parts made once and kept, with their traces).

    Where one process runs every replica, a call runs many steps (not on a
    TPU, whose compiled step checks nearly for free) and there is a
    `model_dir`, loops run unchecked once it holds a checkpoint, and the
    steps of a loop that is not finite run again from that checkpoint with
    the checks (`unchecked_loops.RerunChecked`, its batches from `rewind`).
    """
    if (
        steps_per_loop.looping
        and self._checkpoints is not None
        and self._coordinator is None
        and description.is_single_worker(self._strategy)
        and not model_parts.is_tpu(self._strategy)
    ):
      saves = self._checkpoints
      return unchecked_loops.RerunChecked(
          unchecked=self._unchecked_loop(global_batch_size, label_range),
          checked=functools.partial(self._checked_train_loop, global_batch_size, label_range, looping=True),
          step=self._parts.step,
          rewind=rewind,
          saved_step=lambda: saves.saved_step,
          restore_saved=saves.restore_saved,
      )
    return self._checked_train_loop(global_batch_size, label_range, looping=steps_per_loop.looping)

  def _loop_arguments(self, global_batch_size: int, label_range: interfaces.LabelRange | None) -> dict[str, Any]:
    return dict(
        strategy=self._strategy,
        model=self._parts.model,
        optimizer=self._parts.optimizer,
        task_loss=self._task.loss,
        metrics=self._parts.metrics,
        step=self._parts.step,
        global_batch_size=global_batch_size,
        xla=self._xla,
        clipnorm=self._options.clipnorm,
        loss_scale=self._parts.loss_scaled,
        keras_version=self._parts.keras_version,
        valid_labels=label_range,
    )

  def _checked_train_loop(
      self, global_batch_size: int, label_range: interfaces.LabelRange | None, *, looping: bool
  ) -> loops.TrainLoop:
    """The loop that checks every step, for this batch size, label range and looping, made once and kept."""
    key = (global_batch_size, label_range, looping)
    if key not in self._train_loops:
      arguments = self._loop_arguments(global_batch_size, label_range)
      if self._coordinator is not None:
        self._train_loops[key] = parameter_server_loops.ScheduledTrainLoop(coordinator=self._coordinator, **arguments)
      else:
        self._train_loops[key] = loops.TrainLoop(
            looping=looping, multi_worker=not description.is_single_worker(self._strategy), **arguments
        )
    return self._train_loops[key]

  def _unchecked_loop(
      self, global_batch_size: int, label_range: interfaces.LabelRange | None
  ) -> unchecked_loops.UncheckedTrainLoop:
    """The unchecked loop for this batch size and label range, made once and kept.

    Its steps check the label range only where the task's loss does not fail
    by itself on a label out of range, as the built-in `Classification`'s
    does (on a CPU an op error, on a GPU a NaN loss).
    """
    key = ("unchecked", global_batch_size, label_range)
    if key not in self._train_loops:
      state = list(self._parts.model.variables) + list(
          self._parts.keras_version.optimizer_variables(self._parts.optimizer)
      )
      arguments = self._loop_arguments(global_batch_size, label_range)
      if _loss_fails_on_labels_out_of_range(self._task):
        arguments["valid_labels"] = None
      self._train_loops[key] = unchecked_loops.UncheckedTrainLoop(state=state, **arguments)
    return self._train_loops[key]

  def _advance(self, step: int, train_results: Mapping[str, float]) -> None:
    self._global_step = step
    self._last_train_results = train_results

  def _nothing_to_train(self, steps: int) -> dict[str, float]:
    """Says that the global step is at `steps` already; returns the results of the loop that reached it."""
    if self._checkpoints is not None and self._checkpoints.saved_step == self._global_step:
      where = f"the checkpoint in {self._checkpoints.model_dir} is at step {self._global_step}"
    else:
      where = f"the global step is {self._global_step}"
    logging.info("Nothing to train: %s >= steps=%d.", where, steps)
    if not self._last_train_results and self._checkpoints is not None:
      return reports.train_results_at(self._checkpoints.model_dir, self._global_step)
    return dict(self._last_train_results)

  def _data_ran_out(self, global_batch_size: int, steps: int, first_step: int) -> ConfigError:
    """Saves the steps taken before the training data ran out; returns the error that says so."""
    self._global_step = int(self._parts.step.numpy())
    saved = ""
    if self._checkpoints is not None and self._global_step > (self._checkpoints.saved_step or 0):
      self._checkpoints.save(self._global_step)
      saved = f" Those steps are saved in a checkpoint at step {self._global_step}."
    return ConfigError(
        f"The training data ran out at step {self._global_step} of {steps} "
        f"({self._global_step - first_step} step(s) in this call): it gave no further full batch of "
        f"{global_batch_size} examples although the Trainer repeats it. It is empty, or it cannot be iterated "
        f"twice (e.g. a one-shot Python generator); make it repeatable.{saved}"
    )

  def _save_unless_saved(self) -> None:
    """Writes a checkpoint at the current step, if there is a model_dir and none of this step yet; waits for it."""
    if self._checkpoints is not None:
      self._checkpoints.save_unless_saved(self._global_step)

  def _save_in_background(self) -> None:
    """As `_save_unless_saved`, but returns while the checkpoint is written (with `async_checkpoints`)."""
    if self._checkpoints is not None:
      self._checkpoints.save_unless_saved(self._global_step, in_background=True)

  def _wait_for_background_save(self) -> None:
    """Lets a checkpoint being written in the background complete as training fails; logs, not raises, its failure."""
    if self._checkpoints is None:
      return
    try:
      self._checkpoints.wait()
    except checkpoints.CheckpointWriteError as error:
      logging.warning("%s", error)

  def _save_for_exit(self) -> str | None:
    """Saves (if there is a model_dir and the step is not saved yet), flushes the reports; returns the latest path."""
    self._save_unless_saved()
    self._reporter.flush()
    return None if self._checkpoints is None else checkpoints.latest(self._checkpoints.model_dir)
