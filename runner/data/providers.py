"""Input for the Trainer: the providers of the `DatasetProvider` interface (`runner.interfaces`).

Providers: a plain dataset (`DatasetShards`), in-memory arrays (`InMemory`), a
function (`FromFunction`) and TFRecord files (`TFRecordFiles`).

How a provider shards across input pipelines is its `sharding` policy, one of
`SHARDING` ('auto', 'file' or 'data'; what each means: `runner.sharding_policies`).
"""

from collections.abc import Callable, Sequence
import re
from typing import Any

from absl import logging
import tensorflow as tf

from runner.interfaces import DatasetProvider
from strategies.errors import ConfigError


class DataError(ConfigError):
  """The data does not fit the model or the task, cannot be read, or holds NaN or inf values.

  A mistake in the input, like any ConfigError: the message names what was
  found (the element spec, the label value, the file and record, the step)
  and what was expected; the CLI prints it as one `error:` line and exits 2.
  See `runner.data.checks`.
  """


class DatasetShards(DatasetProvider):
  """A plain unbatched `tf.data.Dataset`, sharded by example across pipelines."""

  def __init__(self, dataset: tf.data.Dataset) -> None:
    if not isinstance(dataset, tf.data.Dataset):
      raise TypeError(f"DatasetShards needs a tf.data.Dataset, got {type(dataset).__name__}.")
    self.dataset = dataset

  def get_dataset(self, input_context: tf.distribute.InputContext) -> tf.data.Dataset:
    """As `DatasetProvider.get_dataset`: this input pipeline's share of `dataset`."""
    return self._by_example(self.dataset, input_context)


def as_provider(data: Any, *, source: str = "data") -> DatasetProvider:
  """Returns `data` as a DatasetProvider.

  Args:
    data: an unbatched `tf.data.Dataset` or a `DatasetProvider`.
    source: what `data` is, for the message, e.g. "data" or
      "what the dataset 'x' returned".

  Raises:
    ConfigError: `data` is neither.
  """
  if isinstance(data, DatasetProvider):
    return data
  if isinstance(data, tf.data.Dataset):
    return DatasetShards(data)
  raise ConfigError(
      f"{source} must be an unbatched tf.data.Dataset of (features, labels[, sample_weight]) "
      f"or a runner.data.DatasetProvider, got {type(data).__name__}."
  )


def known_num_examples(data: Any) -> int | None:
  """Returns the number of examples in `data` where it is known without reading it, else None.

  Known for `InMemory` arrays (the built-in datasets return those) and for a
  `tf.data.Dataset` (or a `DatasetShards` of one) whose cardinality TensorFlow
  knows statically; never counted by iterating.

  Args:
    data: a `tf.data.Dataset` or a `DatasetProvider`.
  """
  if isinstance(data, InMemory):
    return data.num_examples
  dataset = data.dataset if isinstance(data, DatasetShards) else data
  if isinstance(dataset, tf.data.Dataset):
    cardinality = int(dataset.cardinality())
    return cardinality if cardinality >= 0 else None
  return None


class InMemory(DatasetProvider):
  """Arrays held in memory, sharded by example across input pipelines.

  Each pipeline takes every `num_input_pipelines`-th example (a disjoint share)
  and, if asked, shuffles its share (all of it, anew each epoch). The Trainer
  repeats training data itself.
  """

  def __init__(
      self, features: Any, labels: Any, sample_weight: Any = None, *, shuffle: bool = False, seed: int | None = None
  ) -> None:
    """Keeps the arrays; they become a dataset in `get_dataset`.

    Args:
      features: an array, or a nest (dict, tuple) of arrays, with examples on
        the first axis.
      labels: an array with the same number of examples.
      sample_weight: None, or an array with the same number of examples.
      shuffle: shuffle the examples (each epoch anew).
      seed: the shuffle seed; None for a random order.

    Raises:
      ConfigError: the arrays disagree on the number of examples, or it is 0.
    """
    elements = (features, labels) if sample_weight is None else (features, labels, sample_weight)
    counts = {len(a) for a in tf.nest.flatten(elements)}
    if len(counts) != 1 or 0 in counts:
      raise ConfigError(
          "InMemory needs arrays with the same, non-zero number of examples on their first axis, got "
          f"{sorted(counts)}."
      )
    self.elements = elements
    self.num_examples = counts.pop()
    self.shuffle = shuffle
    self.seed = seed

  def get_dataset(self, input_context: tf.distribute.InputContext) -> tf.data.Dataset:
    """As `DatasetProvider.get_dataset`: this input pipeline's share of the elements, shuffled if asked."""
    dataset = self._by_example(tf.data.Dataset.from_tensor_slices(self.elements), input_context)
    if self.shuffle:
      dataset = dataset.shuffle(self.num_examples, seed=self.seed, reshuffle_each_iteration=True)
    return dataset


class FromFunction(DatasetProvider):
  """A Python function that makes each input pipeline's dataset.

  The function gets the `tf.distribute.InputContext` and returns that
  pipeline's unbatched share, the contract of `DatasetProvider.get_dataset`;
  it decides how to shard (`input_context.input_pipeline_id` of
  `input_context.num_input_pipelines`). Data from a Python generator fits
  here through `tf.data.Dataset.from_generator`. A `sharding` of 'file' or
  'data' does not apply, and says so in one logged line.
  """

  def __init__(self, dataset_fn: Callable[[tf.distribute.InputContext], tf.data.Dataset]) -> None:
    """Keeps the function; it runs once per input pipeline in `get_dataset`.

    Args:
      dataset_fn: `fn(input_context) -> tf.data.Dataset`.

    Raises:
      TypeError: `dataset_fn` is not callable.
    """
    if not callable(dataset_fn):
      raise TypeError(f"FromFunction needs a function input_context -> tf.data.Dataset, got {dataset_fn!r}.")
    self.dataset_fn = dataset_fn

  def get_dataset(self, input_context: tf.distribute.InputContext) -> tf.data.Dataset:
    """As `DatasetProvider.get_dataset`: what the function returns for `input_context`."""
    if self.sharding in ("file", "data"):
      self._say_once(
          logging.warning,
          "FromFunction: sharding=%r does not apply; the function %r decides how each input "
          "pipeline's data is sharded.",
          self.sharding,
          getattr(self.dataset_fn, "__name__", self.dataset_fn),
      )
    dataset = self.dataset_fn(input_context)
    if not isinstance(dataset, tf.data.Dataset):
      raise TypeError(
          f"The dataset function {getattr(self.dataset_fn, '__name__', self.dataset_fn)!r} must return a "
          f"tf.data.Dataset, returned {type(dataset).__name__}."
      )
    return dataset


class TFRecordFiles(DatasetProvider):
  """TFRecord files, sharded across input pipelines by file or by record.

  With `sharding` 'file', pipeline `i` of `n` reads files `i, i + n, i + 2n,
  ...` of the sorted file list; with fewer files than pipelines some
  pipeline would get none, so it shards by record instead and says so in one
  logged warning. With 'data', every pipeline reads every file and keeps
  records `i, i + n, ...` of the same stream. 'auto' (also None) is 'file'
  when there are at least as many files as pipelines, else 'data' with one
  logged info line. Either way the shares are disjoint and cover every record
  once per epoch; a share is empty only if its files are (by file) or if
  there are fewer records than pipelines (by record).

  The record stream is a function of the file list alone, the same on every
  host: up to `FILES_READ_AT_ONCE` files are read at once, in parallel,
  `RECORDS_PER_TURN` records from each in turn (TensorFlow's autotuned cycle
  depends on the host's cores, and one record per turn would cost each
  record a turn of the interleave; docs/benchmarks.md#input-and-evaluation).

  The Trainer reads batches (`get_batches`, `get_repeated_batches`): a batch
  of serialized records is read, then parsed by one vectorized call of
  `parse_fn` (`tf.vectorized_map`, which turns e.g. `parse_single_example`
  into `parse_example`), several batches at once. That needs every part
  `parse_fn` returns to have a fixed shape, and TensorFlow to vectorize each
  of its ops; otherwise (said in one logged line) records are parsed one by
  one, as in `get_dataset`. Either way the batches hold the same examples in
  the same order. When every record is kept in the stream's order (sharding
  by file, no shuffle) the batches are cut from the files' turns as they
  come, with no step per record. A record that cannot be read fails the
  first batch that needs its turn's records: the batch it is in or one
  before. (A random op in `parse_fn` then draws for a whole batch at once:
  other values than record by record, as deterministic for a seeded op.)
  """

  FILES_READ_AT_ONCE = 8
  RECORDS_PER_TURN = 32

  def __init__(
      self,
      file_pattern: str | Sequence[str],
      parse_fn: Callable[[tf.Tensor], Any],
      *,
      shuffle_buffer_size: int = 0,
      seed: int | None = None,
      compression_type: str | None = None,
      sharding: str | None = None,
  ) -> None:
    """Lists the files now, so a pattern that matches nothing fails here.

    Args:
      file_pattern: a glob pattern (or a list of them), local or e.g. `gs://`.
      parse_fn: `fn(serialized_record) -> (features, labels[, sample_weight])`,
        traced by `tf.data.Dataset.map`.
      shuffle_buffer_size: 0 to keep the order; else the record shuffle buffer
        (and the file order is shuffled too when sharding by file).
      seed: the shuffle seed; None for a random order.
      compression_type: None, 'GZIP' or 'ZLIB'.
      sharding: 'auto', 'file' or 'data' (see the class); None leaves the
        choice to `config.data.sharding` under `runner.run`, else 'auto'.

    Raises:
      ConfigError: no file matches `file_pattern`, or `sharding` is not one
        of `SHARDING`.
      TypeError: `parse_fn` is not callable.
    """
    patterns = [file_pattern] if isinstance(file_pattern, str) else list(file_pattern)
    self.files = sorted({f for pattern in patterns for f in tf.io.gfile.glob(pattern)})
    if not self.files:
      raise ConfigError(f"No TFRecord file matches {file_pattern!r}.")
    if not callable(parse_fn):
      raise TypeError(f"TFRecordFiles needs a parse function, got {parse_fn!r}.")
    self.sharding = sharding
    self.file_pattern = file_pattern
    self.parse_fn = parse_fn
    self.shuffle_buffer_size = shuffle_buffer_size
    self.seed = seed
    self.compression_type = compression_type

  def get_dataset(self, input_context: tf.distribute.InputContext) -> tf.data.Dataset:
    """As `DatasetProvider.get_dataset`: this input pipeline's records, parsed."""
    return self._parsed(self._records(input_context))

  def get_repeated_dataset(self, input_context: tf.distribute.InputContext, start: int) -> tf.data.Dataset:
    """As `DatasetProvider.get_repeated_dataset`, skipping serialized records before parsing them."""
    return self._parsed(self._records(input_context, repeated=True, start=start))

  def get_batches(self, input_context: tf.distribute.InputContext, batch_size: int) -> tf.data.Dataset:
    """As `DatasetProvider.get_batches`; a batch of records is parsed at once where `parse_fn` vectorizes."""
    return self._parsed_batches(input_context, batch_size, repeated=False, start=0)

  def get_repeated_batches(
      self, input_context: tf.distribute.InputContext, batch_size: int, start: int
  ) -> tf.data.Dataset:
    """As `DatasetProvider.get_repeated_batches`, skipping records before parsing and parsing a batch at once."""
    return self._parsed_batches(input_context, batch_size, repeated=True, start=start)

  def _by_file(self, num_pipelines: int) -> bool:
    """Returns whether `num_pipelines` pipelines shard by file; says once when 'file' or 'auto' falls back."""
    if self.sharding == "data":
      return False
    if len(self.files) >= num_pipelines:
      return True
    self._say_once(
        logging.warning if self.sharding == "file" else logging.info,
        "TFRecordFiles: %d file(s) match %r for %d input pipelines, too few to shard by file; sharding by "
        "example (sharding=%r): every pipeline reads every file and keeps one record in %d.",
        len(self.files),
        self.file_pattern,
        num_pipelines,
        self.sharding or "auto",
        num_pipelines,
    )
    return False

  def _turns(self, input_context: tf.distribute.InputContext) -> tuple[tf.data.Dataset, bool]:
    """Returns `(turns, by_file)`: this pipeline's files read in turns of `RECORDS_PER_TURN` records (a vector each)."""
    num_pipelines, pipeline = input_context.num_input_pipelines, input_context.input_pipeline_id
    by_file = self._by_file(num_pipelines)
    chosen = self.files[pipeline::num_pipelines] if by_file else self.files
    files = tf.data.Dataset.from_tensor_slices(chosen)
    if by_file and self.shuffle_buffer_size:
      files = files.shuffle(len(chosen), seed=self.seed, reshuffle_each_iteration=True)
    turns = files.interleave(
        lambda path: tf.data.TFRecordDataset(path, compression_type=self.compression_type).batch(self.RECORDS_PER_TURN),
        cycle_length=min(len(chosen), self.FILES_READ_AT_ONCE),
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=True,
    )
    return turns, by_file

  def _records(
      self, input_context: tf.distribute.InputContext, *, repeated: bool = False, start: int = 0
  ) -> tf.data.Dataset:
    """This pipeline's serialized records (repeated: without end, from record `start`), shuffled if asked."""
    turns, by_file = self._turns(input_context)
    return self._records_of(turns, by_file, input_context, repeated=repeated, start=start)

  def _records_of(
      self,
      turns: tf.data.Dataset,
      by_file: bool,
      input_context: tf.distribute.InputContext,
      *,
      repeated: bool,
      start: int,
  ) -> tf.data.Dataset:
    """The records of `turns` (see `_turns`) for this pipeline; the shuffle comes before parsing."""
    records = turns.unbatch()
    if not by_file:
      records = records.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    if self.shuffle_buffer_size:
      records = records.shuffle(self.shuffle_buffer_size, seed=self.seed, reshuffle_each_iteration=True)
    if repeated:
      records = records.repeat()
    return records.skip(start) if start else records

  def _record_batches(
      self,
      turns: tf.data.Dataset,
      by_file: bool,
      records: tf.data.Dataset,
      batch_size: int,
      *,
      repeated: bool,
      start: int,
  ) -> tf.data.Dataset:
    """Batches of serialized records: cut from `turns` where every turn is kept whole and in order, else of `records`.

    `turns, by_file` are `_turns`'s; `records` is `_records_of` them, for the same `repeated` and `start`.
    """
    if by_file and not self.shuffle_buffer_size and start % batch_size == 0:
      batches = (turns.repeat() if repeated else turns).rebatch(batch_size, drop_remainder=repeated)
      return batches.skip(start // batch_size) if start else batches
    return records.batch(batch_size, drop_remainder=repeated)

  def _parsed(self, records: tf.data.Dataset) -> tf.data.Dataset:
    return records.map(self.parse_fn, num_parallel_calls=tf.data.AUTOTUNE)

  def _parsed_batches(
      self, input_context: tf.distribute.InputContext, batch_size: int, *, repeated: bool, start: int
  ) -> tf.data.Dataset:
    """Parsed batches of records (repeated: full ones, from record `start`), by a vectorized `parse_fn` if it can."""
    turns, by_file = self._turns(input_context)
    records = self._records_of(turns, by_file, input_context, repeated=repeated, start=start)
    one_by_one = self._parsed(records)
    spec = one_by_one.element_spec
    why_not = None
    if not all(isinstance(s, tf.TensorSpec) and s.shape.is_fully_defined() for s in tf.nest.flatten(spec)):
      why_not = f"it returns parts without a fixed shape ({spec})"
    else:
      batches = self._record_batches(turns, by_file, records, batch_size, repeated=repeated, start=start)
      try:
        parsed = batches.map(self._parse_batch, num_parallel_calls=tf.data.AUTOTUNE)
      except (ValueError, TypeError, NotImplementedError) as error:  # An op without a vectorization.
        reason = re.search(r"No pfor vectorization defined for \S+", str(error))
        why_not = reason.group() if reason else type(error).__name__
      else:
        size = batch_size if repeated else None
        if parsed.element_spec == tf.nest.map_structure(lambda s: tf.TensorSpec([size, *s.shape], s.dtype), spec):
          return parsed
        why_not = f"vectorized, it gives {parsed.element_spec}"  # e.g. a list where one record gives a tuple
    self._say_once(
        logging.info,
        "TFRecordFiles: parsing record by record, as parse_fn %r does not vectorize: %s.",
        getattr(self.parse_fn, "__name__", self.parse_fn),
        why_not,
    )
    return one_by_one.batch(batch_size, drop_remainder=repeated)

  def _parse_batch(self, records: tf.Tensor) -> Any:
    return tf.vectorized_map(self.parse_fn, records, fallback_to_while_loop=False)
