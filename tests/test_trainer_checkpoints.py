"""Checkpoints: written where and when asked, restored across replica counts, resumed runs."""

import os

import keras
import numpy as np
import tensorflow as tf

import strategies
import trainer_testlib

GLOBAL_BATCH = 8


def _checkpoint_names(model_dir):
  state = tf.train.get_checkpoint_state(os.path.join(model_dir, "checkpoints"))
  return [os.path.basename(path) for path in state.all_model_checkpoint_paths]


def test_a_mirrored_2_checkpoint_restores_weights_and_slots_on_one_device_and_mirrored_4(tmp_path, cpu_devices):
  model_dir = str(tmp_path)
  adam = lambda: keras.optimizers.Adam(0.01)  # pylint: disable=unnecessary-lambda-assignment
  writer = trainer_testlib.make_trainer(strategies.MirroredStrategy(cpu_devices(2)), optimizer_fn=adam,
                                        model_dir=model_dir)
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

  writer = trainer_testlib.make_trainer(tf.distribute.OneDeviceStrategy("/cpu:0"), model_fn=lazy,
                                        model_dir=str(tmp_path))
  writer.train(trainer_testlib.classification_data(64), global_batch_size=GLOBAL_BATCH, steps=2)
  reader = trainer_testlib.make_trainer(tf.distribute.OneDeviceStrategy("/cpu:0"), model_fn=lazy,
                                        model_dir=str(tmp_path), seed=5)
  assert reader.global_step == 0  # Not built yet, so not restored yet.
  data = trainer_testlib.classification_data(40)
  assert reader.evaluate(data, global_batch_size=8) == writer.evaluate(data, global_batch_size=8)
  assert reader.global_step == 2


def test_checkpoint_every_max_to_keep_and_always_at_the_end(tmp_path):
  trainer = trainer_testlib.make_trainer(tf.distribute.OneDeviceStrategy("/cpu:0"), model_dir=str(tmp_path),
                                         steps_per_loop=4, checkpoint_every=2, max_to_keep=2)
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
