"""The TF-GNN runner's side of the comparison: configs/graphs.py's model and data in `tensorflow_gnn.runner.run`.

`train(config, strategy, model_dir=..., steps=..., log_every=...)` trains the
model of `configs.graphs.gnn` on the data of `configs.graphs.random_graph_density`
with TF-GNN's own runner (`tensorflow_gnn.runner.run` and its `KerasTrainer`, i.e.
tf_keras `Model.fit`), doing the same work as our Trainer:

- the same graphs in the same order: the data function's unbatched training
  dataset (shuffled with its seed, anew each epoch), its label moved into a
  context feature that the task's `preprocess` takes out again (TF-GNN's
  runner reads labels from the graph); batched by the per-replica batch
  size with `drop_remainder=True`, one input pipeline per worker, repeated;
- the same model: the same layers (`configs.graphs.gnn_logits`) created in
  the same order from Python's `random` seeded with `config.trainer.seed`
  (tf_keras draws each initializer's seed from it, as under our Trainer's
  seed), on the batch merged to components, which both sides do in the
  input pipeline (TF-GNN's runner after batching, ours in the task's
  `preprocess`); the task's `predict` is the identity, so the logits are
  the model's;
- the same loss: sparse categorical crossentropy from logits averaged over the
  global batch (tf_keras's `fit` averages per replica and divides by the
  replicas), Adam with `config.optimizer.learning_rate`, accuracy as metric.

TF-GNN's runner checkpoints, backs up, writes TensorBoard summaries and
exports by default; here all four are off (`checkpoint_every_n_steps='never'`,
`backup_and_restore=False`, `summarize_every_n_steps='never'`, no model
exporters), as a run of ours without a model_dir does none either.

The losses come out of `fit`'s epochs: `steps_per_epoch=log_every`, and a
callback records `logs['loss']` at each epoch's end, which is tf_keras's mean
of the loss over that epoch's steps (its loss metric restarts every epoch); the
input iterator is not restarted between epochs (the dataset repeats and the
epochs have a number of steps). So `log_every=1` gives each step's loss, and
a larger `log_every` the mean of each window, as our Trainer's metrics.jsonl
gives per loop. Steps/s is timed from the end of the first epoch (tracing
and the first steps) to the end of the last, and so is the CPU time of all the
process's threads per step. `steps_per_execution` is TF-GNN's option of the same
name (tf_keras `compile`'s: steps per `tf.function` call; None, TF-GNN's default
off TPU, is 1).

TF-GNN's runner batches and merges with `Dataset.map(..., deterministic=False)`, so
batches may come out of order when the machine is busy (seen on 2 loaded cores: a run under
MirroredStrategy took other batches from its second step on). A comparison that needs the same
batch order calls `tf.config.experimental.enable_op_determinism()` first (it overrides that
argument); a throughput measurement does not.

Importing this module sets TF_USE_LEGACY_KERAS=1 (unless it is set), which
TF-GNN needs before `tf.keras` is first touched.
"""

import dataclasses
import functools
import os
import random
import time

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from tensorflow_gnn import runner as tfgnn_runner  # noqa: E402
import tf_keras  # noqa: E402

from configs import graphs  # noqa: E402
from runner.config import registry  # noqa: E402

LABEL = "label"  # The context feature that carries the label through TF-GNN's runner.


@dataclasses.dataclass(frozen=True)
class TFGNNRun:
  """What one `train` returns.

  Attributes:
    losses: the training loss of each window of `log_every` steps (its mean over the window's steps), in order.
    steps_per_sec: steps after the first window divided by their wall-clock seconds; None for a single window.
    cpu_ms_per_step: the CPU milliseconds (all the process's threads) per step after the first window; None for a
      single window.
    weights: the trained model's weights, numpy arrays in the order of `model.weights` (the same order as a model of
      `configs.graphs.gnn`'s).
    model: the base GNN that TF-GNN's runner trained (its input: one graph of components).
  """

  losses: list
  steps_per_sec: float | None
  cpu_ms_per_step: float | None
  weights: list
  model: tf_keras.Model


class _GraphsWithLabelInContext(tfgnn_runner.DatasetProvider):
  """The data function's (graph, label) pairs as graphs carrying their label in the context feature `LABEL`.

  Shards by example across input pipelines (pipeline i of n keeps examples i, i + n, ...), as our Trainer does
  with a plain dataset.
  """

  def __init__(self, dataset):
    self._dataset = dataset

  def get_dataset(self, context):
    dataset = self._dataset
    if context.num_input_pipelines > 1:
      dataset = dataset.shard(context.num_input_pipelines, context.input_pipeline_id)
    return dataset.map(lambda graph, label: graph.replace_features(context={LABEL: tf.reshape(label, [1])}))


class _ClassifyByLogits(tfgnn_runner.Task):
  """Classification whose model already ends in logits: the label out of the context, `predict` the identity."""

  def preprocess(self, inputs):
    return inputs.remove_features(context=[LABEL]), inputs.context[LABEL]

  def predict(self, *args):
    (logits,) = args
    return logits

  def losses(self):
    return tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True)

  def metrics(self):
    return (tf_keras.metrics.SparseCategoricalAccuracy(name="accuracy"),)


class _EpochLosses(tf_keras.callbacks.Callback):
  """Records each epoch's mean loss, and the wall-clock and CPU time at its end."""

  def __init__(self):
    super().__init__()
    self.losses = []
    self.times = []
    self.cpu_times = []

  def on_epoch_end(self, epoch, logs=None):
    del epoch  # In order.
    self.losses.append(float(logs["loss"]))
    self.times.append(time.perf_counter())
    self.cpu_times.append(time.process_time())


def _check_supported(config, steps, log_every):
  """Raises ValueError for a config or step counts this side cannot train as our Trainer would."""
  if config.model.name != "configs.graphs:gnn" or config.data.name != "configs.graphs:random_graph_density":
    raise ValueError(
        f"tfgnn_runner_side trains configs/graphs.py's model and data, got model {config.model.name!r} and "
        f"data {config.data.name!r}."
    )
  optimizer = config.optimizer
  if (optimizer.name, optimizer.schedule, optimizer.weight_decay, optimizer.clipnorm) != (
      "adam",
      "constant",
      0.0,
      None,
  ):
    raise ValueError(
        "tfgnn_runner_side trains with Adam at a constant learning rate, without weight decay or clipnorm; got "
        f"{optimizer.name!r}, schedule {optimizer.schedule!r}, weight_decay {optimizer.weight_decay}, "
        f"clipnorm {optimizer.clipnorm}."
    )
  if config.trainer.seed is None:
    raise ValueError("tfgnn_runner_side needs config.trainer.seed: the two sides start from the same weights.")
  if log_every < 1 or steps < log_every or steps % log_every:
    raise ValueError(f"steps ({steps}) must be a positive multiple of log_every ({log_every}).")


def base_model(config, merged_graph_spec):
  """Returns the GNN for TF-GNN's runner (its `model_fn`): one graph of components in, logits out.

  Seeds Python's and NumPy's generators with `config.trainer.seed` first, as our Trainer does before it calls the
  model function: tf_keras draws the seed of each initializer from Python's `random`, so this model starts from the
  weights `configs.graphs.gnn(config.model)` starts from after the same seeding.

  Args:
    config: a config of configs/graphs.py.
    merged_graph_spec: the GraphTensorSpec of a batch merged to components, which TF-GNN's runner passes.
  """
  random.seed(config.trainer.seed)
  np.random.seed(config.trainer.seed)
  graph = tf_keras.layers.Input(type_spec=merged_graph_spec)
  return tf_keras.Model(graph, graphs.gnn_logits(graph, config.model))


def train(config, strategy, *, model_dir, steps, log_every=1, steps_per_execution=None):
  """Trains configs/graphs.py's model on its training data with `tensorflow_gnn.runner.run` under `strategy`.

  Args:
    config: a config of configs/graphs.py (`runner.load_config`), with Adam at a constant learning rate.
    strategy: a `tf.distribute.Strategy` (a real class or one of our wrappers) whose scope the model is made in.
    model_dir: the KerasTrainer's model directory (nothing is written there: no checkpoints, summaries or export).
    steps: the number of training steps, a multiple of `log_every`.
    log_every: the steps of each loss in `TFGNNRun.losses` (one tf_keras epoch each).
    steps_per_execution: `tensorflow_gnn.runner.run`'s argument: steps per `tf.function` call (None: its default,
      1 off TPU).

  Returns:
    A `TFGNNRun`.

  Raises:
    ValueError: a config of another model, data or optimizer, without a seed, or `steps` not a multiple of
      `log_every`.
  """
  _check_supported(config, steps, log_every)
  dataset = registry.resolve("dataset", config.data.name)(config.data, "train")
  provider = _GraphsWithLabelInContext(dataset)
  graph_spec = provider.get_dataset(tf.distribute.InputContext()).element_spec

  recorder = _EpochLosses()
  trainer = tfgnn_runner.KerasTrainer(
      strategy,
      model_dir=model_dir,
      steps_per_epoch=log_every,
      verbose=0,
      summarize_every_n_steps="never",
      checkpoint_every_n_steps="never",
      backup_and_restore=False,
      callbacks=[recorder],
  )
  result = tfgnn_runner.run(
      train_ds_provider=provider,
      model_fn=functools.partial(base_model, config),
      optimizer_fn=lambda: tf_keras.optimizers.Adam(learning_rate=config.optimizer.learning_rate),
      trainer=trainer,
      task=_ClassifyByLogits(),
      gtspec=graph_spec,
      global_batch_size=config.data.global_batch_size,
      epochs=steps // log_every,
      drop_remainder=True,
      model_exporters=[],
      steps_per_execution=steps_per_execution,
  )
  timed_steps = steps - log_every
  seconds = recorder.times[-1] - recorder.times[0]
  cpu_seconds = recorder.cpu_times[-1] - recorder.cpu_times[0]
  return TFGNNRun(
      losses=recorder.losses,
      steps_per_sec=timed_steps / seconds if timed_steps else None,
      cpu_ms_per_step=1000 * cpu_seconds / timed_steps if timed_steps else None,
      weights=[w.numpy() for w in result.base_model.weights],
      model=result.base_model,
  )
