"""Checkpoints: written where and when asked, restored across replica counts, resumed runs."""

import os
import re

import keras
import numpy as np
import pytest
import tensorflow as tf

from runner.outputs import checkpoints
import strategies
from testlib import trainer_testlib

GLOBAL_BATCH = 8


def _checkpoint_names(model_dir):
  state = tf.train.get_checkpoint_state(os.path.join(model_dir, "checkpoints"))
  return [os.path.basename(path) for path in state.all_model_checkpoint_paths]


def test_a_mirrored_2_checkpoint_restores_weights_and_slots_on_one_device_and_mirrored_4(tmp_path, cpu_devices):
  model_dir = str(tmp_path)
  adam = lambda: keras.optimizers.Adam(0.01)  # noqa: E731
  writer = trainer_testlib.make_trainer(
      strategies.MirroredStrategy(cpu_devices(2)), optimizer_fn=adam, model_dir=model_dir
  )
  writer.train(trainer_testlib.classification_data(64), global_batch_size=GLOBAL_BATCH, steps=3)
  weights, slots = writer.model.get_weights(), trainer_testlib.optimizer_variables(writer)
  assert any(np.any(slot != 0) for slot in slots)
  for strategy in (tf.distribute.OneDeviceStrategy("/cpu:0"), strategies.MirroredStrategy(cpu_devices(4))):
    reader = trainer_testlib.make_trainer(strategy, optimizer_fn=adam, model_dir=model_dir, seed=99)
    assert reader.global_step == 3
    for got, want in zip(reader.model.get_weights(), weights):
      np.testing.assert_array_equal(got, want)
    restored_slots = trainer_testlib.optimizer_variables(reader)
    assert len(restored_slots) == len(slots)
    for got, want in zip(restored_slots, slots):
      np.testing.assert_array_equal(got, want)


def test_a_lazily_built_model_is_restored_before_its_first_evaluate(tmp_path):
  def lazy():
    return keras.Sequential([keras.layers.Dense(trainer_testlib.NUM_CLASSES)])

  writer = trainer_testlib.make_trainer(
      tf.distribute.OneDeviceStrategy("/cpu:0"), model_fn=lazy, model_dir=str(tmp_path)
  )
  writer.train(trainer_testlib.classification_data(64), global_batch_size=GLOBAL_BATCH, steps=2)
  reader = trainer_testlib.make_trainer(
      tf.distribute.OneDeviceStrategy("/cpu:0"), model_fn=lazy, model_dir=str(tmp_path), seed=5
  )
  assert reader.global_step == 0  # Not built yet, so not restored yet.
  data = trainer_testlib.classification_data(40)
  assert reader.evaluate(data, global_batch_size=8) == writer.evaluate(data, global_batch_size=8)
  assert reader.global_step == 2


def test_checkpoint_every_max_to_keep_and_always_at_the_end(tmp_path):
  trainer = trainer_testlib.make_trainer(
      tf.distribute.OneDeviceStrategy("/cpu:0"),
      model_dir=str(tmp_path),
      steps_per_loop=4,
      checkpoint_every=2,
      max_to_keep=2,
  )
  trainer.train(trainer_testlib.classification_data(64), global_batch_size=GLOBAL_BATCH, steps=7)
  assert _checkpoint_names(tmp_path) == ["ckpt-6", "ckpt-7"]
  assert tf.train.latest_checkpoint(str(tmp_path / "checkpoints")).endswith("ckpt-7")


def test_a_resumed_run_ends_where_an_uninterrupted_one_does(tmp_path):
  # Every global batch is the same 8 examples, so restarting the data stream does not change the batches.
  data = trainer_testlib.classification_data(GLOBAL_BATCH)
  straight = trainer_testlib.make_trainer(tf.distribute.OneDeviceStrategy("/cpu:0"))
  straight.train(data, global_batch_size=GLOBAL_BATCH, steps=5)
  first = trainer_testlib.make_trainer(tf.distribute.OneDeviceStrategy("/cpu:0"), model_dir=str(tmp_path))
  first.train(data, global_batch_size=GLOBAL_BATCH, steps=2)
  second = trainer_testlib.make_trainer(tf.distribute.OneDeviceStrategy("/cpu:0"), model_dir=str(tmp_path), seed=7)
  second.train(data, global_batch_size=GLOBAL_BATCH, steps=5)
  assert second.global_step == 5
  for got, want in zip(second.model.get_weights(), straight.model.get_weights()):
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
  for got, want in zip(trainer_testlib.optimizer_variables(second), trainer_testlib.optimizer_variables(straight)):
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


def _truncate(checkpoint_prefix):
  data_file = tf.io.gfile.glob(checkpoint_prefix + ".data-*")[0]
  with open(data_file, "r+b") as f:
    f.truncate(os.path.getsize(data_file) // 2)


def test_an_unreadable_latest_checkpoint_is_skipped_for_the_previous_one(tmp_path, caplog):
  data = trainer_testlib.classification_data(64)
  one_device = tf.distribute.OneDeviceStrategy("/cpu:0")
  whole = trainer_testlib.make_trainer(one_device, model_dir=str(tmp_path / "whole"), checkpoint_every=2)
  whole.train(data, global_batch_size=GLOBAL_BATCH, steps=6)
  model_dir = str(tmp_path / "damaged")
  trainer_testlib.make_trainer(one_device, model_dir=model_dir, checkpoint_every=2).train(
      data, global_batch_size=GLOBAL_BATCH, steps=4
  )
  _truncate(os.path.join(model_dir, "checkpoints", "ckpt-4"))
  with caplog.at_level("WARNING", logger="absl"):
    resumed = trainer_testlib.make_trainer(one_device, model_dir=model_dir, checkpoint_every=2)
  assert resumed.global_step == 2
  assert re.search(
      r"Skipped the newest checkpoint\(s\) of .*checkpoints, which cannot be read: ckpt-4 "
      r"\(\w+Error: .*\)\. Resumed from ckpt-2 instead",
      caplog.text,
  )
  resumed.train(data, global_batch_size=GLOBAL_BATCH, steps=6)
  for got, want in zip(resumed.model.get_weights(), whole.model.get_weights()):
    np.testing.assert_array_equal(got, want)  # Resumed exactly from step 2.
  assert _checkpoint_names(model_dir)[-1] == "ckpt-6"


def test_no_readable_checkpoint_is_an_error_that_changes_no_weight(tmp_path):
  one_device = tf.distribute.OneDeviceStrategy("/cpu:0")
  model_dir = str(tmp_path)
  trainer_testlib.make_trainer(one_device, model_dir=model_dir, max_to_keep=1).train(
      trainer_testlib.classification_data(64), global_batch_size=GLOBAL_BATCH, steps=3
  )
  _truncate(os.path.join(model_dir, "checkpoints", "ckpt-3"))
  with pytest.raises(
      strategies.ConfigError,
      match=r"No checkpoint in .*checkpoints can be read: ckpt-3 \(\w+Error: "
      r".*\)\. Restore them from a copy, or move them away",
  ):
    trainer_testlib.make_trainer(one_device, model_dir=model_dir)
  fresh = trainer_testlib.make_trainer(one_device)
  before = fresh.model.get_weights()
  with pytest.raises(strategies.ConfigError, match=r"No checkpoint .* can be read"):
    _checkpoints(fresh, model_dir).restore_latest()
  for got, want in zip(fresh.model.get_weights(), before):
    np.testing.assert_array_equal(got, want)


def test_a_checkpoint_of_another_model_restores_nothing(tmp_path):
  one_device = tf.distribute.OneDeviceStrategy("/cpu:0")

  def two_layers(classes):
    return lambda: keras.Sequential(
        [keras.Input((trainer_testlib.NUM_FEATURES,)), keras.layers.Dense(16), keras.layers.Dense(classes)]
    )

  trainer_testlib.make_trainer(one_device, model_dir=str(tmp_path), model_fn=two_layers(4)).train(
      trainer_testlib.classification_data(64), global_batch_size=GLOBAL_BATCH, steps=2
  )
  other = trainer_testlib.make_trainer(one_device, model_fn=two_layers(3))  # Same first layer, another second.
  before = other.model.get_weights()
  with pytest.raises(strategies.ConfigError, match=r"The checkpoint .*ckpt-2 does not match this model"):
    _checkpoints(other, str(tmp_path)).restore_latest()
  for got, want in zip(other.model.get_weights(), before):
    np.testing.assert_array_equal(got, want)


def _checkpoints(trainer, model_dir):
  """A second Checkpoints over a trainer's variables, to restore without making another Trainer."""
  return checkpoints.Checkpoints(
      trainer.strategy,
      model_dir,
      model=trainer.model,
      optimizer=trainer._parts.optimizer,
      step=trainer._parts.step,  # noqa: SLF001
      max_to_keep=3,
  )
