"""Resuming at any step in constant time: each provider's stream starts at a position, exactly as if read from 0.

The providers' endless streams are checked position by position against the
stream read from its start (two input pipelines, both shardings, shuffled or
not, across turns, rounds, shuffle blocks and epochs); the Trainer, stopped
and restarted on a real checkpoint in this process, ends with the weights
of an uninterrupted run, bit for bit.
"""

import os
import re

import numpy as np
import pytest
import tensorflow as tf

import runner
from runner.data import pipeline as input_pipeline
from runner.data import providers as data
from runner.training import train_input
from testlib import paths
from testlib import process_testlib
from testlib import trainer_testlib

SYNTHETIC = os.path.join(paths.REPO, "configs", "synthetic.py")
NUM_EXAMPLES = 40
GLOBAL_BATCH = 8  # 5 steps an epoch on one device.
TOTAL_STEPS = 17
STOPS = (3, 7, 12)  # Mid-epoch 0; then across the end of epochs 0 and 1; then from epoch 2 on, beyond the first.
RECORD_COUNTS = (9, 0, 14, 5, 12)  # Uneven files, one empty; 40 records.


class _SmallTurns(data.TFRecordFiles):
  """TFRecordFiles with rounds of 2 files and turns of 3 records, so tiny files cross many of both."""

  FILES_READ_AT_ONCE = 2
  RECORDS_PER_TURN = 3


def _context(pipeline, pipelines):
  return tf.distribute.InputContext(
      num_input_pipelines=pipelines, input_pipeline_id=pipeline, num_replicas_in_sync=pipelines
  )


def _write_records(directory):
  """Writes `RECORD_COUNTS` records to files part-0...; record k of file f holds the features of example `f * 100 + k`.

  Returns the file pattern and the value of every record, by file.
  """
  features, labels = trainer_testlib.classification_arrays(NUM_EXAMPLES)
  values, example = [], 0
  for index, count in enumerate(RECORD_COUNTS):
    with tf.io.TFRecordWriter(str(directory / f"part-{index}.tfrecord")) as writer:
      for k in range(count):
        feature = {
            "x": tf.train.Feature(float_list=tf.train.FloatList(value=features[example])),
            "y": tf.train.Feature(int64_list=tf.train.Int64List(value=[labels[example]])),
            "id": tf.train.Feature(int64_list=tf.train.Int64List(value=[index * 100 + k])),
        }
        writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
        example += 1
    values.append([index * 100 + k for k in range(count)])
  return str(directory / "part-*.tfrecord"), values


def _parse_id(record):
  value = tf.io.parse_single_example(record, {"id": tf.io.FixedLenFeature([], tf.int64)})["id"]
  return tf.cast(value, tf.float32), value


def _ids(dataset):
  """The labels of `dataset`'s elements (iterated without the autotuning model, whose iterators are slow to delete)."""
  return [int(element[1]) for element in input_pipeline.without_autotune_model(dataset).as_numpy_iterator()]


@pytest.mark.parametrize("shuffle", [0, 4])
@pytest.mark.parametrize("sharding", ["file", "data"])
def test_tfrecord_streams_start_at_any_position_as_if_read_from_the_start(tmp_path, sharding, shuffle):
  pattern, values = _write_records(tmp_path)
  provider = _SmallTurns(pattern, _parse_id, shuffle_buffer_size=shuffle, seed=4, sharding=sharding)
  for pipeline in range(2):
    context = _context(pipeline, 2)
    epoch = _ids(provider.get_dataset(context))
    if sharding == "file":  # files pipeline, pipeline + 2, ...
      assert sorted(epoch) == sorted(v for f in range(pipeline, len(values), 2) for v in values[f])
    else:  # one record in two of the one stream
      assert sorted(epoch) == sorted(_ids(_SmallTurns(pattern, _parse_id, sharding="data").get_dataset(context)))
    size = len(epoch)
    whole = _ids(provider.get_repeated_dataset(context, 0).take(3 * size + 20))
    assert whole[:size] == epoch  # epoch 0 is get_dataset's
    for e in range(3):  # every epoch holds the share once; shuffled, in another order
      assert sorted(whole[e * size : (e + 1) * size]) == sorted(epoch)
    assert (whole[size : 2 * size] != epoch) == bool(shuffle)
    for start in (7, size + 4, 2 * size + 3):  # inside turns, rounds and blocks of epoch 0; epochs 1 and 2
      assert _ids(provider.get_repeated_dataset(context, start).take(len(whole) - start)) == whole[start:]
    batches = input_pipeline.without_autotune_model(provider.get_repeated_batches(context, 4, size + 4).take(4))
    assert [int(v) for batch in batches.as_numpy_iterator() for v in batch[1]] == whole[size + 4 : size + 20]


def test_a_resumed_tfrecord_stream_reads_no_file_before_its_position(tmp_path):
  pattern, values = _write_records(tmp_path)
  provider = _SmallTurns(pattern, _parse_id, sharding="file")
  provider.record_counts(provider.files)  # Counted once, as a run does before its first resume.
  for path in provider.files[:2]:  # The first round (files 0 and 1): unreadable from now on.
    with open(path, "wb") as file:
      file.write(b"not a TFRecord")
  start = len(values[0]) + len(values[1]) + 4  # In the second round (files 2 and 3, turns of 3), epoch 0.
  assert _ids(provider.get_repeated_dataset(_context(0, 1), start).take(4)) == [301, 302, 203, 204]
  with pytest.raises(tf.errors.DataLossError):
    _ids(provider.get_repeated_dataset(_context(0, 1), 0).take(1))


def test_a_tfrecord_stream_from_the_start_counts_no_records_and_an_empty_share_is_empty(tmp_path):
  pattern, values = _write_records(tmp_path)
  provider = _SmallTurns(pattern, _parse_id, sharding="file")
  ids = _ids(provider.get_repeated_dataset(_context(0, 1), 0).take(sum(map(len, values)) + 2))
  assert ids == _ids(provider.get_repeated_dataset(_context(0, 1), 0).take(len(ids)))
  assert ids[-2:] == ids[:2]  # The second epoch starts as the first did.
  assert not provider.__dict__.get("_record_counts")  # Nothing was counted: from step 0 no position is needed.
  empty = tmp_path / "empty"
  empty.mkdir()
  tf.io.TFRecordWriter(str(empty / "part-0.tfrecord")).close()
  assert _ids(_SmallTurns(str(empty / "*.tfrecord"), _parse_id).get_repeated_dataset(_context(0, 1), 0)) == []


@pytest.mark.parametrize("shuffle", [False, True])
def test_in_memory_streams_start_at_any_position_as_if_read_from_the_start(shuffle):
  provider = data.InMemory(np.arange(11, dtype=np.float32), np.arange(11), shuffle=shuffle, seed=6)
  for pipeline in range(2):
    context = _context(pipeline, 2)
    epoch = _ids(provider.get_dataset(context))
    assert sorted(epoch) == list(range(pipeline, 11, 2))
    size = len(epoch)
    whole = _ids(provider.get_repeated_dataset(context, 0).take(3 * size))
    assert whole[:size] == epoch
    assert (whole[size : 2 * size] != epoch) == shuffle
    for start in (1, size, 2 * size + 1):
      assert _ids(provider.get_repeated_dataset(context, start).take(3 * size - start)) == whole[start:]


def test_from_function_starts_where_its_repeated_dataset_fn_says():
  calls = []

  def repeated(context, start):
    calls.append((context.input_pipeline_id, start))
    return tf.data.Dataset.counter(start).map(lambda i: (tf.cast(i, tf.float32), i % 5))

  provider = data.FromFunction(
      lambda context: tf.data.Dataset.range(5).map(lambda i: (tf.cast(i, tf.float32), i)), repeated_dataset_fn=repeated
  )
  assert _ids(provider.get_repeated_dataset(_context(1, 2), 12).take(4)) == [2, 3, 4, 0]
  assert calls == [(1, 12)]
  plain = data.FromFunction(lambda context: tf.data.Dataset.range(5).map(lambda i: (tf.cast(i, tf.float32), i)))
  assert _ids(plain.get_repeated_dataset(_context(0, 1), 12).take(4)) == [2, 3, 4, 0]  # read and skipped


def test_a_resume_that_reads_and_discards_says_so_and_names_the_providers_that_do_not(caplog):
  def two(context):
    return tf.data.Dataset.range(6).map(lambda i: (tf.cast(i, tf.float32), i))

  kinds = {
      "plain dataset": (data.as_provider(two(None)), False),
      "function": (data.FromFunction(two), False),
      "function with repeated_dataset_fn": (data.FromFunction(two, repeated_dataset_fn=lambda c, s: two(c)), True),
      "in memory": (data.InMemory(np.zeros(4, np.float32), np.zeros(4)), True),
  }
  assert {name: data.starts_at_any_position(p) for name, (p, _) in kinds.items()} == {
      name: starts for name, (_, starts) in kinds.items()
  }
  with caplog.at_level("INFO", logger="absl"):
    iterator = train_input.training_iterator(tf.distribute.get_strategy(), kinds["function"][0], 2, start_step=2)
  assert [int(label) for label in next(iterator)[1]] == [4, 5]
  assert (
      "Resuming at step 2: each input pipeline reads its data from the start and discards the examples of the "
      "first 2 steps, a cost that grows with the step (runner.data.InMemory, TFRecordFiles and FromFunction "
      "with a repeated_dataset_fn start at the step at once), so this run sees the batches of an uninterrupted one."
  ) in caplog.messages


def test_from_function_rejects_a_repeated_dataset_fn_that_is_not_one():
  with pytest.raises(TypeError) as error:
    data.FromFunction(lambda context: tf.data.Dataset.range(1), repeated_dataset_fn=3)
  assert str(error.value) == (
      "FromFunction's repeated_dataset_fn must be None or a function (input_context, start) -> tf.data.Dataset, got 3."
  )
  provider = data.FromFunction(lambda context: tf.data.Dataset.range(1), repeated_dataset_fn=lambda context, start: [])
  with pytest.raises(
      TypeError, match=r"^The dataset function '<lambda>' must return a tf.data.Dataset, returned list\.$"
  ):
    provider.get_repeated_dataset(_context(0, 1), 0)


def _provider(kind, tmp_path):
  features, labels = trainer_testlib.classification_arrays(NUM_EXAMPLES)
  if kind.startswith("in_memory"):
    return runner.data.InMemory(features, labels, shuffle=kind.endswith("shuffled"), seed=3)
  if kind == "function":  # starts its own stream at a position
    return runner.data.FromFunction(
        lambda context: tf.data.Dataset.from_tensor_slices((features, labels)),
        repeated_dataset_fn=lambda context, start: tf.data.Dataset.counter(start).map(
            lambda i: (tf.gather(features, i % NUM_EXAMPLES), tf.gather(labels, i % NUM_EXAMPLES))
        ),
    )
  if kind == "function_shuffled":  # a dataset that cannot start in the middle: read and skipped
    return runner.data.FromFunction(
        lambda context: tf.data.Dataset.from_tensor_slices((features, labels)).shuffle(40, 5)
    )
  sharding = "file" if "by_file" in kind else "data"
  pattern, _ = _write_records(tmp_path)
  return _SmallTurns(
      pattern,
      trainer_testlib.parse_classification_record,
      shuffle_buffer_size=6 if kind.endswith("shuffled") else 0,
      seed=7,
      sharding=sharding,
  )


def _train(strategy, model_dir, provider, steps):
  trainer = trainer_testlib.make_trainer(strategy, model_dir=model_dir, steps_per_loop=2)
  trainer.train(provider, global_batch_size=GLOBAL_BATCH, steps=steps)
  return trainer


@pytest.mark.parametrize(
    "kind",
    [
        "in_memory",
        "in_memory_shuffled",
        "function",
        "function_shuffled",
        "tfrecord_by_file",
        "tfrecord_by_file_shuffled",
        "tfrecord_by_record",
        "tfrecord_by_record_shuffled",
    ],
)
def test_a_run_resumed_at_any_step_ends_with_the_weights_of_an_uninterrupted_one(kind, tmp_path):
  one_device = tf.distribute.OneDeviceStrategy("/cpu:0")
  provider = _provider(kind, tmp_path)
  uninterrupted = _train(one_device, str(tmp_path / "whole"), provider, TOTAL_STEPS).model.get_weights()
  for stop in STOPS:
    assert _train(one_device, str(tmp_path / "resumed"), provider, stop).global_step == stop
  resumed = _train(one_device, str(tmp_path / "resumed"), provider, TOTAL_STEPS)
  assert resumed.global_step == TOTAL_STEPS
  for got, want in zip(resumed.model.get_weights(), uninterrupted, strict=True):
    np.testing.assert_array_equal(got, want)


def test_a_resume_on_training_files_added_or_emptied_says_so_in_one_warning(tmp_path, caplog):
  features, labels = trainer_testlib.classification_arrays(64)
  first, second = str(tmp_path / "part-0.tfrecord"), str(tmp_path / "part-1.tfrecord")
  trainer_testlib.write_classification_records(first, features[:32], labels[:32])
  workdir = str(tmp_path / "work")
  overrides = [
      "mode=train",
      "data.name=testlib.trainer_testlib:classification_records",
      f"data.files={tmp_path / 'part-*.tfrecord'}",
      "data.global_batch_size=8",
      "trainer.steps_per_loop=2",
  ]
  runner.run(runner.load_config(SYNTHETIC, [*overrides, "trainer.train_steps=4"]), workdir, quiet=True)

  def resumed(steps, *, command_line):
    """Resumes the run to `steps` through the command line or in this process; returns (then, now) of its warning."""
    if command_line:
      arguments = [f"--config={SYNTHETIC}", f"--workdir={workdir}", *(f"--config.{o}" for o in overrides)]
      status, _, stderr = process_testlib.runner_cli(
          [*arguments, f"--config.trainer.train_steps={steps}"], logs=f"{workdir}.logs"
      ).wait()
      assert status == 0, stderr[-3000:]
      output, warnings = stderr, process_testlib.warning_lines(stderr)
    else:
      caplog.clear()
      with caplog.at_level("INFO", logger="absl"):
        runner.run(runner.load_config(SYNTHETIC, [*overrides, f"trainer.train_steps={steps}"]), workdir, quiet=True)
      output, warnings = caplog.text, [
          record.getMessage() for record in caplog.records if record.levelname == "WARNING"
      ]
    assert "so this run sees the batches" not in output
    [warning] = warnings
    said = re.fullmatch(
        rf"Resuming at step {steps - 2} on other training data than the checkpoint's \(it was trained on (.+); the "
        rf"data now is (.+)\): reading the data from where a run that had always trained on it would be at step "
        rf"{steps - 2}, so this run does not see the batches of an uninterrupted one\.",
        warning,
    )
    assert said, warning
    return said.groups()

  def files(*sizes):
    return rf"{len(sizes)} TFRecord file\(s\) of {sum(sizes):,} bytes \(digest [0-9a-f]{{12}}\)"

  size = os.path.getsize(first)
  trainer_testlib.write_classification_records(second, features[32:], labels[32:])  # A file added.
  then, now = resumed(6, command_line=True)  # One warning line on stderr.
  assert re.fullmatch(files(size), then) and re.fullmatch(files(size, size), now), (then, now)
  open(first, "wb").close()  # A file emptied.
  then, emptied = resumed(8, command_line=False)
  assert then == now  # The checkpoint of step 6 holds the files it was trained on.
  assert re.fullmatch(files(0, size), emptied), emptied
