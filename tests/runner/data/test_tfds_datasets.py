"""TFDS datasets by name ('tfds:NAME'), read with the real TFDS from a data_dir this module prepares offline.

The dataset is built once per module by a builder of its own (`download_and_prepare` on generated
examples, nothing downloaded) into 12 files per split (4 examples each in 'train'), so reading by file,
per-pipeline sharding and the fallback to sharding by example, split slices and a resume that skips whole
files all meet real TFDS files. Example i of 'train' has id i; its features are `trainer_testlib`'s.
"""

import os
import re
import shutil
import sys

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

import runner
from runner import from_config
from runner.config import run_config as config_lib
from runner.data import pipeline as input_pipeline
from strategies.errors import ConfigError
from testlib import trainer_testlib

NAME = "tiny_shards"
TRAIN, TEST, FILES = 48, 12, 12  # Examples of 'train' and 'test', each in 12 files.
FEATURES, LABELS = trainer_testlib.classification_arrays(TRAIN + TEST)
PREPARED = ", ".join(f"{NAME}/{config}/1.0.0" for config in ("arrays", "supervised", "unsupervised"))


class TinyShards(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """'supervised' (and 'arrays') has the supervised keys ('x', 'label'); 'unsupervised' none. Read via `tfds.builder`."""

  VERSION = tfds.core.Version("1.0.0")
  BUILDER_CONFIGS = [tfds.core.BuilderConfig(name=name) for name in ("supervised", "unsupervised", "arrays")]

  def _info(self):
    features = tfds.features.FeaturesDict(
        {
            "x": tfds.features.Tensor(shape=(trainer_testlib.NUM_FEATURES,), dtype=np.float32),
            "image": tfds.features.Image(shape=(2, 2, 1)),
            "label": tfds.features.ClassLabel(num_classes=trainer_testlib.NUM_CLASSES),
            "id": np.int64,
        }
    )
    supervised = None if self.builder_config.name == "unsupervised" else ("x", "label")
    return tfds.core.DatasetInfo(builder=self, features=features, supervised_keys=supervised, disable_shuffling=True)

  def _split_generators(self, dl_manager):
    del dl_manager
    return {"train": self._generate_examples(0, TRAIN), "test": self._generate_examples(TRAIN, TRAIN + TEST)}

  def _generate_examples(self, first, end):
    for i in range(first, end):
      image = np.full((2, 2, 1), i, np.uint8)
      yield i, {"x": FEATURES[i], "image": image, "label": int(LABELS[i]), "id": i}


def scaled_image(image, label):
  """A `config.data.preprocess`: the image as floats in [0, 1], flattened."""
  return tf.reshape(tf.cast(image, tf.float32) / 255.0, [4]), label


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  directory = str(tmp_path_factory.mktemp("tfds"))
  for config, file_format in (("supervised", None), ("unsupervised", None), ("arrays", "array_record")):
    TinyShards(config=config, data_dir=directory, file_format=file_format).download_and_prepare(
        download_config=tfds.download.DownloadConfig(num_shards=FILES)
    )
  return directory


def _config(data_dir, **data):
  """The synthetic config on the supervised dataset by name, with `data`'s fields; not yet validated."""
  fields = {"name": f"tfds:{NAME}/supervised:1.0.0", "tfds_data_dir": data_dir, "global_batch_size": 4, **data}
  return {
      "mode": "train_and_eval",
      "data": fields,
      "model": {"name": "mlp", "hidden_units": (4,), "num_outputs": trainer_testlib.NUM_CLASSES},
      "trainer": {"train_steps": 2, "steps_per_loop": 2},
  }


def _provider(data_dir, split="train", **data):
  return from_config.dataset(config_lib.validate(_config(data_dir, **data)), split)


def _context(pipeline, pipelines):
  return tf.distribute.InputContext(
      num_input_pipelines=pipelines, input_pipeline_id=pipeline, num_replicas_in_sync=pipelines
  )


def _ids(dataset):
  return [int(i) for i in input_pipeline.without_autotune_model(dataset).as_numpy_iterator()]


def test_a_config_trains_and_evaluates_on_a_tfds_dataset_by_name_on_one_device_and_two_replicas(
    data_dir, tmp_path, cpu_devices
):
  provider = _provider(data_dir)
  assert len(provider.files) == FILES and provider.record_counts(provider.files) == [4] * FILES
  features, labels = zip(*input_pipeline.without_autotune_model(provider.get_dataset(_context(0, 1))))
  np.testing.assert_array_equal(np.stack(features), FEATURES[:TRAIN])  # The files in order: examples 0, 1, ...
  np.testing.assert_array_equal(np.stack(labels), LABELS[:TRAIN])
  two = tuple(cpu_devices(2))
  weights = []
  for mode, strategy in (("train", {"name": "one_device"}), ("train_and_eval", {"name": "mirrored", "devices": two})):
    config = {**_config(data_dir), "mode": mode, "strategy": strategy}
    result = runner.run(config, str(tmp_path / strategy["name"]), quiet=True)
    weights.append(result.model.get_weights())
  assert result.num_replicas == 2 and result.global_step == 2 and result.eval_metrics["num_examples"] == TEST
  for got, want in zip(*weights, strict=True):  # The same batches: the same weights, up to the order of a sum.
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_pipelines_read_tfds_files_as_tfds_shards_them_and_start_at_any_position(data_dir):
  provider = _provider(data_dir, label_key="id", sharding="auto")
  builder = tfds.builder(f"{NAME}/supervised:1.0.0", data_dir=data_dir)
  for pipeline in range(2):  # By file: files pipeline, pipeline + 2, ..., as tfds.ReadConfig(input_context=...).
    context = _context(pipeline, 2)
    ids = _ids(provider.get_repeated_dataset(context, 0).take(3 * TRAIN // 2).map(lambda x, i: i))
    read_config = tfds.ReadConfig(input_context=context, interleave_cycle_length=1)  # TFDS's reading, file by file.
    by_tfds = builder.as_dataset("train", read_config=read_config, shuffle_files=False).map(
        lambda example: example["id"]
    )
    assert ids == _ids(by_tfds) * 3 == [i for f in range(pipeline, FILES, 2) for i in range(4 * f, 4 * f + 4)] * 3
    for start in (5, TRAIN // 2 + 3):  # Inside a file of epoch 0; of epoch 1.
      resumed = provider.get_repeated_dataset(context, start).take(len(ids) - start)
      assert _ids(resumed.map(lambda x, i: i)) == ids[start:]
  two_files = _provider(data_dir, train_split="train[:8]", label_key="id")  # For 3 pipelines: by example.
  assert [_ids(two_files.get_dataset(_context(p, 3)).map(lambda x, i: i)) for p in range(3)] == [
      list(range(p, 8, 3)) for p in range(3)
  ]


def test_split_slices_read_part_of_a_file_and_resume_inside_them(data_dir):
  provider = _provider(data_dir, train_split="train[5:14]+train[-3:]", label_key="id")
  epoch = [*range(5, 14), *range(TRAIN - 3, TRAIN)]
  assert _ids(provider.get_dataset(_context(0, 1)).map(lambda x, i: i)) == epoch
  resumed = provider.get_repeated_dataset(_context(0, 1), 10).map(lambda x, i: i).take(6)
  assert _ids(resumed) == [*epoch[10:], *epoch[:4]]
  percent = _provider(data_dir, "eval", eval_split="test[50%:]", label_key="id")
  assert _ids(percent.get_dataset(_context(0, 1)).map(lambda x, i: i)) == list(range(TRAIN + 6, TRAIN + TEST))


def test_a_preprocess_function_decodes_the_features_it_names(data_dir):
  provider = _provider(data_dir, feature_key="image", preprocess=f"{__name__}:scaled_image")
  image, label = next(iter(provider.get_repeated_dataset(_context(0, 1), 7)))
  np.testing.assert_allclose(image.numpy(), np.full(4, 7 / 255, np.float32))
  assert int(label) == LABELS[7]


def _train(provider, model_dir, steps):
  trainer = trainer_testlib.make_trainer(
      tf.distribute.OneDeviceStrategy("/cpu:0"), model_dir=model_dir, steps_per_loop=2
  )
  trainer.train(provider, global_batch_size=4, steps=steps)
  return trainer


def test_a_resumed_run_ends_bit_for_bit_as_an_uninterrupted_one_without_opening_the_files_before_it(data_dir, tmp_path):
  copy = str(tmp_path / "tfds")
  shutil.copytree(data_dir, copy)
  uninterrupted = _train(_provider(copy), str(tmp_path / "whole"), 12).model.get_weights()
  assert _train(_provider(copy), str(tmp_path / "resumed"), 10).global_step == 10
  provider = _provider(copy)
  for path in provider.files[:8]:  # The first round of files (FILES_READ_AT_ONCE): steps 0-7 read them.
    with open(path, "wb") as file:
      file.write(b"not a TFRecord")
  resumed = _train(provider, str(tmp_path / "resumed"), 12)  # Steps 10 and 11: files 10 and 11, in round 2.
  for got, want in zip(resumed.model.get_weights(), uninterrupted, strict=True):
    np.testing.assert_array_equal(got, want)
  with pytest.raises(runner.data.DataError) as error:  # From step 0 the damaged file is one DataError line.
    _train(provider, str(tmp_path / "fresh"), 2)
  assert re.match(
      rf"The training data cannot be read at step \d: {re.escape(provider.files[0])} is damaged at record 0 \(counting "
      r"from 0; corrupted record at 0",
      str(error.value),
  )
  os.remove(provider.files[3])
  with pytest.raises(runner.data.DataError) as error:
    _provider(copy)
  assert str(error.value) == (
      f"tfds:{NAME}/supervised:1.0.0 split 'train': 1 of its 12 file(s) are missing, e.g. {provider.files[3]!r}; "
      "prepare the dataset again (download_and_prepare)."
  )


@pytest.mark.parametrize(
    "data, message",
    [
        (
            {"name": "tfds:tiny_shard"},
            "config.data.name='tfds:tiny_shard': TFDS has no dataset 'tiny_shard', and none is prepared in DIR. "
            f"Did you mean 'tiny_shards'? Prepared there: {PREPARED}.",
        ),
        (
            {"name": "tfds:mnist"},
            "The TFDS dataset 'mnist' is not prepared in DIR (a run downloads nothing): prepare it with `python -c "
            "\"import tensorflow_datasets as tfds; tfds.builder('mnist', data_dir='DIR').download_and_prepare()\"` "
            "(or `tfds build mnist --data_dir=DIR`, which needs apache-beam).",
        ),
        (
            {"name": "tfds:tiny_shards", "tfds_data_dir": "/nonexistent/tfds"},
            "config.data.name='tfds:tiny_shards': TFDS has no dataset 'tiny_shards', and none is prepared in "
            "/nonexistent/tfds.",  # Then TFDS's own closest name, and "Prepared there: none."
        ),
        (
            {"name": f"tfds:{NAME}/supervised:2.0.0"},
            f"config.data.name='tfds:{NAME}/supervised:2.0.0': TFDS has no dataset '{NAME}/supervised:2.0.0', and none "
            f"is prepared in DIR. Prepared there: {PREPARED}.",
        ),
        (
            {"eval_split": "valid"},
            "config.data.eval_split='valid' is not a split of 'tiny_shards/supervised:1.0.0' (Unknown split 'valid'. "
            "Should be one of ['train', 'test'].); its splits: train, test (slices such as 'train[90%:]' and sums "
            "such as 'train+test' work too).",
        ),
        (
            {"label_key": "labels"},
            "config.data.label_key='labels' is not a feature of 'tiny_shards/supervised:1.0.0'. Did you mean "
            "'label'? Its features: id, image, label, x.",
        ),
        (
            {"name": f"tfds:{NAME}/unsupervised:1.0.0", "feature_key": "x"},
            f"The TFDS dataset '{NAME}/unsupervised:1.0.0' has no supervised keys: set config.data.feature_key and "
            "config.data.label_key to two of its features: id, image, label, x.",
        ),
        (
            {"name": f"tfds:{NAME}/arrays"},
            f"The TFDS dataset '{NAME}/arrays' is stored as array_record files; a run reads TFDS's default, tfrecord: "
            'prepare it so with `python -c "import tensorflow_datasets as tfds; '
            f"tfds.builder('{NAME}/arrays', data_dir='DIR', file_format='tfrecord').download_and_prepare()\"`.",
        ),
        ({"name": "tfds:"}, "config.data.name='tfds:' names no TFDS dataset; give 'tfds:NAME', e.g. 'tfds:mnist'."),
        ({"train_split": ""}, "config.data.train_split must name a split of the dataset, got ''."),
        (
            {"preprocess": "scaled_image"},
            "config.data.preprocess must be an import path 'package.module:function', got 'scaled_image'.",
        ),
    ],
)
def test_a_tfds_dataset_that_cannot_be_read_is_one_config_error_naming_what_is_valid(data_dir, data, message):
  with pytest.raises(ConfigError) as error:
    _provider(data_dir, split="eval", **data)
  assert str(error.value).replace(data_dir, "DIR").startswith(message)


def test_without_tensorflow_datasets_a_tfds_name_says_how_to_install_it(data_dir, monkeypatch):
  monkeypatch.setitem(sys.modules, "tensorflow_datasets", None)  # What importlib finds for a missing package.
  with pytest.raises(ConfigError) as error:
    config_lib.validate(_config(data_dir))
  assert str(error.value) == (
      f"Dataset 'tfds:{NAME}/supervised:1.0.0' needs tensorflow-datasets, which is not installed: "
      "pip install -e \".[tfds]\" (or pip install 'tf-runner[tfds]')."
  )
