"""Checkpoints written in the background (`async_checkpoints`, the default): what they hold, and signals during a write.

The in-process tests check that each checkpoint holds the weights of its own
step although training went on while it was written, and that a failed write
is named. The process test stops one run with real SIGTERM and then
SIGKILL, each while a checkpoint of 13 MB (a 1024x1024 hidden
layer and Adam's slots) is being written, seen by its `ckpt-N_temp/`
directory; the same command resumes it each time, and it ends with the
weights of an uninterrupted run, bit for bit. It is also the suite's test of
SIGTERM and SIGKILL on one device through `python -m runner` (Ctrl-C, which
takes the same path as SIGTERM, on two replicas:
tests/runner/cluster/test_fault_tolerance.py).
(What `strategies.tensorflow_workarounds.end_async_checkpoint_writer` works
around is checked in tests/project/test_workarounds_outputs.py.)
"""

import os
import shutil
import signal
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

import runner
from runner.outputs import checkpoint_list
from runner.outputs.checkpoints import CheckpointWriteError
from runner.workdir import lock as workdir_lock
from strategies.errors import ConfigError
from testlib import paths
from testlib import process_testlib
from testlib import trainer_testlib

STEPS = 40  # Two interruptions, each at a write past the step resumed from, then the end.
RUN = [
    f"--config={os.path.join(paths.REPO, 'configs', 'synthetic.py')}",
    "--config.mode=train",
    "--config.strategy.name=one_device",
    "--config.data.num_examples=512",
    "--config.model.hidden_units=(1024,1024)",  # 1.1M weights; with Adam's two slots a checkpoint of 13 MB.
    f"--config.trainer.train_steps={STEPS}",
    "--config.trainer.steps_per_loop=5",
    "--config.trainer.checkpoint_every=5",
    "--config.trainer.max_to_keep=100",  # Every checkpoint stays, to be read.
]


class _WeightsAtEachStep(runner.actions.Action):
  """Keeps a copy of the model's weights after each loop (actions run before the loop's checkpoint)."""

  def __init__(self):
    self.model = None  # The Trainer's, once it is made.
    self.weights = {}

  def __call__(self, loop):
    self.weights[loop.step] = [w.numpy().copy() for w in self.model.weights]


def test_each_checkpoint_written_in_the_background_holds_its_own_steps_weights(tmp_path):
  strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
  weights = _WeightsAtEachStep()
  trainer = trainer_testlib.make_trainer(
      strategy, model_dir=str(tmp_path), steps_per_loop=1, checkpoint_every=1, max_to_keep=None, actions=[weights]
  )
  weights.model = trainer.model
  trainer.train(trainer_testlib.classification_data(64), global_batch_size=8, steps=4)
  directory = str(tmp_path / "checkpoints")
  assert [checkpoint_list.step_of(p) for p in checkpoint_list.read(directory).paths] == [1, 2, 3, 4]
  for step in (1, 2, 3, 4):
    restored = trainer_testlib.make_trainer(strategy, model_dir=str(tmp_path))
    restored.restore(checkpoint=os.path.join(directory, f"ckpt-{step}"))
    assert restored.global_step == step
    for got, want in zip(restored.model.weights, weights.weights[step], strict=True):
      np.testing.assert_array_equal(got.numpy(), want)
  assert not np.array_equal(weights.weights[1][0], weights.weights[4][0])  # Training moved them: the test can fail.


class _BlockWrite(runner.actions.Action):
  """Puts a file where the checkpoint of `step` writes its shards (`ckpt-N_temp/`), so that its write fails."""

  def __init__(self, directory, step):
    self.directory, self.step = directory, step

  def __call__(self, loop):
    if loop.step == self.step:
      os.makedirs(self.directory, exist_ok=True)
      open(os.path.join(self.directory, f"ckpt-{self.step}_temp"), "w").close()  # noqa: SIM115


def test_a_failed_background_write_is_named_at_the_next_save_with_the_previous_checkpoint_intact(tmp_path):
  directory = str(tmp_path / "checkpoints")
  trainer = trainer_testlib.make_trainer(
      tf.distribute.OneDeviceStrategy("/cpu:0"),
      model_dir=str(tmp_path),
      steps_per_loop=1,
      checkpoint_every=1,
      actions=[_BlockWrite(directory, 2)],
  )
  with pytest.raises(CheckpointWriteError, match=r"^Could not write the checkpoint of step 2 to .*ckpt-1 is intact"):
    trainer.train(trainer_testlib.classification_data(64), global_batch_size=8, steps=6)
  assert trainer.global_step == 3  # Raised by the save of step 3, the next one.
  assert [checkpoint_list.step_of(p) for p in checkpoint_list.read(directory).paths] == [1]
  assert sorted(os.listdir(directory)) == ["checkpoint", "ckpt-1.data-00000-of-00001", "ckpt-1.index"]


def test_async_checkpoints_must_be_a_bool():
  with pytest.raises(ConfigError, match=r"async_checkpoints must be True or False, got 'yes'"):
    trainer_testlib.make_trainer(tf.distribute.OneDeviceStrategy("/cpu:0"), async_checkpoints="yes")


class _Run(process_testlib.TrainingProcess):

  def __init__(self, workdir, env):
    super().__init__(
        [sys.executable, "-m", "runner", f"--workdir={workdir}", *RUN], workdir=workdir, env=env, name="run"
    )

  def signal_while_writing(self, signum, after):
    """Sends `signum` once a checkpoint past step `after` is being written in the background; returns its step."""
    directory = os.path.join(self.workdir, "checkpoints")
    deadline = time.monotonic() + process_testlib.TIMEOUT_SECONDS
    while not (writing := [step for step in _being_written(directory) if step > after]):
      assert self.process.poll() is None, f"the run exited before a checkpoint was written: {self.stderr()[-3000:]}"
      assert time.monotonic() < deadline, "no checkpoint written in time"
      time.sleep(0.002)
    self.process.send_signal(signum)
    return writing[0]


def _being_written(directory):
  """The steps of the `ckpt-N_temp/` directories holding shards in `directory`: checkpoints being written."""
  if not os.path.isdir(directory):
    return []
  return [
      checkpoint_list.step_of(path[: -len(checkpoint_list.INTERRUPTED_SAVE_SUFFIX)])
      for path in checkpoint_list.interrupted_saves(directory)
      if os.listdir(path)
  ]


def _assert_every_listed_checkpoint_is_whole(workdir):
  """Each checkpoint the list file names reads whole; returns their steps."""
  directory = os.path.join(str(workdir), "checkpoints")
  listed = checkpoint_list.read(directory)
  assert listed.problem is None, listed.problem  # The list names exactly the checkpoints on disk.
  for path in listed.paths:
    reader = tf.train.load_checkpoint(path)
    for name in reader.get_variable_to_shape_map():
      reader.get_tensor(name)
  return [checkpoint_list.step_of(path) for path in listed.paths]


def test_sigterm_and_sigkill_during_background_writes_then_the_run_resumes_exactly(tmp_path, subprocess_env, caplog):
  """One run stopped twice while it writes in the background (each rerun resumes it), then run to the end.

  Each stop saves, says so in one line and releases the workdir's lock; SIGKILL leaves the write it cut short, which
  the rerun removes; the end holds the weights of an uninterrupted run, bit for bit, and one row per loop. A copy of
  what SIGKILL left is removed from another workdir too (`_assert_a_killed_saves_leftover_is_removed_...`).
  """
  workdir, checkpoints = tmp_path / "run", str(tmp_path / "run" / "checkpoints")
  resumed_from, resumed_lines = 0, []
  for signum, name in [(signal.SIGTERM, "SIGTERM")]:  # Ctrl-C: test_fault_tolerance.py, on two replicas.
    run = _Run(workdir, subprocess_env)
    # Past its writer's first save (copied eagerly), so that it writes the copy TensorFlow traced.
    writing = run.signal_while_writing(signum, after=resumed_from or 5)
    code, _, stderr = run.wait()
    assert code == 128 + signum, stderr[-3000:]
    assert "Traceback" not in stderr, stderr[-3000:]
    resumed_lines.append((resumed_from, stderr))
    stopped_at = run.train_rows()[-1]["step"]
    [line] = [line for line in stderr.splitlines() if f"Stopped by {name}:" in line]
    assert line.endswith(
        f"Stopped by {name}: saved a checkpoint at step {stopped_at} ({checkpoints}/ckpt-{stopped_at}); run the same "
        "command again to resume from there."
    ), line
    steps = _assert_every_listed_checkpoint_is_whole(workdir)
    assert writing in steps and steps[-1] == stopped_at  # The write in flight completed, then the stop's own save.
    assert not _being_written(checkpoints)
    assert workdir_lock.FILE_NAME not in os.listdir(workdir)  # Released before the exit.
    resumed_from = stopped_at
  run = _Run(workdir, subprocess_env)
  writing = run.signal_while_writing(signal.SIGKILL, after=resumed_from)
  assert run.wait()[0] == -signal.SIGKILL
  resumed_lines.append((resumed_from, run.stderr()))
  assert _being_written(checkpoints) == [writing]  # Killed part-way through the write of 13 MB.
  steps = _assert_every_listed_checkpoint_is_whole(workdir)
  assert steps and all(step < writing for step in steps)  # Never listed: the previous checkpoint is the latest.
  leftover = str(tmp_path / "killed" / f"ckpt-{writing}_temp")
  shutil.copytree(os.path.join(checkpoints, f"ckpt-{writing}_temp"), leftover)
  final = _Run(workdir, subprocess_env)
  # While it starts: the leftover's copy in another workdir, in this process (a tiny model).
  _assert_a_killed_saves_leftover_is_removed_when_training_starts_again(leftover, tmp_path / "other", caplog)
  status, stdout, stderr = final.wait()
  assert status == 0 and f"global step: {STEPS}" in stdout, stderr[-3000:]
  assert f"Removed {checkpoints}/ckpt-{writing}_temp, left by a save that was interrupted" in stderr
  assert not _being_written(checkpoints)
  resumed_lines.append((steps[-1], stderr))
  for step, stderr in resumed_lines[1:]:  # Each rerun started at the step of the last complete checkpoint.
    assert f"Resuming at step {step}: each input pipeline starts its stream at the examples of step {step}" in stderr
  # Each loop reported once, although the stopped and killed runs reported loops past their last checkpoint.
  assert [row["step"] for row in process_testlib.train_rows(workdir)] == list(range(5, STEPS + 1, 5))
  # The uninterrupted run, in this process (after the rerun: two runs of this model at once slow each other down).
  config = runner.load_config(RUN[0].removeprefix("--config="), [arg.removeprefix("--config.") for arg in RUN[1:]])
  assert runner.run(config, str(tmp_path / "uninterrupted"), quiet=True).global_step == STEPS
  got = process_testlib.final_checkpoint_values(workdir)
  want = process_testlib.final_checkpoint_values(tmp_path / "uninterrupted")
  assert sorted(got) == sorted(want) and len(want) > 4
  for name, value in want.items():
    np.testing.assert_array_equal(got[name], value, err_msg=name)


def _assert_a_killed_saves_leftover_is_removed_when_training_starts_again(leftover, parent, caplog):
  """What a save SIGKILLed part-way left is removed when training starts again, and only then.

  The `ckpt-N_temp/` directory `leftover` is moved into the checkpoints of a run to step 6 (ckpt-2, ckpt-4, ckpt-6:
  one every 2 steps, 3 kept): restoring alone removes nothing; training removes it, says so, and rotates.
  """
  assert os.listdir(leftover)  # The shards TensorFlow was writing, never merged into a checkpoint.
  model_dir, checkpoints = str(parent / "run"), str(parent / "run" / "checkpoints")

  def trainer():
    return trainer_testlib.make_trainer(
        tf.distribute.OneDeviceStrategy("/cpu:0"), model_dir=model_dir, checkpoint_every=2, max_to_keep=3
    )

  trainer().train(trainer_testlib.classification_data(64), global_batch_size=8, steps=6)
  moved = os.path.join(checkpoints, os.path.basename(leftover))
  shutil.move(leftover, moved)
  caplog.clear()
  resumed = trainer()
  assert resumed.global_step == 6 and os.path.isdir(moved)  # Restoring alone removes nothing.
  with caplog.at_level("INFO", logger="absl"):
    resumed.train(trainer_testlib.classification_data(64), global_batch_size=8, steps=8)
  assert not os.path.exists(moved)
  assert f"Removed {moved}, left by a save that was interrupted" in caplog.text
  assert "rebuilt" not in caplog.text  # The list was sound: neither rebuilt nor rewritten before the save.
  assert [checkpoint_list.step_of(p) for p in checkpoint_list.read(checkpoints).paths] == [4, 6, 8]
  assert sorted({name.split(".")[0] for name in os.listdir(checkpoints) if name.startswith("ckpt-")}) == [
      "ckpt-4",
      "ckpt-6",
      "ckpt-8",
  ]
