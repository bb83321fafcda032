"""Data mistakes are one DataError line naming what was found and what was expected (runner.data.checks).

The command line turns each into one `error:` line with exit status 2 (the
cases in test_cli.py); here the messages themselves, in one process, as for
a model, dataset or task function that does not fit (one of them also
through the command line).
"""

import os
import re
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf

import runner
from runner import models as builtin_models
from runner.config import run_config as config_lib
from runner.data.providers import DataError
import strategies
from testlib import paths
from testlib import process_testlib
from testlib import trainer_testlib

NUM_FEATURES, NUM_CLASSES = trainer_testlib.NUM_FEATURES, trainer_testlib.NUM_CLASSES
SYNTHETIC = os.path.join(paths.REPO, "configs", "synthetic.py")
RECORDS = "testlib.trainer_testlib:classification_records"  # config.data.files (and eval_files): TFRecord files.


@pytest.fixture(name="one_device")
def fixture_one_device():
  return tf.distribute.OneDeviceStrategy("/cpu:0")


def _lazy_model():
  """A model that builds from its first batch (no keras.Input)."""
  return keras.Sequential([keras.layers.Flatten(), keras.layers.Dense(NUM_CLASSES)])


def _dataset(features, labels):
  return tf.data.Dataset.from_tensor_slices((features, labels))


def test_features_of_another_shape_than_the_models_input_are_named_with_both(one_device):
  features = np.zeros((32, 5), np.float32)
  with pytest.raises(DataError) as raised:
    trainer_testlib.make_trainer(one_device).train(
        _dataset(features, np.zeros(32, np.int32)), global_batch_size=8, steps=1
    )
  assert str(raised.value) == (
      "The training data's features have shape (5,) per example (element spec (TensorSpec(shape=(5,), "
      "dtype=tf.float32, name=None), TensorSpec(shape=(), dtype=tf.int32, name=None))), but the model's input "
      "takes (8,)."
  )


def test_dict_features_for_the_builtin_mlp_are_named_with_their_keys(one_device):
  model_config = config_lib.default_config().model
  features = {"words": np.zeros((32, 3), np.float32), "age": np.zeros((32, 1), np.float32)}
  trainer = trainer_testlib.make_trainer(one_device, model_fn=lambda: builtin_models.mlp(model_config))
  with pytest.raises(DataError) as raised:
    trainer.train(_dataset(features, np.zeros(32, np.int32)), global_batch_size=8, steps=1)
  assert str(raised.value) == (
      "The training data's features are a dict with the keys 'age', 'words' ({'words': TensorSpec(shape=(3,), "
      "dtype=tf.float32, name=None), 'age': TensorSpec(shape=(1,), dtype=tf.float32, name=None)} per example), but "
      "the model 'mlp' is a keras.Sequential, which takes one tensor: combine the parts in the dataset (tf.concat "
      "after flattening each), or use a functional keras.Model with one keras.Input per part (as an import path in "
      "config.model.name)."
  )


class _Concatenated(keras.layers.Layer):
  """A first layer that takes a dict of features."""

  def call(self, features):
    return keras.ops.concatenate([features["a"], features["b"]], axis=-1)


def test_a_sequential_model_whose_own_first_layer_takes_a_dict_trains_on_dict_features(one_device):
  def model_fn():
    return keras.Sequential([_Concatenated(), keras.layers.Dense(NUM_CLASSES)])

  trainer = trainer_testlib.make_trainer(one_device, model_fn=model_fn)
  features = {"a": np.zeros((32, 3), np.float32), "b": np.ones((32, 2), np.float32)}
  trainer.train(_dataset(features, np.zeros(32, np.int32)), global_batch_size=8, steps=1)
  assert trainer.global_step == 1


def test_a_batched_dataset_is_named_for_a_model_with_an_input_and_for_one_that_builds_lazily(one_device):
  features, labels = trainer_testlib.classification_arrays(32)
  batched = _dataset(features, labels).batch(8)
  message = (
      r"^The training data looks batched: every part of its elements has a first dimension of unknown size "
      r"\(element spec \(TensorSpec\(shape=\(None, 8\).*\)\)\)\. The Trainer batches the data itself; return an "
      r"unbatched dataset of one example per element \(drop the \.batch\(\.\.\.\)\)\.$"
  )
  for model_fn in (trainer_testlib.model_fn, _lazy_model):
    with pytest.raises(DataError, match=message):
      trainer_testlib.make_trainer(one_device, model_fn=model_fn).train(batched, global_batch_size=8, steps=1)
  with pytest.raises(
      DataError,
      match=r"^The training data's features have shape \(8, 8\) per example, one "
      r"dimension more than the model's input \(8,\): the dataset looks batched\.",
  ):
    trainer_testlib.make_trainer(one_device).train(
        _dataset(features, labels).batch(8, drop_remainder=True).map(lambda x, y: (x, y[0])),
        global_batch_size=8,
        steps=1,
    )


def test_ragged_and_variable_length_features_are_named(one_device):
  labels = np.zeros(6, np.int32)
  ragged = _dataset(tf.ragged.constant([[1.0] * (i + 1) for i in range(6)]), labels)
  with pytest.raises(
      DataError,
      match=r"^The training data's features are ragged \(RaggedTensorSpec\(TensorShape"
      r"\(\[None\]\), tf\.float32, 0, tf\.int64\)\), but the Trainer batches dense "
      r"tensors of one shape for a model that builds from its first batch\. Pad or cut them to a fixed length",
  ):
    trainer_testlib.make_trainer(one_device, model_fn=_lazy_model).train(ragged, global_batch_size=2, steps=1)
  varying = tf.data.Dataset.from_generator(
      lambda: ((np.ones(i + 1, np.float32), 0) for i in range(6)),
      output_signature=(tf.TensorSpec([None], tf.float32), tf.TensorSpec([], tf.int32)),
  )
  with pytest.raises(
      DataError,
      match=r"^The training data's features have shape \(None,\) per example, of varying "
      r"length, and the model builds from its first batch, so it needs one fixed "
      r"shape\.",
  ):
    trainer_testlib.make_trainer(one_device, model_fn=_lazy_model).train(varying, global_batch_size=2, steps=1)
  with pytest.raises(
      DataError,
      match=r"^The training data's features have shape \(None,\) per example, of varying "
      r"length, but the model's input takes the fixed shape \(8,\)\.",
  ):
    trainer_testlib.make_trainer(one_device).train(varying, global_batch_size=2, steps=1)
  named = _dataset({"title": tf.ragged.constant([["a"], ["b", "c"]])}, np.zeros(2, np.int32))
  with pytest.raises(DataError, match=r"^The training data's features\['title'\] are ragged"):
    trainer_testlib.make_trainer(one_device, model_fn=_lazy_model).train(named, global_batch_size=2, steps=1)


def test_a_label_outside_the_classes_is_named_with_its_step_example_and_the_number_of_classes(cpu_devices):
  features, labels = trainer_testlib.classification_arrays(64)
  labels[37] = 2 * NUM_CLASSES + 1  # In the batch of step 3 (global batch 16).
  trainer = trainer_testlib.make_trainer(strategies.MirroredStrategy(cpu_devices(2)), steps_per_loop=4)
  with pytest.raises(DataError) as raised:
    trainer.train(_dataset(features, labels), global_batch_size=16, steps=4)
  assert str(raised.value) == (
      "The training data's batch of step 3 holds a label outside the task's range: example 37 of the data "
      "(counting from 0) has label 9, but labels must be integers in [0, 4) (class ids of a model with 4 outputs "
      "(classes))."
  )
  assert trainer.global_step == 0  # The loop ended in the error: no step of it is reported.


def test_a_label_outside_the_classes_is_named_at_its_step_with_one_step_per_call(one_device):
  # One step per call: the loss op fails on the label, and the step that failed is not counted (it was, once).
  features, labels = trainer_testlib.classification_arrays(64)
  labels[37] = 2 * NUM_CLASSES + 1  # In the batch of step 3 (global batch 16).
  trainer = trainer_testlib.make_trainer(one_device, steps_per_loop=1)
  with pytest.raises(DataError, match=r"^The training data's batch of step 3 holds a label outside the task's range"):
    trainer.train(_dataset(features, labels), global_batch_size=16, steps=4)
  assert trainer.global_step == 2


class _OneHotClassification(runner.tasks.Classification):
  """Cross-entropy through tf.one_hot, which gives a finite loss for any label, as on a GPU or a TPU."""

  def loss(self, labels, outputs):
    one_hot = tf.one_hot(tf.reshape(tf.cast(labels, tf.int32), [-1]), NUM_CLASSES)
    return tf.nn.softmax_cross_entropy_with_logits(one_hot, outputs)


def test_a_label_outside_the_classes_stops_the_step_where_the_loss_would_not_fail(one_device):
  features, labels = trainer_testlib.classification_arrays(64)
  labels[45] = -1  # In the batch of step 6 (global batch 8); the loss of a -1 label is finite here.
  trainer = trainer_testlib.make_trainer(one_device, task=_OneHotClassification(), steps_per_loop=4)
  with pytest.raises(
      DataError,
      match=r"^The training data's batch of step 6 holds a label outside the task's "
      r"range: example 45 of the data \(counting from 0\) has label -1, but labels "
      r"must be integers in \[0, 4\)",
  ):
    trainer.train(_dataset(features, labels), global_batch_size=8, steps=8)
  assert trainer.global_step == 6  # Steps 5 and 6 ran in the loop that stopped; 6 is named.


def test_float_labels_are_refused_for_classification_before_any_step(one_device):
  features, _ = trainer_testlib.classification_arrays(16)
  fractions = np.linspace(0.5, 0.95, 16).astype(np.float32)
  with pytest.raises(
      DataError,
      match=r"^The training data's labels are float32, but task Classification takes "
      r"class ids, integers in \[0, 4\)\. If they hold whole numbers, cast them in "
      r"the dataset \(tf\.cast\(labels, tf\.int32\)\); for targets in \[0, 1\) "
      r"use task 'regression'",
  ):
    trainer_testlib.make_trainer(one_device).train(_dataset(features, fractions), global_batch_size=8, steps=2)


def test_labels_the_task_cannot_score_are_named_before_any_step(one_device):
  features, labels = trainer_testlib.classification_arrays(16)
  one_hot = np.eye(NUM_CLASSES, dtype=np.float32)[labels]
  with pytest.raises(
      DataError,
      match=r"^The training data's labels are TensorSpec\(shape=\(4,\), dtype=tf\.float32, "
      r"name=None\) per example, but task Classification takes one class id per "
      r"example \(shape \(\) or \(1,\)\) for a model with 4 outputs\. They look "
      r"one-hot: give the class id instead \(tf\.argmax\(labels\) in the dataset\)\.$",
  ):
    trainer_testlib.make_trainer(one_device).train(_dataset(features, one_hot), global_batch_size=8, steps=1)
  with pytest.raises(
      DataError,
      match=r"^The training data's labels have shape \(3,\) per example, but task "
      r"Regression needs as many values as the model's outputs per example, \(4,\)\.",
  ):
    trainer_testlib.make_trainer(one_device, task=runner.tasks.Regression()).train(
        _dataset(features, features[:, :3]), global_batch_size=8, steps=1
    )


def test_evaluation_labels_are_checked_and_its_padding_is_not(one_device):
  trainer = trainer_testlib.make_trainer(one_device, task=_OneHotClassification())
  features, labels = trainer_testlib.classification_arrays(20)
  bad = labels.copy()
  bad[-1] = NUM_CLASSES
  with pytest.raises(
      DataError,
      match=r"^The evaluation data holds a label outside the task's range: example 19 of "
      r"the data \(counting from 0\) has label 4, but labels must be integers in "
      r"\[0, 4\)",
  ):
    trainer.evaluate(_dataset(features, bad), global_batch_size=8)

  class FromOne(_OneHotClassification):  # Valid labels 1..3: the padding's label 0 would fail if checked.

    def check_labels(self, labels_spec, outputs_spec):
      return runner.tasks.LabelRange(low=1, high=NUM_CLASSES, integer=True, meaning="1, 2 or 3")

  from_one = trainer_testlib.make_trainer(one_device, task=FromOne())
  results = from_one.evaluate(_dataset(features, 1 + labels % 3), global_batch_size=8)  # 20 = 2 batches + 4 + padding
  assert results["num_examples"] == 20
  with pytest.raises(
      DataError,
      match=r"example 0 of the data \(counting from 0\) has label 0, but labels must be "
      r"integers in \[1, 4\) \(1, 2 or 3\)",
  ):
    from_one.evaluate(_dataset(features, labels % 3), global_batch_size=8)


def _parse(record):
  parsed = tf.io.parse_single_example(
      record, {"x": tf.io.FixedLenFeature([NUM_FEATURES], tf.float32), "y": tf.io.FixedLenFeature([], tf.int64)}
  )
  return parsed["x"], parsed["y"]


def test_a_damaged_tfrecord_file_is_named_with_its_record(tmp_path, one_device):
  features, labels = trainer_testlib.classification_arrays(64)
  paths = [str(tmp_path / f"part-{i}.tfrecord") for i in range(2)]
  offsets = [
      trainer_testlib.write_classification_records(path, features[32 * i : 32 * (i + 1)], labels[32 * i : 32 * (i + 1)])
      for i, path in enumerate(paths)
  ]
  with open(paths[1], "rb") as f:
    damaged = bytearray(f.read())
  damaged[offsets[1][20] + 40] ^= 0xFF  # Inside the data of record 20 of the second file.
  with open(paths[1], "wb") as f:
    f.write(bytes(damaged))
  data = runner.data.TFRecordFiles(str(tmp_path / "part-*.tfrecord"), _parse)
  trainer = trainer_testlib.make_trainer(one_device, steps_per_loop=10)
  with pytest.raises(DataError) as raised:
    trainer.train(data, global_batch_size=8, steps=10)
  # The two files are read in turns of 32 records: record 20 of part-1 is the 53rd, in the batch of step 7, and
  # its turn (records 33 to 64) is first needed by step 5, which fails. TensorFlow's reason names the offset of
  # the record's data, after its 12-byte header.
  assert runner.data.TFRecordFiles.RECORDS_PER_TURN == 32
  assert str(raised.value) == (
      f"The training data cannot be read at step 5: {paths[1]} is damaged at record 20 (counting from 0; corrupted "
      f"record at {offsets[1][20] + 12}). Replace or re-write that file, or leave it out of the data."
  )


def test_a_damaged_file_of_a_plain_tfrecord_dataset_is_named_with_its_record(tmp_path, one_device):
  features, labels = trainer_testlib.classification_arrays(64)
  path = str(tmp_path / "train.tfrecord")
  offsets = trainer_testlib.write_classification_records(path, features, labels)
  with open(path, "rb") as f:
    damaged = bytearray(f.read())
  damaged[offsets[50] + 40] ^= 0xFF  # Inside the data of record 50.
  with open(path, "wb") as f:
    f.write(bytes(damaged))
  trainer = trainer_testlib.make_trainer(one_device, steps_per_loop=10)
  with pytest.raises(DataError) as raised:
    trainer.train(tf.data.TFRecordDataset(path).map(_parse), global_batch_size=8, steps=10)
  # Record 50 is in the batch of step 7 (records 48 to 55); the file name comes from the dataset's own graph.
  assert str(raised.value) == (
      f"The training data cannot be read at step 7: {path} is damaged at record 50 (counting from 0; corrupted "
      f"record at {offsets[50] + 12}). Replace or re-write that file, or leave it out of the data."
  )


def _float_feature(values):
  return tf.train.Feature(float_list=tf.train.FloatList(value=values))


def _int_feature(values):
  return tf.train.Feature(int64_list=tf.train.Int64List(value=values))


def _write_examples(path, count, feature_of):
  """Writes `count` records, the tf.train.Example of `feature_of(i)` ({name: tf.train.Feature}) each."""
  with tf.io.TFRecordWriter(path) as writer:
    for i in range(count):
      writer.write(tf.train.Example(features=tf.train.Features(feature=feature_of(i))).SerializeToString())


_OTHER_SCHEMAS = {  # Record 3 of the second file, as it is written instead of {"x": 8 floats, "y": 1 int}.
    "other_name": (
        {"features": _float_feature([1.0] * NUM_FEATURES), "y": _int_feature([1])},
        "Feature: x (data type: float) is required but could not be found",
    ),
    "other_dtype": (
        {"x": _int_feature([1] * NUM_FEATURES), "y": _int_feature([1])},
        "Key: x. Data types don't match. Data type: int64 but expected type: float",
    ),
    "other_length": (
        {"x": _float_feature([1.0] * 3), "y": _int_feature([1])},
        "Key: x. Can't parse serialized Example: Some float_list slice was not parsed",
    ),
}


@pytest.mark.parametrize("schema", sorted(_OTHER_SCHEMAS))
def test_a_tfrecord_of_another_schema_is_named_with_its_file_record_and_feature(tmp_path, one_device, schema):
  written, mismatch = _OTHER_SCHEMAS[schema]

  def good(i):
    return {"x": _float_feature([0.5] * NUM_FEATURES), "y": _int_feature([i % NUM_CLASSES])}

  paths = [str(tmp_path / f"part-{i}.tfrecord") for i in range(2)]
  _write_examples(paths[0], 16, good)
  _write_examples(paths[1], 16, lambda i: written if i == 3 else good(i))
  data = runner.data.TFRecordFiles(str(tmp_path / "part-*.tfrecord"), _parse)
  trainer = trainer_testlib.make_trainer(one_device, steps_per_loop=2)
  expected = (
      f"{paths[1]}, record 3 (counting from 0): {mismatch}. Write the files with the features parse_fn "
      "reads, or change the features it reads."
  )
  with pytest.raises(DataError) as raised:
    trainer.train(data, global_batch_size=8, steps=4)
  assert str(raised.value) == "The training data cannot be parsed at step 3: " + expected  # Records 16 to 23.
  with pytest.raises(DataError) as raised:
    trainer.evaluate(data, global_batch_size=8)
  assert str(raised.value) == "The evaluation data cannot be parsed: " + expected


def test_a_plain_tfrecord_dataset_of_another_schema_is_named_with_its_files_and_the_parsers_reason(
    tmp_path, one_device
):
  path = str(tmp_path / "train.tfrecord")
  _write_examples(path, 16, lambda i: {"x": _float_feature([1.0] * 3), "y": _int_feature([1])})
  trainer = trainer_testlib.make_trainer(one_device, steps_per_loop=2)
  with pytest.raises(DataError) as raised:
    trainer.train(tf.data.TFRecordDataset(path).map(_parse), global_batch_size=8, steps=4)
  assert str(raised.value) == (
      f"The training data cannot be parsed at step 1: TensorFlow's Example parser says in a record of {path}: Key: x. "
      "Can't parse serialized Example: Some float_list slice was not parsed. Write the files with the features the "
      "parse function reads, or change the features it reads (runner.data.TFRecordFiles names the file and record)."
  )


def test_a_run_that_fails_on_its_data_leaves_the_workdir_as_it_found_it(tmp_path):
  config = runner.load_config(SYNTHETIC, ["data.num_classes=12", "trainer.train_steps=4", "trainer.steps_per_loop=2"])
  with pytest.raises(
      DataError,
      match=r"^The training data's batch of step 1 holds a label outside the task's "
      r"range: example \d+ of the data \(counting from 0\) has label 1[01], but labels "
      r"must be integers in \[0, 10\)",
  ):
    runner.run(config, workdir=str(tmp_path / "new"))
  assert not (tmp_path / "new").exists()
  existing = tmp_path / "existing"
  existing.mkdir()
  (existing / "notes.txt").write_text("mine")
  with pytest.raises(DataError):
    runner.run(config, workdir=str(existing))
  assert os.listdir(existing) == ["notes.txt"]


_FUNCTIONS = textwrap.dedent("""
    import keras
    import numpy as np
    import tensorflow as tf

    def two_outputs(config):
      features = keras.Input((16,))
      return keras.Model(features, [keras.layers.Dense(10)(features), keras.layers.Dense(3)(features)])

    def left_and_right(config):
      left, right = keras.Input((8,), name="left"), keras.Input((8,), name="right")
      return keras.Model({"left": left, "right": right}, keras.layers.Dense(10)(keras.layers.Concatenate()([left, right])))

    def other_keys(config, split):
      x = np.ones((64, 8), np.float32)
      return tf.data.Dataset.from_tensor_slices(({"a": x, "b": x}, np.zeros(64, np.int32)))

    def without_split(config):
      return tf.data.Dataset.from_tensor_slices((np.ones((64, 16), np.float32), np.zeros(64, np.int32)))

    def declared_input(config):
      features = keras.Input((16,))
      return keras.Model(features, keras.layers.Dense(10)(features))

    def string_features(config, split):
      x = tf.strings.as_string(np.ones((64, 16), np.float32))
      return tf.data.Dataset.from_tensor_slices((x, np.zeros(64, np.int32)))

    def task_without_config():
      raise AssertionError("never called")
    """)

_DOES_NOT_FIT = {
    "model_with_two_outputs": (
        ["--config.model.name=fits:two_outputs"],
        r"Task Classification's loss takes one output tensor, but the model returns a list of 2 tensors of shapes "
        r"\[\(None, 10\), \(None, 3\)\]\. Give the model one output, or name a task of your own",
    ),
    "dict_features_of_other_keys": (
        ["--config.model.name=fits:left_and_right", "--config.data.name=fits:other_keys"],
        r"The training data's features have the keys 'a', 'b', but the model's inputs are named 'left', 'right'\.",
    ),
    "dataset_without_split": (
        ["--config.data.name=fits:without_split"],
        r"The dataset 'fits:without_split' has the parameters \(config\), but it is called as "
        r"without_split\(config\.data, split\) with split 'train' or 'eval' \(too many positional arguments\)",
    ),
    "string_features": (
        ["--config.model.name=fits:declared_input", "--config.data.name=fits:string_features"],
        r"The training data's features are string, but the model's input takes float32\. Convert them",
    ),
    "task_without_config": (
        ["--config.task.name=fits:task_without_config"],
        r"The task 'fits:task_without_config' has the parameters \(\), but it is called as "
        r"task_without_config\(config\.task\) \(too many positional arguments\)",
    ),
}


@pytest.mark.parametrize("case", sorted(_DOES_NOT_FIT))
def test_a_function_that_does_not_fit_is_named_before_the_workdir_changes(tmp_path, monkeypatch, case):
  overrides, message = _DOES_NOT_FIT[case]
  (tmp_path / "fits.py").write_text(_FUNCTIONS)
  monkeypatch.syspath_prepend(str(tmp_path))
  monkeypatch.delitem(sys.modules, "fits", raising=False)
  workdir = tmp_path / "workdir"
  workdir.mkdir()
  (workdir / "notes.txt").write_text("mine")
  overrides = ["mode=train", "trainer.train_steps=2"] + [override.removeprefix("--config.") for override in overrides]
  with pytest.raises(strategies.ConfigError, match=f"^{message}"):  # Some when the config loads, some as it runs.
    runner.run(runner.load_config(SYNTHETIC, overrides), str(workdir), quiet=True)
  assert os.listdir(workdir) == ["notes.txt"]
  monkeypatch.delitem(sys.modules, "fits", raising=False)


def test_a_function_that_does_not_fit_is_one_error_line_through_the_cli(tmp_path):
  overrides, message = _DOES_NOT_FIT["dataset_without_split"]
  (tmp_path / "fits.py").write_text(_FUNCTIONS)
  workdir = tmp_path / "workdir"
  workdir.mkdir()
  (workdir / "notes.txt").write_text("mine")
  env = paths.subprocess_environment()
  env["PYTHONPATH"] += os.pathsep + str(tmp_path)
  run = subprocess.run(
      [sys.executable, "-m", "runner", f"--config={SYNTHETIC}", f"--workdir={workdir}", "--mode=train"]
      + ["--config.trainer.train_steps=2", *overrides],
      env=env,
      capture_output=True,
      text=True,
      timeout=300,
      check=False,
  )
  assert run.returncode == 2, run.stderr[-3000:]
  assert "Traceback" not in run.stderr
  errors = process_testlib.error_lines(run.stderr)
  assert len(errors) == 1 and re.match(f"^error: {message}", errors[0]), run.stderr[-3000:]
  assert os.listdir(workdir) == ["notes.txt"]


def _records_run(workdir, files, train_steps, *more):
  """Starts `python -m runner` training the synthetic config's model on the TFRecord `files` to `train_steps`."""
  return process_testlib.runner_cli(
      [
          f"--config={SYNTHETIC}",
          f"--workdir={workdir}",
          "--mode=train",
          f"--config.data.name={RECORDS}",
          f"--config.data.files={files}",
          "--config.data.global_batch_size=8",
          "--config.trainer.steps_per_loop=2",
          f"--config.trainer.train_steps={train_steps}",
          *more,
      ],
      logs=f"{workdir}.logs",
  )


def _flip_byte(path, offset):
  with open(path, "r+b") as f:
    f.seek(offset)
    value = f.read(1)[0]
    f.seek(offset)
    f.write(bytes([value ^ 0xFF]))


def test_a_file_damaged_from_its_first_record_or_between_a_run_and_its_resume_is_one_error_line(tmp_path):
  # Both are read before the first step (whether the data holds a record; the record counts a resume starts from).
  features, labels = trainer_testlib.classification_arrays(64)
  fresh, resumed = str(tmp_path / "fresh.tfrecord"), str(tmp_path / "resumed.tfrecord")
  offsets = trainer_testlib.write_classification_records(fresh, features, labels)
  trainer_testlib.write_classification_records(resumed, features, labels)
  _flip_byte(fresh, offsets[0] + 40)  # Inside the data of record 0.
  fresh_run = _records_run(tmp_path / "fresh_run", fresh, 4)
  workdir = tmp_path / "work"
  overrides = [f"data.name={RECORDS}", f"data.files={resumed}", "data.global_batch_size=8", "trainer.steps_per_loop=2"]
  runner.run(runner.load_config(SYNTHETIC, [*overrides, "trainer.train_steps=4"]), str(workdir), quiet=True)
  _flip_byte(resumed, offsets[40] + 40)  # Between the run and its resume: record 40 damaged, the last one cut short.
  os.truncate(resumed, os.path.getsize(resumed) - 10)
  before = process_testlib.files_of(workdir)
  for process, path, record, step in ((_records_run(workdir, resumed, 8), resumed, 40, 5), (fresh_run, fresh, 0, 1)):
    status, _, stderr = process.wait()
    assert status == 2, stderr[-3000:]
    assert process_testlib.error_lines(stderr) == [
        f"error: The training data cannot be read at step {step}: {path} is damaged at record {record} (counting "
        f"from 0; corrupted record at {offsets[record] + 12}). Replace or re-write that file, or leave it out of the "
        "data."
    ]
    assert "Traceback" not in stderr
  assert process_testlib.files_of(workdir) == before  # Byte for byte.
  assert not (tmp_path / "fresh_run").exists()


def test_evaluation_data_without_examples_is_one_error_line_before_training_and_never_a_row_of_zeros(
    tmp_path, one_device
):
  features, labels = trainer_testlib.classification_arrays(64)
  train, empty = str(tmp_path / "train.tfrecord"), str(tmp_path / "eval.tfrecord")
  trainer_testlib.write_classification_records(train, features, labels)
  tf.io.TFRecordWriter(empty).close()
  run = _records_run(tmp_path / "work", train, 4, "--mode=train_and_eval", f"--config.data.eval_files={empty}")
  message = (
      "The evaluation data holds no examples: its loss and metrics would be zeros over 0 examples. Give it at least "
      "one example (under runner.run: what config.data's dataset returns for split 'eval'), or evaluate nothing "
      "(mode 'train')."
  )
  trainer = trainer_testlib.make_trainer(one_device, model_dir=str(tmp_path / "in_process"), steps_per_loop=2)
  unknown = trainer_testlib.classification_data(16).filter(lambda x, y: y > 10)  # Empty, though not known before.
  with pytest.raises(DataError) as raised:
    trainer.train(trainer_testlib.classification_data(16), global_batch_size=8, steps=2, eval_data=unknown)
  assert str(raised.value) == message
  assert [row["split"] for row in process_testlib.metrics_rows(tmp_path / "in_process")] == ["train"]
  status, _, stderr = run.wait()
  assert status == 2, stderr[-3000:]
  assert process_testlib.error_lines(stderr) == [f"error: {message}"]
  assert not (tmp_path / "work").exists()
