"""`run(config)`: one config to a training run, and what it returns, `RunResult`."""

from collections.abc import Iterator, Mapping, Sequence
import contextlib
import copy
import dataclasses
import functools
import gc
import itertools
import os
import tempfile
from typing import Any

from absl import logging
import ml_collections
import tensorflow as tf

from runner.cluster import roles
from runner.cluster import vertex
from runner.config import optimizers
from runner.config import registry
from runner.config import run_config as config_lib
from runner.data import pipeline as input_pipeline
from runner.data import providers as data_lib
from runner.outputs import best as best_checkpoint
from runner.outputs import checkpoints
from runner.outputs import progress_output
from runner.outputs import reports
from runner.tasks import Task
from runner.training import continuous_eval as continuous_eval_lib
from runner.training import keras_versions
from runner.training import options as trainer_options
from runner.training import predict
from runner.training import steps_per_loop as steps_per_loop_lib
from runner.training.trainer import Trainer
from runner.workdir import config_history
from runner.workdir import lock as workdir_lock
from runner.workdir import remote
from runner.workdir import state as workdir_state
from strategies import checks
from strategies import factory as strategy_factory
from strategies import schema as strategy_schema
from strategies import tensorflow_workarounds
from strategies.errors import ConfigError
from strategies.errors import first_line

EXPORT_DIR = "export"
_RUNS_STARTED = itertools.count()  # `run` calls past validation in this process.
TRAINING_MODES = ("train", "train_and_eval")  # The modes that hold the workdir's lock (`workdir_lock`).
# What a filesystem raises when it cannot be reached (TensorFlow's GCS client: FailedPrecondition for a host it
# cannot resolve or connect to); any other error of a workdir is the user's to fix.
_UNREACHABLE = (tf.errors.UnavailableError, tf.errors.DeadlineExceededError, tf.errors.FailedPreconditionError)


@dataclasses.dataclass(frozen=True)
class RunResult:
  """What a run did.

  Attributes:
    workdir: the directory with config.json, config_history.jsonl,
      checkpoints, summaries, metrics.jsonl and the export.
    config: the resolved config (as written to `workdir/config.json`).
    strategy: the `tf.distribute.Strategy` it ran under.
    num_replicas: the strategy's replicas in sync.
    global_step: the step count after the run.
    train_metrics: the last train loop's `loss` and task metrics; for a
      resumed run already at `train_steps`, those of that step's train row in
      `metrics.jsonl` (see `Trainer.train`). None when there are none (mode
      'eval' or 'export', or no such row).
    eval_metrics: the final evaluation (`loss`, the task's metrics,
      `num_examples`), or None when the mode does not evaluate. A
      'train_and_eval' run with nothing left to train returns the one
      `metrics.jsonl` holds for its step (evaluating only without one).
      Mode 'continuous_eval': the evaluation of the last checkpoint it took
      (None if none).
    checkpoint_path: the latest checkpoint in the workdir, or None; for mode
      'continuous_eval', the last checkpoint it evaluated; for mode 'predict', the one it restored.
    export_path: the SavedModel directory for mode 'export', and for a training mode under Vertex AI
      (`AIP_MODEL_DIR`, see `run`); else None.
    model: the Keras model (Keras 3 or tf_keras) with the run's final weights (on every worker of
      a multi-worker job, the same weights).
    predictions_path: the predictions' directory (`WORKDIR/predictions`) for mode 'predict', else None.
  """

  workdir: str
  config: ml_collections.ConfigDict
  strategy: tf.distribute.Strategy
  num_replicas: int
  global_step: int
  train_metrics: Mapping[str, float] | None
  eval_metrics: Mapping[str, float] | None
  checkpoint_path: str | None
  export_path: str | None
  model: Any  # A keras.Model, or a tf_keras.Model.
  predictions_path: str | None = None


def run(
    config: ml_collections.ConfigDict, workdir: str | None = None, *, quiet: bool = False, actions: Sequence[Any] = ()
) -> RunResult:
  """Runs `config.mode` ('train', 'eval', 'train_and_eval', 'export', 'continuous_eval' or 'predict').

  The config is validated before any TensorFlow device work; then the
  strategy is built and the batch sizes are checked against its replica
  count; then the workdir is checked; then data, model, task and optimizer
  are built and the latest checkpoint restored, and only then is the config
  recorded (`config.json`, `config_history.jsonl`; see `config_history`) and
  the mode run. A workdir with checkpoints resumes the run ('train'
  continues to `config.trainer.train_steps`), refusing a config that
  changes what the checkpoint holds; 'eval' and 'export' need a checkpoint
  there. A run that fails before it trains leaves the workdir as it was (one
  it created is removed); one that trained keeps what it wrote (see
  `workdir_state`). A training run holds the workdir's lock from before it
  writes anything until it returns or fails, so a second one stops at once
  (see `workdir_lock`); 'eval' and 'export' neither take nor wait for it.
  'continuous_eval' is the evaluator beside a trainer (`continuous_eval`):
  it takes the evaluator's lock, not the trainer's (one evaluator per
  workdir), records no config and writes only its evaluations. 'predict'
  takes no lock either and writes only `WORKDIR/predictions` (`_predict_result`).
  Calls in one process (a sweep) do not pile up: each closes its Trainer
  (`Trainer.close`) before it returns, and each after the first starts by
  freeing what the runs before it left (`_free_earlier_runs`).

  Args:
    config: a ConfigDict with any part of the schema (`runner.config.default_config()`);
      the rest takes its defaults.
    workdir: where checkpoints, summaries, metrics.jsonl, the config files
      and the export go (a local path, `~` expanded, or e.g. `gs://`); None
      makes a new temporary directory, or under Vertex AI takes the
      directories its variables name (`runner.cluster.vertex.output_dirs`;
      a training run then ends by exporting to `AIP_MODEL_DIR`).
    quiet: False (the default) shows the CLI's progress on stderr while the
      run lasts: the workdir, a line per train loop and per evaluation, the
      checkpoints (absl INFO logs; see `progress_output`). True shows only
      warnings and errors.
    actions: `runner.actions.Action`s of a training run, after the built-in
      ones (the Trainer's `actions`; `ray_train.tune` reports each evaluation so).

  Returns:
    A `RunResult`.

  Raises:
    ConfigError: a bad config, a directory of Vertex AI's that cannot be
      written (`vertex.check_writable`), a workdir that is empty, cannot be written or
      that another training run holds (`workdir_lock.WorkdirInUseError`), a batch size
      the replica count does not divide, no checkpoint to evaluate, export or predict with,
      a checkpoint the config does not match, or one that cannot be written.
    runner.data.DataError (a ConfigError): the data does not fit the model or
      the task, cannot be read, or holds NaN or inf values.
    FloatingPointError: a step's loss or gradients were not finite (the
      training diverged).
    runner.workdir.remote.UnreachableError: the workdir's filesystem could not
      be reached (no network); a later run may reach it.
  """
  with progress_output.shown(quiet=checks.boolean(quiet, "quiet")):
    config = for_this_task(config_lib.validate(config))
    _free_earlier_runs()
    strategy = create_strategy(config)
    outputs = vertex.output_dirs(workdir)
    workdir = reachable_workdir(outputs.workdir)
    vertex.check_writable(outputs)
    if config.mode == "continuous_eval":
      return _continuous_eval_result(config, strategy, workdir, outputs.summary_dir)
    if config.mode == "predict":
      return _predict_result(config, strategy, workdir)
    with (
        _workdir_for(config, strategy, workdir) as workdir,
        _restored_trainer(config, strategy, workdir, outputs.summary_dir, actions) as (trainer, train_data),
    ):
      eval_data = None  # The eval split, made once where the mode uses it.
      if config.mode != "train":
        eval_data = _prepared(config, "eval", "export" if config.mode == "export" else "evaluation")
      evaluation = {"global_batch_size": config.data.eval_global_batch_size, "steps": config.trainer.eval_steps}
      train_metrics = export_path = None
      if config.mode in TRAINING_MODES:
        train_metrics = trainer.train(
            train_data,
            global_batch_size=config.data.global_batch_size,
            steps=config.trainer.train_steps,
            eval_data=eval_data,
            eval_every=None if eval_data is None else config.trainer.eval_every,
            eval_global_batch_size=evaluation["global_batch_size"],
            eval_steps=evaluation["steps"],
        )
      eval_metrics = trainer.last_eval_metrics
      if config.mode == "train_and_eval" and eval_metrics is None:  # Trained before; nothing left to train.
        eval_metrics = reports.eval_results_at(workdir, trainer.global_step)  # Returned as it is: no second row.
        if eval_metrics:
          logging.info(
              f"Not evaluating again: the metrics of {workdir} hold the evaluation at step "
              f"{trainer.global_step} (mode 'eval' evaluates anew)."
          )
      if config.mode == "eval" or (config.mode == "train_and_eval" and not eval_metrics):
        eval_metrics = trainer.evaluate(eval_data, **evaluation)
      if config.mode == "export" or (config.mode in TRAINING_MODES and outputs.export_dir):
        export_path = trainer.export(outputs.export_dir or os.path.join(workdir, EXPORT_DIR), data=eval_data)
      outcome = (train_metrics or None, eval_metrics, checkpoints.latest(workdir), export_path)
      return _result(config, trainer, workdir, trainer.global_step, outcome)


def _result(config: Any, trainer: Trainer, workdir: str, step: int, outcome: tuple[Any, Any, Any, Any]) -> RunResult:
  """The `RunResult` of `trainer` at `step`; `outcome` holds its fields from `train_metrics` to `export_path`."""
  strategy = trainer.strategy
  return RunResult(workdir, config, strategy, strategy.num_replicas_in_sync, step, *outcome, trainer.model)


def for_this_task(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """`config` for this task: on a cluster's `evaluator` task, its training becomes `continuous_eval`, on this machine.

  The evaluator of a TFJob, Vertex AI or TF_CONFIG cluster runs the same
  command as the trainers, but is not one of them (`runner.cluster.roles`):
  a training mode becomes 'continuous_eval', under the strategy `auto`
  chooses for this machine (with `config.strategy.virtual_cpus` kept).
  Every other config is returned as it is.
  """
  role, found = roles.role(config)
  if role != roles.EVALUATE:
    return config
  evaluator = copy.deepcopy(config)
  with evaluator.unlocked():
    evaluator.strategy = strategy_schema.default_config()
    evaluator.strategy.virtual_cpus = config.strategy.get("virtual_cpus")
    if config.mode in TRAINING_MODES:
      evaluator.mode = "continuous_eval"
  logging.info(
      f"{found.describe()}: mode {evaluator.mode!r} under strategy auto (the trainers: mode {config.mode!r} under "
      f"{config.strategy.name})."
  )
  return config_lib.validate(evaluator)


def _continuous_eval_result(
    config: ml_collections.ConfigDict, strategy: tf.distribute.Strategy, workdir: str | None, summary_dir: str | None
) -> RunResult:
  """Runs mode 'continuous_eval': the evaluator beside a trainer (`runner.training.continuous_eval`).

  It evaluates each new checkpoint a trainer of the same config writes to
  `workdir`, once, and ends after the checkpoint of
  `config.trainer.train_steps`, or after `config.trainer.eval_timeout_seconds`
  without a new checkpoint; its `RunResult` holds the last evaluation (None
  when there was none). It holds the workdir's evaluator lock while it runs
  and writes into `workdir` only its evaluations (TensorBoard scalars in
  `summaries/eval`, `eval` rows of `metrics.jsonl`), so a failure leaves the
  workdir as it is. SIGTERM or Ctrl-C end it with 143 or 130.
  """
  if workdir is None:
    raise ConfigError(
        "Mode 'continuous_eval' evaluates the checkpoints a training run writes to its workdir: give that "
        "workdir (--workdir=DIR, or runner.run(config, workdir))."
    )
  trainer = create_trainer(config, strategy, workdir, summary_dir=summary_dir)
  with contextlib.closing(trainer):
    last = continuous_eval_lib.evaluate_new_checkpoints(
        trainer,
        dataset(config, "eval"),
        final_step=config.trainer.train_steps,
        timeout_seconds=config.trainer.eval_timeout_seconds,
        global_batch_size=config.data.eval_global_batch_size,
        steps=config.trainer.eval_steps,
    )
  if last is None:
    return _result(config, trainer, workdir, trainer.global_step, (None,) * 4)
  return _result(config, trainer, workdir, last.step, (None, dict(last.metrics), last.checkpoint, None))


def _predict_result(
    config: ml_collections.ConfigDict, strategy: tf.distribute.Strategy, workdir: str | None
) -> RunResult:
  """Runs mode 'predict': the model of the workdir's latest (or best) checkpoint over a split, into `predictions/`.

  The split is `config.data.predict_split` (None: 'eval'), in batches of
  `config.data.eval_global_batch_size`; the files are those of
  `Trainer.predict`, in `WORKDIR/predictions`, which a rerun replaces whole.
  It takes no lock and changes nothing else in the workdir: no config is
  recorded, no metrics, summaries or checkpoints are written.

  Raises:
    ConfigError: no workdir, no checkpoint in it (or, with
      `config.predict.checkpoint='best'`, none in `WORKDIR/best`), or one
      the config does not match; nothing was written.
  """
  if workdir is None:
    raise ConfigError(
        "Mode 'predict' runs the model of a training run's checkpoint: give that run's workdir (--workdir=DIR, or "
        "runner.run(config, workdir))."
    )
  train_data, _ = check_resumable(config, workdir)
  best = best_checkpoint.checkpoint_path(workdir) if config.predict.checkpoint == "best" else None
  trainer = create_trainer(config, strategy, workdir)
  with contextlib.closing(trainer):
    trainer.restore(data=train_data, checkpoint=best)
    path = trainer.predict(
        _prepared(config, config.data.predict_split or "eval", "prediction"),
        global_batch_size=config.data.eval_global_batch_size,
        path=os.path.join(workdir, predict.DIRECTORY),
    )
  result = _result(
      config, trainer, workdir, trainer.global_step, (None, None, best or checkpoints.latest(workdir), None)
  )
  return dataclasses.replace(result, predictions_path=path)


def _free_earlier_runs() -> None:
  """Frees what the runs before this one in this process left, when there were any.

  Two things a finished run leaves outlive it:
  - reference cycles only Python's cycle collector frees: TensorFlow's traced
    graphs (each op refers to its graph and the graph to its ops), and with
    them the run's Trainer, model and the input threads their graphs
    captured. Collected here (`gc.collect()`), unless this process turned the
    collector off (`gc.disable()`, as the test suite does): it keeps its choice.
  - TensorFlow's cache of the kernels it instantiated for the run's traced
    functions, which keeps each function's executor after the function is
    gone (`tensorflow_workarounds.clear_kernel_cache`; kernels still in use are rebuilt when next run).
  Without this a sweep of runs in one process grew by several MB and threads
  per run; with it, it stays flat (docs/benchmarks.md#sweeps-in-one-process).
  The first run of a process (the command line's only one) pays nothing.
  """
  if not next(_RUNS_STARTED):
    return
  if gc.isenabled():
    gc.collect()
  tensorflow_workarounds.clear_kernel_cache()


@contextlib.contextmanager
def _workdir_for(
    config: ml_collections.ConfigDict, strategy: tf.distribute.Strategy, workdir: str | None
) -> Iterator[str]:
  """Yields the run's workdir (None: a new temporary one), made and checked to be written, locked as below.

  A training run's chief holds the workdir's lock (`workdir_lock`) from
  before it writes anything; another worker, 'eval' and 'export' take none.
  ConfigError: it cannot be created or written; `WorkdirInUseError`: another
  live run holds it, and nothing was written.

  A run that fails inside leaves the workdir as it was unless it trained
  (`workdir_state`); only the chief that holds the lock (or, without one,
  a chief while no training run holds it) puts it back.
  """
  is_chief = strategy.extended.should_checkpoint
  created = workdir is None or not tf.io.gfile.exists(workdir)
  workdir = tempfile.mkdtemp(prefix="tf-runner-") if workdir is None else workdir
  probe, lock = os.path.join(workdir, f".write-test-{os.getpid()}"), None
  try:  # Made, locked (a training run's chief), then checked that it can be written, in that order.
    tf.io.gfile.makedirs(workdir)
    if is_chief and config.mode in TRAINING_MODES:
      lock = workdir_lock.acquire(workdir, mode=config.mode)
    with tf.io.gfile.GFile(probe, "w") as f:
      f.write("")
    tf.io.gfile.remove(probe)
  except (tf.errors.OpError, OSError) as e:
    if lock is not None:
      lock.release()
    reason = getattr(e, "message", None) or str(e)
    raise ConfigError(f"The workdir {workdir!r} cannot be written ({reason}); choose another --workdir.") from None
  try:
    service = trainer_options.data_service(config)
    served = f"; {service.describe()}" if service is not None and config.mode in TRAINING_MODES else ""
    logging.info("Mode %s in the workdir %s%s%s.", config.mode, workdir, " (new)" if created else "", served)
    before = workdir_state.WorkdirState.read(workdir, created=created)
    try:
      yield workdir
    except BaseException:
      if lock is not None or (is_chief and not workdir_lock.is_held(workdir)):
        before.restore_unless_trained()
      raise
  finally:
    if lock is not None:
      lock.release()


@contextlib.contextmanager
def _restored_trainer(
    config: ml_collections.ConfigDict,
    strategy: tf.distribute.Strategy,
    workdir: str,
    summary_dir: str | None,
    actions: Sequence[Any] = (),
) -> Iterator[tuple[Trainer, input_pipeline.PreparedData]]:
  """Builds the Trainer, checks the config against the workdir's checkpoint, restores it, records the config.

  Yields `(trainer, train_data)`; closes the Trainer (`Trainer.close`) after.
  """
  train_data, previous = check_resumable(config, workdir)
  trainer = create_trainer(config, strategy, workdir, summary_dir=summary_dir, actions=actions)
  with contextlib.closing(trainer):
    step = trainer.restore(data=train_data)
    if strategy.extended.should_checkpoint:
      config_history.record(workdir, config, step=step, data_spec=str(train_data.element_spec), previous=previous)
    yield trainer, train_data


def check_resumable(
    config: ml_collections.ConfigDict, workdir: str
) -> tuple[input_pipeline.PreparedData, dict[str, Any] | None]:
  """The checks of the workdir's checkpoint a run makes before it builds the Trainer; the dry run makes them too.

  Returns:
    `(train_data, previous)`: the training data (its element spec found
    once, for these checks and the Trainer's), and the workdir's latest
    recorded run (`config_history.latest`).

  Raises:
    ConfigError: mode 'eval', 'export' or 'predict' without a checkpoint (or without the best one, for
      `config.predict.checkpoint='best'`), or a checkpoint
      trained with another model, task, optimizer, precision or data
      (`config_history.check_resumable`).
  """
  checkpoint = checkpoints.latest(workdir)
  if config.mode in ("eval", "export", "predict") and checkpoint is None:
    raise ConfigError(
        f"Mode {config.mode!r} needs a checkpoint in {os.path.join(workdir, checkpoints.DIRECTORY)}, and there is "
        "none; train first (mode 'train' or 'train_and_eval' with the same workdir)."
    )
  best = os.path.join(workdir, best_checkpoint.DIRECTORY)
  if (
      config.mode == "predict"
      and config.predict.checkpoint == "best"
      and best_checkpoint.checkpoint_path(workdir) is None
  ):
    raise ConfigError(
        f"config.predict.checkpoint='best' needs the best checkpoint in {best}, and there "
        "is none; train with config.trainer.best_metric set, or predict with config.predict.checkpoint='latest'."
    )
  train_data = _prepared(config, "train", "training")
  previous = config_history.latest(workdir)
  config_history.check_resumable(previous, config, str(train_data.element_spec), checkpoint)
  return train_data, previous


def reachable_workdir(workdir: str | None) -> str | None:
  """`remote.user_path(workdir)`, once its filesystem has answered whether it exists.

  Raises:
    ConfigError: an empty path, or one its filesystem refuses (an unknown
      scheme, no permission, ...).
    remote.UnreachableError: its filesystem could not be reached (no network,
      the storage service down); a later run may reach it.
  """
  workdir = remote.user_path(workdir)
  if workdir is None:
    return None
  try:
    tf.io.gfile.exists(workdir)
  except tf.errors.OpError as e:
    reason = first_line(e.message)
    if isinstance(e, _UNREACHABLE):
      raise remote.UnreachableError(
          f"The workdir {workdir!r} cannot be reached ({reason}); rerun when it can be, or choose another --workdir."
      ) from None
    raise ConfigError(f"The workdir {workdir!r} cannot be used ({reason}); choose another --workdir.") from None
  return workdir


def create_strategy(config: ml_collections.ConfigDict) -> tf.distribute.Strategy:
  """Builds `config.strategy` and checks both batch sizes against its replica count.

  Raises:
    ConfigError: from `strategies.create`, or a batch size in `config.data`
      that the replica count (for training, times `gradient_accumulation_steps`) does not divide (the numbers named).
  """
  strategy = strategy_factory.create(config.strategy)
  accumulation = config.optimizer.gradient_accumulation_steps
  for field, micro_batches in (("global_batch_size", accumulation), ("eval_global_batch_size", 1)):
    try:
      input_pipeline.check_global_batch_size(strategy, config.data[field], micro_batches)
    except ConfigError as e:
      raise ConfigError(f"config.data.{field}: {e}") from None
  return strategy


def per_replica_batch_sizes(config: ml_collections.ConfigDict, num_replicas: int) -> dict[str, int]:
  """Returns {'train': per-replica train batch, 'eval': per-replica eval batch}."""
  data = config.data
  return {"train": data.global_batch_size // num_replicas, "eval": data.eval_global_batch_size // num_replicas}


def describe_workdir(workdir: str | None, step: int | None) -> str:
  """Returns one line on what `workdir` holds for a run: nothing yet, or a run to resume from `step`."""
  if workdir is None:
    return "none given: a new temporary directory, a new run"
  if step is None:
    held = "does not exist yet" if not tf.io.gfile.exists(workdir) else "holds no checkpoint"
    return f"{workdir} {held}: a new run"
  return f"{workdir} holds a run at step {step} (checkpoint ckpt-{step}): it would resume from step {step}"


def step_plan(config: ml_collections.ConfigDict, strategy: tf.distribute.Strategy, step: int | None = None) -> str:
  """Returns one line on what `config.mode` will do under `strategy` from global step `step` (None: no checkpoint).

  It names the steps, loops, evaluations and checkpoints left.
  """
  trainer = config.trainer
  evaluation = f"evaluate {'all of the eval split' if trainer.eval_steps is None else f'{trainer.eval_steps} batches'}"
  if config.mode == "continuous_eval":
    return (
        f"mode continuous_eval: {evaluation} at each new checkpoint in the workdir, once, until the checkpoint of "
        f"step {trainer.train_steps} or {trainer.eval_timeout_seconds:g} s without a new one"
    )
  if config.mode in ("eval", "export", "predict"):
    if step is None:
      return f"mode {config.mode}: none, it needs a checkpoint in the workdir and there is none (exit 2)"
    action = {"eval": evaluation, "export": f"export a SavedModel to WORKDIR/{EXPORT_DIR}"}.get(
        config.mode,
        f"write the outputs over split {config.data.predict_split or 'eval'!r} to WORKDIR/{predict.DIRECTORY}",
    )
    best = config.mode == "predict" and config.predict.checkpoint == "best"
    restored = f"the checkpoint in WORKDIR/{best_checkpoint.DIRECTORY}" if best else f"the checkpoint of step {step}"
    return f"mode {config.mode}: restore {restored}, {action}"
  step = step or 0
  if step >= trainer.train_steps:
    line = f"mode {config.mode}: nothing to train, step {step} is at train_steps={trainer.train_steps}"
    return line + (f"; {evaluation}" if config.mode == "train_and_eval" else "")
  start = f"from step {step} " if step else ""
  line = f"mode {config.mode}: train {start}to step {trainer.train_steps} in "
  sizes = steps_per_loop_lib.resolve(
      trainer.steps_per_loop,
      strategy=strategy,
      cadences=(trainer.eval_every, trainer.checkpoint_every, trainer.export_every),
  )
  if isinstance(sizes, steps_per_loop_lib.MeasuredStepsPerLoop):
    line += (
        f"loops of a size chosen from the measured step time (auto: at most {sizes.most} steps, host overhead under 2%)"
    )
  else:
    loops = -(-(trainer.train_steps - step) // sizes.size)
    line += f"{loops} loop(s) of up to {sizes.size} steps"
  if config.mode == "train_and_eval" and trainer.eval_every and trainer.eval_every < trainer.train_steps:
    line += f", {evaluation} every {trainer.eval_every} steps"
  if trainer.checkpoint_every and trainer.checkpoint_every < trainer.train_steps:
    line += f", checkpoint every {trainer.checkpoint_every} steps"
  if config.mode == "train_and_eval":
    line += f"; then {evaluation}"
  return line


def dataset(config: ml_collections.ConfigDict, split: str) -> data_lib.DatasetProvider:
  """Returns the `split` ('train' or 'eval') of `config.data` as a DatasetProvider.

  A provider that did not choose its `sharding` (None) gets `config.data.sharding`.

  Raises:
    ConfigError: the dataset function returned neither a tf.data.Dataset nor
      a DatasetProvider.
  """
  return _prepared(config, split, "training" if split == "train" else "evaluation").provider


def _prepared(config: ml_collections.ConfigDict, split: str, purpose: str) -> input_pipeline.PreparedData:
  """The `split` of `config.data` as the `PreparedData` the run and its Trainer share (see `dataset`)."""
  made = registry.resolve("dataset", config.data.name)(config.data, split)
  source = f"What the dataset {config.data.name!r} returned for split {split!r}"
  prepared = input_pipeline.PreparedData(made, purpose, source=source)
  if prepared.provider.sharding is None:
    prepared.provider.sharding = config.data.sharding
  return prepared


def create_trainer(
    config: ml_collections.ConfigDict,
    strategy: tf.distribute.Strategy,
    workdir: str | None,
    *,
    summary_dir: str | None = None,
    actions: Sequence[Any] = (),
) -> Trainer:
  """Returns the Trainer that `config` describes, writing to `workdir`, with `actions` after the built-in ones.

  Its summaries go to `summary_dir` if given (else `workdir/summaries`).

  Raises:
    ConfigError: the task or model function returned the wrong kind of object.
  """
  make_task = registry.resolve("task", config.task.name)
  task = trainer_options.made(
      make_task(config.task), Task, role="the task function", fn=make_task, expected="a runner.Task"
  )
  build_model = registry.resolve("model", config.model.name)
  # The model model_fn made: optimizer_fn, called after it, makes an optimizer of the model's Keras.
  models: list[Any] = []

  @functools.wraps(build_model)  # Messages name the user's function.
  def model_fn() -> Any:
    models[:] = [build_model(config.model)]
    return models[0]

  def optimizer_fn() -> Any:
    keras_version = keras_versions.of(models[0]) or keras_versions.KERAS_3
    return optimizers.create(config.optimizer, config.trainer.train_steps, keras_version.module)

  options = trainer_options.config_arguments(config, workdir)
  return Trainer(
      strategy,
      model_fn=model_fn,
      optimizer_fn=optimizer_fn,
      task=task,
      summary_dir=summary_dir,
      actions=actions,
      **options,
  )
