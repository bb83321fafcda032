"""The Trainer's training input: the distributed iterator of a provider's batches, from the step a run is at."""

from collections.abc import Callable
from typing import Any

from absl import logging

from runner.data import pipeline as input_pipeline
from runner.data import providers as data_lib
from runner.data import service as service_lib
from runner.training import parameter_server_loops
from strategies.errors import ConfigError


class TrainInput:
  """A Trainer's training iterator, kept across `train` calls on the same data and global batch size.

  So consecutive `train` calls in one process continue the data stream where
  the last one stopped (and skip rebuilding the input pipeline). A new
  iterator starts at the batch of a given global step (`training_iterator`),
  and is kept for the calls after. A new one that is not rewound (steps run
  again with the checks, `loops.RerunChecked`) notes what the data
  is in the checkpoints (`Checkpoints.swap_training_data`), and a resume on
  other data than the checkpoint's says so.

  Attributes:
    current: `(data, global_batch_size, iterator)` of the iterator kept, or
      None (a later call makes a new one).
  """

  def __init__(
      self,
      strategy: Any,
      *,
      coordinator: Any,
      preprocess: Callable[[Any], Any] | None,
      checkpoints: Any,
      service: service_lib.DataService | None = None,
  ) -> None:
    """Initializes the `TrainInput` (the arguments as for `training_iterator`; `checkpoints` may be None).

    Raises:
      ConfigError: a `service` under parameter servers.
    """
    if coordinator is not None and service is not None:
      raise ConfigError(service_lib.NOT_UNDER_PARAMETER_SERVERS)
    self._strategy, self._checkpoints = strategy, checkpoints
    self._options = {"coordinator": coordinator, "preprocess": preprocess, "service": service}
    self.current: tuple[Any, int, Any] | None = None

  def iterator(self, data: Any, global_batch_size: int, step: int, *, rewound: bool = False) -> Any:
    """Returns the iterator of `data` (a `PreparedData`) from global step `step`: the one kept, unless `rewound`."""
    if not rewound and self.current is not None and self.current[:2] == (data, global_batch_size):
      return self.current[2]
    was = None  # What the checkpoint says the run trained on.
    if not rewound and self._checkpoints is not None:
      was = self._checkpoints.swap_training_data(data.description)
    change = (was, data.description) if was not in (None, "", data.description) else None
    iterator = training_iterator(
        self._strategy, data.provider, global_batch_size, start_step=step, data_change=change, **self._options
    )
    self.current = (data, global_batch_size, iterator)
    return iterator


def training_iterator(
    strategy: Any,
    provider: Any,
    global_batch_size: int,
    *,
    start_step: int,
    coordinator: Any = None,
    preprocess: Callable[[Any], Any] | None = None,
    data_change: tuple[str, str] | None = None,
    service: service_lib.DataService | None = None,
) -> Any:
  """Returns the distributed iterator of `provider`'s batches from the batch of global step `start_step` on.

  A run that resumes at step S sees the batches an uninterrupted run sees
  from S (for data whose order is deterministic); it says so in one line,
  or, on other data than the checkpoint's (`data_change`), in one warning
  that it reads that data where a run that had always trained on it would
  be at S.
  Under parameter servers each worker reads its own share instead
  (`parameter_server_loops.per_worker_iterator`).
  A global batch larger than the whole data (where that is known cheaply:
  `providers.known_num_examples`) gets a warning.

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
    service: None, or the tf.data service that makes the batches (`input_pipeline.for_training`).

  Raises:
    ConfigError: the elements are not of the contract's form.
    ClusterError: the `service`'s dispatcher did not answer.
  """
  num_examples = data_lib.known_num_examples(provider)  # Known only where it is cheap (in memory, built in, ...).
  if num_examples is not None and num_examples < global_batch_size:
    logging.warning(
        f"The global batch of {global_batch_size} examples is larger than the whole training data ({num_examples} "
        "examples): every step repeats examples within its batch. Use a global batch of at most "
        f"{num_examples} (config.data.global_batch_size), or more data."
    )
  at = f"Resuming at step {start_step}"
  if start_step and data_change is not None:
    logging.warning(
        f"{at} on other training data than the checkpoint's (it was trained on {data_change[0]}; the data now is "
        f"{data_change[1]}): reading the data from where a run that had always trained on it would be at step "
        f"{start_step}, so this run does not see the batches of an uninterrupted one."
    )
  elif start_step and coordinator is not None:
    workers = parameter_server_loops.num_workers(coordinator.strategy)
    logging.info(
        f"{at}: each of the {workers} workers starts its own share of the data at its batch "
        f"{start_step // workers} (step // workers)."
    )
  elif start_step and not data_lib.starts_at_any_position(provider):
    logging.info(
        f"{at}: each input pipeline reads its data from the start and discards the examples of the first "
        f"{start_step} steps, a cost that grows with the step (runner.data.InMemory, TFRecordFiles and FromFunction "
        "with a repeated_dataset_fn start at the step at once), so this run sees the batches of an uninterrupted one."
    )
  elif start_step:
    logging.info(
        f"{at}: each input pipeline starts its stream at the examples of step {start_step}, so this run sees the "
        "batches of an uninterrupted one."
    )
  if coordinator is not None:
    return parameter_server_loops.per_worker_iterator(
        coordinator, provider, global_batch_size, start_step=start_step, preprocess=preprocess
    )
  distributed = input_pipeline.for_training(
      strategy, provider, global_batch_size, start_step=start_step, preprocess=preprocess, service=service
  )
  return iter(distributed)
