"""How the user's data becomes per-replica batches distributed over a strategy."""

from collections.abc import Callable
import functools
import time
from typing import Any

import tensorflow as tf

from runner.data import providers as data_lib
from runner.data import service as service_lib
from strategies import checks
from strategies import peers
from strategies.errors import ClusterError
from strategies.errors import ConfigError

ELEMENT_CONTRACT = "(features, labels) or (features, labels, sample_weight)"
_DISPATCHER_POLL_SECONDS = 0.5


def check_global_batch_size(strategy: tf.distribute.Strategy, global_batch_size: int, micro_batches: int = 1) -> None:
  """Checks that `global_batch_size` splits evenly over the strategy's replicas (and `micro_batches` within each).

  Raises:
    ConfigError: it is not a positive int, or the replica count (times
      `micro_batches`) does not divide it (the message names the numbers and
      the nearest valid sizes).
  """
  checks.positive_int(global_batch_size, "global_batch_size")
  replicas = strategy.num_replicas_in_sync
  multiple = replicas * micro_batches
  if global_batch_size % multiple:
    lower = global_batch_size // multiple * multiple
    nearest = [size for size in (lower, lower + multiple) if size > 0]
    each = f" times gradient_accumulation_steps={micro_batches} micro-batches each" if micro_batches > 1 else ""
    raise ConfigError(
        f"global_batch_size={global_batch_size} does not split over the {replicas} replicas of the strategy{each}; "
        f"it must be a multiple of {multiple}, e.g. {' or '.join(map(str, nearest))}."
    )


def check_micro_batches(data: "PreparedData", preprocess: Callable[[Any], Any] | None, micro_batches: int) -> None:
  """Checks that gradient accumulation can slice `data`'s batches of features (after `preprocess`) into micro-batches.

  Raises:
    ConfigError: `micro_batches` > 1 and a feature is neither a tensor nor a
      ragged tensor (a `tf.SparseTensor`, a `GraphTensor`).
  """
  if micro_batches == 1:
    return
  spec = data.features_spec if preprocess is None else preprocessed_spec(preprocess, data.features_spec)
  sliceable = (tf.TensorSpec, tf.RaggedTensorSpec)
  kinds = {s.value_type.__name__ for s in tf.nest.flatten(spec) if not isinstance(s, sliceable)}
  if kinds:
    raise ConfigError(
        f"gradient_accumulation_steps={micro_batches} slices each batch into micro-batches, which its features' "
        f"{', '.join(sorted(kinds))} cannot be (tensors and ragged tensors can); set gradient_accumulation_steps=1."
    )


def for_training(
    strategy: tf.distribute.Strategy,
    data: Any,
    global_batch_size: int,
    *,
    start_step: int = 0,
    preprocess: Callable[[Any], Any] | None = None,
    service: service_lib.DataService | None = None,
) -> Any:
  """Distributes `data` for training: repeated, in full per-replica batches, from `start_step` on.

  Each input pipeline repeats its share and batches it by
  `input_context.get_per_replica_batch_size(global_batch_size)` with
  `drop_remainder=True` (the provider's `get_repeated_batches`), so shapes
  are static and a step always sees a full global batch.

  The order of the batches is a function of the step: a pipeline whose data
  is deterministic (a seeded shuffle, or none) gives the batches of step `s`
  whether the run started at 0 or resumed at `start_step <= s`. To get
  there, a pipeline's stream starts at the position after the examples of
  the first `start_step` steps (`start_step * per-replica batch * its
  replicas`; see `DatasetProvider.get_repeated_dataset`): at once for
  `InMemory` and `TFRecordFiles`, by reading and discarding those examples
  for a provider that cannot start in the middle.

  Args:
    strategy: the `tf.distribute.Strategy`.
    data: a `runner.data.DatasetProvider` (`providers.as_provider` makes one
      of a dataset) of `(features, labels)` or `(features, labels, sample_weight)`.
    global_batch_size: examples per step over all replicas.
    start_step: the global step the first batch is for.
    preprocess: None, or a function mapped over each batch's features (the
      task's `preprocess`), in parallel, keeping the batches' order.
    service: None, or the tf.data service whose workers make each
      pipeline's batches (preprocessed), in its mode (`service_lib.DataService.describe`
      says what that keeps), once its dispatcher accepts a connection.

  Returns:
    The distributed dataset from `distribute_datasets_from_function`.

  Raises:
    ConfigError: the elements are not of the contract's form.
    ClusterError: the service's dispatcher accepted no connection within its `timeout_seconds`.
  """

  def dataset_fn(input_context: tf.distribute.InputContext) -> tf.data.Dataset:
    batch_size = input_context.get_per_replica_batch_size(global_batch_size)
    replicas = input_context.num_replicas_in_sync // input_context.num_input_pipelines
    batches = data.get_repeated_batches(input_context, batch_size, start_step * replicas * batch_size)
    batches = _preprocessed(_checked(batches, "training", batched=True), preprocess)
    if service is not None:
      batches = batches.apply(tf.data.experimental.service.distribute(service.mode, service.address))
    return without_autotune_model(batches.prefetch(tf.data.AUTOTUNE))

  if service is not None:
    _wait_for_dispatcher(service)
  return strategy.distribute_datasets_from_function(dataset_fn)


def _wait_for_dispatcher(service: service_lib.DataService) -> None:
  """Returns once `service`'s dispatcher accepts a connection; raises ClusterError past its `timeout_seconds`.

  TensorFlow's client would retry for an hour, in C++, where neither SIGTERM
  nor Ctrl-C reach it.
  """
  address = service.address.removeprefix("grpc://")
  deadline = None if service.timeout_seconds is None else time.monotonic() + service.timeout_seconds
  while not peers.listening(address):
    if deadline is not None and time.monotonic() > deadline:
      raise ClusterError(
          f"The tf.data service dispatcher at {service.address} (config.data.service) accepted no connection within "
          f"{service.timeout_seconds:g} s (config.strategy.timeout_seconds). Start it (python -m runner.data_service "
          f"--dispatcher={address}) or give its address; a restart of the run resumes from its last checkpoint."
      )
    time.sleep(_DISPATCHER_POLL_SECONDS)


def for_evaluation(
    strategy: tf.distribute.Strategy,
    data: Any,
    global_batch_size: int,
    *,
    bounded: bool,
    preprocess: Callable[[Any], Any] | None = None,
) -> Any:
  """Distributes `data` for evaluation, padded so that every example counts exactly once.

  Each input pipeline batches its elements by the per-replica batch size
  (the provider's `get_batches`) and maps each batch to `(features, labels, weight, mask)` (weight: the sample
  weights or 1; mask: 1 per example), its final partial batch filled up with
  padding examples (zeros with weight 0 and mask 0); endless batches of
  padding follow. Every batch is therefore full and of static shape (as TPUs
  and XLA need); the padding adds nothing to the loss, metrics or example
  count, and the evaluation loop stops once the real examples are used up.
  The batches are those of padding the elements one by one and then
  batching, made a batch at a time (one vectorized map per batch, not per
  example) and prefetched. Composite features (ragged, sparse, a
  `GraphTensor`) are padded with copies of the first example instead, by example.

  Args:
    strategy: the `tf.distribute.Strategy`.
    data: as for `for_training`, but finite unless `bounded`.
    global_batch_size: examples per step over all replicas.
    bounded: the caller stops after a given number of steps, so `data` may
      be infinite.
    preprocess: as for `for_training`, mapped over the padded batches.

  Returns:
    `(distributed_dataset, num_input_pipelines)`.

  Raises:
    ConfigError: the elements are not of the contract's form, or `data` is
      infinite and not `bounded`.
  """
  pipelines = []

  def dataset_fn(input_context: tf.distribute.InputContext) -> tf.data.Dataset:
    batch_size = input_context.get_per_replica_batch_size(global_batch_size)
    batches = _checked(data.get_batches(input_context, batch_size), "evaluation", batched=True)
    if not bounded and batches.cardinality() == tf.data.INFINITE_CARDINALITY:
      raise ConfigError(
          "The evaluation data is infinite (it repeats), so evaluating all of it never ends; "
          "pass evaluate(..., steps=N) or give data that does not repeat."
      )
    pipelines.append(input_context.num_input_pipelines)
    if all(isinstance(spec, tf.TensorSpec) for spec in tf.nest.flatten(batches.element_spec)):
      batches = batches.map(functools.partial(_weighted_masked_and_full, batch_size=batch_size))
      batches = batches.concatenate(_padding(batches))
    else:
      batches = _padded_by_example(data.get_dataset(input_context), batch_size)
    return without_autotune_model(_preprocessed(batches, preprocess).prefetch(tf.data.AUTOTUNE))

  distributed = strategy.distribute_datasets_from_function(dataset_fn)
  return distributed, pipelines[0]


def without_autotune_model(dataset: tf.data.Dataset) -> tf.data.Dataset:
  """Returns `dataset` with tf.data's autotuning model off: no model thread in its iterators.

  In TensorFlow 2.21 the model thread of an iterator sleeps on a timer whose
  period doubles up to a minute, and deleting the iterator waits for it to
  wake: a distributed iterator deleted after a run blocked whoever dropped it
  (a Trainer garbage-collected, the interpreter at exit) for seconds up to a
  minute. Without the model, AUTOTUNE parallelism stays at its starting
  value (the cores) and prefetch buffers size themselves as they are read
  (docs/benchmarks.md#input-without-the-autotuning-model).
  """
  options = tf.data.Options()
  options.autotune.enabled = False
  return dataset.with_options(options)


def _checked(dataset: Any, purpose: str, *, batched: bool = False) -> tf.data.Dataset:
  """Returns `dataset` if its elements (`batched`: batches of them) follow the contract, else raises ConfigError."""
  if not isinstance(dataset, tf.data.Dataset):
    raise ConfigError(f"The {purpose} DatasetProvider returned {type(dataset).__name__}, not a tf.data.Dataset.")
  spec = (dataset.unbatch() if batched else dataset).element_spec
  if not isinstance(spec, tuple) or len(spec) not in (2, 3):
    raise ConfigError(
        f"The {purpose} data must be an unbatched dataset of {ELEMENT_CONTRACT}; its elements are {spec}."
    )
  if len(spec) == 3 and (not isinstance(spec[2], tf.TensorSpec) or spec[2].shape.rank != 0):
    raise ConfigError(
        f"The sample_weight of the {purpose} data must be one scalar per example, got {spec[2]}; "
        f"elements must be {ELEMENT_CONTRACT} and unbatched."
    )
  return dataset


@tf.autograph.experimental.do_not_convert  # Plain graph code: converting it would only add to the first call.
def _weighted_masked_and_full(
    features: Any, labels: Any, sample_weight: Any = None, *, batch_size: int
) -> tuple[Any, Any, tf.Tensor, tf.Tensor]:
  """Maps a batch to `(features, labels, weight, mask)` of `batch_size` examples, a partial one filled with padding."""
  real = tf.shape(labels)[0]
  weight = tf.ones([real]) if sample_weight is None else tf.cast(sample_weight, tf.float32)
  return tf.nest.map_structure(lambda t: _filled_up(t, batch_size), (features, labels, weight, tf.ones([real])))


def _filled_up(batch: tf.Tensor, batch_size: int) -> tf.Tensor:
  """Returns `batch` with zeros appended on its first axis up to `batch_size` rows, that size static."""
  missing = batch_size - tf.shape(batch)[:1]
  full = tf.concat([batch, tf.zeros(tf.concat([missing, tf.shape(batch)[1:]], 0), batch.dtype)], 0)
  if batch.shape.rank is not None:
    full.set_shape([batch_size, *batch.shape[1:]])
  return full


def _preprocessed(batches: tf.data.Dataset, preprocess: Callable[[Any], Any] | None) -> tf.data.Dataset:
  """`batches` with `preprocess` mapped over their features (the first part), in parallel and in order."""
  if preprocess is None:
    return batches
  return batches.map(
      lambda features, *rest: (preprocess(features), *rest), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True
  )


def _padded_by_example(examples: tf.data.Dataset, batch_size: int) -> tf.data.Dataset:
  """Batches `examples` with composite features (ragged, sparse, GraphTensor) as `(features, labels, weight, mask)`.

  A composite batch cannot be filled up with zeros, so the examples are
  followed by endless copies of the first one, each paired with its mask
  (1, or 0 for a copy), then batched: the batches of the provider's
  `get_batches`, filled up. Nothing maps single examples: a map would turn
  an example's ragged tensor of one ragged dimension into a dense one.
  """
  real = tf.data.Dataset.zip(examples, tf.data.Dataset.from_tensors(1.0).repeat())
  padding = tf.data.Dataset.zip(examples.take(1).repeat(), tf.data.Dataset.from_tensors(0.0).repeat())
  return real.concatenate(padding).batch(batch_size, drop_remainder=True).map(_weighted_and_masked)


@tf.autograph.experimental.do_not_convert
def _weighted_and_masked(element: tuple[Any, ...], mask: tf.Tensor) -> tuple[Any, Any, tf.Tensor, tf.Tensor]:
  """Maps a batch of `(element, mask)` to `(features, labels, weight, mask)`; weight is 0 where mask is."""
  weight = mask if len(element) == 2 else tf.cast(element[2], tf.float32) * mask
  return element[0], element[1], weight, mask


def _padding(batches: tf.data.Dataset) -> tf.data.Dataset:
  """Returns endless zero-weight, zero-mask batches shaped like `batches`' (full batches)."""
  spec = batches.element_spec
  if all(s.shape.is_fully_defined() for s in tf.nest.flatten(spec)):
    zeros = tf.nest.map_structure(lambda s: tf.zeros(s.shape, s.dtype), spec)
    return tf.data.Dataset.from_tensors(zeros).repeat()
  # Shapes known only from the data: copy the first batch, with weights and mask 0.
  return batches.take(1).map(lambda x, y, w, m: (x, y, tf.zeros_like(w), tf.zeros_like(m))).repeat()


def preprocessed_spec(preprocess: Any, features_spec: Any) -> Any:
  """The spec of `preprocess(features)` for a batch of `features_spec`, found by tracing it (nothing runs)."""
  traced = tf.function(preprocess, autograph=False).get_concrete_function(features_spec)
  return tf.nest.map_structure(tf.type_spec_from_value, traced.structured_outputs)


def element_spec(data: Any, purpose: str) -> Any:
  """Returns the element spec of `data` (one example), checked against the contract.

  Args:
    data: a `runner.data.DatasetProvider` (asked for the dataset of a single
      input pipeline).
    purpose: what the data is for, named in messages (e.g. "training").

  Raises:
    ConfigError: the elements are not of the contract's form.
  """
  return _checked(data.get_dataset(tf.distribute.InputContext()), purpose).element_spec


def batch_spec(spec: Any) -> Any:
  """Returns the spec of a batch of elements of `spec` (a nest of specs, composite ones too), batch dimension None.

  As tf.data batches them: the element spec of a dataset of such elements, batched (nothing is read).
  """
  return tf.data.Dataset.from_generator(list, output_signature=spec).batch(2).element_spec


class PreparedData:
  """The user's data, prepared once: what `runner.run` and the Trainer share, and what the Trainer's caches key on.

  `Trainer.train`, `evaluate`, `restore` and `export` take it as they take a
  dataset or a provider; a `runner.run` makes it once per split.

  Attributes:
    data: what the user gave, a `tf.data.Dataset` or a `runner.data.DatasetProvider`.
    provider: `data` as a DatasetProvider (`providers.as_provider`).
    purpose: what the data is for, named in messages ("training", "evaluation", "export").
  """

  def __init__(self, data: Any, purpose: str, *, source: str = "data") -> None:
    """Makes `data` a provider; raises ConfigError (naming `source`) if it is neither a dataset nor a provider."""
    self.data = data
    self.provider = data_lib.as_provider(data, source=source)
    self.purpose = purpose

  @functools.cached_property
  def element_spec(self) -> Any:
    """The spec of one element, checked against the contract (`element_spec`); found once."""
    return element_spec(self.provider, self.purpose)

  @functools.cached_property
  def features_spec(self) -> Any:
    """The spec of a batch of features (`batch_spec`), batch dimension None."""
    return batch_spec(self.element_spec[0])

  @functools.cached_property
  def description(self) -> str:
    """What tells this data from other data (`providers.description`): what a checkpoint keeps of its input."""
    return data_lib.description(self.provider)
