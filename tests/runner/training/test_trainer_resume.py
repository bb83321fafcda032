"""Resuming in one process: a new Trainer on the same model_dir, or a closed Trainer training on.

The bit-identical resume of every kind of data is in tests/runner/data/test_resume_at_any_position.py; the real
signals and processes are in test_fault_tolerance.py.
"""

import os

import numpy as np
import tensorflow as tf

import runner
from runner.outputs import metrics_file
import strategies
from testlib import trainer_testlib

GLOBAL_BATCH = 8
TOTAL_STEPS = 20  # 2.5 epochs of 64 examples: a resume crosses an epoch boundary.
STEPS_PER_LOOP = 3


def _shuffled_data():
  return runner.data.InMemory(*trainer_testlib.classification_arrays(64), shuffle=True, seed=3)


def _train(strategy, model_dir, data, steps):
  trainer = trainer_testlib.make_trainer(strategy, model_dir=model_dir, steps_per_loop=STEPS_PER_LOOP)
  trainer.train(data, global_batch_size=GLOBAL_BATCH, steps=steps)
  return trainer


def test_resuming_from_the_start_of_a_run_is_not_the_same_as_resuming_exactly(tmp_path):
  """The bit-identical resumes (here and in tests/runner/data/test_resume_at_any_position.py) can fail.

  The same stop without skipping the trained batches gives other weights.
  """
  one_device = tf.distribute.OneDeviceStrategy("/cpu:0")
  data = _shuffled_data()
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
  data = _shuffled_data()
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
  data = _shuffled_data()
  uninterrupted = _train(one_device, str(tmp_path / "whole"), data, TOTAL_STEPS).model.get_weights()
  trainer = _train(one_device, str(tmp_path / "closed"), data, 7)
  open_before = [os.path.basename(path) for path in _open_files_under(tmp_path / "closed")]
  assert "metrics.jsonl" in open_before and any(name.startswith("events.out.tfevents") for name in open_before)
  iterator = trainer._input.current[2]  # noqa: SLF001
  trainer.close()
  assert _open_files_under(tmp_path / "closed") == []  # metrics.jsonl and the event files.
  assert trainer._input.current is None  # noqa: SLF001
  trainer.train(data, global_batch_size=GLOBAL_BATCH, steps=TOTAL_STEPS)  # A new input, from step 7.
  assert trainer._input.current[2] is not iterator  # noqa: SLF001
  for got, want in zip(trainer.model.get_weights(), uninterrupted):
    np.testing.assert_array_equal(got, want)
  rows = [row["step"] for row in metrics_file.rows(str(tmp_path / "closed")) if row["split"] == "train"]
  assert rows == [3, 6, 7, 10, 13, 16, 19, 20]
