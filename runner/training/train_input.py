"""The Trainer's training input: the distributed iterator of a provider's batches, from the step a run is at."""

from collections.abc import Callable
from typing import Any

from absl import logging

from runner.data import pipeline as input_pipeline
from runner.data import providers as data_lib
from runner.training import parameter_server_loops


def training_iterator(
    strategy: Any,
    provider: Any,
    global_batch_size: int,
    *,
    start_step: int,
    coordinator: Any = None,
    preprocess: Callable[[Any], Any] | None = None,
    data_change: tuple[str, str] | None = None,
) -> Any:
  """Returns the distributed iterator of `provider`'s batches from the batch of global step `start_step` on.

  A run that resumes at step S sees the batches an uninterrupted run sees
  from S (for data whose order is deterministic); it says so in one line,
  or, on other data than the checkpoint's (`data_change`), in one warning
  that it reads that data where a run that had always trained on it would
  be at S.
  Under parameter servers each worker reads its own share instead
  (`parameter_server_loops.per_worker_iterator`).
  A global batch larger than the whole data (where that is known cheaply)
  gets a warning.

  Args:
    strategy: the `tf.distribute.Strategy` the steps run under.
    provider: a `runner.data.DatasetProvider`.
    global_batch_size: examples per step over all replicas.
    start_step: the global step the first batch is for.
    coordinator: under parameter servers, the `ClusterCoordinator`: the
      iterator is then per worker (`parameter_server_loops.per_worker_iterator`).
    preprocess: None, or the task's `preprocess`, mapped over each replica's
      batch of features in the input pipeline.
    data_change: None, or `(what the checkpoint says the run trained on,
      the data now)` (`runner.data.providers.description`) where they differ.

  Raises:
    ConfigError: the elements are not of the contract's form.
  """
  _warn_if_batch_exceeds_data(provider, global_batch_size)
  if start_step and data_change is not None:
    logging.warning(
        "Resuming at step %d on other training data than the checkpoint's (it was trained on %s; the data now is "
        "%s): reading the data from where a run that had always trained on it would be at step %d, so this run does "
        "not see the batches of an uninterrupted one.",
        start_step,
        *data_change,
        start_step,
    )
  elif start_step and coordinator is not None:
    workers = parameter_server_loops.num_workers(coordinator.strategy)
    logging.info(
        "Resuming at step %d: each of the %d workers starts its own share of the data at its batch %d "
        "(step // workers).",
        start_step,
        workers,
        start_step // workers,
    )
  elif start_step and not data_lib.starts_at_any_position(provider):
    logging.info(
        "Resuming at step %d: each input pipeline reads its data from the start and discards the examples of the "
        "first %d steps, a cost that grows with the step (runner.data.InMemory, TFRecordFiles and FromFunction "
        "with a repeated_dataset_fn start at the step at once), so this run sees the batches of an uninterrupted one.",
        start_step,
        start_step,
    )
  elif start_step:
    logging.info(
        "Resuming at step %d: each input pipeline starts its stream at the examples of step %d, "
        "so this run sees the batches of an uninterrupted one.",
        start_step,
        start_step,
    )
  if coordinator is not None:
    return parameter_server_loops.per_worker_iterator(
        coordinator, provider, global_batch_size, start_step=start_step, preprocess=preprocess
    )
  return iter(
      input_pipeline.for_training(strategy, provider, global_batch_size, start_step=start_step, preprocess=preprocess)
  )


def _warn_if_batch_exceeds_data(provider: Any, global_batch_size: int) -> None:
  """Logs a warning when the training data is known to hold fewer examples than one global batch.

  Known only where it is cheap (`providers.known_num_examples`): in-memory
  arrays, the built-in datasets, a dataset of known cardinality.
  """
  num_examples = data_lib.known_num_examples(provider)
  if num_examples is not None and num_examples < global_batch_size:
    logging.warning(
        "The global batch of %d examples is larger than the whole training data (%d examples): every step "
        "repeats examples within its batch. Use a global batch of at most %d (config.data.global_batch_size), "
        "or more data.",
        global_batch_size,
        num_examples,
        num_examples,
    )
