"""The interfaces a user implements: the task, the input and periodic work after train loops.

What the model is trained to do is a `Task`, its input a `DatasetProvider`,
and the work after train loops an `Action` (which sees a `LoopEnd`).

The built-in implementations live beside their users: `runner.tasks`, `runner.data` and `runner.actions`.
"""

import abc
from collections.abc import Callable, Mapping
import dataclasses
from typing import Any

from absl import logging
import tensorflow as tf

from runner.sharding_policies import SHARDING
from strategies import checks


@dataclasses.dataclass(frozen=True)
class LabelRange:
  """The values every label must take; every step checks its batch's smallest and largest label against it.

  Attributes:
    low: the least valid value.
    high: the first value past the valid ones (exclusive).
    integer: labels must be whole numbers.
    meaning: what the labels are, for messages, e.g. "class ids of a model
      with 10 outputs (classes)".
  """

  low: float
  high: float
  integer: bool
  meaning: str

  def describe(self) -> str:
    """E.g. "integers in [0, 10) (class ids of a model with 10 outputs (classes))"."""
    kind = "integers" if self.integer else "values"
    return f"{kind} in [{self.low:g}, {self.high:g}) ({self.meaning})"


class Task(abc.ABC):
  """The loss and metrics of one kind of problem.

  The Trainer calls `loss` inside each replica's step with float32 outputs and
  averages the per-example values over the global batch itself (honouring
  sample weights), so a task never reduces over the batch. `metrics` is called
  once, inside `strategy.scope()`. `preprocess` maps each batch's features
  in the input pipeline, before the model sees them.
  """

  @abc.abstractmethod
  def loss(self, labels: tf.Tensor, outputs: tf.Tensor) -> tf.Tensor:
    """Returns the per-example loss, a float32 tensor of shape `[batch]`.

    Args:
      labels: the labels of one per-replica batch, as the dataset gives them.
      outputs: the model's outputs for that batch, cast to float32.
    """

  def metrics(self) -> list[Any]:
    """Returns fresh Keras metrics, each updated with `(labels, outputs, sample_weight)`.

    Their names are the keys of the Trainer's results; each must give a scalar.
    """
    return []

  def preprocess(self, features: Any) -> Any:
    """Returns one replica's batch of features as the model takes them; the default returns them unchanged.

    Mapped over each replica's batch in the input pipeline (a parallel
    `tf.data` map, in order), for training and evaluation, so it runs
    beside the steps, not in them: e.g. to merge a batch of TF-GNN
    `GraphTensor`s into one graph of many components
    (`graph.merge_batch_to_components()`), as TF-GNN's runner does. That can
    also be the model's first layer, which then runs inside the step. With a
    `preprocess` of its own, the dataset's features are not checked against
    the model's input (the model takes what this returns), and
    `Trainer.export` serves the model on preprocessed features.

    Args:
      features: the features of one per-replica batch, as batched from the
        dataset (composite ones included).
    """
    return features

  def check_labels(self, labels_spec: Any, outputs_spec: Any) -> LabelRange | None:
    """Checks that labels of `labels_spec` can be scored against outputs of `outputs_spec`.

    The Trainer calls it once per dataset, before the first step, and checks
    every batch's labels against the range it returns. The default checks
    nothing.

    Args:
      labels_spec: the spec of one example's labels (no batch dimension).
      outputs_spec: the spec of the model's outputs for a batch (a nest of
        `tf.TensorSpec`, batch dimension first).

    Returns:
      The `LabelRange` every label value must lie in, or None.

    Raises:
      ConfigError: such labels cannot work; the message starts with
        "labels" and names the spec found and the one expected. Or such
        outputs cannot (e.g. several for a loss that takes one); the message
        names them and starts otherwise, as it is not about the data.
    """
    return None


class DatasetProvider(abc.ABC):
  """Makes the input of one input pipeline.

  The Trainer calls `get_dataset` once per input pipeline (once per worker
  under multi-worker strategies) inside `distribute_datasets_from_function`,
  then batches the result by the per-replica batch size. Subclasses decide how
  to shard, following `sharding` where they have a choice.
  """

  _sharding: str | None = None

  @property
  def sharding(self) -> str | None:
    """The sharding policy: 'auto', 'file' or 'data' (see `SHARDING`), or None when not chosen ('auto').

    `runner.run` sets it to `config.data.sharding` when the dataset function
    returned a provider that did not choose (None); a policy given to a
    provider's constructor is kept. Setting it checks the value (ConfigError
    naming the valid ones).
    """
    return self._sharding

  @sharding.setter
  def sharding(self, sharding: str | None) -> None:
    if sharding is not None:
      checks.one_of(sharding, SHARDING, f"{type(self).__name__} sharding")
    self._sharding = sharding

  def _say_once(self, log: Callable[..., object], message: str, *args: object) -> None:
    """Logs `message` with `log` (e.g. `logging.warning`) the first time this provider says it."""
    said = self.__dict__.setdefault("_said", set())
    if message not in said:
      said.add(message)
      log(message, *args)

  def _say_if_file_sharding_asked(self) -> None:
    """For data without files, sharded by example: a policy 'file' gets one line saying it does not apply."""
    if self.sharding == "file":
      self._say_once(
          logging.warning,
          f"{type(self).__name__}: sharding='file', but its data has no files; sharding by example instead "
          "(input pipeline i of n keeps examples i, i + n, ...).",
      )

  def _by_example(self, dataset: tf.data.Dataset, input_context: tf.distribute.InputContext) -> tf.data.Dataset:
    """Returns `dataset` sharded by example: pipeline i of n keeps examples i, i + n, ...

    For data without files; a policy 'file' gets one line saying it does not apply.
    """
    self._say_if_file_sharding_asked()
    if input_context.num_input_pipelines == 1:
      return dataset
    return dataset.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)

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

  def get_repeated_dataset(self, input_context: tf.distribute.InputContext, start: int) -> tf.data.Dataset:
    """Returns this pipeline's data repeated without end, from position `start` of that endless stream on.

    The Trainer trains on this; a run that resumes at a later step passes the
    number of examples this pipeline already gave. For an exact resume the
    stream must be a function of the position: the result must equal
    `get_repeated_dataset(input_context, 0).skip(start)`, and each epoch of
    it hold every example of `get_dataset(input_context)` once (in any
    order). The default is `get_dataset(input_context).repeat().skip(start)`,
    which reads and discards `start` examples: a cost that grows with the
    step a run resumes at. `InMemory` and `TFRecordFiles` start at the
    position in constant time instead (docs/benchmarks.md#resume-cost), as
    does `FromFunction` given a `repeated_dataset_fn`.
    """
    dataset = self.get_dataset(input_context).repeat()
    return dataset.skip(start) if start else dataset

  def get_batches(self, input_context: tf.distribute.InputContext, batch_size: int) -> tf.data.Dataset:
    """Returns `get_dataset(input_context)` in batches of `batch_size`, the last one possibly smaller.

    What evaluation reads. The default batches `get_dataset`; a provider may
    make the same batches more cheaply (TFRecordFiles parses a batch of
    records at once).
    """
    return self.get_dataset(input_context).batch(batch_size)

  def get_repeated_batches(
      self, input_context: tf.distribute.InputContext, batch_size: int, start: int
  ) -> tf.data.Dataset:
    """Returns `get_repeated_dataset(input_context, start)` in full batches of `batch_size`.

    What training reads; as `get_batches`, a provider may make the same
    batches more cheaply.
    """
    return self.get_repeated_dataset(input_context, start).batch(batch_size, drop_remainder=True)


@dataclasses.dataclass(frozen=True)
class LoopEnd:
  """What an action sees after a train loop; the same on every worker.

  Attributes:
    step: the global step after the loop.
    total_steps: the step `train` runs to.
    train_results: `loss` and every metric over this loop's steps (reduced
      over all replicas, so equal on every worker).
    steps_per_sec, examples_per_sec: the loop's throughput (this worker's clock).
    learning_rate: the optimizer's learning rate after the loop.
    stop_signal: None, or the signal (`signal.SIGTERM`, `signal.SIGINT`)
      that asked training to stop; the built-in stop action then saves and
      exits, before the user's actions run.
    is_chief: this worker writes the run's files.
    tracing_seconds: for the first loop of a `train` call whose loop function
      was traced before it, the seconds tracing took (not counted in
      `steps_per_sec`); else None.
    eval_results: the evaluation run at this step, else None. The built-in
      evaluation action, which runs before the user's actions, returns the
      `LoopEnd` that carries it (`with_eval_results`).
    stop_at: the step an action asked training to end at (`stop`), else None.
  """

  step: int
  total_steps: int
  train_results: Mapping[str, float]
  steps_per_sec: float
  examples_per_sec: float
  learning_rate: float
  stop_signal: int | None
  is_chief: bool
  tracing_seconds: float | None = None
  eval_results: Mapping[str, float] | None = None
  # The steps asked by `stop`; shared by the copies `with_eval_results` makes, so every request of the loop counts.
  _stop_requests: list[int] = dataclasses.field(default_factory=list, repr=False, compare=False)

  @property
  def stop_at(self) -> int | None:
    """The earliest step an action asked training to stop at (`stop`), or None."""
    return min(self._stop_requests, default=None)

  def stop(self, at_step: int | None = None) -> None:
    """Asks training to end once the global step reaches `at_step` (None: now, after this loop).

    The end is a normal one: the final evaluation and checkpoint still
    happen. Ask the same on every worker (decide from this object's values,
    which are equal everywhere), or workers would stop at different steps.
    """
    self._stop_requests.append(self.step if at_step is None else checks.positive_int(at_step, "at_step"))

  def with_eval_results(self, eval_results: Mapping[str, float]) -> "LoopEnd":
    """Returns this loop's end with `eval_results` (what the built-in evaluation action returns)."""
    return dataclasses.replace(self, eval_results=eval_results)


class Action(abc.ABC):
  """Work the Trainer does after train loops, on every worker, with the loop's `LoopEnd`.

  Attributes:
    every_steps: None (the default) runs the action after every loop; an int
      N makes loops end at multiples of N and runs the action only there.
  """

  every_steps: int | None = None

  @abc.abstractmethod
  def __call__(self, loop: LoopEnd) -> LoopEnd | None:
    """Does the work for the loop that just ended; may call `loop.stop(...)`.

    Runs on every worker. Write files only where `loop.is_chief`.

    Returns:
      None, or the `LoopEnd` the actions after this one see instead (a copy
      with more in it, e.g. `loop.with_eval_results(...)`): what one action
      tells the next is in what it returns, never in a changed object.
    """
