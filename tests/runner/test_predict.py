"""Mode 'predict': every example of the split once, with the model's outputs, from the latest or the best checkpoint."""

import glob
import json
import os
import shutil

import numpy as np
import pytest
import tensorflow as tf

import runner
from runner import from_config
from runner import models
from runner.data import builtin_datasets
from runner.data import providers as data_lib
from runner.training import predict
from strategies import ConfigError
from testlib import process_testlib

NUM_TRAIN, NUM_EVAL, BATCH = 63, 37, 8  # Neither count divides by the batch of 8 or by 2 replicas.


def _config(mode, **sections):
  config = {
      "mode": mode,
      "strategy": {"name": "one_device"},
      "data": {
          "name": "synthetic",
          "global_batch_size": BATCH,
          "num_examples": NUM_TRAIN,
          "num_eval_examples": NUM_EVAL,
      },
      "model": {"hidden_units": (8,)},
      "trainer": {"train_steps": 2, "steps_per_loop": 2},
  }
  for section, fields in sections.items():
    config[section] = {**config.get(section, {}), **fields}
  return config


def _outputs_by_split(model):
  """{split: `model`'s outputs for the split's examples in their array order}."""
  config = runner.config.validate(_config("train"))
  return {
      split: model(builtin_datasets.synthetic(config.data, split).elements[0]).numpy() for split in ("train", "eval")
  }


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
  """A workdir trained 4 steps on one device whose `best/` holds the checkpoint of step 2; the outputs at 2 and 4.

  The outputs at 4 are those of the training run's model; those at 2 of a new model with ckpt-2 restored.
  """
  workdir = str(tmp_path_factory.mktemp("predict") / "work")
  trained = runner.run(_config("train", trainer={"train_steps": 4, "checkpoint_every": 2}), workdir, quiet=True)
  at_2 = models.mlp(trained.config.model)
  at_2.build((None, trained.config.data.num_features))
  tf.train.Checkpoint(model=at_2).read(os.path.join(workdir, "checkpoints", "ckpt-2")).assert_existing_objects_matched()
  os.mkdir(os.path.join(workdir, "best"))
  for path in glob.glob(os.path.join(workdir, "checkpoints", "ckpt-2.*")):
    shutil.copy(path, os.path.join(workdir, "best"))
  with open(os.path.join(workdir, "best", "best.json"), "w") as f:  # As runner.outputs.best writes it.
    json.dump({"step": 2, "metric": "accuracy", "value": 0.5}, f)
  return workdir, {2: _outputs_by_split(at_2), 4: _outputs_by_split(trained.model)}


def _predictions(path):
  """{index: outputs} of the files in `path`, read back with tf.data; asserts that no index is there twice."""
  files = sorted(glob.glob(os.path.join(path, "*.tfrecord")))
  spec = {"index": tf.io.FixedLenFeature([], tf.int64), "outputs": tf.io.FixedLenFeature([10], tf.float32)}
  rows = list(tf.data.TFRecordDataset(files).map(lambda record: tf.io.parse_single_example(record, spec)))
  by_index = {int(row["index"]): row["outputs"].numpy() for row in rows}
  assert len(by_index) == len(rows)
  return by_index


def _assert_predicted(result, expected):
  by_index = _predictions(result.predictions_path)
  assert sorted(by_index) == list(range(len(expected)))
  np.testing.assert_allclose(np.stack([by_index[i] for i in range(len(expected))]), expected, rtol=1e-5, atol=1e-6)


def test_one_device_predicts_the_eval_split_from_the_latest_checkpoint_and_changes_nothing_else(workdir):
  workdir, outputs = workdir
  before = process_testlib.listing(workdir, skip=predict.DIRECTORY)
  result = runner.run(_config("predict", data={"eval_global_batch_size": BATCH}), workdir, quiet=True)
  assert result.predictions_path == os.path.join(workdir, "predictions")
  assert result.global_step == 4 and result.checkpoint_path == os.path.join(workdir, "checkpoints", "ckpt-4")
  assert result.eval_metrics is None and result.train_metrics is None
  assert os.listdir(result.predictions_path) == ["part-00000.tfrecord"]
  _assert_predicted(result, outputs[4]["eval"])
  assert process_testlib.listing(workdir, skip=predict.DIRECTORY) == before
  assert sorted(os.listdir(workdir)) == [
      "best",
      "checkpoints",
      "config.json",
      "config_history.jsonl",
      "metrics.jsonl",
      "predictions",
      "summaries",
  ]


def test_two_mirrored_replicas_predict_the_train_split_in_its_order_and_replace_the_predictions_whole(
    workdir, cpu_devices, monkeypatch
):
  workdir, outputs = workdir
  os.makedirs(os.path.join(workdir, "predictions"), exist_ok=True)
  with open(os.path.join(workdir, "predictions", "part-00099.tfrecord"), "w") as f:
    f.write("an earlier run's file")
  monkeypatch.setattr(predict, "EXAMPLES_PER_FILE", 10)
  config = _config(
      "predict",
      strategy={"name": "mirrored", "devices": tuple(cpu_devices(2))},
      data={"eval_global_batch_size": BATCH, "predict_split": "train"},
  )
  result = runner.run(config, workdir, quiet=True)
  assert result.num_replicas == 2
  assert sorted(os.listdir(result.predictions_path)) == [f"part-{i:05d}.tfrecord" for i in range(7)]  # 63 by 10
  _assert_predicted(result, outputs[4]["train"])  # The shuffled train split, by array row.


def test_checkpoint_best_predicts_with_the_checkpoint_in_best(workdir):
  workdir, outputs = workdir
  result = runner.run(_config("predict", predict={"checkpoint": "best"}), workdir, quiet=True)
  assert result.global_step == 2 and result.checkpoint_path == os.path.join(workdir, "best", "ckpt-2")
  _assert_predicted(result, outputs[2]["eval"])
  assert not np.allclose(outputs[2]["eval"], outputs[4]["eval"])
  assert from_config.step_plan(result.config, result.strategy, 4) == (  # What --dry_run prints.
      "mode predict: restore the checkpoint in WORKDIR/best, write the outputs over split 'eval' to WORKDIR/predictions"
  )


def test_bad_input_is_one_config_error_and_changes_nothing(workdir, tmp_path):
  workdir, _ = workdir
  with pytest.raises(
      ConfigError, match=r"^config.data.predict_split='evl' is not valid. Did you mean 'eval'\? Valid: train, eval.$"
  ):
    runner.run(_config("predict", data={"predict_split": "evl"}), workdir)
  with pytest.raises(
      ConfigError,
      match=r"^Mode 'predict' needs a checkpoint in .*/empty/checkpoints, and there is none; train first",
  ):
    runner.run(_config("predict"), str(tmp_path / "empty"))
  assert not (tmp_path / "empty").exists()
  (tmp_path / "trained" / "checkpoints").mkdir(parents=True)
  for path in glob.glob(os.path.join(workdir, "checkpoints", "*")):
    shutil.copy(path, tmp_path / "trained" / "checkpoints")
  before = process_testlib.listing(tmp_path / "trained", skip=predict.DIRECTORY)
  with pytest.raises(
      ConfigError,
      match=r"^config.predict.checkpoint='best' needs the best checkpoint in .*/trained/best, and there is none; ",
  ):
    runner.run(_config("predict", predict={"checkpoint": "best"}), str(tmp_path / "trained"))
  assert process_testlib.listing(tmp_path / "trained", skip=predict.DIRECTORY) == before and sorted(
      os.listdir(tmp_path / "trained")
  ) == ["checkpoints"]
  with pytest.raises(ConfigError, match=r"^config.predict.checkpoint='last' is not valid. Did you mean 'latest'\?"):
    runner.config.validate(_config("predict", predict={"checkpoint": "last"}))
  with pytest.raises(ConfigError, match=r"^Mode 'predict' runs the model of a training run's checkpoint: give"):
    runner.run(_config("predict"))


def test_infinite_data_is_a_config_error(tmp_path):
  data = data_lib.DatasetShards(tf.data.Dataset.from_tensors((tf.zeros([16]), 0)).repeat())
  with pytest.raises(ConfigError, match=r"^The prediction data is infinite \(it repeats\), so predicting all of it"):
    predict.write(tf.distribute.get_strategy(), None, data, BATCH, str(tmp_path / "predictions"))
  assert os.listdir(tmp_path) == []
