"""Small shared pieces of the Trainer tests: a tiny model, its data and a Trainer factory."""

import keras
import numpy as np
import tensorflow as tf

import runner

NUM_FEATURES = 8
NUM_CLASSES = 4
MULTI_WORKER_BATCH = 16
MULTI_WORKER_STEPS = 6


def classification_arrays(num_examples=256, seed=0):
  """Returns `(features [n, 8] float32, labels [n] int32)`: Gaussian features, labels from a random linear map."""
  rng = np.random.default_rng(seed)
  features = rng.standard_normal((num_examples, NUM_FEATURES)).astype(np.float32)
  labels = np.argmax(features @ rng.standard_normal((NUM_FEATURES, NUM_CLASSES)), axis=1).astype(np.int32)
  return features, labels


def classification_data(num_examples=256, seed=0):
  """Returns the unbatched dataset of `classification_arrays`."""
  return tf.data.Dataset.from_tensor_slices(classification_arrays(num_examples, seed))


def parse_classification_record(record):
  """Parses a `tf.train.Example` of `classification_arrays`' example: float features "x", int label "y"."""
  parsed = tf.io.parse_single_example(
      record,
      {"x": tf.io.FixedLenFeature([NUM_FEATURES], tf.float32), "y": tf.io.FixedLenFeature([], tf.int64)},
  )
  return parsed["x"], tf.cast(parsed["y"], tf.int32)


def write_classification_records(path, features, labels):
  """Writes one tf.train.Example of "x" (features) and "y" (label) per example; returns each record's byte offset."""
  offsets, offset = [], 0
  with tf.io.TFRecordWriter(path) as writer:
    for x, y in zip(features, labels):
      record = tf.train.Example(
          features=tf.train.Features(
              feature={
                  "x": tf.train.Feature(float_list=tf.train.FloatList(value=x)),
                  "y": tf.train.Feature(int64_list=tf.train.Int64List(value=[y])),
              }
          )
      ).SerializeToString()
      writer.write(record)
      offsets.append(offset)
      offset += len(record) + 16  # Length, its CRC, the data, its CRC.
  return offsets


@runner.config_fields(files="", eval_files="")
def classification_records(config, split):
  """A config's dataset (`data.name='testlib.trainer_testlib:classification_records'`): `TFRecordFiles` of records
  of `write_classification_records`, `config.files` for training, `config.eval_files` (else the same) for evaluation.
  """
  pattern = config.eval_files if split == "eval" and config.eval_files else config.files
  return runner.data.TFRecordFiles(pattern, parse_classification_record)


def model_fn():
  """A Dense 8 -> 4 logits model with a declared input."""
  return keras.Sequential([keras.Input((NUM_FEATURES,)), keras.layers.Dense(NUM_CLASSES)])


def optimizer_fn():
  return keras.optimizers.SGD(learning_rate=0.1, momentum=0.9)


def make_trainer(strategy, **options):
  """Returns a classification Trainer of the tiny model, seeded, with `options` for the rest."""
  arguments = dict(model_fn=model_fn, optimizer_fn=optimizer_fn, task=runner.tasks.Classification(), seed=0)
  arguments.update(options)
  return runner.Trainer(strategy, **arguments)


def optimizer_variables(trainer):
  """Returns the optimizer's variables (slots, iterations, ...) as numpy arrays, in order."""
  return [np.array(v.numpy()) for v in trainer._parts.optimizer.variables]  # noqa: SLF001


class UnevenShards(runner.data.DatasetProvider):
  """The first pipeline of two gets 70% of the examples, the second the rest (one pipeline: all)."""

  def __init__(self, dataset):
    self.dataset = dataset

  def get_dataset(self, input_context):
    if input_context.num_input_pipelines == 1:
      return self.dataset
    assert input_context.num_input_pipelines == 2, input_context.num_input_pipelines
    first = int(0.7 * int(self.dataset.cardinality()))
    return self.dataset.take(first) if input_context.input_pipeline_id == 0 else self.dataset.skip(first)
