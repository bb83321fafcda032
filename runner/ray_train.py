"""Ray Train as a way in: `runner.run(config, workdir)` on every worker of a `ray.train.tensorflow.TensorflowTrainer`.

Ray Train starts the workers and hands each its `TF_CONFIG` (every task a
`worker`, the world rank its index, so worker 0, Ray's rank 0, is
TensorFlow's chief); `multi_worker_mirrored` reads it, and the workers train
one job as `python -m runner.launch --workers=N` would. Each worker reports to
Ray once, at the end (`ray.train.report`, which every worker must call):
the chief attaches a copy of the run's final checkpoint, so Ray keeps the
chief's metrics in `Result.metrics` and that copy as `Result.checkpoint`.

`tune` runs a Ray Tune sweep: one `runner.run` (or, with a `ScalingConfig`,
one Ray Train job) per sampled config, each evaluation reported to Tune, so
its scheduler (ASHA, say) may stop a trial.

Ray is imported only by these functions: the package never needs it
(`pip install "tf-runner[ray]"` brings it).
"""

import atexit
from collections.abc import Iterator, Mapping
import contextlib
import os
import tempfile
import threading
from typing import Any, TYPE_CHECKING

from absl import logging
import ml_collections
import tensorflow as tf

from runner import from_config
from runner.config import registry
from runner.config import run_config as config_lib
from runner.interfaces import Action
from runner.interfaces import LoopEnd
from runner.outputs import checkpoint_list
from runner.outputs import checkpoints
from runner.workdir import remote
from strategies import checks
from strategies.errors import ConfigError

if TYPE_CHECKING:
  import ray.train
  import ray.tune

MULTI_WORKER_STRATEGY = "multi_worker_mirrored"  # The strategy that reads Ray's TF_CONFIG: every task a worker.


def run(
    config: ml_collections.ConfigDict,
    *,
    workdir: str,
    scaling_config: "ray.train.ScalingConfig",
    run_config: "ray.train.RunConfig | None" = None,
) -> "ray.train.Result":
  """Trains `config` on Ray Train workers: `TensorflowTrainer(train_loop_per_worker, ...).fit()`.

  The config and the workers are checked here, on the driver, before Ray
  starts any worker. A worker's `ConfigError` or `FloatingPointError` (the
  same on every worker of a multi-worker job: data that does not fit, a
  batch size the replicas do not divide, a diverged step) is raised here as
  that error, chained to Ray's; other failures stay Ray's
  `ray.train.TrainingFailedError`.

  Args:
    config: the run's config, as `runner.load_config` returns it. With more
      than one worker, `config.strategy.name` must be 'multi_worker_mirrored'
      (every other strategy would train each worker alone).
    workdir: the run's workdir, made absolute here unless it is a URL such as
      `gs://...`; every worker must reach it (a shared file system or bucket
      on a cluster of several machines), as under `runner.launch`.
    scaling_config: Ray's `ScalingConfig` (`num_workers`, `use_gpu`,
      `resources_per_worker`, ...).
    run_config: Ray's `RunConfig` (`name`, `storage_path` where Ray keeps the
      reported checkpoint, ...); None for Ray's default.

  Returns:
    Ray's `Result`: `metrics` are the chief's (see `train_loop_per_worker`),
    `checkpoint` the copy of the run's final checkpoint.

  Raises:
    ConfigError: a bad config, workdir or worker count (named, with what is
      valid), or a worker's `ConfigError`.
    FloatingPointError: a worker's step diverged.
    ray.train.TrainingFailedError: any other failure of a worker or of Ray.
  """
  loop_config = {"config": _checked(config, scaling_config.num_workers), "workdir": _absolute(workdir)}
  from ray.train.tensorflow import TensorflowTrainer  # noqa: PLC0415  Ray is optional: imported only where used.

  trainer = TensorflowTrainer(
      train_loop_per_worker, train_loop_config=loop_config, scaling_config=scaling_config, run_config=run_config
  )
  with _workers_user_errors_raised():
    return trainer.fit()


@contextlib.contextmanager
def _workers_user_errors_raised() -> Iterator[None]:
  """Raises a `ray.train.WorkerGroupError`'s `ConfigError` or `FloatingPointError` as itself, chained to Ray's.

  That of the lowest rank among the workers that failed so; any other error
  passes as it is. Ray 2.60 gives the worker's exception itself in
  `worker_failures` (rank -> exception).
  """
  import ray.train  # noqa: PLC0415  Ray is optional: imported only where it is used.

  try:
    yield
  except ray.train.WorkerGroupError as error:
    for rank in sorted(error.worker_failures):
      if isinstance(error.worker_failures[rank], (ConfigError, FloatingPointError)):
        raise error.worker_failures[rank] from error
    raise


def train_loop_per_worker(loop_config: Mapping[str, Any]) -> None:
  """Runs `runner.run(config, workdir)` on this worker and reports the result to Ray.

  Every worker calls `ray.train.report` once, after its run, with the
  `RunResult`'s `workdir`, `num_replicas`, `global_step`, `train_metrics`,
  `eval_metrics` and `checkpoint_path`, and `cluster`: the strategy's cluster
  (`{"worker": [addresses]}` from Ray's `TF_CONFIG`; {} for a strategy of
  one process). Ray keeps rank 0's: the chief's. The chief also attaches a
  copy of the run's final checkpoint, laid out as a workdir holding only that
  checkpoint (`checkpoints/ckpt-N.*` and its list), which Ray persists to
  its storage path; a run that ends without a checkpoint attaches none, and
  then Ray's `Result.metrics` is None.

  Args:
    loop_config: `{"config": ConfigDict, "workdir": str}`, Ray's
      `train_loop_config` (`run` builds it).

  Raises:
    ConfigError, FloatingPointError, ClusterError: what `runner.run` raises.
  """
  import ray.train  # noqa: PLC0415  Ray is optional: imported only where it is used.

  result = from_config.run(loop_config["config"], loop_config["workdir"])
  resolver = getattr(result.strategy, "cluster_resolver", None)
  metrics = {
      "workdir": result.workdir,
      "num_replicas": result.num_replicas,
      "global_step": result.global_step,
      "train_metrics": None if result.train_metrics is None else dict(result.train_metrics),
      "eval_metrics": None if result.eval_metrics is None else dict(result.eval_metrics),
      "checkpoint_path": result.checkpoint_path,
      "cluster": resolver.cluster_spec().as_dict() if resolver is not None else {},
  }
  if ray.train.get_context().get_world_rank() != 0 or result.checkpoint_path is None:
    ray.train.report(metrics)
    return
  with tempfile.TemporaryDirectory(prefix="tf_runner_ray_checkpoint_") as directory:
    _copy_checkpoint(result.checkpoint_path, directory)
    ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(directory))


def _copy_checkpoint(checkpoint_path: str, workdir: str) -> None:
  """Copies the checkpoint at `checkpoint_path` (`.../ckpt-N`) into `workdir/checkpoints`, with its list.

  `workdir` then holds that checkpoint as a run's workdir would, so
  `tf.train.latest_checkpoint(workdir + "/checkpoints")` finds it.
  """
  directory = os.path.join(workdir, checkpoints.DIRECTORY)
  tf.io.gfile.makedirs(directory)
  for source in tf.io.gfile.glob(checkpoint_path + ".*"):
    tf.io.gfile.copy(source, os.path.join(directory, os.path.basename(source)), overwrite=True)
  copied = checkpoint_list.read(directory)  # The list is made from the copied files.
  checkpoint_list.write(copied)


def _checked(config: ml_collections.ConfigDict, num_workers: int | tuple[int, int]) -> ml_collections.ConfigDict:
  """Returns `config` validated (`runner.config.validate`) for `num_workers` Ray workers (ScalingConfig's).

  Raises:
    ConfigError: a bad config, or more than one worker with a strategy other than 'multi_worker_mirrored'.
  """
  config = config_lib.validate(config)
  most_workers = max(num_workers) if isinstance(num_workers, tuple) else num_workers  # A tuple: (min, max), elastic.
  if most_workers > 1 and config.strategy.name != MULTI_WORKER_STRATEGY:
    raise ConfigError(
        f"ScalingConfig(num_workers={num_workers!r}) runs more than one worker, but config.strategy.name is "
        f"{config.strategy.name!r}, which would train each of them alone; set config.strategy.name="
        f"{MULTI_WORKER_STRATEGY!r}, whose workers read the TF_CONFIG that Ray gives each one and train one job."
    )
  if config.strategy.get("cluster", "auto") == "slurm":
    raise ConfigError(
        "config.strategy.cluster='slurm': under Ray Train the cluster is the TF_CONFIG that Ray gives each worker; "
        "set config.strategy.cluster='auto' or 'tf_config'."
    )
  for field in ("worker_hosts", "task_index"):
    if config.strategy.get(field) is not None:
      raise ConfigError(
          f"config.strategy.{field}={config.strategy[field]!r}: under Ray Train the workers' addresses come from "
          "the TF_CONFIG that Ray gives each one; leave config.strategy.worker_hosts and task_index unset."
      )
  return config


def _absolute(workdir: Any) -> str:
  """Returns `workdir` made absolute, its `~` expanded (a URL such as `gs://...` as it is).

  Raises:
    ConfigError: `workdir` is not a non-empty string.
  """
  if not isinstance(workdir, str) or not workdir.strip():
    raise ConfigError(
        f"workdir={workdir!r}: give the run's workdir, a path or URL every Ray worker reaches (e.g. gs://...)."
    )
  workdir = remote.user_path(workdir)
  return workdir if remote.is_remote(workdir) else os.path.abspath(workdir)


def tune(
    config: ml_collections.ConfigDict,
    *,
    param_space: Mapping[str, Any],
    num_samples: int,
    metric: str,
    mode: str,
    workdir: str,
    scaling_config: "ray.train.ScalingConfig | None" = None,
    search_alg: Any = None,
    scheduler: Any = None,
) -> "ray.tune.ResultGrid":
  """Tunes `config` with Ray Tune: `Tuner(trial, param_space=..., tune_config=TuneConfig(...)).fit()`.

  Each trial runs `runner.run` (one worker, in the trial's Ray actor; or,
  with `scaling_config`, a Ray Train job as `run` starts, whose chief's
  evaluations are reported) on `config` with the trial's values set, in its
  own workdir
  `WORKDIR/trial_ID` (Tune's trial id), which holds the usual `config.json`,
  `metrics.jsonl` and checkpoints; Tune keeps its own records in
  `WORKDIR/ray_tune`. Every evaluation (those of `config.trainer.eval_every`
  and the final one) is reported to Tune as its results (`loss`, the task's
  metrics, `num_examples`) and `step`, once that step's checkpoint is
  written: a trial runs with `checkpoint_every` set to `eval_every` (unless
  a `checkpoint_every` that divides it is set) and `async_checkpoints`
  False. So whatever Tune does after a report, even ending the trial's
  actor at once, the trial's workdir holds its state at that report. A
  trial of one worker that the scheduler stops ends at that step, logging
  "Stopped by the Tune scheduler at step N, whose checkpoint is saved.";
  its last checkpoint and `metrics.jsonl` row are those of its last report.
  A Ray Train job's workers go on while their report travels, and Ray ends
  them where they are at a stop: its last checkpoint is that of the last
  report or a later one, and `metrics.jsonl` may hold rows past it (a
  resume drops them). Everything is checked here, before any trial starts.

  Args:
    config: the base config, as `runner.load_config` returns it; its mode
      'train_and_eval'.
    param_space: {config path: value}, e.g. {'optimizer.learning_rate':
      ray.tune.loguniform(1e-4, 1e-1)}: a Tune search space or a constant,
      set as the override 'path=value' of `runner.load_config` would be.
    num_samples: how many configs to sample (Tune's `TuneConfig.num_samples`).
    metric: the evaluation result Tune ranks and schedules by: 'loss' or a
      metric of the task.
    mode: 'min' or 'max'.
    workdir: the sweep's folder (made absolute; a URL such as `gs://...`
      that every Ray node reaches on a cluster).
    scaling_config: None (a trial is one worker), or Ray's `ScalingConfig`
      of each trial's Ray Train job, checked as `run` checks it.
    search_alg: a `ray.tune.search.Searcher`, or None (Tune's random and grid search).
    scheduler: a `ray.tune.schedulers.TrialScheduler` such as
      `ASHAScheduler()`, or None (every trial runs to its end).

  Returns:
    Tune's `ResultGrid`: a trial's `Result.metrics` are its last report,
    `Result.path` Tune's trial folder; `get_best_result()` ranks by `metric`
    and `mode`. A trial that failed holds its error (`Result.error`).

  Raises:
    ConfigError: a param_space path that is not a config field (with a
      did-you-mean), a value of the wrong type, a metric the evaluation does
      not produce, a config `scaling_config`'s workers cannot train (as
      `run`), or another bad argument.
  """
  from ray import tune as ray_tune  # noqa: PLC0415  Ray is optional: imported only where used.

  config = config_lib.validate(config)
  if config.mode != "train_and_eval":
    raise ConfigError(f"config.mode={config.mode!r}: tune ranks trials by their evaluations; use 'train_and_eval'.")
  if not isinstance(param_space, Mapping) or not param_space:
    raise ConfigError(f"param_space must be a non-empty dict {{config path: value}}, got {param_space!r}.")
  for path, value in param_space.items():
    samples = [value]  # A constant; a sample of a search space, or every value of a grid, checks its type too.
    if isinstance(value, ray_tune.search.sample.Domain):
      samples = [value.sample()]
    elif isinstance(value, Mapping) and "grid_search" in value:
      samples = list(value["grid_search"])
    try:
      for sample in samples:
        config_lib.overridden(config, {path: sample})
    except ConfigError as error:
      raise ConfigError(f"param_space[{path!r}]: {error}") from None
  task = registry.resolve("task", config.task.name)(config.task)
  results = ["loss", *(m.name for m in task.metrics()), "num_examples"]
  if metric not in results:
    raise ConfigError(
        f"metric={metric!r} is not a result of the evaluation.{checks.did_you_mean(metric, results)} "
        f"It reports: {', '.join(results)}."
    )
  if scaling_config is not None:
    _checked(config, scaling_config.num_workers)
  workdir = _absolute(workdir)
  tuner = ray_tune.Tuner(
      ray_tune.with_parameters(_trial, base=config, workdir=workdir, scaling_config=scaling_config),
      param_space=dict(param_space),
      tune_config=ray_tune.TuneConfig(
          metric=metric,
          mode=checks.one_of(mode, ("min", "max"), "mode"),
          num_samples=checks.positive_int(num_samples, "num_samples"),
          search_alg=search_alg,
          scheduler=scheduler,
          reuse_actors=scaling_config is None,  # Trials one after another share a process: TensorFlow starts once.
      ),
      run_config=ray_tune.RunConfig(storage_path=workdir, name="ray_tune"),
  )
  return tuner.fit()


class _ReportToTune(Action):
  """After each evaluation: reports its results and `step` (`report`); ends training if Tune stopped the trial."""

  def __init__(self, report: Any) -> None:
    self._report = report  # `ray.tune.report`, or on a Ray Train worker `ray.train.report`.
    self.step: int | None = None  # Of the last report.
    self.stopped = False

  def __call__(self, loop: LoopEnd) -> None:
    """Reports `loop.eval_results`, if any; a stop of the scheduler ends training at this step (`loop.stop`)."""
    if loop.eval_results is not None:
      self.report(loop.eval_results, loop.step)
      if self.stopped and loop.step < loop.total_steps:
        logging.warning(f"Stopped by the Tune scheduler at step {loop.step}, whose checkpoint is saved.")
        loop.stop()

  def report(self, results: Mapping[str, float], step: int) -> None:
    self.step = step
    try:
      self._report({**results, "step": step})
    except SystemExit:  # What `tune.report` raises once Tune has stopped the trial.
      self.stopped = True


def _run_reporting(config: ml_collections.ConfigDict, workdir: str, report: Any) -> bool:
  """`runner.run(config, workdir)` with each evaluation, the final one too, passed to `report`; returns if stopped."""
  reporter = _ReportToTune(report)
  result = from_config.run(config, workdir, quiet=True, actions=[reporter])
  if result.eval_metrics and result.global_step != reporter.step and not reporter.stopped:  # The final evaluation.
    reporter.report(result.eval_metrics, result.global_step)
  return reporter.stopped


def _trial_per_worker(loop_config: Mapping[str, Any]) -> None:
  """A Ray Train worker of a `tune` trial: each evaluation goes to `ray.train.report` (rank 0's on to Tune)."""
  import ray.train  # noqa: PLC0415  Ray is optional: imported only where it is used.

  _run_reporting(loop_config["config"], loop_config["workdir"], ray.train.report)


def _trial(
    values: Mapping[str, Any],
    *,
    base: ml_collections.ConfigDict,
    workdir: str,
    scaling_config: "ray.train.ScalingConfig | None",
) -> None:
  """One trial of `tune`: `runner.run` of `base` with `values` set, in `workdir/trial_ID`, reporting to Tune.

  With `scaling_config`, a Ray Train job whose workers report with `ray.train.report`, forwarded to Tune by
  `TuneReportCallback` (Ray's way to run Train in a Tune trial). A stop of the scheduler ends this trial's actor,
  and with it the job, which it owns.
  """
  from ray import tune as ray_tune  # noqa: PLC0415  Ray is optional: imported only where used.

  config = config_lib.overridden(base, values)
  every, saves = config.trainer.eval_every, config.trainer.checkpoint_every
  if every is not None:  # Each report follows its step's checkpoint, written, whatever Tune does after the report.
    saves = saves if saves is not None and every % saves == 0 else every
    config = config_lib.overridden(config, {"trainer.checkpoint_every": saves, "trainer.async_checkpoints": False})
  trial_id = ray_tune.get_context().get_trial_id()
  trial_workdir = os.path.join(workdir, f"trial_{trial_id}")
  if scaling_config is not None:
    import ray.train  # noqa: PLC0415  Ray is optional: imported only where it is used.
    from ray.train.tensorflow import TensorflowTrainer  # noqa: PLC0415
    from ray.tune.integration.ray_train import TuneReportCallback  # noqa: PLC0415

    trainer = TensorflowTrainer(
        _trial_per_worker,
        train_loop_config={"config": config, "workdir": trial_workdir},
        scaling_config=scaling_config,
        run_config=ray.train.RunConfig(
            name=f"trial_{trial_id}", storage_path=os.path.join(workdir, "ray_train"), callbacks=[TuneReportCallback()]
        ),
    )
    with _workers_user_errors_raised():
      trainer.fit()
    return
  # A stopped trial's run ends (its TensorBoard summaries flushed) before its actor exits (`atexit`) or takes the
  # next trial (Ray Tune waits TUNE_FUNCTION_THREAD_TIMEOUT_S for it, 2 by default, then fails the next trial).
  os.environ.setdefault("TUNE_FUNCTION_THREAD_TIMEOUT_S", "60")
  ended = threading.Event()
  atexit.register(ended.wait)
  try:
    if _run_reporting(config, trial_workdir, ray_tune.report):
      raise SystemExit(0)  # Ended: now end as Tune ends a stopped trial's thread, without its report of the end.
  finally:
    ended.set()
    atexit.unregister(ended.wait)
