"""The best checkpoint (`best_metric`: WORKDIR/best/) and the periodic exports (`export_every`: WORKDIR/exports/STEP/)."""

import json
import os
import shutil

import numpy as np
import pytest
import tensorflow as tf

import runner
from runner.config import run_config
from runner.outputs import best
from runner.outputs import metrics_file
import strategies
from strategies import ConfigError
from testlib import trainer_testlib

BATCH = 16
_FEATURES, _LABELS = trainer_testlib.classification_arrays(176)  # 128 to train on, 48 to evaluate.
EVAL_FEATURES, EVAL_LABELS = _FEATURES[128:], _LABELS[128:]
TRAIN_DATA = tf.data.Dataset.from_tensor_slices((_FEATURES[:128], _LABELS[:128]))
EVAL_DATA = tf.data.Dataset.from_tensor_slices((EVAL_FEATURES, EVAL_LABELS))
FEATURES = _FEATURES[:5]


def _train(trainer, steps, eval_data=EVAL_DATA, eval_every=2):
  trainer.train(TRAIN_DATA, global_batch_size=BATCH, steps=steps, eval_data=eval_data, eval_every=eval_every)
  return trainer


def _best_row(model_dir):
  """The eval row of metrics.jsonl with the highest accuracy (the earliest of equal ones)."""
  rows = [row for row in metrics_file.rows(str(model_dir)) if row["split"] == "eval"]
  return max(rows, key=lambda row: (row["accuracy"], -row["step"]))


def _best_json(model_dir):
  with open(os.path.join(model_dir, best.DIRECTORY, best.INFO_FILE), encoding="utf-8") as f:
    return json.load(f)


def _served(saved_model):
  (outputs,) = tf.saved_model.load(saved_model).signatures["serving_default"](tf.constant(FEATURES)).values()
  return outputs.numpy()


def _check_best_is_the_best_evaluation(model_dir):
  """best.json is the best eval row of metrics.jsonl; its checkpoint's weights score that row; its SavedModel serves them.

  Returns:
    That row.
  """
  row = _best_row(model_dir)
  assert _best_json(model_dir) == {"step": row["step"], "metric": "accuracy", "value": row["accuracy"]}
  model, step = trainer_testlib.model_fn(), tf.Variable(0, dtype=tf.int64)  # Restored as the Trainer's checkpoint.
  tf.train.Checkpoint(model=model, step=step).read(best.checkpoint_path(str(model_dir))).expect_partial()
  assert step.numpy() == row["step"]
  logits = model(EVAL_FEATURES).numpy()
  assert np.mean(np.argmax(logits, axis=1) == EVAL_LABELS) == pytest.approx(row["accuracy"])
  log_softmax = logits - np.log(np.sum(np.exp(logits), axis=1, keepdims=True))
  assert -np.mean(log_softmax[np.arange(len(EVAL_LABELS)), EVAL_LABELS]) == pytest.approx(row["loss"], rel=1e-5)
  np.testing.assert_allclose(_served(str(model_dir / "best" / "saved_model")), model(FEATURES), rtol=1e-5)
  return row


def test_best_and_exports_on_one_device_through_interrupted_swaps_and_a_resume(tmp_path, cpu_devices):
  strategy = tf.distribute.OneDeviceStrategy(cpu_devices(1)[0])
  options = dict(model_dir=str(tmp_path), best_metric="accuracy", quiet=True)
  trainer = _train(trainer_testlib.make_trainer(strategy, export_every=2, max_to_keep=1, **options), 2)
  assert _best_json(tmp_path)["step"] == 2
  # A crash while best.tmp/ was written (best/ whole), beside a best.old/ that a swap left, and an unfinished export.
  shutil.copytree(tmp_path / "best", tmp_path / "best.old")
  shutil.copytree(tmp_path / "best" / "saved_model", tmp_path / "best.tmp" / "saved_model")
  (tmp_path / "exports" / ".writing-3").mkdir()

  _train(trainer, 4)  # The next train call evaluates at 4 and finds a better one.
  assert sorted(os.listdir(tmp_path)) == ["best", "checkpoints", "exports", "metrics.jsonl", "summaries"]
  assert os.listdir(tmp_path / "exports") == ["4"]  # Every 2 steps, the newest max_to_keep=1; no unfinished one.
  np.testing.assert_allclose(_served(str(tmp_path / "exports" / "4")), trainer.model(FEATURES), rtol=1e-5)
  row = _check_best_is_the_best_evaluation(tmp_path)
  assert row["step"] == 4

  # A crash between the swap's two renames: no best/, the previous one whole in best.old/, a new one in best.tmp/.
  os.rename(tmp_path / "best", tmp_path / "best.old")
  shutil.copytree(tmp_path / "best.old" / "saved_model", tmp_path / "best.tmp" / "saved_model")
  assert best.checkpoint_path(str(tmp_path)) == str(tmp_path / "best.old" / "ckpt-4")
  # A resumed run whose evaluations (of labels shifted by one) are all worse keeps the best it reads from best.json,
  # back in best/.
  shifted = EVAL_DATA.map(lambda features, label: (features, (label + 1) % trainer_testlib.NUM_CLASSES))
  resumed = _train(trainer_testlib.make_trainer(strategy, **options), 6, eval_data=shifted)
  assert resumed.last_eval_metrics["accuracy"] < row["accuracy"]
  assert sorted(os.listdir(tmp_path)) == ["best", "checkpoints", "exports", "metrics.jsonl", "summaries"]
  assert _check_best_is_the_best_evaluation(tmp_path) == row


def test_best_on_two_mirrored_replicas(tmp_path, cpu_devices):
  strategy = strategies.MirroredStrategy(cpu_devices(2))
  trainer = trainer_testlib.make_trainer(strategy, model_dir=str(tmp_path), best_metric="accuracy", quiet=True)
  _train(trainer, 2, eval_every=None)  # The final evaluation alone, which follows the actions of the last loop.
  assert _check_best_is_the_best_evaluation(tmp_path)["step"] == 2
  fresh = trainer_testlib.make_trainer(strategy, model_dir=str(tmp_path), seed=1)  # As mode 'predict' restores it.
  assert fresh.restore(checkpoint=best.checkpoint_path(str(tmp_path))) == 2
  np.testing.assert_allclose(fresh.model(FEATURES), trainer.model(FEATURES), rtol=1e-6)


def test_bad_best_metric_best_mode_and_export_every(tmp_path):
  cpu = tf.distribute.OneDeviceStrategy("/cpu:0")
  for options, message in (
      ({"best_metric": "acuracy"}, r"best_metric='acuracy' is not .* Did you mean 'accuracy'\? .*: loss, accuracy\.$"),
      ({"best_metric": "loss", "best_mode": "lowest"}, r"best_mode='lowest' is not valid\..* Valid: max, min\.$"),
      ({"best_mode": "max"}, r"best_mode='max' needs a best_metric"),
      ({"export_every": 0}, r"export_every must be a positive int, got 0\."),
  ):
    with pytest.raises(ConfigError, match=message):
      trainer_testlib.make_trainer(cpu, model_dir=str(tmp_path), **options)
  for option in ({"best_metric": "loss"}, {"export_every": 2}):
    with pytest.raises(ConfigError, match=r"=(loss|2) needs a model_dir to write the (best checkpoint|exports) to"):
      trainer_testlib.make_trainer(cpu, **option)

  quick = {"trainer": {"train_steps": 4, "steps_per_loop": 2}, "data": {"num_examples": 64, "num_eval_examples": 16}}
  with pytest.raises(ConfigError, match=r"best_metric='acc' is not .* reports: loss, accuracy\.$"):
    runner.run({**quick, "trainer": {**quick["trainer"], "best_metric": "acc"}}, str(tmp_path / "new"), quiet=True)
  assert not (tmp_path / "new").exists()  # It failed before training: the workdir it made is gone.
  for trainer, message in (
      ({"best_metric": "loss", "best_mode": "lowest"}, r"config.trainer.best_mode='lowest' is not valid.* max, min"),
      ({"export_every": 3}, r"config.trainer.export_every=3 is not a multiple of .*steps_per_loop=2.* such as 4"),
  ):
    with pytest.raises(ConfigError, match=message):
      run_config.validate({"trainer": {**quick["trainer"], **trainer}})
  with pytest.raises(ConfigError, match=r"best_metric='loss' keeps the best .* mode 'train' does not evaluate"):
    run_config.validate({"mode": "train", "trainer": {"best_metric": "loss"}})
