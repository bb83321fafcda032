"""Exact resume: a run stopped at any step and restarted trains on the batches of an uninterrupted run.

Here the restart is a new Trainer on the same model_dir in this process; the
real signals and processes are in test_fault_tolerance.py.
"""

import os

import numpy as np
import pytest
import tensorflow as tf

import runner
from runner.outputs import metrics_file
import strategies
from testlib import trainer_testlib

GLOBAL_BATCH = 8
TOTAL_STEPS = 20  # 2.5 epochs of 64 examples: a resume crosses an epoch boundary.
STEPS_PER_LOOP = 3


def _write_records(directory, num_files=3):
  features, labels = trainer_testlib.classification_arrays(64)
  for index in range(num_files):
    with tf.io.TFRecordWriter(os.path.join(directory, f"part-{index}.tfrecord")) as writer:
      for example in range(index, 64, num_files):
        writer.write(
            tf.train.Example(
                features=tf.train.Features(
                    feature={
                        "x": tf.train.Feature(float_list=tf.train.FloatList(value=features[example])),
                        "y": tf.train.Feature(int64_list=tf.train.Int64List(value=[labels[example]])),
                    }
                )
            ).SerializeToString()
        )


def _data(kind, tmp_path):
  features, labels = trainer_testlib.classification_arrays(64)
  if kind == "in_memory":
    return runner.data.InMemory(features, labels)
  if kind == "in_memory_shuffled":
    return runner.data.InMemory(features, labels, shuffle=True, seed=3)
  if kind == "function_shuffled":
    return runner.data.FromFunction(
        lambda context: tf.data.Dataset.from_tensor_slices((features, labels))
        .shard(context.num_input_pipelines, context.input_pipeline_id)
        .shuffle(64, seed=5)
    )
  records = tmp_path / "records"
  records.mkdir(exist_ok=True)
  _write_records(str(records))
  shuffle = 16 if kind == "tfrecord_shuffled" else 0
  return runner.data.TFRecordFiles(
      str(records / "*.tfrecord"), trainer_testlib.parse_classification_record, shuffle_buffer_size=shuffle, seed=7
  )


def _train(strategy, model_dir, data, steps):
  trainer = trainer_testlib.make_trainer(strategy, model_dir=model_dir, steps_per_loop=STEPS_PER_LOOP)
  trainer.train(data, global_batch_size=GLOBAL_BATCH, steps=steps)
  return trainer


@pytest.mark.parametrize(
    "kind", ["in_memory", "in_memory_shuffled", "function_shuffled", "tfrecord", "tfrecord_shuffled"]
)
def test_a_resumed_run_ends_with_the_weights_of_an_uninterrupted_one(kind, tmp_path):
  one_device = tf.distribute.OneDeviceStrategy("/cpu:0")
  data = _data(kind, tmp_path)
  uninterrupted = _train(one_device, str(tmp_path / "whole"), data, TOTAL_STEPS).model.get_weights()
  for stop in (7, 16):  # Mid-loop and mid-epoch, twice.
    _train(one_device, str(tmp_path / "resumed"), data, stop)
  resumed = _train(one_device, str(tmp_path / "resumed"), data, TOTAL_STEPS)
  assert resumed.global_step == TOTAL_STEPS
  for got, want in zip(resumed.model.get_weights(), uninterrupted):
    np.testing.assert_array_equal(got, want)


def test_resuming_from_the_start_of_a_run_is_not_the_same_as_resuming_exactly(tmp_path):
  """The check above can fail: the same stop without skipping the trained batches gives other weights."""
  one_device = tf.distribute.OneDeviceStrategy("/cpu:0")
  data = _data("in_memory_shuffled", tmp_path)
  uninterrupted = _train(one_device, str(tmp_path / "whole"), data, TOTAL_STEPS).model.get_weights()
  first = _train(one_device, str(tmp_path / "restarted"), data, 7)
  replayed = trainer_testlib.make_trainer(one_device, steps_per_loop=STEPS_PER_LOOP)
  replayed.model.set_weights(first.model.get_weights())
  optimizer = replayed._parts.optimizer  # noqa: SLF001
  for variable, value in zip(optimizer.variables, trainer_testlib.optimizer_variables(first)):
    variable.assign(value)
  replayed.train(data, global_batch_size=GLOBAL_BATCH, steps=TOTAL_STEPS - 7)  # The data from its beginning.
  differences = [np.max(np.abs(got - want)) for got, want in zip(replayed.model.get_weights(), uninterrupted)]
  assert max(differences) > 1e-3


def test_a_resumed_mirrored_run_matches_within_float_tolerance(tmp_path, cpu_devices):
  data = _data("in_memory_shuffled", tmp_path)
  uninterrupted = _train(
      strategies.MirroredStrategy(cpu_devices(2)), str(tmp_path / "whole"), data, TOTAL_STEPS
  ).model.get_weights()
  _train(strategies.MirroredStrategy(cpu_devices(2)), str(tmp_path / "resumed"), data, 7)
  resumed = _train(strategies.MirroredStrategy(cpu_devices(2)), str(tmp_path / "resumed"), data, TOTAL_STEPS)
  for got, want in zip(resumed.model.get_weights(), uninterrupted):
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


def _open_files_under(directory):
  """The files under `directory` this process holds open."""
  paths = (os.path.realpath(os.path.join("/proc/self/fd", fd)) for fd in os.listdir("/proc/self/fd"))
  return sorted(path for path in paths if path.startswith(os.path.realpath(directory)))


def test_close_releases_the_input_and_the_files_and_training_goes_on_as_if_uninterrupted(tmp_path):
  one_device = tf.distribute.OneDeviceStrategy("/cpu:0")
  data = _data("in_memory_shuffled", tmp_path)
  uninterrupted = _train(one_device, str(tmp_path / "whole"), data, TOTAL_STEPS).model.get_weights()
  trainer = _train(one_device, str(tmp_path / "closed"), data, 7)
  open_before = [os.path.basename(path) for path in _open_files_under(tmp_path / "closed")]
  assert "metrics.jsonl" in open_before and any(name.startswith("events.out.tfevents") for name in open_before)
  iterator = trainer._train_input[2]  # noqa: SLF001
  trainer.close()
  assert _open_files_under(tmp_path / "closed") == []  # metrics.jsonl and the event files.
  assert trainer._train_input is None  # noqa: SLF001
  trainer.train(data, global_batch_size=GLOBAL_BATCH, steps=TOTAL_STEPS)  # A new input, from step 7.
  assert trainer._train_input[2] is not iterator  # noqa: SLF001
  for got, want in zip(trainer.model.get_weights(), uninterrupted):
    np.testing.assert_array_equal(got, want)
  rows = [row["step"] for row in metrics_file.rows(str(tmp_path / "closed")) if row["split"] == "train"]
  assert rows == [3, 6, 7, 10, 13, 16, 19, 20]
