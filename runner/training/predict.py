"""Batch prediction: a model's outputs for every example of a split, once each, as TFRecord files of tf.train.Example.

Each example is paired with its position in the split before the split is sharded over the input pipelines and
batched; the batches are padded as evaluation pads them (`input_pipeline.for_evaluation`: a mask of 0 marks padding),
every replica's rows are gathered to every worker (`strategy.gather`), and the chief writes the real ones.
"""

import os
from typing import Any
import uuid

from absl import logging
import tensorflow as tf

from runner.data import checks as data_checks
from runner.data import pipeline as input_pipeline
from runner.data import providers as data_lib
from runner.training import loops
from runner.training import parameter_server_loops
from strategies.errors import ConfigError

DIRECTORY = "predictions"  # Under the workdir, in mode 'predict'.
EXAMPLES_PER_FILE = 100_000  # A file `part-NNNNN.tfrecord` holds at most this many examples.


def indexed(provider: Any) -> data_lib.DatasetShards:
  """The split of `provider` as one input pipeline reads it, each element `(element, its position)`, then sharded.

  `InMemory` arrays are read in their order, unshuffled, so a position is an array row. Every input pipeline
  reads the whole split and keeps its share of it (example i, i + n, ... of n pipelines).

  Raises:
    ConfigError: the split is infinite (it repeats).
  """
  if isinstance(provider, data_lib.InMemory):
    provider = data_lib.InMemory(*provider.elements)
  whole = provider.get_dataset(tf.distribute.InputContext())
  if whole.cardinality() == tf.data.INFINITE_CARDINALITY:
    raise ConfigError(
        "The prediction data is infinite (it repeats), so predicting all of it never ends; give data "
        "that does not repeat."
    )
  return data_lib.DatasetShards(tf.data.Dataset.zip(whole, tf.data.Dataset.range(2**62)))


def write(
    strategy: tf.distribute.Strategy,
    model: Any,
    provider: Any,
    global_batch_size: int,
    path: str,
    *,
    preprocess: Any = None,
) -> str:
  """Writes `model(features)` for every example of `provider` into the directory `path`, replacing it whole.

  `path` gets files `part-00000.tfrecord`, `part-00001.tfrecord`, ... of `tf.train.Example`s (with one input
  pipeline in the split's order; with several, each global batch holds every pipeline's share in turn), each
  with an int64 feature `index` (the example's position in the split: see `indexed`) and a float feature
  `outputs` (the model's output for it, its tensors flattened and concatenated in `tf.nest` order). The files
  are written into a new directory beside `path` and, once all are, moved into `path`, whatever else it held
  removed (`_replace`): a failure before leaves `path` as it was. Every worker runs the steps; only the chief
  writes. Under a ParameterServerStrategy the coordinator runs the model itself, as evaluation does
  (`parameter_server_loops.evaluation_strategy`).

  Args:
    strategy: the `tf.distribute.Strategy` the model was made under.
    model: the Keras model, called with `training=False`.
    provider: a `runner.data.DatasetProvider` of `(features, labels[, sample_weight])`.
    global_batch_size: examples per step over all replicas; a multiple of the replica count.
    path: the directory of the predictions (local or `gs://`).
    preprocess: None, or the task's `preprocess`, mapped over each batch's features.

  Returns:
    `path`.

  Raises:
    ConfigError: the batch size does not split over the replicas, or the data is infinite.
    DataError: the data cannot be read or parsed (`data_checks.step_error`).
  """
  input_pipeline.check_global_batch_size(strategy, global_batch_size)
  strategy = parameter_server_loops.evaluation_strategy(strategy)
  dataset, pipelines = input_pipeline.for_evaluation(
      strategy,
      indexed(provider),
      global_batch_size,
      bounded=False,
      preprocess=None if preprocess is None else lambda element: (preprocess(element[0]), *element[1:]),
  )

  def replica_step(batch: Any) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    element, index, _, mask = batch
    outputs = tf.nest.flatten(loops.float32_outputs(model(element[0], training=False)))
    rows = tf.shape(index)[0]
    return index, tf.concat([tf.cast(tf.reshape(t, [rows, -1]), tf.float32) for t in outputs], 1), mask

  step = loops.own_function(
      lambda iterator: [strategy.gather(t, axis=0) for t in strategy.run(replica_step, args=(next(iterator),))],
      autograph=False,
  )
  writes = strategy.extended.should_checkpoint
  # Beside `path`, its name not starting with path's: ram:// (and a listing by prefix) takes a prefix for a folder.
  temporary = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
  files: list[tf.io.TFRecordWriter] = []
  written = 0
  try:
    if writes:
      tf.io.gfile.makedirs(temporary)
    try:
      iterator = iter(dataset)
      while True:
        try:
          index, outputs, mask = (t.numpy() for t in step(iterator))
        except (tf.errors.InvalidArgumentError, tf.errors.DataLossError) as e:
          raise data_checks.step_error(e, provider, None, step=None, purpose="prediction") from None
        for row in (mask > 0).nonzero()[0] if writes else ():
          if written % EXAMPLES_PER_FILE == 0:
            if files:
              files[-1].close()
            files.append(tf.io.TFRecordWriter(os.path.join(temporary, f"part-{len(files):05d}.tfrecord")))
          files[-1].write(_example(index[row], outputs[row]))
          written += 1
        if not mask.any() or (pipelines == 1 and not mask.all()):  # One pipeline: its first padding is its last.
          break
    finally:
      for file in files:
        file.close()
    if writes:
      _replace(path, temporary)
      logging.info("Wrote the predictions of %d examples to %s.", written, path)
  finally:
    if tf.io.gfile.exists(temporary):
      tf.io.gfile.rmtree(temporary)
  return path


def _example(index: Any, outputs: Any) -> bytes:
  """A serialized `tf.train.Example` of `index` (int64) and `outputs` (floats)."""
  return tf.train.Example(
      features=tf.train.Features(
          feature={
              "index": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(index)])),
              "outputs": tf.train.Feature(float_list=tf.train.FloatList(value=outputs)),
          }
      )
  ).SerializeToString()


def _replace(path: str, temporary: str) -> None:
  """Moves the files of the directory `temporary` into the directory `path`, then removes whatever else it held.

  File by file, not the directory at once: not every TensorFlow file system renames a directory (ram:// does not).
  """
  new = tf.io.gfile.listdir(temporary)
  old = tf.io.gfile.listdir(path) if tf.io.gfile.isdir(path) else []
  tf.io.gfile.makedirs(path)
  for name in new:
    tf.io.gfile.rename(os.path.join(temporary, name), os.path.join(path, name), overwrite=True)
  for name in set(old) - set(new):
    stale = os.path.join(path, name.rstrip("/"))
    (tf.io.gfile.rmtree if tf.io.gfile.isdir(stale) else tf.io.gfile.remove)(stale)
