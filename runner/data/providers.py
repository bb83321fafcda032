"""Input for the Trainer: the providers of the `DatasetProvider` interface (`runner.interfaces`).

Providers: a plain dataset (`DatasetShards`), in-memory arrays (`InMemory`), a
function (`FromFunction`) and TFRecord files (`TFRecordFiles`).

How a provider shards across input pipelines is its `sharding` policy, one of
`SHARDING` ('auto', 'file' or 'data'; what each means: `runner.sharding_policies`).
"""

import bisect
from collections.abc import Callable, Sequence
import concurrent.futures
import contextlib
import hashlib
import itertools
import json
import os
import random
import re
from typing import Any

from absl import logging
import numpy as np
import tensorflow as tf

from runner.interfaces import DatasetProvider
from runner.workdir import remote
from strategies.errors import ConfigError

# Epochs and positions of an endless stream are numbered up to this bound, never reached in practice.
_ENDLESS = 2**62


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
  cardinality = int(dataset.cardinality()) if isinstance(dataset, tf.data.Dataset) else -1
  return cardinality if cardinality >= 0 else None


def holds_no_examples(data: Any) -> bool:
  """Whether `data` (a dataset or a provider) is known to hold no example, found reading at most one record.

  Known where the number of examples is (`known_num_examples`) and for
  `TFRecordFiles` (whose files are read up to their first record); False
  where it is not known, or a file cannot be read (that is named where the
  data is read).
  """
  if isinstance(data, TFRecordFiles):
    try:
      return next(iter(tf.data.TFRecordDataset(data.files, compression_type=data.compression_type)), None) is None
    except tf.errors.DataLossError:
      return False
  return known_num_examples(data) == 0


def description(provider: DatasetProvider) -> str:
  """Returns what tells `provider`'s data from other data, in words and a digest: what a checkpoint keeps of its input.

  `TFRecordFiles`: the number of files, their bytes, and a digest of their
  names (from their common folder on, so a copy elsewhere is the same data)
  and sizes, found without opening a file; `InMemory`: the number of
  examples and a digest of the arrays. Another provider cannot be told from
  other data without reading it: its kind alone.
  """
  digest = hashlib.sha256()
  if isinstance(provider, TFRecordFiles):
    with concurrent.futures.ThreadPoolExecutor(32) as pool:  # A stat is a request on a remote file system (gs://).
      sizes = list(pool.map(lambda path: tf.io.gfile.stat(path).length, provider.files))
    folder = os.path.dirname(os.path.commonprefix(provider.files))
    digest.update(json.dumps([[path[len(folder) :] for path in provider.files], sizes]).encode())
    return f"{len(sizes)} TFRecord file(s) of {sum(sizes):,} bytes (digest {digest.hexdigest()[:12]})"
  if isinstance(provider, InMemory):
    for array in map(np.asarray, tf.nest.flatten(provider.elements)):
      digest.update(f"{array.dtype}{array.shape}".encode())
      if array.dtype != object:  # An array of Python objects holds pointers.
        digest.update(np.ascontiguousarray(array).data)
    return f"{provider.num_examples:,} examples in memory (digest {digest.hexdigest()[:12]})"
  return f"a {type(provider).__name__}"


def _key(seed: int, *values: Any) -> tf.Tensor:
  """Returns the key of tf.random's stateless ops for `seed` with each of `values` folded in.

  The same inputs give the same key in a traced function and eagerly.
  """
  key = tf.constant([seed, 0], tf.int64)
  for value in values:
    key = tf.random.experimental.stateless_fold_in(key, tf.cast(value, tf.int64))
  return key


def _positions_from(start: int, step: int = 1) -> tf.data.Dataset:
  """The endless positions `start, start + step, ...` (int64): `Dataset.counter` without its `scan`.

  In TensorFlow 2.21 a counter built outside a `tf.function` adds its scan
  function to the process's global graph, where it stays: one per input
  pipeline per run, which a sweep of runs in one process accumulates.
  """
  return tf.data.Dataset.range(start, _ENDLESS, step).repeat()  # Endless in cardinality too, as a counter is.


def starts_at_any_position(provider: DatasetProvider) -> bool:
  """Whether `provider`'s repeated stream starts at a position without reading the examples before it.

  True for `InMemory`, `TFRecordFiles` and a `FromFunction` with a
  `repeated_dataset_fn`, and for a provider of the user's own that makes its
  repeated stream itself; a plain dataset, another `FromFunction` and a
  provider that keeps the defaults read and discard them.
  """
  if isinstance(provider, FromFunction):
    return provider.repeated_dataset_fn is not None
  made = type(provider)
  return (
      made.get_repeated_dataset is not DatasetProvider.get_repeated_dataset
      or made.get_repeated_batches is not DatasetProvider.get_repeated_batches
  )


class InMemory(DatasetProvider):
  """Arrays held in memory, sharded by example across input pipelines.

  Each pipeline takes every `num_input_pipelines`-th example (a disjoint share)
  and, if asked, shuffles its share (all of it, anew each epoch). The Trainer
  repeats training data itself.

  Position `p` of a pipeline's endless stream is example `p % n` of its share
  of `n` examples in epoch `p // n`; shuffled, epoch `e`'s order is the
  permutation `tf.raw_ops.RandomIndexShuffle` (`tf.random.experimental.index_shuffle`
  with one seed per position) picks for the key of the seed and the pipeline,
  and `e`. So a stream starts at any position at once
  (`get_repeated_dataset`), with nothing read or discarded before it: a
  resumed run costs the same at step 100 and at step 10^6
  (docs/benchmarks.md#resume-cost). With `seed=None` the provider draws one
  seed when it is made: its order is random across processes, and a resumed
  run in a new process sees other batches.
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
    self._stream_seed = random.SystemRandom().randrange(2**31) if seed is None else seed

  # Examples gathered at once where a stream is read one by one (`get_dataset`).
  _GATHERED_AT_ONCE = 1024

  def get_dataset(self, input_context: tf.distribute.InputContext) -> tf.data.Dataset:
    """As `DatasetProvider.get_dataset`: this input pipeline's share of the elements, shuffled if asked (epoch 0)."""
    return self.get_batches(input_context, self._GATHERED_AT_ONCE).unbatch()

  def get_repeated_dataset(self, input_context: tf.distribute.InputContext, start: int) -> tf.data.Dataset:
    """As `DatasetProvider.get_repeated_dataset`, in constant time: the stream is a function of the position."""
    return self.get_repeated_batches(input_context, self._GATHERED_AT_ONCE, start).unbatch()

  def get_batches(self, input_context: tf.distribute.InputContext, batch_size: int) -> tf.data.Dataset:
    """As `DatasetProvider.get_batches`: epoch 0 of the stream, a batch gathered at once."""
    return self._gathered(tf.data.Dataset.range(self._share_size(input_context)).batch(batch_size), input_context)

  def get_repeated_batches(
      self, input_context: tf.distribute.InputContext, batch_size: int, start: int
  ) -> tf.data.Dataset:
    """As `DatasetProvider.get_repeated_batches`, in constant time, a batch gathered at once."""
    firsts = _positions_from(start, batch_size)
    return self._gathered(firsts.map(lambda first: first + tf.range(batch_size, dtype=tf.int64)), input_context)

  def _share_size(self, input_context: tf.distribute.InputContext) -> int:
    """The examples of this pipeline's share: `input_pipeline_id, + num_input_pipelines, ...`."""
    return len(range(input_context.input_pipeline_id, self.num_examples, input_context.num_input_pipelines))

  def _gathered(self, positions: tf.data.Dataset, input_context: tf.distribute.InputContext) -> tf.data.Dataset:
    """The batches of examples at `positions` (vectors, int64) of this pipeline's endless stream (see the class)."""
    self._say_if_file_sharding_asked()
    pipelines, pipeline = input_context.num_input_pipelines, input_context.input_pipeline_id
    share_size = self._share_size(input_context)
    arrays = tf.nest.map_structure(tf.convert_to_tensor, self.elements)
    if not share_size:  # Fewer examples than pipelines: nothing for this one, whatever the positions.
      return positions.take(0).map(lambda _: tf.nest.map_structure(lambda array: array[:0], arrays))

    def examples(positions: tf.Tensor) -> Any:
      epochs, indices = positions // share_size, positions % share_size
      if self.shuffle:  # A permutation per epoch: the key of the seed and the pipeline, and the epoch.
        keys = tf.concat([tf.tile(_key(self._stream_seed, pipeline)[None], [tf.size(epochs), 1]), epochs[:, None]], 1)
        indices = tf.raw_ops.RandomIndexShuffle(index=indices, seed=keys, max_index=share_size - 1)
      return tf.nest.map_structure(lambda array: tf.gather(array, pipeline + pipelines * indices), arrays)

    return positions.map(examples, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)


class FromFunction(DatasetProvider):
  """A Python function that makes each input pipeline's dataset.

  The function gets the `tf.distribute.InputContext` and returns that
  pipeline's unbatched share, the contract of `DatasetProvider.get_dataset`;
  it decides how to shard (`input_context.input_pipeline_id` of
  `input_context.num_input_pipelines`). Data from a Python generator fits
  here through `tf.data.Dataset.from_generator`. A `sharding` of 'file' or
  'data' does not apply, and says so in one logged line.

  A dataset the function returns cannot be started in the middle: to resume
  at position `start` its repetition is read from the beginning and `start`
  examples are discarded (`DatasetProvider.get_repeated_dataset`), a cost
  that grows with the step. A `repeated_dataset_fn` that knows its data can
  start the endless stream at the position itself, e.g. at once from
  `tf.data.Dataset.range(start, 2**62)` mapped to examples; resuming then
  costs what that function costs. (`Dataset.counter` works too, but in
  TensorFlow 2.21 each one leaves a function in the global graph for good.)
  """

  def __init__(
      self,
      dataset_fn: Callable[[tf.distribute.InputContext], tf.data.Dataset],
      *,
      repeated_dataset_fn: Callable[[tf.distribute.InputContext, int], tf.data.Dataset] | None = None,
  ) -> None:
    """Keeps the functions; they run once per input pipeline in `get_dataset` and `get_repeated_dataset`.

    Args:
      dataset_fn: `fn(input_context) -> tf.data.Dataset`.
      repeated_dataset_fn: None, or `fn(input_context, start) -> tf.data.Dataset`:
        the pipeline's data repeated without end from position `start` on,
        under the contract of `DatasetProvider.get_repeated_dataset` (equal to
        `fn(input_context, 0).skip(start)`, each epoch holding the examples of
        `dataset_fn(input_context)` once).

    Raises:
      TypeError: a function is not callable.
    """
    if not callable(dataset_fn):
      raise TypeError(f"FromFunction needs a function input_context -> tf.data.Dataset, got {dataset_fn!r}.")
    if repeated_dataset_fn is not None and not callable(repeated_dataset_fn):
      raise TypeError(
          "FromFunction's repeated_dataset_fn must be None or a function (input_context, start) -> tf.data.Dataset, "
          f"got {repeated_dataset_fn!r}."
      )
    self.dataset_fn = dataset_fn
    self.repeated_dataset_fn = repeated_dataset_fn

  def get_dataset(self, input_context: tf.distribute.InputContext) -> tf.data.Dataset:
    """As `DatasetProvider.get_dataset`: what the function returns for `input_context`."""
    if self.sharding in ("file", "data"):
      self._say_once(
          logging.warning,
          f"FromFunction: sharding={self.sharding!r} does not apply; the function {_name(self.dataset_fn)!r} decides "
          "how each input pipeline's data is sharded.",
      )
    return _called(self.dataset_fn, input_context)

  def get_repeated_dataset(self, input_context: tf.distribute.InputContext, start: int) -> tf.data.Dataset:
    """As `DatasetProvider.get_repeated_dataset`: `repeated_dataset_fn`'s stream, else the default's (read, skipped)."""
    if self.repeated_dataset_fn is None:
      return super().get_repeated_dataset(input_context, start)
    return _called(self.repeated_dataset_fn, input_context, start)


def _name(function: Callable[..., Any]) -> Any:
  return getattr(function, "__name__", function)


def _called(function: Callable[..., Any], *args: Any) -> tf.data.Dataset:
  """Returns what `function(*args)` returns if it is a `tf.data.Dataset`; else raises TypeError naming both."""
  dataset = function(*args)
  if not isinstance(dataset, tf.data.Dataset):
    raise TypeError(
        f"The dataset function {_name(function)!r} must return a tf.data.Dataset, returned {type(dataset).__name__}."
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

  The record stream is a function of the file list and the seed alone, the
  same on every host: an epoch reads its files in rounds of up to
  `FILES_READ_AT_ONCE` files at once, in parallel, `RECORDS_PER_TURN`
  records from each in turn until the round's files are used up
  (TensorFlow's autotuned cycle depends on the host's cores, and one record
  per turn would cost each record a turn of the interleave;
  docs/benchmarks.md#input-and-evaluation). Shuffled, the file order (by
  file) is drawn anew each epoch, and each consecutive block of
  `shuffle_buffer_size` records is permuted, anew each epoch
  (`tf.random.experimental.stateless_shuffle`): where a record lands is a
  function of its position, the seed and the epoch.

  So the repeated stream starts at any position without reading what comes
  before (`get_repeated_dataset`): from the files' record counts (counted
  when a stream first starts past 0, once per provider, reading every file
  once: the cost of a resume does not grow with its step, but with the
  data; a run from step 0 counts nothing) the round, turn and record it falls
  in are computed (`_turns_from`); the files of that round
  are entered by skipping records unparsed (TFRecord framing is read, not
  the data; a GZIP or ZLIB file is decompressed up to there), and a
  shuffled stream reads the one block it starts in. With `seed=None` the
  provider draws one seed when it is made: its order is random across
  processes, and a resumed run in a new process sees other batches.

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
      shuffle_buffer_size: 0 to keep the order; else the records are
        shuffled in consecutive blocks of this many, anew each epoch (and the
        file order is shuffled too when sharding by file).
      seed: the shuffle seed; None for a random order.
      compression_type: None, 'GZIP' or 'ZLIB'.
      sharding: 'auto', 'file' or 'data' (see the class); None leaves the
        choice to `config.data.sharding` under `runner.run`, else 'auto'.

    Raises:
      ConfigError: no file matches `file_pattern`, it matches a local folder,
        or `sharding` is not one of `SHARDING`.
      TypeError: `parse_fn` is not callable.
    """
    self.files = sorted(set(tf.io.gfile.glob(file_pattern)))  # One pattern or a list of them.
    if not self.files:
      raise ConfigError(f"No TFRecord file matches {file_pattern!r}.")
    directories = [f for f in self.files if not remote.is_remote(f) and os.path.isdir(f)]  # A stat each, local only.
    if directories:
      raise ConfigError(
          f"{file_pattern!r} matches the folder {directories[0]!r}, not a TFRecord file; name the files, e.g. "
          f"{os.path.join(directories[0], '*.tfrecord')!r}."
      )
    if not callable(parse_fn):
      raise TypeError(f"TFRecordFiles needs a parse function, got {parse_fn!r}.")
    self.sharding = sharding
    self.file_pattern = file_pattern
    self.parse_fn = parse_fn
    self.shuffle_buffer_size = shuffle_buffer_size
    self.seed = seed
    self._stream_seed = random.SystemRandom().randrange(2**31) if seed is None else seed
    self.compression_type = compression_type
    self._record_counts: dict[str, int] = {}  # Path -> records, counted once (`record_counts`).

  def get_dataset(self, input_context: tf.distribute.InputContext) -> tf.data.Dataset:
    """As `DatasetProvider.get_dataset`: this input pipeline's records (epoch 0 of its stream), parsed."""
    return self._parsed(self._stream(input_context, repeated=False, start=0))

  def get_repeated_dataset(self, input_context: tf.distribute.InputContext, start: int) -> tf.data.Dataset:
    """As `DatasetProvider.get_repeated_dataset`, started at `start` without reading the records before it."""
    return self._parsed(self._stream(input_context, repeated=True, start=start))

  def get_batches(self, input_context: tf.distribute.InputContext, batch_size: int) -> tf.data.Dataset:
    """As `DatasetProvider.get_batches`; a batch of records is parsed at once where `parse_fn` vectorizes."""
    return self._parsed_batches(input_context, batch_size, repeated=False, start=0)

  def get_repeated_batches(
      self, input_context: tf.distribute.InputContext, batch_size: int, start: int
  ) -> tf.data.Dataset:
    """As `DatasetProvider.get_repeated_batches`, started as `get_repeated_dataset` and parsing a batch at once."""
    return self._parsed_batches(input_context, batch_size, repeated=True, start=start)

  def record_counts(self, files: Sequence[str]) -> list[int]:
    """Returns the number of records in each of `files` (of `self.files`), counted once per provider and kept.

    Counting reads each file once (in batches of records, without parsing);
    a resumed stream needs the counts to find where its position is.
    """
    counts = self._record_counts
    with tf.init_scope():  # Eager even where a dataset function is traced (parameter servers' per-worker datasets).
      for path in files:
        if path not in counts:
          batches = self._records(path).batch(4096)
          counts[path] = int(batches.reduce(tf.constant(0, tf.int64), lambda n, batch: n + tf.size(batch, tf.int64)))
    return [counts[path] for path in files]

  def _records(self, path: Any) -> tf.data.Dataset:
    return tf.data.TFRecordDataset(path, compression_type=self.compression_type)

  def _by_file(self, num_pipelines: int) -> bool:
    """Returns whether `num_pipelines` pipelines shard by file; says once when 'file' or 'auto' falls back."""
    if self.sharding == "data" or len(self.files) >= num_pipelines:
      return self.sharding != "data"
    self._say_once(
        logging.warning if self.sharding == "file" else logging.info,
        f"TFRecordFiles: {len(self.files)} file(s) match {self.file_pattern!r} for {num_pipelines} input pipelines, "
        f"too few to shard by file; sharding by example (sharding={self.sharding or 'auto'!r}): every pipeline reads "
        f"every file and keeps one record in {num_pipelines}.",
    )
    return False

  def _turns_of(self, paths: Any, skips: Any) -> tf.data.Dataset:
    """One round: the files `paths` (at most `FILES_READ_AT_ONCE`), each from record `skips[i]`, in turns."""
    return tf.data.Dataset.from_tensor_slices((paths, tf.cast(skips, tf.int64))).interleave(
        lambda path, skip: self._records(path).skip(skip).batch(self.RECORDS_PER_TURN),
        cycle_length=self.FILES_READ_AT_ONCE,
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=True,
    )

  def _rounds(self, paths: Any) -> tf.data.Dataset:
    """The turns of `paths` (a vector, in order) read in rounds of `FILES_READ_AT_ONCE` files from their start."""
    rounds = tf.data.Dataset.from_tensor_slices(paths).batch(self.FILES_READ_AT_ONCE)
    return rounds.flat_map(lambda round_paths: self._turns_of(round_paths, tf.zeros_like(round_paths, tf.int64)))

  def _turns_from(self, paths: list[str], counts: list[int], record: int) -> tf.data.Dataset:
    """The turns of one epoch of the files `paths` (in the epoch's order, of `counts` records) from `record` on.

    The round, turn and file `record` falls in are found from the counts
    alone (a round of up to `FILES_READ_AT_ONCE` files gives turn t of each
    file that has records left, in order, then turn t + 1). Only that round's
    files are read before it, by skipping their records unparsed: the rest
    of the current turn, then the round from the next file on, each file
    before it (and itself) one turn further; then the rounds after it.
    """
    at, per_turn = 0, self.RECORDS_PER_TURN
    while record >= sum(counts[at : at + self.FILES_READ_AT_ONCE]):
      record -= sum(counts[at : at + self.FILES_READ_AT_ONCE])
      at += self.FILES_READ_AT_ONCE
    round_paths, round_counts = paths[at : at + self.FILES_READ_AT_ONCE], counts[at : at + self.FILES_READ_AT_ONCE]
    turns = [(t, slot) for t in range(max(round_counts) // per_turn + 1) for slot in range(len(round_counts))]
    sizes = [min(per_turn, max(0, round_counts[slot] - t * per_turn)) for t, slot in turns]
    index = bisect.bisect_right(list(itertools.accumulate(sizes)), record)
    (turn, slot), offset = turns[index], record - sum(sizes[:index])
    first = turn * per_turn
    current = self._records(round_paths[slot]).skip(first + offset).take(per_turn - offset).batch(per_turn)
    after, before = round_paths[slot + 1 :], round_paths[: slot + 1]
    turns_left = current.concatenate(
        self._turns_of(after + before, [first] * len(after) + [first + per_turn] * len(before))
    )
    rest = paths[at + self.FILES_READ_AT_ONCE :]
    return turns_left.concatenate(self._rounds(tf.constant(rest))) if rest else turns_left

  def _stream(
      self, input_context: tf.distribute.InputContext, *, repeated: bool, start: int, as_turns: bool = False
  ) -> tf.data.Dataset:
    """This pipeline's serialized records (`as_turns`: in turns), epoch 0 or (`repeated`) without end from `start`.

    Epoch `e` reads the pipeline's files (by file: its own, in an order
    shuffled by the seed and `e`; by record: all, sorted) in rounds of
    `FILES_READ_AT_ONCE`, `RECORDS_PER_TURN` records from each in turn; by
    record, the pipeline keeps one record in `num_input_pipelines`;
    shuffled, each block of `shuffle_buffer_size` records is permuted
    (`stateless_shuffle`, seeded by the seed, `e` and the block). So the
    stream is a function of the position: from `start`, the files before it
    are not read, a file in the round it falls in is entered by skipping its
    records unparsed (`_turns_from`), and a shuffled stream reads at most
    the one block before `start`. From 0 nothing is counted: only whether
    the share holds a record at all. `as_turns`: the turns as they are (only
    where every record is kept in order: by file, unshuffled).
    """
    pipelines, pipeline = input_context.num_input_pipelines, input_context.input_pipeline_id
    by_file, block_size = self._by_file(pipelines), self.shuffle_buffer_size
    files = self.files[pipeline::pipelines] if by_file else self.files

    def epoch(number: Any, position: int = 0, counts: list[int] | None = None) -> tf.data.Dataset:
      """Epoch `number` of the stream from its position `position` on (which needs the files' record `counts`)."""
      with contextlib.nullcontext() if counts is None else tf.init_scope():  # Counted: the order is read, eagerly.
        order = tf.range(len(files), dtype=tf.int64)
        if by_file and block_size:
          order = tf.random.experimental.stateless_shuffle(order, _key(self._stream_seed, number, pipeline, -1))
      block = position // block_size if block_size else 0
      first = block * block_size if block_size else position  # Where reading starts.
      if counts is None:
        turns = self._rounds(tf.gather(tf.constant(files), order))
      else:
        at = first if by_file else first * pipelines + pipeline
        turns = self._turns_from([files[i] for i in order.numpy()], [counts[i] for i in order.numpy()], at)
      if as_turns:
        return turns
      records = turns.unbatch()
      if not by_file:
        records = records.shard(pipelines, pipeline if counts is None else 0)
      if block_size:
        records = (
            tf.data.Dataset.zip(_positions_from(block), records.batch(block_size))
            .map(
                lambda n, rows: tf.random.experimental.stateless_shuffle(
                    rows, _key(self._stream_seed, number, pipeline, n)
                )
            )
            .unbatch()
        )
      return records.skip(position - first)

    counts = self.record_counts(files) if repeated and start else None
    if counts is None:
      share = int(repeated and self._has_records(files, 1 if by_file else pipeline + 1))  # Its size is not needed.
    else:
      share = sum(counts) if by_file else len(range(pipeline, sum(counts), pipelines))
    if not share:  # One epoch, or nothing to repeat: an empty stream, as repeating an empty dataset gives.
      return epoch(0)
    number, position = divmod(start, share)
    first_epoch = epoch(0) if counts is None else epoch(number, position, counts)
    return first_epoch.concatenate(tf.data.Dataset.range(number + 1, _ENDLESS).flat_map(epoch))

  def _has_records(self, files: Sequence[str], at_least: int) -> bool:
    """Whether `files` hold at least `at_least` records together; reads at most that many."""
    with tf.init_scope():
      records = self._records(files).take(at_least)
      return records.reduce(tf.constant(0, tf.int64), lambda n, _: n + 1).numpy() == at_least  # An eager read.

  def _parsed(self, records: tf.data.Dataset) -> tf.data.Dataset:
    return records.map(self.parse_fn, num_parallel_calls=tf.data.AUTOTUNE)

  def _parsed_batches(
      self, input_context: tf.distribute.InputContext, batch_size: int, *, repeated: bool, start: int
  ) -> tf.data.Dataset:
    """Parsed batches of records (repeated: full ones, from record `start`), by a vectorized `parse_fn` if it can."""
    in_order = self._by_file(input_context.num_input_pipelines) and not self.shuffle_buffer_size
    stream = self._stream(input_context, repeated=repeated, start=start, as_turns=in_order)  # In order: in turns.
    records = stream.unbatch() if in_order else stream
    one_by_one = self._parsed(records)
    spec = one_by_one.element_spec
    batches = (stream.rebatch if in_order else records.batch)(batch_size, drop_remainder=repeated)
    why_not = f"it returns parts without a fixed shape ({spec})"
    if all(isinstance(s, tf.TensorSpec) and s.shape.is_fully_defined() for s in tf.nest.flatten(spec)):
      try:
        parsed = batches.map(
            lambda records: tf.vectorized_map(self.parse_fn, records, fallback_to_while_loop=False),
            num_parallel_calls=tf.data.AUTOTUNE,
        )
      except (ValueError, TypeError, NotImplementedError) as error:  # An op without a vectorization.
        reason = re.search(r"No pfor vectorization defined for \S+", str(error))
        why_not = reason.group() if reason else type(error).__name__
      else:
        size = batch_size if repeated else None
        if parsed.element_spec == tf.nest.map_structure(lambda s: tf.TensorSpec([size, *s.shape], s.dtype), spec):
          return parsed
        why_not = f"vectorized, it gives {parsed.element_spec}"  # e.g. a list where one record gives a tuple
    self._say_once(  # Once per provider, whatever the reason (a batch size of None or of `batch_size`).
        logging.info,
        "TFRecordFiles: parsing record by record, as parse_fn %r does not vectorize: %s.",
        _name(self.parse_fn),
        why_not,
    )
    return one_by_one.batch(batch_size, drop_remainder=repeated)
