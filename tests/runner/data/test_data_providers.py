"""The DatasetProviders of runner.data: in-memory arrays, a function, TFRecord files; sharding across pipelines.

Sharding is checked in-process with real `tf.distribute.InputContext`s, from
a config through `runner.run`, and across two `python -m runner` worker
processes.
"""

import logging
import os
import subprocess
import sys
import textwrap

import ml_collections
import numpy as np
import portpicker
import pytest
import tensorflow as tf

import runner
from runner.config import run_config as config_lib
from runner.data import builtin_datasets
from runner.data import pipeline as input_pipeline
from runner.data import providers as data
from strategies import ConfigError
from testlib import paths

REPO = paths.REPO
TIMEOUT_SECONDS = 180
# A dataset function for config runs over the records of `_write_records`.
RECORDS_PLUGIN = textwrap.dedent("""
    import tensorflow as tf
    from runner.data import providers as data

    PROVIDERS = {}

    def parse(record):
      value = tf.io.parse_single_example(record, {"value": tf.io.FixedLenFeature([], tf.int64)})["value"]
      return tf.reshape(tf.cast(value, tf.float32) / 100.0, [1]), value % 10

    def records(config, split):
      # train leaves the policy to config.data.sharding; eval chooses one, which the config does not change.
      PROVIDERS[split] = data.TFRecordFiles(config.pattern, parse, sharding=None if split == "train" else "data")
      return PROVIDERS[split]
    """)


def _context(pipeline, pipelines):
  return tf.distribute.InputContext(
      num_input_pipelines=pipelines, input_pipeline_id=pipeline, num_replicas_in_sync=pipelines
  )


def _values(dataset, index=0):
  return [int(np.asarray(element[index]).reshape(-1)[0]) for element in dataset]


def test_in_memory_shards_by_example_and_shuffles_with_its_seed():
  features = np.arange(10, dtype=np.float32)[:, None]
  provider = data.InMemory({"x": features}, np.arange(10), np.ones(10, np.float32), shuffle=True, seed=3)
  shares = [[int(f["x"][0]) for f, _, _ in provider.get_dataset(_context(i, 2))] for i in range(2)]
  assert sorted(shares[0]) == [0, 2, 4, 6, 8] and sorted(shares[1]) == [1, 3, 5, 7, 9]
  assert shares[0] != [0, 2, 4, 6, 8] or shares[1] != [1, 3, 5, 7, 9]  # shuffled
  again = [int(f["x"][0]) for f, _, _ in provider.get_dataset(_context(0, 2))]
  assert again == shares[0]  # the same seed gives the same order
  in_order = data.InMemory(features, np.arange(10))
  assert _values(in_order.get_dataset(_context(0, 1))) == list(range(10))
  assert in_order.num_examples == 10


def test_in_memory_rejects_arrays_of_different_lengths():
  with pytest.raises(ConfigError, match=r"same, non-zero number of examples.*got \[3, 4\]"):
    data.InMemory(np.zeros((4, 2)), np.zeros(3))


def test_from_function_calls_the_function_per_pipeline():
  calls = []

  def dataset_fn(input_context):
    calls.append(input_context.input_pipeline_id)
    return tf.data.Dataset.range(6).shard(input_context.num_input_pipelines, input_context.input_pipeline_id)

  provider = data.FromFunction(dataset_fn)
  assert list(provider.get_dataset(_context(1, 2)).as_numpy_iterator()) == [1, 3, 5]
  assert calls == [1]
  with pytest.raises(TypeError, match=r"must return a tf.data.Dataset, returned list"):
    data.FromFunction(lambda context: [1, 2]).get_dataset(_context(0, 1))
  with pytest.raises(TypeError, match=r"needs a function input_context -> tf.data.Dataset"):
    data.FromFunction(3)


def _write_records(directory, num_files, per_file):
  """Writes files part-<i>.tfrecord, record k of file i holding the int64 i * 100 + k."""
  for i in range(num_files):
    with tf.io.TFRecordWriter(str(directory / f"part-{i}.tfrecord")) as writer:
      for k in range(per_file):
        example = tf.train.Example(
            features=tf.train.Features(
                feature={"value": tf.train.Feature(int64_list=tf.train.Int64List(value=[i * 100 + k]))}
            )
        )
        writer.write(example.SerializeToString())
  return str(directory / "part-*.tfrecord")


def _parse(record):
  value = tf.io.parse_single_example(record, {"value": tf.io.FixedLenFeature([], tf.int64)})["value"]
  return tf.cast(value, tf.float32), value


def test_tfrecord_files_shard_by_file(tmp_path):
  pattern = _write_records(tmp_path, num_files=4, per_file=3)
  provider = data.TFRecordFiles(pattern, _parse)
  shares = [sorted(_values(provider.get_dataset(_context(i, 2)), index=1)) for i in range(2)]
  assert shares[0] == [0, 1, 2, 200, 201, 202]  # files 0 and 2
  assert shares[1] == [100, 101, 102, 300, 301, 302]  # files 1 and 3
  single = sorted(_values(provider.get_dataset(_context(0, 1)), index=1))
  assert len(single) == 12 and single == sorted(shares[0] + shares[1])
  shuffled = data.TFRecordFiles(pattern, _parse, shuffle_buffer_size=12, seed=1)
  order = _values(shuffled.get_dataset(_context(0, 1)), index=1)
  assert sorted(order) == single and order != single


@pytest.mark.parametrize("pipelines", [2, 3])
@pytest.mark.parametrize("num_files", [1, 2, 3])
@pytest.mark.parametrize("sharding", ["auto", "file", "data"])
def test_every_policy_gives_every_pipeline_a_disjoint_share_of_every_record(
    tmp_path, caplog, sharding, num_files, pipelines
):
  pattern = _write_records(tmp_path, num_files=num_files, per_file=4)
  provider = data.TFRecordFiles(pattern, _parse, sharding=sharding)
  with caplog.at_level(logging.INFO, logger="absl"):
    shares = [_values(provider.get_dataset(_context(i, pipelines)), index=1) for i in range(pipelines)]
  assert all(shares), shares  # no pipeline without data
  assert sorted(sum(shares, [])) == [i * 100 + k for i in range(num_files) for k in range(4)]  # each record once
  by_file = sharding != "data" and num_files >= pipelines
  if by_file:  # pipeline i reads files i, i + n, ...
    assert [sorted(share) for share in shares] == [
        [f * 100 + k for f in range(i, num_files, pipelines) for k in range(4)] for i in range(pipelines)
    ]
  else:  # every n-th record of the one stream every pipeline reads
    stream = _values(data.TFRecordFiles(pattern, _parse, sharding="data").get_dataset(_context(0, 1)), index=1)
    assert shares == [stream[i::pipelines] for i in range(pipelines)]
  lines = [r for r in caplog.records if "too few to shard by file" in r.getMessage()]
  if by_file or sharding == "data":
    assert lines == []
  else:  # said once per provider, not once per pipeline; a warning only when 'file' was asked for
    assert [r.levelno for r in lines] == [logging.WARNING if sharding == "file" else logging.INFO]
    assert lines[0].getMessage() == (
        f"TFRecordFiles: {num_files} file(s) match {pattern!r} for {pipelines} input pipelines, too few to shard by "
        f"file; sharding by example (sharding={sharding!r}): every pipeline reads every file and keeps one record "
        f"in {pipelines}."
    )
  for i in range(pipelines):  # resume: skipping `start` examples of this pipeline's stream, under every policy
    context = _context(i, pipelines)
    assert _values(provider.get_repeated_dataset(context, 5).take(9), index=1) == _values(
        provider.get_repeated_dataset(context, 0).skip(5).take(9), index=1
    )


def _batches(dataset):
  return [[np.asarray(part).tolist() for part in batch] for batch in dataset.as_numpy_iterator()]


def _parse_with_string_length(record):
  """As `_parse`, through StringLength, an op TensorFlow cannot vectorize (a Python op would hang the iterator's end)."""
  features, value = _parse(record)
  return features * tf.cast(tf.strings.length(record) > 0, tf.float32), value


@pytest.mark.parametrize("parse_fn", [_parse, _parse_with_string_length], ids=["vectorized", "record_by_record"])
@pytest.mark.parametrize("shuffle,sharding", [(0, "data"), (5, "data"), (0, "file")])
def test_tfrecord_files_give_the_trainer_the_batches_of_parsing_record_by_record(
    tmp_path, caplog, parse_fn, shuffle, sharding
):
  # Sharding by file without a shuffle cuts the batches from whole turns of RECORDS_PER_TURN records.
  pattern = _write_records(tmp_path, num_files=3, per_file=data.TFRecordFiles.RECORDS_PER_TURN + 7)
  provider = data.TFRecordFiles(pattern, parse_fn, shuffle_buffer_size=shuffle, seed=2, sharding=sharding)
  with caplog.at_level(logging.INFO, logger="absl"):
    for context in (_context(0, 1), _context(1, 2)):
      assert _batches(provider.get_batches(context, 4)) == _batches(provider.get_dataset(context).batch(4))
      for start in (0, 5, 44, 120):  # Within the first epoch (44 a whole number of batches), and epochs in.
        batches = _batches(provider.get_repeated_batches(context, 4, start).take(40))
        assert batches == _batches(provider.get_repeated_dataset(context, start).batch(4, drop_remainder=True).take(40))
        assert len(batches) == 40
  said = [r.getMessage() for r in caplog.records if "record by record" in r.getMessage()]
  if parse_fn is _parse:
    assert said == []
  else:  # once per provider, with TensorFlow's reason
    assert said == [
        "TFRecordFiles: parsing record by record, as parse_fn '_parse_with_string_length' does not "
        "vectorize: No pfor vectorization defined for StringLength."
    ]


def test_the_record_stream_is_a_function_of_the_file_list_alone(tmp_path):
  turn = data.TFRecordFiles.RECORDS_PER_TURN
  pattern = _write_records(tmp_path, num_files=3, per_file=turn + 2)
  provider = data.TFRecordFiles(pattern, _parse, sharding="data")
  stream = (
      list(range(turn))
      + [100 + k for k in range(turn)]
      + [200 + k for k in range(turn)]
      + [turn, turn + 1, 100 + turn, 101 + turn, 200 + turn, 201 + turn]
  )
  assert _values(provider.get_dataset(_context(0, 1)), index=1) == stream  # RECORDS_PER_TURN from each file in turn
  assert _values(provider.get_dataset(_context(1, 2)), index=1) == stream[1::2]


def test_data_without_files_is_sharded_by_example_and_file_says_so_once(caplog):
  values = np.arange(7)
  providers = [
      data.InMemory(values.astype(np.float32), values),
      data.as_provider(tf.data.Dataset.from_tensor_slices((values, values))),
  ]
  for sharding in ("auto", "data", "file"):
    for provider in providers:
      provider.sharding = sharding
      with caplog.at_level(logging.INFO, logger="absl"):
        shares = [_values(provider.get_dataset(_context(i, 2)), index=1) for i in range(2)]
      assert shares == [[0, 2, 4, 6], [1, 3, 5]]
  said = [r.getMessage() for r in caplog.records if "has no files" in r.getMessage()]
  assert said == [
      f"{name}: sharding='file', but its data has no files; sharding by example instead (input "
      "pipeline i of n keeps examples i, i + n, ...)."
      for name in ("InMemory", "DatasetShards")
  ]


def test_from_function_says_once_that_a_policy_does_not_apply(caplog):
  def halves(input_context):
    return tf.data.Dataset.range(4).shard(input_context.num_input_pipelines, input_context.input_pipeline_id)

  provider = data.FromFunction(halves)
  provider.sharding = "data"
  with caplog.at_level(logging.WARNING, logger="absl"):
    shares = [list(provider.get_dataset(_context(i, 2)).as_numpy_iterator()) for i in range(2)]
  assert shares == [[0, 2], [1, 3]]
  assert [r.getMessage() for r in caplog.records] == [
      "FromFunction: sharding='data' does not apply; the function 'halves' decides how each input pipeline's data "
      "is sharded."
  ]


def test_a_bad_sharding_is_a_config_error_naming_the_valid_ones(tmp_path):
  pattern = _write_records(tmp_path, num_files=1, per_file=1)
  with pytest.raises(
      ConfigError,
      match=r"^TFRecordFiles sharding='files' is not valid\. Did you mean 'file'\? Valid: auto, file, data\.$",
  ):
    data.TFRecordFiles(pattern, _parse, sharding="files")
  with pytest.raises(TypeError, match=r"positional argument"):
    data.TFRecordFiles(pattern, _parse, 0, None, None, "file")  # keyword-only
  provider = data.InMemory(np.zeros(2), np.zeros(2))
  with pytest.raises(ConfigError, match=r"^InMemory sharding='example' is not valid\..* Valid: auto, file, data\.$"):
    provider.sharding = "example"
  assert provider.sharding is None and data.TFRecordFiles(pattern, _parse).sharding is None  # not chosen
  with pytest.raises(
      ConfigError,
      match=r"^config\.data\.sharding='by_file' is not valid\. Did you mean 'file'\? Valid: auto, file, data\.$",
  ):
    config_lib.validate({"data": {"sharding": "by_file"}})
  assert config_lib.default_config().data.sharding == "auto"


def test_tfrecord_files_need_a_matching_file(tmp_path):
  with pytest.raises(ConfigError, match=r"No TFRecord file matches '.*nothing-\*.tfrecord'"):
    data.TFRecordFiles(str(tmp_path / "nothing-*.tfrecord"), _parse)
  (tmp_path / "shards").mkdir()
  with pytest.raises(ConfigError, match=r"'.*/sh\*' matches the folder '.*/shards', not a TFRecord file; name the"):
    data.TFRecordFiles(str(tmp_path / "sh*"), _parse)


def test_builtin_datasets_split_once_and_keep_eval_in_order():
  config = ml_collections.ConfigDict({"test_fraction": 0.2, "seed": 0})
  train = data.as_provider(builtin_datasets.digits(config, "train"))
  test = data.as_provider(builtin_datasets.digits(config, "eval"))
  assert (train.num_examples, test.num_examples) == (1437, 360)
  train_features = {f.tobytes() for f, _ in train.get_dataset(_context(0, 1)).as_numpy_iterator()}
  test_batch = list(test.get_dataset(_context(0, 1)).as_numpy_iterator())
  assert not train_features & {f.tobytes() for f, _ in test_batch}  # disjoint
  assert all(0.0 <= f.min() and f.max() <= 1.0 for f, _ in test_batch)
  assert [int(label) for _, label in test_batch] == [int(label) for _, label in test.get_dataset(_context(0, 1))]


def test_synthetic_is_deterministic_with_distinct_splits():
  config = ml_collections.ConfigDict(
      {
          "num_examples": 64,
          "num_eval_examples": 32,
          "num_features": 5,
          "num_classes": 3,
          "noise": 0.0,
          "regression": False,
          "shuffle": True,
          "seed": 4,
      }
  )
  train, test = builtin_datasets.synthetic(config, "train"), builtin_datasets.synthetic(config, "eval")
  assert (train.shuffle, test.shuffle) == (True, False)
  config.shuffle = False
  assert not builtin_datasets.synthetic(config, "train").shuffle
  features, labels = train.elements
  assert features.shape == (64, 5) and set(np.unique(labels)) <= {0, 1, 2}
  assert np.array_equal(builtin_datasets.synthetic(config, "train").elements[0], features)
  assert test.num_examples == 32 and not np.array_equal(test.elements[0][:32], features[:32])
  config.regression = True
  assert builtin_datasets.synthetic(config, "eval").elements[1].shape == (32, 1)


def test_a_config_run_gives_config_data_sharding_to_a_provider_that_did_not_choose(tmp_path, monkeypatch):
  pattern = _write_records(tmp_path, num_files=2, per_file=8)
  (tmp_path / "sharded_records.py").write_text(RECORDS_PLUGIN)
  monkeypatch.syspath_prepend(str(tmp_path))
  config = {
      "strategy": {"name": "one_device"},
      "data": {"name": "sharded_records:records", "pattern": pattern, "global_batch_size": 4, "sharding": "file"},
      "model": {"hidden_units": (4,)},
      "trainer": {"train_steps": 2, "steps_per_loop": 1},
  }
  result = runner.run(config, str(tmp_path / "work"))
  import sharded_records  # noqa: PLC0415

  assert {split: p.sharding for split, p in sharded_records.PROVIDERS.items()} == {"train": "file", "eval": "data"}
  assert result.global_step == 2 and result.eval_metrics["num_examples"] == 16
  sys.modules.pop("sharded_records", None)


def test_two_workers_over_one_file_with_sharding_file_each_say_so_once_and_finish(tmp_path, subprocess_env):
  pattern = _write_records(tmp_path, num_files=1, per_file=40)
  (tmp_path / "sharded_records.py").write_text(RECORDS_PLUGIN)
  config_file = tmp_path / "sharded_config.py"
  config_file.write_text(textwrap.dedent(f"""
      import ml_collections

      def get_config():
        return ml_collections.ConfigDict({{
            "mode": "train",
            "data": {{"name": "sharded_records:records", "pattern": {pattern!r}, "global_batch_size": 8}},
            "model": {{"hidden_units": (8,)}},
            "trainer": {{"train_steps": 20, "steps_per_loop": 10}}}})
      """))
  env = dict(subprocess_env, PYTHONPATH=os.pathsep.join([str(tmp_path), subprocess_env["PYTHONPATH"]]))
  hosts = tuple(f"localhost:{portpicker.pick_unused_port()}" for _ in range(2))
  workers = []
  for index in range(2):  # Output to files: a full pipe would stop one worker and, through the all-reduce, both.
    with (
        open(tmp_path / f"worker{index}.out", "w", encoding="utf-8") as out,
        open(tmp_path / f"worker{index}.err", "w", encoding="utf-8") as err,
    ):
      workers.append(
          subprocess.Popen(
              [
                  sys.executable,
                  "-m",
                  "runner",
                  f"--config={config_file}",
                  f"--workdir={tmp_path / 'work'}",
                  "--config.strategy.name=multi_worker_mirrored",
                  f"--config.strategy.worker_hosts={hosts!r}",
                  f"--config.strategy.task_index={index}",
                  "--config.data.sharding=file",
              ],
              cwd=REPO,
              env=env,
              stdout=out,
              stderr=err,
          )
      )
  try:
    for worker in workers:
      worker.wait(timeout=TIMEOUT_SECONDS)
  finally:
    for worker in workers:
      worker.kill()
  said = (
      f"TFRecordFiles: 1 file(s) match {pattern!r} for 2 input pipelines, too few to shard by file; sharding "
      "by example (sharding='file'): every pipeline reads every file and keeps one record in 2."
  )
  for index, worker in enumerate(workers):
    stdout, stderr = ((tmp_path / f"worker{index}.{kind}").read_text(encoding="utf-8") for kind in ("out", "err"))
    assert worker.returncode == 0 and "global step: 20" in stdout, stderr[-3000:]
    lines = [line for line in stderr.splitlines() if "too few to shard by file" in line]
    assert len(lines) == 1 and lines[0].startswith("W") and lines[0].endswith(said), lines


def test_the_trainers_input_runs_without_the_autotuning_model_whose_thread_stalls_iterator_deletion(cpu_devices):
  """The model thread of tf.data's autotuning (TensorFlow 2.21) made deleting a long-used iterator wait for its timer."""
  examples = runner.data.DatasetShards(
      tf.data.Dataset.from_tensor_slices((np.zeros((16, 3), np.float32), np.zeros(16, np.int32)))
  )
  mirrored = tf.distribute.MirroredStrategy(cpu_devices(2))
  training = input_pipeline.for_training(mirrored, examples, 4)
  evaluation, _ = input_pipeline.for_evaluation(mirrored, examples, 4, bounded=False)
  # The per-worker datasets that distribute_datasets_from_function built (TensorFlow keeps them in `_datasets`).
  for distributed in (training, evaluation):
    assert [d.options().autotune.enabled for d in distributed._datasets] == [False]  # noqa: SLF001
  features, _ = next(iter(training))
  assert [tuple(t.shape) for t in mirrored.experimental_local_results(features)] == [(2, 3), (2, 3)]
