"""What a stopped run leaves behind: a damaged checkpoint list, replayed rows.

An interrupted save's `ckpt-N_temp` (what a real SIGKILL left) and its removal when training starts again:
tests/runner/outputs/test_async_checkpoints.py.
"""

import glob
import os
import re
import shutil

import numpy as np
import pytest
import tensorflow as tf

import runner
from runner.outputs import checkpoints as checkpoints_lib
import strategies
from testlib import process_testlib
from testlib import trainer_testlib

GLOBAL_BATCH = 8
ONE_DEVICE = tf.distribute.OneDeviceStrategy("/cpu:0")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """`(model_dir, weights at step 6)` of a run to step 6 with a checkpoint every 2 steps: ckpt-2, ckpt-4, ckpt-6."""
  model_dir = str(tmp_path_factory.mktemp("trained") / "run")
  trainer = _trainer(model_dir)
  trainer.train(trainer_testlib.classification_data(64), global_batch_size=GLOBAL_BATCH, steps=6)
  return model_dir, trainer.model.get_weights()


def _trainer(model_dir, **options):
  return trainer_testlib.make_trainer(ONE_DEVICE, model_dir=model_dir, checkpoint_every=2, max_to_keep=3, **options)


def _copy(trained, parent):
  """A copy of the trained run's model_dir, as `parent/run`; returns `(model_dir, its checkpoint directory)`."""
  model_dir = str(parent / "run")
  shutil.copytree(trained[0], model_dir)
  return model_dir, os.path.join(model_dir, "checkpoints")


def _checkpoint_files(directory):
  """{name: bytes} of the `ckpt-N` files in `directory`."""
  files = {}
  for path in glob.glob(os.path.join(directory, "ckpt-*")):
    if os.path.isfile(path):
      with open(path, "rb") as f:
        files[os.path.basename(path)] = f.read()
  return files


def _names(files):
  return sorted({name.split(".")[0] for name in files}, key=lambda name: int(name.split("-")[1]))


def _removed(path):
  os.remove(path)


def _truncated_to_half(path):
  with open(path, "r+b") as f:
    f.truncate(os.path.getsize(path) // 2)


def _zeroed(path):
  size = os.path.getsize(path)
  with open(path, "wb") as f:
    f.write(bytes(size))


def _emptied(path):
  open(path, "wb").close()


def _cut_to_its_first_two_lines(path):
  """Still a valid list: it names the newest checkpoint, not all of them (a cut at a line's end)."""
  with open(path, "rb") as f:
    lines = f.read().splitlines(keepends=True)
  with open(path, "wb") as f:
    f.write(b"".join(lines[:2]))


def _random_bytes(path):
  size = os.path.getsize(path)
  with open(path, "wb") as f:
    f.write(np.random.default_rng(0).bytes(size))


_PROBLEM = {
    _removed: "is missing",
    _truncated_to_half: r"(cannot be read \(ParseError: .*\)|does not name ckpt-\d.*)",
    _zeroed: r"cannot be read \(ParseError: .*\)",
    _emptied: "names no checkpoint",
    _cut_to_its_first_two_lines: "does not name ckpt-4",
    _random_bytes: r"cannot be read \(UnicodeDecodeError: .*\)",
}


@pytest.mark.parametrize("damage", list(_PROBLEM), ids=lambda damage: damage.__name__.strip("_"))
def test_a_damaged_checkpoint_list_is_rebuilt_from_the_files_and_rotation_knows_them_all(
    damage, trained, tmp_path, caplog
):
  model_dir, checkpoints = _copy(trained, tmp_path)
  damage(os.path.join(checkpoints, "checkpoint"))
  before = _checkpoint_files(checkpoints)
  assert _names(before) == ["ckpt-2", "ckpt-4", "ckpt-6"]
  assert checkpoints_lib.latest(model_dir) == os.path.join(checkpoints, "ckpt-6")  # What runner.run and the CLI see.
  assert checkpoints_lib.latest_step(model_dir) == 6
  with caplog.at_level("WARNING", logger="absl"):
    resumed = _trainer(model_dir)
  assert resumed.global_step == 6
  for got, want in zip(resumed.model.get_weights(), trained[1]):
    np.testing.assert_array_equal(got, want)
  warnings = re.findall(r"The checkpoint list .* rebuilt it from .*", caplog.text)
  assert len(warnings) == 1, caplog.text
  assert re.fullmatch(
      rf"The checkpoint list {re.escape(os.path.join(checkpoints, 'checkpoint'))} {_PROBLEM[damage]}; rebuilt it "
      r"from the checkpoint files: ckpt-2, ckpt-4, ckpt-6 \(newest last\)\. It is rewritten at the next save\.",
      warnings[0],
  ), warnings[0]
  assert _checkpoint_files(checkpoints) == before  # Restoring touched no checkpoint.

  resumed.train(trainer_testlib.classification_data(64), global_batch_size=GLOBAL_BATCH, steps=10)
  after = _checkpoint_files(checkpoints)
  assert _names(after) == ["ckpt-6", "ckpt-8", "ckpt-10"]  # max_to_keep=3 rotated the oldest found on disk.
  assert {name: data for name, data in after.items() if name.startswith("ckpt-6.")} == {
      name: data for name, data in before.items() if name.startswith("ckpt-6.")
  }
  with open(os.path.join(checkpoints, "checkpoint"), encoding="utf-8") as f:
    written = f.read()
  assert re.findall(r'^all_model_checkpoint_paths: "(.*)"$', written, re.M) == ["ckpt-6", "ckpt-8", "ckpt-10"]
  assert re.findall(r'^model_checkpoint_path: "(.*)"$', written, re.M) == ["ckpt-10"]
  assert not [name for name in os.listdir(checkpoints) if ".tmp" in name]


def test_a_rebuilt_list_whose_newest_checkpoint_is_unreadable_falls_back_and_never_deletes_the_newest(
    trained, tmp_path, caplog
):
  model_dir, checkpoints = _copy(trained, tmp_path)
  os.remove(os.path.join(checkpoints, "checkpoint"))
  data_file = glob.glob(os.path.join(checkpoints, "ckpt-6.data-*"))[0]
  with open(data_file, "r+b") as f:
    f.truncate(os.path.getsize(data_file) // 2)
  with caplog.at_level("WARNING", logger="absl"):
    resumed = _trainer(model_dir)
  assert resumed.global_step == 4
  assert "is missing; rebuilt it from the checkpoint files: ckpt-2, ckpt-4, ckpt-6 (newest last)" in caplog.text
  assert re.search(
      r"Skipped the newest checkpoint\(s\) of .*checkpoints, which cannot be read: ckpt-6 "
      r"\(\w+Error: .*\)\. Resumed from ckpt-4 instead",
      caplog.text,
  )
  resumed.train(trainer_testlib.classification_data(64), global_batch_size=GLOBAL_BATCH, steps=8)
  assert _names(_checkpoint_files(checkpoints)) == ["ckpt-4", "ckpt-6", "ckpt-8"]
  assert checkpoints_lib.latest(model_dir) == os.path.join(checkpoints, "ckpt-8")
  reader = tf.train.load_checkpoint(os.path.join(checkpoints, "ckpt-6"))  # Written again by this run: whole.
  assert reader.get_tensor("step/.ATTRIBUTES/VARIABLE_VALUE") == 6


def _write_list(directory, names):
  """Writes `directory`'s checkpoint list as naming `names`, oldest first, the last as the newest."""
  with open(os.path.join(directory, "checkpoint"), "w", encoding="utf-8") as f:
    f.write(
        f'model_checkpoint_path: "{names[-1]}"\n' + "".join(f'all_model_checkpoint_paths: "{name}"\n' for name in names)
    )


def test_a_copied_workdirs_list_naming_the_originals_checkpoints_never_touches_them(trained, tmp_path, caplog):
  original, original_checkpoints = _copy(trained, tmp_path / "original")
  model_dir, checkpoints = _copy(trained, tmp_path / "copy")
  _write_list(
      checkpoints,
      [
          os.path.join(original_checkpoints, "ckpt-2"),
          os.path.join(original_checkpoints, "ckpt-4"),
          os.path.join(checkpoints, "ckpt-4"),
          "ckpt-4",
          "ckpt-9",  # Its own, thrice; no files.
          os.path.join(original_checkpoints, "ckpt-6"),
      ],
  )
  untouched = process_testlib.files_of(original)
  assert checkpoints_lib.latest(model_dir) == os.path.join(checkpoints, "ckpt-6")
  with caplog.at_level("WARNING", logger="absl"):
    resumed = _trainer(model_dir)
  assert resumed.global_step == 6
  for got, want in zip(resumed.model.get_weights(), trained[1]):
    np.testing.assert_array_equal(got, want)
  outside = ", ".join(os.path.join(original_checkpoints, name) for name in ("ckpt-2", "ckpt-4", "ckpt-6"))
  assert (
      f"The checkpoint list {os.path.join(checkpoints, 'checkpoint')} names checkpoints outside its directory: "
      f"{outside} (left out: they are neither restored from nor deleted), and names ckpt-4 more than once, and "
      "names checkpoints that have no files: ckpt-9, and does not name ckpt-2, ckpt-6; rebuilt it from the "
      "checkpoint files: ckpt-2, ckpt-4, ckpt-6 (newest last). It is rewritten at the next save."
  ) in caplog.text

  resumed.train(trainer_testlib.classification_data(64), global_batch_size=GLOBAL_BATCH, steps=12)
  assert _names(_checkpoint_files(checkpoints)) == ["ckpt-8", "ckpt-10", "ckpt-12"]  # max_to_keep=3, its own only.
  with open(os.path.join(checkpoints, "checkpoint"), encoding="utf-8") as f:
    assert re.findall(r'^all_model_checkpoint_paths: "(.*)"$', f.read(), re.M) == ["ckpt-8", "ckpt-10", "ckpt-12"]
  assert process_testlib.files_of(original) == untouched  # Byte for byte.


def test_a_list_naming_only_another_directorys_checkpoints_is_an_error_touching_nothing(trained, tmp_path):
  original, original_checkpoints = _copy(trained, tmp_path / "original")
  model_dir, checkpoints = _copy(trained, tmp_path / "copy")
  for path in glob.glob(os.path.join(checkpoints, "ckpt-*")):
    os.remove(path)
  _write_list(checkpoints, [os.path.join(original_checkpoints, "ckpt-6")])
  before = {directory: process_testlib.files_of(directory) for directory in (original, model_dir)}
  with pytest.raises(
      strategies.ConfigError,
      match=(
          rf"^The checkpoint list {re.escape(os.path.join(checkpoints, 'checkpoint'))} names only checkpoints outside "
          rf"its directory: {re.escape(os.path.join(original_checkpoints, 'ckpt-6'))}\. A run restores from and rotates "
          rf"only the checkpoints in {re.escape(checkpoints)}: copy them there to resume from them, or remove the list to "
          r"train from scratch\.$"
      ),
  ):
    _trainer(model_dir)
  assert {directory: process_testlib.files_of(directory) for directory in (original, model_dir)} == before


def test_runner_run_resumes_over_a_garbled_checkpoint_list(tmp_path):
  config = {
      "mode": "train",
      "strategy": {"name": "one_device"},
      "data": {"name": "synthetic", "global_batch_size": 32, "num_examples": 256},
      "model": {"hidden_units": (16,)},
      "trainer": {"train_steps": 40, "steps_per_loop": 20, "checkpoint_every": 20},
  }
  workdir = str(tmp_path / "work")
  runner.run(config, workdir)
  with open(os.path.join(workdir, "checkpoints", "checkpoint"), "wb") as f:
    f.write(b"\xff\xfe garbled \x00")
  resumed = runner.run({**config, "trainer": {**config["trainer"], "train_steps": 60}}, workdir)
  assert resumed.global_step == 60 and resumed.checkpoint_path.endswith("ckpt-60")
  assert [entry["step"] for entry in process_testlib.config_history(workdir)] == [0, 40]


class _CrashAtStep(runner.actions.Action):
  """Raises after the reports (and evaluation) of step `step`, before its checkpoint: a crash past the last one."""

  def __init__(self, step):
    self.step = step

  def __call__(self, loop):
    if loop.step == self.step:
      raise RuntimeError(f"crashed at step {loop.step}")


def test_rows_of_steps_past_the_restored_one_are_dropped_so_each_step_has_one_row(tmp_path, caplog):
  model_dir = str(tmp_path / "run")
  data, eval_data = trainer_testlib.classification_data(64), trainer_testlib.classification_data(16, seed=1)
  train = dict(global_batch_size=GLOBAL_BATCH, steps=6, eval_data=eval_data, eval_every=1)
  crashed = _trainer(model_dir, actions=[_CrashAtStep(5)])
  with pytest.raises(RuntimeError, match="crashed at step 5"):
    crashed.train(data, **train)
  before = process_testlib.metrics_rows(model_dir)
  assert [(row["split"], row["step"]) for row in before] == [
      (split, step) for step in range(1, 6) for split in ("train", "eval")
  ]
  with caplog.at_level("INFO", logger="absl"):
    resumed = _trainer(model_dir)
    assert resumed.global_step == 4
    resumed.train(data, **train)
  after = process_testlib.metrics_rows(model_dir)
  assert [(row["split"], row["step"]) for row in after] == [
      (split, step) for step in range(1, 7) for split in ("train", "eval")
  ]
  assert after[:8] == before[:8]  # The rows up to the restored step stay as they were.
  assert re.search(
      r"Dropped 2 row\(s\) of .*metrics\.jsonl past step 4, written by a run that stopped before its "
      r"next checkpoint",
      caplog.text,
  )
  assert not [name for name in os.listdir(model_dir) if ".tmp" in name]
