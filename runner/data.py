"""Input for the Trainer: unbatched datasets and the DatasetProvider interface."""

import abc

import tensorflow as tf


class DatasetProvider(abc.ABC):
  """Makes the input of one input pipeline.

  The Trainer calls `get_dataset` once per input pipeline (once per worker
  under multi-worker strategies) inside `distribute_datasets_from_function`,
  then batches the result by the per-replica batch size. Subclasses decide how
  to shard: by file or by example.
  """

  @abc.abstractmethod
  def get_dataset(self, input_context: tf.distribute.InputContext) -> tf.data.Dataset:
    """Returns this pipeline's share of the data, unbatched.

    Args:
      input_context: which pipeline this is (`input_pipeline_id` of
        `num_input_pipelines`) and the replica layout.

    Returns:
      An unbatched `tf.data.Dataset` of `(features, labels)` or
      `(features, labels, sample_weight)`, already sharded for this pipeline.
    """


class DatasetShards(DatasetProvider):
  """A plain unbatched `tf.data.Dataset`, sharded by example across pipelines."""

  def __init__(self, dataset: tf.data.Dataset):
    if not isinstance(dataset, tf.data.Dataset):
      raise TypeError(f"DatasetShards needs a tf.data.Dataset, got {type(dataset).__name__}.")
    self.dataset = dataset

  def get_dataset(self, input_context):
    if input_context.num_input_pipelines == 1:
      return self.dataset
    return self.dataset.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)


def as_provider(data) -> DatasetProvider:
  """Returns `data` as a DatasetProvider.

  Args:
    data: an unbatched `tf.data.Dataset` or a `DatasetProvider`.

  Raises:
    TypeError: `data` is neither.
  """
  if isinstance(data, DatasetProvider):
    return data
  if isinstance(data, tf.data.Dataset):
    return DatasetShards(data)
  raise TypeError(
      "data must be an unbatched tf.data.Dataset of (features, labels[, sample_weight]) "
      f"or a runner.data.DatasetProvider, got {type(data).__name__}.")
