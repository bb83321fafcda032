"""The Trainer's options in one place, checked when they are made, and the checks of what it is handed."""

from collections.abc import Callable, Mapping, Sequence
import dataclasses
from typing import Any

import tensorflow as tf

from runner import interfaces
from runner.data import service as service_lib
from runner.outputs import profiling
from runner.tasks import Task
from runner.training import keras_versions
from runner.training import scoped_settings
from runner.training import steps_per_loop as steps_per_loop_lib
from strategies import checks
from strategies.errors import ConfigError

# Names a metric may not take: they are keys of the Trainer's own results and reports.
RESERVED_NAMES = ("loss", "num_examples", "steps_per_sec", "examples_per_sec", "learning_rate", "split", "step")


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainerOptions:
  """How a Trainer trains; each field is the `runner.Trainer` keyword argument of the same name, documented here.

  The Trainer makes this object once from its keyword arguments (`of`), and
  `runner.run` passes a config's (`config_arguments`).

  Attributes:
    model_dir: where checkpoints, summaries and metrics.jsonl go; None keeps
      nothing on disk.
    steps_per_loop: steps per `tf.function` call (and per report); under
      parameter servers, per scheduled function (a report then covers one
      function per worker). "auto": chosen from the measured step time so
      that the host's cost stays under 2% of a loop (`runner.training.steps_per_loop`).
    checkpoint_every: save every this many steps (needs `model_dir`); a
      checkpoint is also always written at the end of `train`.
    max_to_keep: how many recent checkpoints to keep (None: all).
    async_checkpoints: write the checkpoints of `checkpoint_every` in the
      background with TensorFlow's asynchronous checkpointing, while training
      goes on (on one worker; see `runner.outputs.checkpoints`). The
      final checkpoint, and the one a stop signal saves, are always complete
      before `train` goes on or the process exits.
    jit_compile: compile each replica's forward and backward pass with XLA.
    precision: 'float32', 'mixed_bfloat16' or 'mixed_float16'.
    clipnorm: None, or the bound on the global norm of the summed gradient.
    gradient_accumulation_steps: k; a step runs k micro-batches of
      `global_batch_size / k` one after another and applies their summed
      gradient once, so it trains as k = 1 does, with one micro-batch's
      activations in memory (`loops.TrainLoop`; docs/trainer.md#gradient-accumulation).
    seed: None, or an int that fixes the initial weights.
    actions: `runner.actions.Action`s run after every train loop.
    profile_steps: None, or `(first, last)`: record a TensorFlow profiler
      trace of global steps first..last (needs `model_dir`; see
      `runner.outputs.profiling`).
    best_metric: None, or an evaluation result ('loss' or a task metric's
      name): after each evaluation during `train` that improves on it, the
      model is kept in `model_dir/best/` (see `runner.outputs.best`, which
      checks it when the Trainer is made).
    best_mode: 'max' or 'min' (better is higher or lower); None: 'min' for a
      `best_metric` whose name holds 'loss', else 'max'.
    export_every: None, or export a SavedModel every this many steps to
      `model_dir/exports/STEP/`, keeping the newest `max_to_keep`.
    data_service: None, or a `runner.data.service.DataService`: the
      training input's batches are made by that tf.data service's workers
      (evaluation input stays local); not under parameter servers.
    report_metric: None, or an evaluation result ('loss' or a task metric's
      name): after each evaluation during `train` the chief reports it for
      Vertex AI's hyperparameter tuning (`runner.outputs.hypertune.ReportMetric`,
      which checks it when the Trainer is made).
    summary_dir: where the TensorBoard summaries go (`train/`, `eval/`);
      None: `model_dir/summaries`.
    quiet: False shows the progress lines of `train`, `evaluate` and
      `export` on stderr as `python -m runner` does, also in a plain Python
      program (see `runner.outputs.progress_output`); True shows only
      warnings and errors. Under `runner.run`, its own `quiet` decides.

  Raises:
    ConfigError: from the constructor, naming the first invalid option.
  """

  model_dir: str | None = None
  steps_per_loop: int | str = 1
  checkpoint_every: int | None = None
  max_to_keep: int | None = 3
  async_checkpoints: bool = True
  jit_compile: bool = False
  precision: str = "float32"
  clipnorm: float | None = None
  gradient_accumulation_steps: int = 1
  seed: int | None = None
  actions: Sequence[interfaces.Action] = ()
  profile_steps: tuple[int, int] | None = None
  best_metric: str | None = None
  best_mode: str | None = None
  export_every: int | None = None
  data_service: service_lib.DataService | None = None
  report_metric: str | None = None
  summary_dir: str | None = None
  quiet: bool = False

  def __post_init__(self) -> None:
    if self.steps_per_loop != steps_per_loop_lib.AUTO and not _is_positive_int(self.steps_per_loop):
      raise ConfigError(
          f"steps_per_loop must be a positive int or {steps_per_loop_lib.AUTO!r}, got {self.steps_per_loop!r}."
      )
    checks.positive_int(self.checkpoint_every, "checkpoint_every", optional=True)
    checks.positive_int(self.max_to_keep, "max_to_keep", optional=True)
    for name in ("async_checkpoints", "jit_compile", "quiet"):
      checks.boolean(getattr(self, name), name)
    checks.one_of(self.precision, scoped_settings.PRECISIONS, "precision")
    checks.positive_number(self.clipnorm, "clipnorm", optional=True)
    checks.positive_int(self.gradient_accumulation_steps, "gradient_accumulation_steps")
    if self.seed is not None and not checks.is_int(self.seed):
      raise ConfigError(f"seed must be None or an int, got {self.seed!r}.")
    if isinstance(self.actions, interfaces.Action) or not all(isinstance(a, interfaces.Action) for a in self.actions):
      raise ConfigError(f"actions must be a list of runner.actions.Action objects, got {self.actions!r}.")
    for action in self.actions:
      checks.positive_int(action.every_steps, f"{type(action).__name__}.every_steps", optional=True)
    object.__setattr__(self, "actions", tuple(self.actions))
    object.__setattr__(self, "profile_steps", profiling.check_steps(self.profile_steps))
    if self.data_service is not None and not isinstance(self.data_service, service_lib.DataService):
      raise ConfigError(f"data_service must be None or a runner.data.service.DataService, got {self.data_service!r}.")
    if self.best_mode is not None and self.best_metric is None:
      raise ConfigError(f"best_mode={self.best_mode!r} needs a best_metric to compare the evaluations by.")
    checks.positive_int(self.export_every, "export_every", optional=True)
    for name, needs in (
        ("checkpoint_every", "checkpoints"),
        ("profile_steps", "the trace"),
        ("best_metric", "the best checkpoint"),
        ("export_every", "the exports"),
        ("summary_dir", "metrics.jsonl beside the summaries"),
    ):
      if getattr(self, name) is not None and self.model_dir is None:
        raise ConfigError(f"{name}={getattr(self, name)} needs a model_dir to write {needs} to.")

  @classmethod
  def of(cls, arguments: Mapping[str, Any]) -> "TrainerOptions":
    """Returns the options among `arguments`, a mapping that may hold other names too (the Trainer's `locals()`)."""
    return cls(**{f.name: arguments[f.name] for f in dataclasses.fields(cls) if f.name in arguments})


def _is_positive_int(value: Any) -> bool:
  return checks.is_int(value) and value >= 1


def config_arguments(config: Any, model_dir: str | None) -> dict[str, Any]:
  """Returns the Trainer's keyword arguments for the options a run config sets (`runner.run`).

  Those of `config.trainer` by their names, `config.optimizer.clipnorm` and
  `gradient_accumulation_steps`, `model_dir`, and the `data_service` of
  `config.data.service`; the config's `steps_per_loop` None (auto) is "auto".
  """
  arguments = {f.name: config.trainer[f.name] for f in dataclasses.fields(TrainerOptions) if f.name in config.trainer}
  for name in ("clipnorm", "gradient_accumulation_steps"):
    arguments[name] = config.optimizer[name]
  arguments.update(model_dir=model_dir, data_service=data_service(config))
  arguments["steps_per_loop"] = arguments["steps_per_loop"] or steps_per_loop_lib.AUTO
  return arguments


def data_service(config: Any) -> service_lib.DataService | None:
  """The `DataService` of `config.data.service` (None: none), waiting up to `config.strategy.timeout_seconds`."""
  if config.data.service is None:
    return None
  timeout = config.strategy.timeout_seconds
  return service_lib.DataService(address=config.data.service, mode=config.data.service_mode, timeout_seconds=timeout)


def check_components(strategy: Any, model_fn: Any, optimizer_fn: Any, task: Any) -> None:
  """Checks what the Trainer is handed besides its options.

  Raises:
    ConfigError: the strategy is not a `tf.distribute.Strategy`, a function
      is not a callable, or `task` is not a `runner.Task`.
  """
  if not isinstance(strategy, tf.distribute.Strategy):
    raise ConfigError(f"strategy must be a tf.distribute.Strategy (strategies.create), got {type(strategy).__name__}.")
  for name, fn in (("model_fn", model_fn), ("optimizer_fn", optimizer_fn)):
    if keras_versions.of(fn) is not None or not callable(fn):
      raise ConfigError(
          f"{name} must be a function with no arguments that makes the object inside strategy.scope(), "
          f"got {type(fn).__name__}."
      )
  if not isinstance(task, Task):
    raise ConfigError(f"task must be a runner.Task (e.g. runner.tasks.Classification()), got {task!r}.")


def made(value: Any, kind: type | Callable[[Any], bool], *, role: str, fn: Callable[..., Any], expected: str) -> Any:
  """Returns `value`, what the function `fn` (a `role`, e.g. 'model_fn') made, if it is of `kind` (a type or a test).

  Raises:
    ConfigError: naming the function (by module and name), what it returned
      and what it must return (`expected`, e.g. 'a keras.Model').
  """
  if not (isinstance(value, kind) if isinstance(kind, type) else kind(value)):
    while hasattr(fn, "func"):  # functools.partial
      fn = fn.func
    name = f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', repr(fn))}"
    raise ConfigError(f"{role} {name} returned {type(value).__name__}; it must return {expected}.")
  return value


def metric_names(metrics: Sequence[Any]) -> list[str]:
  """Returns the names of `metrics`, checked to be Keras metrics with unique, unreserved names.

  Raises:
    ConfigError: a metric is not a `keras.metrics.Metric` (or a
      `tf_keras.metrics.Metric`), or its name is reserved or used twice.
  """
  names: list[str] = []
  for metric in metrics:
    if not keras_versions.is_metric(metric):
      raise ConfigError(f"Task.metrics() must return Keras metrics (of keras or tf_keras), got {metric!r}.")
    if metric.name in RESERVED_NAMES or metric.name in names:
      raise ConfigError(
          f"Metric name {metric.name!r} is {'reserved' if metric.name in RESERVED_NAMES else 'used twice'}; "
          f"give each metric a unique name other than {', '.join(RESERVED_NAMES)}."
      )
    names.append(metric.name)
  return names
