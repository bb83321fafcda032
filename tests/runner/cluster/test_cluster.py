"""Multi-worker jobs: workers that agree, and workers that never hang. Real processes on localhost ports."""

import os
import signal
import subprocess
import sys
import time

import numpy as np
import portpicker
import pytest
import tensorflow as tf

import runner
from runner import exit_codes
from strategies import ClusterError
from strategies import peers
from testlib import paths

REPO = paths.REPO
SYNTHETIC = os.path.join(REPO, "configs", "synthetic.py")
AGREEMENT_MAIN = os.path.join(paths.TESTLIB, "agreement_main.py")
TIMEOUT_SECONDS = 180
STEPS = 12
# Unshuffled data and a global batch every worker count divides: each global batch is the same examples
# whichever the number of workers, so the run must equal one process's.
OVERRIDES = [
    "mode=train",
    "data.global_batch_size=48",
    "data.num_examples=480",
    "data.shuffle=false",
    f"trainer.train_steps={STEPS}",
    "trainer.steps_per_loop=4",
    "trainer.checkpoint_every=4",
]
CHIEF_FILES = {"checkpoints", "summaries", "metrics.jsonl", "config.json", "config_history.jsonl"}


def _hosts(count):
  return tuple(f"localhost:{portpicker.pick_unused_port()}" for _ in range(count))


def _cluster_overrides(hosts, index):
  return ["strategy.name=multi_worker_mirrored", f"strategy.worker_hosts={hosts!r}", f"strategy.task_index={index}"]


def _runner(hosts, index, workdir, *args):
  """The `python -m runner` command line of worker `index`."""
  return [sys.executable, "-m", "runner", f"--config={SYNTHETIC}", f"--workdir={workdir}", *args] + [
      f"--config.{override}" for override in _cluster_overrides(hosts, index)
  ]


def _finish(processes):
  """Waits for every process; returns [(status, stdout, stderr)]."""
  try:
    outputs = [p.communicate(timeout=TIMEOUT_SECONDS) for p in processes]
    return [(p.returncode, stdout, stderr) for p, (stdout, stderr) in zip(processes, outputs)]
  finally:
    for p in processes:
      p.kill()


def _start(command, env):
  """Starts `command` with Ctrl-C (SIGINT) at its default, as from a terminal, even if this process ignores it.

  A shell without job control starts background jobs with SIGINT ignored, and
  Python then keeps it ignored instead of raising KeyboardInterrupt.
  """
  return subprocess.Popen(
      command,
      cwd=REPO,
      env=env,
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      text=True,
      preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # noqa: PLW1509
  )


def test_workers_end_identical_and_equal_to_one_device_and_only_the_chief_writes_and_exports(tmp_path, subprocess_env):
  num_workers = 2
  scratch = tmp_path / "tmp"
  scratch.mkdir()
  env = dict(subprocess_env, TMPDIR=str(scratch))
  workdir = tmp_path / "job"
  hosts = _hosts(num_workers)
  workers = [
      _start(
          [
              sys.executable,
              AGREEMENT_MAIN,
              str(tmp_path / f"weights_{i}.npz"),
              str(workdir),
              *OVERRIDES,
              *_cluster_overrides(hosts, i),
          ],
          env,
      )
      for i in range(num_workers)
  ]
  try:  # One device, in this process, while the workers start.
    single = runner.run(
        runner.load_config(SYNTHETIC, OVERRIDES + ["strategy.name=one_device"]), str(tmp_path / "single")
    )
  finally:
    results = _finish(workers)
  for status, stdout, stderr in results:
    assert status == 0, stderr[-3000:]
    assert stdout.splitlines()[-1] == f"global step: {STEPS}"

  per_worker = []
  for index in range(num_workers):
    with np.load(tmp_path / f"weights_{index}.npz") as saved:
      per_worker.append([saved[f"arr_{i}"] for i in range(len(saved.files))])
  for other in per_worker[1:]:
    for got, want in zip(other, per_worker[0]):
      np.testing.assert_array_equal(got, want)
  assert single.global_step == STEPS
  expected = single.model.get_weights()
  assert len(per_worker[0]) == len(expected) == 4
  for got, want in zip(per_worker[0], expected):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)

  assert set(os.listdir(workdir)) == CHIEF_FILES
  checkpoints = tf.train.get_checkpoint_state(str(workdir / "checkpoints"))
  assert [os.path.basename(p) for p in checkpoints.all_model_checkpoint_paths] == ["ckpt-4", "ckpt-8", "ckpt-12"]
  assert not [name for name in os.listdir(scratch) if name.startswith("tf_runner_worker_")]

  # The same job exports: the chief writes the SavedModel, which loads and serves.
  results = _finish(
      [
          _start(_runner(hosts, i, workdir, "--mode=export", *[f"--config.{o}" for o in OVERRIDES[1:]]), env)
          for i in range(num_workers)
      ]
  )
  assert [status for status, _, _ in results] == [0] * num_workers, [stderr[-2000:] for _, _, stderr in results]
  assert set(os.listdir(workdir)) == CHIEF_FILES | {"export"}
  served = tf.saved_model.load(str(workdir / "export")).signatures["serving_default"]
  features = np.random.RandomState(0).normal(size=(5, 16)).astype(np.float32)
  (output,) = served(tf.constant(features)).values()
  np.testing.assert_allclose(output.numpy(), single.model(features).numpy(), rtol=1e-4, atol=1e-5)


@pytest.fixture(scope="module")
def side_by_side(tmp_path_factory):
  """Workers that end before training does, started side by side once for the file: {name: outcome}.

  'alone': worker:1 of 3, whose peers never come (timeout 3 s); SIGTERM and SIGINT: worker:0 of 2, each signalled while
  it waits for worker:1; 'lost': 2 training workers, worker:1 killed (SIGKILL) after step 100. An outcome is
  `(status, stdout, stderr)`, with the workdir, the hosts (and the victim's outcome) beside it.
  """
  env = paths.subprocess_environment()
  root = tmp_path_factory.mktemp("side_by_side")
  hosts = {"alone": _hosts(3), "lost": _hosts(2), **{signum: _hosts(2) for signum in (signal.SIGTERM, signal.SIGINT)}}
  workdirs = {name: root / str(name) / "job" for name in hosts}
  for workdir in workdirs.values():
    workdir.parent.mkdir()
  args = [
      "--mode=train",
      "--config.trainer.train_steps=1000000",
      "--config.trainer.steps_per_loop=10",
      "--config.trainer.checkpoint_every=50",
  ]
  processes = {
      "alone": _start(_runner(hosts["alone"], 1, workdirs["alone"], "--config.strategy.timeout_seconds=3"), env),
      **{
          signum: _start(_runner(hosts[signum], 0, workdirs[signum]), env) for signum in (signal.SIGTERM, signal.SIGINT)
      },
      "lost": _start(_runner(hosts["lost"], 0, workdirs["lost"], *args), env),
      "victim": _start(_runner(hosts["lost"], 1, workdirs["lost"], *args), env),
  }
  try:
    for signum in (signal.SIGTERM, signal.SIGINT):
      _wait_for_line(processes[signum], "waiting for worker:1 (at most 300 s)")
      processes[signum].send_signal(signum)
    _wait_for_line(processes["lost"], "step 100/1000000")
    processes["victim"].kill()
  except BaseException:
    for process in processes.values():
      process.kill()
    raise
  outcomes = dict(zip(processes, _finish(list(processes.values()))))
  return {name: (outcomes[name], workdirs[name], hosts[name]) for name in hosts}


def test_a_worker_whose_peer_never_comes_gives_up_at_the_timeout_naming_it(side_by_side):
  (status, stdout, stderr), workdir, hosts = side_by_side["alone"]
  assert status == exit_codes.CLUSTER, stderr[-3000:]
  assert stderr.splitlines()[-1] == (
      f"error: worker:1 waited 3 s for the other tasks and gave up: nothing listens at worker:0 ({hosts[0]}), "
      f"worker:2 ({hosts[2]}). Start every task (the same command with its own TF_CONFIG or task_index), or "
      "raise config.strategy.timeout_seconds."
  )
  assert "Traceback" not in stderr and "global step" not in stdout
  assert not os.listdir(workdir.parent)  # Nothing was written.


def test_sigterm_and_ctrl_c_end_a_worker_that_waits_for_its_peers(side_by_side):
  (status, _, stderr), workdir, _ = side_by_side[signal.SIGTERM]
  assert status == 143
  assert stderr.splitlines()[-1] == "error: SIGTERM while waiting for the other tasks to join; stopped before any work."
  assert not os.listdir(workdir.parent)  # It did not write its workdir.
  (status, _, stderr), workdir, _ = side_by_side[signal.SIGINT]
  assert status == 130
  assert stderr.splitlines()[-1] == "Stopped by Ctrl-C during start-up; nothing was written."
  assert not os.listdir(workdir.parent)


def test_a_worker_that_dies_mid_run_stops_the_others_with_one_line_naming_it(side_by_side):
  (status, stdout, stderr), _, hosts = side_by_side["lost"]
  assert status == exit_codes.CLUSTER, stderr[-3000:]
  last = stderr.splitlines()[-1]
  assert last.startswith("error: worker:0 stopped after step ")
  assert (
      f"worker:1 ({hosts[1]})" in last
      and "Restart every task with the same command; the job resumes from its last checkpoint, at step " in last
  )
  step = int(last.split("stopped after step ")[1].split(":")[0])
  saved = int(last.rsplit("at step ", 1)[1].rstrip("."))
  assert saved == step - step % 50 and saved >= 100
  assert "Traceback" not in stderr and stdout == ""


def test_the_lost_peer_message_names_the_peers_in_tensorflows_error():
  resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
      tf.train.ClusterSpec({"worker": ["localhost:1", "localhost:2", "localhost:3"]}), task_type="worker", task_id=0
  )
  error = tf.errors.UnavailableError(
      None,
      None,
      (
          "Collective ops is aborted by: Error reported from /job:worker/task:0: The following tasks are unhealthy "
          "(stopped sending heartbeats):\n/job:worker/replica:0/task:2\nThe tasks have crashed."
      ),
  )
  message = str(peers.lost(error, cluster_resolver=resolver, step=40, saved_step=None))
  assert message.startswith(
      "worker:0 stopped after step 40: worker:2 stopped sending heartbeats (it crashed, was "
      "killed or hangs). Nothing listens at worker:1 (localhost:2), worker:2 (localhost:3). "
  )
  assert message.endswith("Restart every task with the same command; the job resumes from step 0 (no checkpoint yet).")


def test_a_taken_port_is_named_before_any_waiting():
  with socket_holding_a_port() as port:
    spec = tf.train.ClusterSpec({"worker": [f"localhost:{port}", "localhost:1"]})
    with pytest.raises(
        ClusterError,
        match=rf"^worker:0 cannot listen at localhost:{port}: .*Another process holds "
        "the port; choose free ports for the cluster\\.$",
    ):
      peers.join(lambda: None, cluster_spec=spec, task_type="worker", task_id=0, timeout_seconds=1)


class socket_holding_a_port:  # noqa: N801
  """A context manager: a listening socket on a free port (without SO_REUSEADDR, so the port is taken)."""

  def __enter__(self):
    import socket  # noqa: PLC0415

    self._socket = socket.socket()
    self._socket.bind(("", 0))
    self._socket.listen(1)
    return self._socket.getsockname()[1]

  def __exit__(self, *exc):
    self._socket.close()


def _wait_for_line(process, text, timeout=TIMEOUT_SECONDS):
  """Reads `process`'s stderr until a line contains `text`; the rest stays readable by communicate()."""
  deadline = time.monotonic() + timeout
  for line in process.stderr:
    if text in line:
      return
    assert time.monotonic() < deadline, f"no line with {text!r}"
  raise AssertionError(f"the process ended without a line with {text!r}; status {process.wait()}")
