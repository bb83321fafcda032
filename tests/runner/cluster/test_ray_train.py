"""Ray Train and Ray Tune, for real and on loopback.

The driver script of docs/clusters.md trains one 2-worker job: it runs as it
stands in the docs, in a child process that starts a local Ray on 127.0.0.1
only (`RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`), with two `TensorflowTrainer` CPU
workers that each run `runner.run`; beside it, the same job through
`python -m runner.launch --workers=2`. `ray_train.tune` runs 3 trials in a Ray
that this process starts, on 127.0.0.1 only too. Ray's processes are found by
the `RAY_TMPDIR` in their environment and must all be gone at the end.
"""

import json
import os
import re
import shutil
import signal
import sys
import tempfile
import time

import numpy as np
import pytest

import runner
from runner import ray_train
from runner.outputs import checkpoints
from strategies import ConfigError
from testlib import paths
from testlib import process_testlib
from testlib import reference_runs

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # Read at `import ray`: a local Ray on 127.0.0.1.
ray = pytest.importorskip("ray", reason="Ray is not installed: pip install -e '.[ray]'")
ray_train_api = pytest.importorskip("ray.train", reason="Ray is not installed: pip install -e '.[ray]'")

REPO = paths.REPO
SYNTHETIC = os.path.join(REPO, "configs", "synthetic.py")
CLUSTERS_DOC = os.path.join(REPO, "docs", "clusters.md")
STEPS = reference_runs.STEPS
TIMEOUT_SECONDS = 480  # Per process: a Ray start-up and three TensorFlow start-ups on 2 busy cores.
LOOPBACK_ADDRESS = re.compile(r"^127\.0\.0\.1:\d+$")


def _driver_script():
  """The driver script of docs/clusters.md's "Ray Train" section, as it stands there."""
  with open(CLUSTERS_DOC, encoding="utf-8") as f:
    section = f.read().split("\n## Ray Train\n", 1)[1].split("\n## ", 1)[0]
  return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def _ray_processes(ray_tmpdir, *, wait_seconds=60):
  """The pids of the processes of the Ray that ran in `ray_tmpdir`, after up to `wait_seconds`.

  Every process of that Ray (its daemons, and its workers, whose command line
  Ray renames) has `RAY_TMPDIR=ray_tmpdir` in its environment, inherited from
  the driver. They end shortly after the driver's `ray.shutdown()`: they are
  given that long (one took over 20 s while the suite's other worker ran several jobs at once).
  """
  deadline = time.monotonic() + wait_seconds
  while (found := _processes_with(f"RAY_TMPDIR={ray_tmpdir}\0".encode())) and time.monotonic() < deadline:
    time.sleep(0.5)
  return found


def _processes_with(variable):
  """The pids of the processes whose environment holds `variable`, one variable's bytes with its NUL."""
  found = []
  for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
      with open(f"/proc/{pid}/environ", "rb") as f:
        if variable in f.read():
          found.append(int(pid))
    except OSError:  # The process ended meanwhile.
      continue
  return found


def _kill(pids):
  for pid in pids:
    try:
      os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
      continue


@pytest.mark.ray
def test_the_docs_driver_script_trains_one_2_replica_job_like_the_launcher_on_loopback(tmp_path, subprocess_env):
  script = tmp_path / "train_ray.py"
  script.write_text(_driver_script())
  (tmp_path / "home").mkdir()
  ray_tmpdirs = []

  def driver(workdir, *args):
    """The docs' script in a child process whose Ray is its own, on 127.0.0.1 only."""
    ray_tmpdirs.append(tempfile.mkdtemp(prefix="tf-runner-ray-", dir="/tmp"))  # Short: Ray's Unix sockets are in it.
    env = {name: value for name, value in subprocess_env.items() if name != "RAY_ADDRESS"}
    env.update(
        RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0",  # Ray's servers and the workers' TF_CONFIG on 127.0.0.1.
        RAY_USAGE_STATS_ENABLED="0",
        RAY_TMPDIR=ray_tmpdirs[-1],
        HOME=str(tmp_path / "home"),  # Ray writes ~/.ray/auth_token.
    )
    command = [sys.executable, str(script), f"--config={SYNTHETIC}", f"--workdir={workdir}", *args]
    return process_testlib.TrainingProcess(command, workdir=workdir, env=env, name="train_ray")

  overrides = [o for o in reference_runs.OVERRIDES if not o.startswith("strategy.name=")]  # The script sets it.
  process = driver(tmp_path / "ray", f"--storage_path={tmp_path / 'ray_results'}", *overrides)
  try:
    launch_workdir = reference_runs.launched_workdir(subprocess_env)  # Meanwhile, or made by another test.
    status, stdout, stderr = process.wait(TIMEOUT_SECONDS)
  finally:
    _kill([process.process.pid])
    left = [pid for directory in ray_tmpdirs for pid in _ray_processes(directory)]
    _kill(left)
    for directory in ray_tmpdirs:
      shutil.rmtree(directory, ignore_errors=True)
  assert not left, f"Ray processes left running: {left}"
  assert status == 0, stderr[-5000:]

  metrics_line, checkpoint_line = stdout.splitlines()[-2:]
  metrics = json.loads(metrics_line)
  assert metrics["num_replicas"] == 2 and metrics["global_step"] == STEPS
  assert metrics["workdir"] == str(tmp_path / "ray")
  assert metrics["checkpoint_path"] == str(tmp_path / "ray" / "checkpoints" / f"ckpt-{STEPS}")
  (workers,) = metrics["cluster"].values()
  assert list(metrics["cluster"]) == ["worker"] and len(workers) == 2
  assert all(LOOPBACK_ADDRESS.match(address) for address in workers), workers
  rows = process_testlib.metrics_rows(tmp_path / "ray")
  assert [row["step"] for row in rows if row["split"] == "train"] == list(range(10, STEPS + 1, 10))
  assert metrics["train_metrics"] == {name: rows[-1][name] for name in ("loss", "accuracy")}
  assert metrics["eval_metrics"] is None  # Mode train.

  launched = process_testlib.final_checkpoint_values(launch_workdir)
  assert sorted(launched) and sorted(launched) == sorted(process_testlib.final_checkpoint_values(tmp_path / "ray"))
  reported = checkpoint_line.removeprefix("checkpoint: ")
  assert reported.startswith(str(tmp_path / "ray_results"))
  for workdir in (tmp_path / "ray", reported):
    for name, value in process_testlib.final_checkpoint_values(workdir).items():
      np.testing.assert_array_equal(value, launched[name], err_msg=name)  # Bit for bit.
  assert (
      process_testlib.train_rows(tmp_path / "ray")[-1]["loss"] == process_testlib.train_rows(launch_workdir)[-1]["loss"]
  )


def _config(*overrides):
  return runner.load_config(SYNTHETIC, list(overrides))


@pytest.mark.parametrize(
    ("config", "workdir", "num_workers", "message"),
    [
        (
            ("strategy.name=mirrored",),
            "run",
            2,
            "ScalingConfig(num_workers=2) runs more than one worker, but config.strategy.name is 'mirrored', which "
            "would train each of them alone; set config.strategy.name='multi_worker_mirrored', whose workers read the "
            "TF_CONFIG that Ray gives each one and train one job.",
        ),
        (
            ("strategy.name=one_device",),
            "run",
            (1, 3),
            "ScalingConfig(num_workers=(1, 3)) runs more than one worker, but config.strategy.name is 'one_device', "
            "which would train each of them alone; set config.strategy.name='multi_worker_mirrored', whose workers "
            "read the TF_CONFIG that Ray gives each one and train one job.",
        ),
        (
            ("strategy.name=multi_worker_mirrored", "strategy.worker_hosts=('localhost:1', 'localhost:2')"),
            "run",
            2,
            "config.strategy.worker_hosts=('localhost:1', 'localhost:2'): under Ray Train the workers' addresses come "
            "from the TF_CONFIG that Ray gives each one; leave config.strategy.worker_hosts and task_index unset.",
        ),
        (
            ("strategy.name=multi_worker_mirrored", "strategy.cluster=slurm"),
            "run",
            2,
            "config.strategy.cluster='slurm': under Ray Train the cluster is the TF_CONFIG that Ray gives each worker; "
            "set config.strategy.cluster='auto' or 'tf_config'.",
        ),
        (
            ("strategy.name=multi_worker_mirrored", "trainer.train_steps=0"),
            "run",
            2,
            "config.trainer.train_steps must be a positive int, got 0.",
        ),
        (
            ("strategy.name=multi_worker_mirrored",),
            "",
            2,
            "workdir='': give the run's workdir, a path or URL every Ray worker reaches (e.g. gs://...).",
        ),
    ],
)
def test_bad_input_is_refused_on_the_driver_before_ray_starts(config, workdir, num_workers, message):
  with pytest.raises(ConfigError) as error:
    ray_train.run(
        _config(*config), workdir=workdir, scaling_config=ray_train_api.ScalingConfig(num_workers=num_workers)
    )
  assert str(error.value) == message


@pytest.mark.parametrize("error", [ConfigError("config.data.global_batch_size: no."), FloatingPointError("diverged")])
def test_a_workers_user_error_reaches_the_driver_as_itself_and_others_stay_rays(error):
  other = RuntimeError("a bug")
  failed = ray_train_api.WorkerGroupError("Rank 0, 1: ...", {1: error, 0: other})
  with pytest.raises(type(error)) as raised, ray_train._workers_user_errors_raised():
    raise failed
  assert raised.value is error and raised.value.__cause__ is failed
  only_others = ray_train_api.WorkerGroupError("Rank 0: ...", {0: other})
  with pytest.raises(ray_train_api.WorkerGroupError) as raised, ray_train._workers_user_errors_raised():
    raise only_others
  assert raised.value is only_others


def test_a_workdir_with_a_tilde_is_the_home_folder_for_every_ray_worker(monkeypatch, tmp_path):
  monkeypatch.setenv("HOME", str(tmp_path))
  assert ray_train._absolute("~/runs/x") == str(tmp_path / "runs" / "x")
  assert ray_train._absolute("gs://bucket/~x") == "gs://bucket/~x"


SLOW_LEARNING_RATE = 1e-6  # The trial the scheduler stops.


def _tune_config(*overrides):
  return _config(
      "trainer.train_steps=5",  # Evaluations at steps 2 and 4 (eval_every), and the final one at 5.
      "trainer.steps_per_loop=2",
      "trainer.eval_every=2",
      "data.num_examples=256",
      "data.num_eval_examples=64",
      *overrides,
  )


@pytest.mark.ray
def test_tune_runs_a_trial_per_config_reports_each_evaluation_and_its_scheduler_stops_one(tmp_path):
  from ray import tune  # noqa: PLC0415  Ray is imported above (it is optional).
  from ray.tune.schedulers import FIFOScheduler  # noqa: PLC0415
  from ray.tune.search.basic_variant import BasicVariantGenerator  # noqa: PLC0415

  saved_at_report = []  # (sweep, learning rate, reported step, the step of the trial's latest checkpoint then)

  class StopsTheSlowTrial(FIFOScheduler):
    """Tune's scheduler, forced: STOP for the slow trial at its first result. It runs in this process."""

    def __init__(self, sweep):
      super().__init__()
      self.sweep = sweep

    def on_trial_result(self, tune_controller, trial, result):
      learning_rate = trial.config["optimizer.learning_rate"]
      latest = checkpoints.latest_step(str(tmp_path / self.sweep / f"trial_{trial.trial_id}"))
      saved_at_report.append((self.sweep, learning_rate, result["step"], latest))
      if learning_rate == SLOW_LEARNING_RATE:
        return self.STOP
      return super().on_trial_result(tune_controller, trial, result)

  ray_tmpdir = tempfile.mkdtemp(prefix="tf-runner-ray-", dir="/tmp")  # Short: Ray's Unix sockets are in it.
  (tmp_path / "home").mkdir()
  with pytest.MonkeyPatch.context() as patch:
    patch.delenv("RAY_ADDRESS", raising=False)
    env = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_TMPDIR": ray_tmpdir, "HOME": str(tmp_path / "home")}
    env["RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"] = "0.5"  # Ray Train sees its workers' end sooner than every 2 s.
    env["PYTHONPATH"] = paths.subprocess_environment()["PYTHONPATH"]  # The trials import this repository.
    for name, value in env.items():
      patch.setenv(name, value)
    try:
      # Three CPUs: for a trial's actor and its Ray Train job's 2 workers, below. The 3 trials of one worker
      # first run one after another (max_concurrent=1), in one actor that tune reuses.
      context = ray.init(address="local", include_dashboard=False, num_cpus=3, log_to_driver=False)
      grid = ray_train.tune(
          _tune_config(),
          param_space={"optimizer.learning_rate": tune.grid_search([3e-3, SLOW_LEARNING_RATE, 3e-2])},
          num_samples=1,
          metric="loss",
          mode="min",
          workdir=str(tmp_path / "sweep"),
          search_alg=BasicVariantGenerator(max_concurrent=1),
          scheduler=StopsTheSlowTrial("sweep"),
      )
      scaled_grid = ray_train.tune(
          _tune_config("strategy.name=multi_worker_mirrored"),
          param_space={"optimizer.learning_rate": 3e-3},
          num_samples=1,
          metric="loss",
          mode="min",
          workdir=str(tmp_path / "scaled_sweep"),
          scaling_config=ray_train_api.ScalingConfig(num_workers=2),  # A CPU each.
          scheduler=StopsTheSlowTrial("scaled_sweep"),
      )
    finally:
      ray.shutdown()
      left = _ray_processes(ray_tmpdir)
      _kill(left)
      shutil.rmtree(ray_tmpdir, ignore_errors=True)
  assert not left, f"Ray processes left running: {left}"
  assert context.address_info["node_ip_address"] == "127.0.0.1"
  assert LOOPBACK_ADDRESS.match(context.address_info["gcs_address"]), context.address_info

  assert len(grid) == 3 and not grid.errors
  # Each report's step is checkpointed before the report reaches Tune, whatever Tune does after it. A trial of one
  # worker waits for Tune at its report; a Ray Train job's workers go on meanwhile, perhaps saving later steps.
  reports = [(SLOW_LEARNING_RATE, 2)] + [(rate, step) for rate in (3e-3, 3e-2) for step in (2, 4, 5)]
  assert sorted(row for row in saved_at_report if row[0] == "sweep") == sorted(("sweep", *r, r[1]) for r in reports)
  scaled = [row[1:] for row in saved_at_report if row[0] == "scaled_sweep"]
  assert [row[:2] for row in scaled] == [(3e-3, 2), (3e-3, 4), (3e-3, 5)] and all(s >= step for _, step, s in scaled)
  last_loss = {}
  for result in grid:
    learning_rate = result.config["optimizer.learning_rate"]
    workdir = tmp_path / "sweep" / f"trial_{result.metrics['trial_id']}"
    with open(workdir / "config.json", encoding="utf-8") as f:
      written = json.load(f)
    assert written["optimizer"]["learning_rate"] == learning_rate
    assert (written["trainer"]["checkpoint_every"], written["trainer"]["async_checkpoints"]) == (2, False)
    evaluations = [row for row in process_testlib.metrics_rows(workdir) if row["split"] == "eval"]
    reported = result.metrics_dataframe
    for name in ("step", "loss", "accuracy"):
      assert list(reported[name]) == [row[name] for row in evaluations], name
    steps = [2] if learning_rate == SLOW_LEARNING_RATE else [2, 4, 5]
    assert [row["step"] for row in evaluations] == steps
    stop_step = steps[-1]
    assert checkpoints.latest(str(workdir)) == str(workdir / "checkpoints" / f"ckpt-{stop_step}")
    last_loss[learning_rate] = evaluations[-1]["loss"]
  best = grid.get_best_result()
  assert last_loss[best.config["optimizer.learning_rate"]] == min(last_loss.values()) == best.metrics["loss"]

  (result,) = scaled_grid  # A Ray Train job of 2 workers, each evaluation of its chief reported to Tune.
  assert not scaled_grid.errors
  workdir = tmp_path / "scaled_sweep" / f"trial_{result.metrics['trial_id']}"
  with open(workdir / "config.json", encoding="utf-8") as f:
    assert json.load(f)["strategy"]["name"] == "multi_worker_mirrored"
  evaluations = [row for row in process_testlib.metrics_rows(workdir) if row["split"] == "eval"]
  assert [row["step"] for row in evaluations] == [2, 4, 5]
  for name in ("step", "loss", "accuracy"):
    assert list(result.metrics_dataframe[name]) == [row[name] for row in evaluations], name
  assert os.listdir(tmp_path / "scaled_sweep" / "ray_train") == [f"trial_{result.metrics['trial_id']}"]  # Its records.


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (
            {"param_space": {"trainer.train_step": 10}},
            "param_space['trainer.train_step']: Override 'trainer.train_step=10': config.trainer has no field "
            "'train_step'. Did you mean 'train_steps'?",
        ),
        (
            {"param_space": {"optimiser.learning_rate": 0.1}},
            "param_space['optimiser.learning_rate']: Override 'optimiser.learning_rate=0.1': config has no field "
            "'optimiser'. Did you mean 'optimizer'?",
        ),
        (
            {"param_space": {"optimizer.learning_rate": {"grid_search": [0.1, "fast"]}}},
            "param_space['optimizer.learning_rate']: Override \"optimizer.learning_rate='fast'\": "
            "config.optimizer.learning_rate must be a float, got 'fast'.",
        ),
        ({"param_space": {}}, "param_space must be a non-empty dict {config path: value}, got {}."),
        (
            {"metric": "acuracy"},
            "metric='acuracy' is not a result of the evaluation. Did you mean 'accuracy'? It reports: loss, accuracy, "
            "num_examples.",
        ),
        (
            {"scaling_config": ray_train_api.ScalingConfig(num_workers=2)},
            "ScalingConfig(num_workers=2) runs more than one worker, but config.strategy.name is 'auto', which "
            "would train each of them alone;",
        ),
        (
            {"config": _tune_config("mode=train")},
            "config.mode='train': tune ranks trials by their evaluations; use 'train_and_eval'.",
        ),
    ],
)
def test_tune_refuses_bad_input_before_any_trial(arguments, message, tmp_path):
  arguments = {"config": _tune_config(), "param_space": {"optimizer.learning_rate": 0.1}, "metric": "loss", **arguments}
  with pytest.raises(ConfigError) as error:
    ray_train.tune(**arguments, num_samples=1, mode="min", workdir=str(tmp_path))
  assert str(error.value).startswith(message)
  assert not os.listdir(tmp_path)
