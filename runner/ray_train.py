"""Ray Train as a way in: `runner.run(config, workdir)` on every worker of a `ray.train.tensorflow.TensorflowTrainer`.

Ray Train starts the workers and hands each its `TF_CONFIG` (every task a
`worker`, the world rank its index, so worker 0, Ray's rank 0, is
TensorFlow's chief); `multi_worker_mirrored` reads it, and the workers train
one job as `python -m runner.launch --workers=N` would. Each worker reports to
Ray once, at the end (`ray.train.report`, which every worker must call):
the chief attaches a copy of the run's final checkpoint, so Ray keeps the
chief's metrics in `Result.metrics` and that copy as `Result.checkpoint`.

Ray is imported only by these functions: the package never needs it
(`pip install "tf-runner[ray]"` brings it).
"""

from collections.abc import Iterator, Mapping
import contextlib
import os
import tempfile
from typing import Any, TYPE_CHECKING

import ml_collections
import tensorflow as tf

from runner import from_config
from runner.config import run_config as config_lib
from runner.outputs import checkpoint_list
from runner.outputs import checkpoints
from runner.workdir import remote
from strategies.errors import ConfigError

if TYPE_CHECKING:
  import ray.train

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
