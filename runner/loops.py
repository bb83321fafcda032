"""The inner loops: per-replica steps and the `tf.function`s that run many of them per call.

Each loop returns one vector per call (a single host transfer); its layout is
defined, and decoded into a named result, here and nowhere else.
"""

import dataclasses
import math
import signal
from typing import Dict, Optional, Tuple

import tensorflow as tf

from strategies import sharded_variables
from strategies.errors import ConfigError

SUM = tf.distribute.ReduceOp.SUM


def float32_outputs(outputs):
  """Returns the model's outputs with every floating tensor cast to float32 (mixed precision)."""
  return tf.nest.map_structure(lambda t: tf.cast(t, tf.float32) if t.dtype.is_floating else t, outputs)


@dataclasses.dataclass(frozen=True)
class TrainLoopResult:
  """What one call of a `TrainLoop` did.

  Attributes:
    steps_run: the steps taken (fewer than asked only when a step's batch,
      loss or gradients were not finite).
    loss: the mean global loss over those steps.
    learning_rate: the optimizer's learning rate after the steps.
    metrics: every metric's result over those steps, by name.
    stop_signal: None, or `signal.SIGINT` or `signal.SIGTERM` when some
      worker noted that signal (SIGINT wins when both were).
    non_finite: None, or, when the last step's batch was finite, what was
      not finite at that step, e.g. "the loss became nan" (the training
      diverged).
    non_finite_data: the parts of the last step's batch that held NaN or inf
      values, of ("features", "labels"); empty when it was finite.
    labels_out_of_range: the last step's batch held a label outside the
      loop's `valid_labels`.
  """
  steps_run: int
  loss: float
  learning_rate: float
  metrics: Dict[str, float]
  stop_signal: Optional[int] = None
  non_finite: Optional[str] = None
  non_finite_data: Tuple[str, ...] = ()
  labels_out_of_range: bool = False

  @property
  def results(self):
    """`{"loss": loss, <metric>: value, ...}`, what reports and actions see."""
    return {"loss": self.loss, **self.metrics}


# What every step sums over replicas, in this order (one all-reduce with the loss):
# the loss, replicas whose worker noted SIGTERM / SIGINT, replicas whose gradients are not
# finite, replicas whose batch's features / labels hold non-finite values, and replicas whose
# batch holds a label outside the valid range. The last four stop training at that step.
_STEP_SUMS = ("loss", "sigterm", "sigint", "bad_gradients", "bad_features", "bad_labels", "bad_label_values")
# The vector one call returns: the call's totals, then the last step's sums but the loss.
_RESULT = ("steps_run", "mean_loss", "learning_rate") + _STEP_SUMS


def _maybe_xla(fn, xla):
  return tf.function(fn, jit_compile=True) if xla else fn


class TrainLoop:
  """Runs training steps: `steps_per_loop` of them inside one `tf.function` call.

  With `steps_per_loop == 1` the function runs one step, with no loop around
  it. Otherwise it runs `num_steps` steps (a tensor argument, so a shorter
  last loop reuses the same trace) in a `tf.range` loop over the distributed
  iterator, stopping early at the first step whose loss or gradients are not
  finite. The iterator is an argument, not a capture: a function that
  captures an iterator and applies a Keras optimizer is never freed (TF
  2.21), which would leak the iterator's threads with every Trainer.

  The step variable advances with every step, so when the data runs out
  part-way (the call raises `tf.errors.OutOfRangeError`) it still counts the
  steps whose updates were applied.

  A call also takes this worker's stop request (a SIGTERM or SIGINT was
  noted) and sums it over workers with the loss, so every worker learns of
  any request after the same call, at no extra communication.

  A call returns one float32 vector, fetched to the host in one transfer
  (layout `_RESULT`, then the metrics), decoded into a `TrainLoopResult`. The
  metrics are reset at the start of each call, so they describe that call's
  steps.
  """

  def __init__(self, *, strategy, model, optimizer, task_loss, metrics, step, global_batch_size, steps_per_loop,
               xla, clipnorm, loss_scale, valid_labels=None):
    """Args:
      strategy: the `tf.distribute.Strategy` the variables were made under.
      model, optimizer: built Keras objects, made in `strategy.scope()`.
      task_loss: `fn(labels, float32_outputs) -> per-example loss [batch]`.
      metrics: Keras metrics made in scope, updated per replica.
      step: the global step variable, advanced by the steps run.
      global_batch_size: examples per step over all replicas.
      steps_per_loop: steps per call; 1 builds the loop-free function.
      xla: compile each replica's forward and backward pass with XLA.
      clipnorm: None, or the bound on the global norm of the summed gradient.
      loss_scale: the optimizer is a `keras.optimizers.LossScaleOptimizer`
        (which skips steps with non-finite gradients by itself, so those do
        not stop training).
      valid_labels: None, or the `runner.tasks.LabelRange` every label must
        lie in; a step whose batch holds another stops training.
    """
    self._strategy = strategy
    self._model = model
    self._optimizer = optimizer
    self._task_loss = task_loss
    self._metrics = metrics
    self._step = step
    self._global_batch_size = global_batch_size
    self._clipnorm = clipnorm
    self._loss_scale = loss_scale
    self._valid_labels = valid_labels
    self._gradients = _maybe_xla(self._loss_and_gradients, xla)
    self._looping = steps_per_loop > 1
    self._stop_values = {None: tf.constant([0.0, 0.0]), signal.SIGTERM: tf.constant([1.0, 0.0]),
                         signal.SIGINT: tf.constant([0.0, 1.0])}
    self.function = tf.function(self._many_steps if self._looping else self._one_step)

  def __call__(self, iterator, num_steps, stop_signal):
    """Runs `num_steps` steps (1 when looping is off) from `iterator`; returns a `TrainLoopResult`.

    Args:
      iterator: the distributed training iterator.
      num_steps: the steps to run.
      stop_signal: None, or the signal this worker noted (SIGTERM or SIGINT).
    """
    stop = self._stop_values[stop_signal]
    if self._looping:
      vector = self.function(iterator, tf.constant(num_steps, tf.int32), stop).numpy()
    else:
      vector = self.function(iterator, stop).numpy()
    values = dict(zip(_RESULT, vector.tolist()))
    return TrainLoopResult(
        steps_run=int(values["steps_run"]), loss=values["mean_loss"], learning_rate=values["learning_rate"],
        metrics={metric.name: value for metric, value in zip(self._metrics, vector[len(_RESULT):].tolist())},
        stop_signal=(signal.SIGINT if values["sigint"] > 0 else signal.SIGTERM if values["sigterm"] > 0 else None),
        non_finite=non_finite_cause(values), non_finite_data=non_finite_data(values),
        labels_out_of_range=values["bad_label_values"] > 0)

  def trace(self, iterator):
    """Traces the loop's function for `iterator` without running a step; returns whether it was traced now.

    The calls that follow use this trace (the step count is a tensor), so the
    first call's time is the steps' time, not the tracing's. A looping
    function is also called once for zero steps, which readies it to run
    (graph optimization, instantiation) without reading a batch. False: it
    was traced before, and nothing was done.
    """
    if self.function.experimental_get_tracing_count():
      return False
    if self._looping:
      self.function(iterator, tf.constant(0, tf.int32), self._stop_values[None])
    else:
      self.function.get_concrete_function(iterator, self._stop_values[None])
    return True

  def _one_step(self, iterator, stop):
    for metric in self._metrics:
      metric.reset_state()
    sums = self._step_sums(iterator, stop)
    with tf.control_dependencies([sums]):  # Counted once its batch was read, as in `_many_steps`.
      self._step.assign_add(1)
    return self._results(tf.constant(1.0), sums[0], sums)

  def _many_steps(self, iterator, num_steps, stop):
    for metric in self._metrics:
      metric.reset_state()
    loss_sum = tf.constant(0.0)
    sums = tf.zeros([len(_STEP_SUMS)])
    steps_run = tf.constant(0)
    for _ in tf.range(num_steps):
      sums = self._step_sums(iterator, stop)
      with tf.control_dependencies([sums]):  # Counted once its batch was read: true when the data runs out.
        self._step.assign_add(1)
      loss_sum += sums[0]
      steps_run += 1
      if tf.logical_not(tf.math.is_finite(sums[0])) | tf.reduce_any(sums[3:] > 0):  # Not `or`: AutoGraph's cond.
        break
    steps_run = tf.cast(steps_run, tf.float32)
    return self._results(steps_run, loss_sum / steps_run, sums)

  def _step_sums(self, iterator, stop):
    """Runs one step; returns its `_STEP_SUMS`, summed over replicas."""
    per_replica = self._strategy.run(self._replica_step, args=(next(iterator), stop))
    return self._strategy.reduce(SUM, per_replica, axis=None)

  def _results(self, steps_run, mean_loss, sums):
    learning_rate = tf.cast(self._optimizer.learning_rate, tf.float32)
    values = [steps_run, mean_loss, learning_rate] + tf.unstack(sums) + [_scalar(m) for m in self._metrics]
    return tf.stack(values)

  def _replica_step(self, batch, stop):
    loss, outputs, flags = self._replica_update(batch)
    for metric in self._metrics:
      metric.update_state(batch[1], outputs, sample_weight=batch[2] if len(batch) == 3 else None)
    return tf.concat([tf.reshape(loss, [1]), stop, flags], axis=0)

  def _replica_update(self, batch):
    """One replica's forward and backward pass and optimizer update.

    Returns:
      `(loss, outputs, flags)`: this replica's share of the global loss, the
      model's float32 outputs, and `[bad_gradients, bad_features,
      bad_labels, bad_label_values]` (1.0 where the gradients, the batch's
      features or its labels hold non-finite values, or where a label lies
      outside `valid_labels`).
    """
    features, labels = batch[0], batch[1]
    sample_weight = batch[2] if len(batch) == 3 else None
    loss, gradients, outputs = self._gradients(features, labels, sample_weight)
    variables = self._model.trainable_variables
    if self._loss_scale:
      bad_gradients = tf.constant(0.0)
    else:
      bad_gradients = 1.0 - tf.cast(_all_finite([g for g in gradients if g is not None]), tf.float32)
    self._optimizer.apply(self._agreed_and_clipped(gradients), variables)
    bad_data = 1.0 - tf.cast(tf.stack([_all_finite(tf.nest.flatten(features)), _all_finite([labels]),
                                       _labels_in(labels, self._valid_labels)]), tf.float32)
    return loss, outputs, tf.concat([tf.reshape(bad_gradients, [1]), bad_data], axis=0)

  def _loss_and_gradients(self, features, labels, sample_weight):
    with tf.GradientTape() as tape:
      outputs = float32_outputs(self._model(features, training=True))
      per_example_loss = self._task_loss(labels, outputs)
      if sample_weight is not None:
        sample_weight = tf.cast(sample_weight, per_example_loss.dtype)
      loss = tf.nn.compute_average_loss(
          per_example_loss, sample_weight=sample_weight, global_batch_size=self._global_batch_size)
      if self._model.losses:
        loss += tf.nn.scale_regularization_loss(tf.add_n([tf.cast(l, tf.float32) for l in self._model.losses]))
      objective = self._optimizer.scale_loss(loss) if self._loss_scale else loss
    return loss, sharded_variables.gradients(tape, objective, self._model.trainable_variables), outputs

  def _agreed_and_clipped(self, gradients):
    """Applies `clipnorm` to the gradient summed over replicas; makes replicas agree on finiteness.

    Each replica scales its own gradient by the same factor, so the sum the
    optimizer forms is the clipped sum. Under loss scaling, a non-finite
    gradient on any replica is made non-finite on all of them, so every
    replica skips the same steps.
    """
    clip = self._clipnorm is not None
    agree = self._loss_scale and self._strategy.num_replicas_in_sync > 1
    if not (clip or agree):
      return gradients
    context = tf.distribute.get_replica_context()
    present = [g for g in gradients if g is not None]
    if clip:
      norm = tf.linalg.global_norm(context.all_reduce(SUM, present))
      if self._loss_scale:
        norm /= tf.cast(self._optimizer.dynamic_scale, norm.dtype)
      factor = self._clipnorm / tf.maximum(norm, self._clipnorm)
      poison = tf.where(tf.math.is_finite(norm), 0.0, float("nan"))
    else:
      local_bad = 1.0 - tf.cast(tf.reduce_all([tf.reduce_all(tf.math.is_finite(g)) for g in present]), tf.float32)
      factor = 1.0
      poison = tf.where(context.all_reduce(SUM, local_bad) > 0, float("nan"), 0.0)
    return [None if g is None else g * tf.cast(factor, g.dtype) + tf.cast(poison, g.dtype) for g in gradients]


class EvalLoop:
  """Evaluates a padded distributed dataset (see `input_pipeline.for_evaluation`) in one call.

  The call runs steps until the real examples are used up (or `max_steps`),
  and returns `(results, labels_out_of_range)`: `results` is
  `{"loss": float, <metric>: float, ..., "num_examples": int}`, `loss` the
  weighted sum of per-example losses over the number of real examples;
  `labels_out_of_range` says whether a real example's label lay outside
  `valid_labels`. It is fetched as one float64 vector `[loss, num_examples,
  labels_out_of_range, *metric_results]`. Metrics are reset at the start of
  each call.
  """

  def __init__(self, *, strategy, model, task_loss, metrics, num_input_pipelines, xla, valid_labels=None):
    """Args:
      strategy, model, task_loss, metrics, valid_labels: as for `TrainLoop`.
      num_input_pipelines: the dataset's input pipelines; with one, the first
        step that sees padding is the last one.
      xla: compile each replica's forward pass with XLA.
    """
    self._strategy = strategy
    self._model = model
    self._task_loss = task_loss
    self._metrics = metrics
    self._single_pipeline = num_input_pipelines == 1
    self._valid_labels = valid_labels
    self._forward = _maybe_xla(lambda features: self._model(features, training=False), xla)
    self.function = tf.function(self._evaluate)

  def __call__(self, iterator, max_steps):
    values = self.function(iterator, tf.constant(max_steps, tf.int64)).numpy()
    results = {"loss": float(values[0]), **{metric.name: float(value) for metric, value in zip(self._metrics, values[3:])},
               "num_examples": int(values[1])}
    return results, values[2] > 0

  def _evaluate(self, iterator, max_steps):
    for metric in self._metrics:
      metric.reset_state()
    replicas = float(self._strategy.num_replicas_in_sync)
    loss_sum = tf.constant(0.0, tf.float64)
    count = tf.constant(0, tf.int64)
    bad_labels = tf.constant(0.0)
    steps = tf.constant(0, tf.int64)
    done = tf.constant(False)
    while not done and steps < max_steps:
      # [weighted loss sum, real examples, replicas with a full batch, replicas with any real example,
      #  replicas with a label outside valid_labels]
      sums = self._strategy.reduce(SUM, self._strategy.run(self._replica_step, args=(next(iterator),)), axis=None)
      loss_sum += tf.cast(sums[0], tf.float64)
      count += tf.cast(sums[1], tf.int64)
      bad_labels += sums[4]
      steps += 1
      done = sums[3] == 0.0 or (self._single_pipeline and sums[2] < replicas)
    loss = loss_sum / tf.cast(tf.maximum(count, 1), tf.float64)
    results = [loss, tf.cast(count, tf.float64), tf.cast(bad_labels, tf.float64)] + [
        tf.cast(_scalar(metric), tf.float64) for metric in self._metrics]
    return tf.stack(results)

  def _replica_step(self, batch):
    features, labels, weight, mask = batch
    outputs = float32_outputs(self._forward(features))
    per_example_loss = self._task_loss(labels, outputs)
    for metric in self._metrics:
      metric.update_state(labels, outputs, sample_weight=weight)
    real = tf.reduce_sum(mask)
    return tf.stack([
        tf.reduce_sum(tf.cast(per_example_loss, tf.float32) * weight),
        real,
        tf.cast(real == tf.cast(tf.shape(mask)[0], tf.float32), tf.float32),
        tf.cast(real > 0.0, tf.float32),
        1.0 - tf.cast(_labels_in(labels, self._valid_labels, mask=mask), tf.float32),
    ])


def _all_finite(tensors):
  """Whether every floating tensor of `tensors` holds only finite values (True when there is none).

  One sum per tensor and one check: far fewer ops per step than checking
  each element's finiteness. A sum overflows only past 3.4e38, which a
  training step never reaches unless it diverged.
  """
  sums = [tf.reduce_sum(tf.cast(t, tf.float32)) for t in tensors if t.dtype.is_floating]
  return tf.math.is_finite(tf.add_n(sums)) if sums else tf.constant(True)


def _labels_in(labels, valid_labels, mask=None):
  """Whether every label lies in `valid_labels` (a `LabelRange`; None: True), from the extremes: few ops per step.

  With a `mask` (1.0 for a real example, 0.0 for padding), padding is not checked.
  """
  if valid_labels is None:
    return tf.constant(True)
  if mask is not None:
    real = tf.reshape(mask > 0.0, [-1] + [1] * (labels.shape.rank - 1))
    labels = tf.where(real, labels, tf.cast(valid_labels.low, labels.dtype))
  low, high = valid_labels.low, valid_labels.high
  if labels.dtype.is_integer:  # For an integer x: x >= low iff x >= ceil(low), and x < high iff x < ceil(high).
    low, high = math.ceil(low), math.ceil(high)
  # In the labels' own dtype: no float64 in the step (a TPU has none).
  valid = (tf.reduce_min(labels) >= tf.cast(low, labels.dtype)) & (tf.reduce_max(labels) < tf.cast(high, labels.dtype))
  if valid_labels.integer and not labels.dtype.is_integer:
    valid &= tf.reduce_all(tf.equal(labels, tf.floor(labels)))
  return valid


def non_finite_data(values):
  """Returns the parts of a loop's last batch, of ("features", "labels"), that held NaN or inf values.

  Args:
    values: the last step's `bad_features` and `bad_labels` by name (as
      decoded from `_RESULT`).
  """
  return tuple(part for part in ("features", "labels") if values[f"bad_{part}"] > 0)


def non_finite_cause(values):
  """Says what was not finite at a loop's last step although its batch was finite; None if all was.

  Args:
    values: the last step's `loss`, `bad_gradients`, `bad_features` and
      `bad_labels` by name (as decoded from `_RESULT`).
  """
  if non_finite_data(values) or (math.isfinite(values["loss"]) and values["bad_gradients"] == 0):
    return None
  what = (f"the loss became {values['loss']}" if not math.isfinite(values["loss"])
          else f"the gradients became non-finite (the loss was {values['loss']:.4g})")
  return f"{what}; the batch's features and labels are finite, so the training diverged"


def _scalar(metric):
  result = metric.result()
  if result.shape.rank != 0:
    raise ConfigError(
        f"Metric {metric.name!r} gives a result of shape {result.shape}; the Trainer reports scalar metrics "
        "only. Return metrics with scalar results from Task.metrics().")
  return tf.cast(result, tf.float32)
