"""The Trainer: a generic custom training loop for any `tf.distribute.Strategy` and any Keras model."""

import math
import numbers
import os
import time

from absl import logging
import keras
import tensorflow as tf

from runner import checkpointing
from runner import distributed_input
from runner import exporting
from runner import global_state
from runner import loops
from runner import preemption
from runner import reporting
from runner.tasks import Task
from strategies import checks
from strategies.errors import ConfigError

_RESERVED_NAMES = ("loss", "num_examples", "steps_per_sec", "examples_per_sec", "learning_rate", "split", "step")
_ALL_STEPS = 2**62


class Trainer:
  """Trains, evaluates and exports a Keras model under a `tf.distribute.Strategy`.

  The model, optimizer and metrics are made inside `strategy.scope()`; input
  is batched per replica and distributed with
  `distribute_datasets_from_function`; `steps_per_loop` steps run inside one
  `tf.function`; the loss is averaged over the global batch, so results do not
  depend on the replica count. With a `model_dir`, the Trainer keeps
  checkpoints in `model_dir/checkpoints` (restoring the latest before its
  first train, evaluate or export), TensorBoard scalars in
  `model_dir/summaries/{train,eval}` and one JSON row per report in
  `model_dir/metrics.jsonl`.
  """

  def __init__(self, strategy, *, model_fn, optimizer_fn, task, model_dir=None, steps_per_loop=1,
               checkpoint_every=None, max_to_keep=3, jit_compile=False, precision="float32", clipnorm=None,
               seed=None):
    """Makes the model, optimizer and metrics in `strategy.scope()`.

    Args:
      strategy: any `tf.distribute.Strategy` but ParameterServerStrategy.
      model_fn: `() -> keras.Model`, called in scope under the `precision`
        dtype policy. The model may build lazily on its first batch.
      optimizer_fn: `() -> keras.optimizers.Optimizer`, called in scope.
      task: a `runner.Task`: the per-example loss and the metrics.
      model_dir: where checkpoints, summaries and metrics.jsonl go; None keeps
        nothing on disk.
      steps_per_loop: steps per `tf.function` call (and per report).
      checkpoint_every: save every this many steps (needs `model_dir`); a
        checkpoint is also always written at the end of `train`.
      max_to_keep: how many recent checkpoints to keep (None: all).
      jit_compile: compile each replica's forward and backward pass with XLA;
        evaluation then pads to full batches (static shapes).
      precision: 'float32', 'mixed_bfloat16' or 'mixed_float16' (which adds
        dynamic loss scaling).
      clipnorm: None, or the bound on the global norm of the gradient summed
        over replicas.
      seed: None, or an int that fixes the initial weights (see
        `global_state.random_seed`).

    Raises:
      ConfigError: an argument is invalid, the strategy is a
        ParameterServerStrategy, or `model_fn`, `optimizer_fn` or
        `task.metrics()` returned something unusable.
    """
    _check_strategy(strategy)
    for name, fn in (("model_fn", model_fn), ("optimizer_fn", optimizer_fn)):
      if isinstance(fn, (keras.Model, keras.optimizers.Optimizer)) or not callable(fn):
        raise ConfigError(
            f"{name} must be a function with no arguments that makes the object inside strategy.scope(), "
            f"got {type(fn).__name__}.")
    if not isinstance(task, Task):
      raise ConfigError(
          f"task must be a runner.Task (e.g. runner.tasks.Classification(), runner.tasks.Regression()), "
          f"got {task!r}.")
    checks.positive_int(steps_per_loop, "steps_per_loop")
    checks.positive_int(checkpoint_every, "checkpoint_every", optional=True)
    checks.positive_int(max_to_keep, "max_to_keep", optional=True)
    if checkpoint_every is not None and model_dir is None:
      raise ConfigError(f"checkpoint_every={checkpoint_every} needs a model_dir to write checkpoints to.")
    if not isinstance(jit_compile, bool):
      raise ConfigError(f"jit_compile must be True or False, got {jit_compile!r}.")
    global_state.check_precision(precision)
    if clipnorm is not None and (isinstance(clipnorm, bool) or not isinstance(clipnorm, numbers.Real)
                                 or not 0 < clipnorm < math.inf):
      raise ConfigError(f"clipnorm must be None or a positive number, got {clipnorm!r}.")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
      raise ConfigError(f"seed must be None or an int, got {seed!r}.")

    self._strategy = strategy
    self._task = task
    self._model_dir = model_dir
    self._steps_per_loop = steps_per_loop
    self._checkpoint_every = checkpoint_every
    self._xla = jit_compile and not _is_tpu(strategy)  # TPU steps are compiled with XLA anyway.
    self._clipnorm = clipnorm
    with strategy.scope(), global_state.random_seed(seed):
      with global_state.dtype_policy(precision):
        self._model = model_fn()
      if not isinstance(self._model, keras.Model):
        raise ConfigError(f"model_fn must return a keras.Model, returned {type(self._model).__name__}.")
      optimizer = optimizer_fn()
      if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise ConfigError(
            f"optimizer_fn must return a keras.optimizers.Optimizer, returned {type(optimizer).__name__}.")
      if precision == "mixed_float16" and not isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
      self._optimizer = optimizer
      self._metrics = list(task.metrics())
      self._step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step",
                               aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
    self._metric_names = _checked_metric_names(self._metrics)
    self._checkpoints = None
    if model_dir is not None:
      self._checkpoints = checkpointing.Checkpoints(
          strategy, os.path.join(model_dir, checkpointing.DIRECTORY), model=self._model, optimizer=self._optimizer,
          step=self._step, max_to_keep=max_to_keep)
    self._reporter = reporting.Reporter(model_dir, is_chief=strategy.extended.should_checkpoint)
    self._features_spec = None
    self._ready = False
    self._global_step = 0
    self._saved_step = None
    self._train_loops = {}
    self._train_input = None  # ((id(data), global_batch_size), data, distributed iterator)
    self._eval_loop = None
    self._weights_finite = None
    self._last_train_results = {}
    self._last_eval_results = None
    self._prepare(None)

  @property
  def strategy(self):
    """The `tf.distribute.Strategy` everything runs under."""
    return self._strategy

  @property
  def model(self):
    """The Keras model (its variables are the strategy's distributed variables)."""
    return self._model

  @property
  def last_eval_metrics(self):
    """The results of the latest evaluation (those inside `train` included), or None."""
    return None if self._last_eval_results is None else dict(self._last_eval_results)

  @property
  def global_step(self):
    """The number of training steps taken so far, restored checkpoints included (an int)."""
    return self._global_step

  def train(self, data, *, global_batch_size, steps, eval_data=None, eval_every=None,
            eval_global_batch_size=None, eval_steps=None):
    """Trains until the global step reaches `steps`.

    `steps` is a total, so calling `train` again with the same arguments (in
    this or a new process with the same `model_dir`) resumes where the run
    stopped. Each loop of `steps_per_loop` steps is reported (progress line,
    summaries, metrics.jsonl); loops end early at evaluation and checkpoint
    boundaries, and a checkpoint is always written at the end. On SIGTERM the
    Trainer finishes the current loop, saves a checkpoint and exits the
    process with code 143.

    Args:
      data: an unbatched `tf.data.Dataset` of `(features, labels)` or
        `(features, labels, sample_weight)`, or a `runner.data.DatasetProvider`
        of such datasets. It is repeated as needed.
      global_batch_size: examples per step over all replicas; a multiple of
        the replica count.
      steps: the global step to train to.
      eval_data: like `data` but finite: evaluated every `eval_every` steps
        and at the end.
      eval_every: None (evaluate at the end only) or a positive int.
      eval_global_batch_size: the evaluations' global batch size; None means
        `global_batch_size`.
      eval_steps: None to evaluate all of `eval_data`, or at most this many
        global batches per evaluation.

    Returns:
      The last loop's `loss` and metrics, a dict of floats (the previous
      results, or {} if none, when the global step is already at `steps`).

    Raises:
      ConfigError: an argument or the data is invalid.
      FloatingPointError: the loss or the weights became non-finite (the
        message names the step); no checkpoint is written with such weights.
    """
    distributed_input.check_global_batch_size(self._strategy, global_batch_size)
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
      raise ConfigError(f"steps (the global step to train to) must be an int >= 0, got {steps!r}.")
    checks.positive_int(eval_every, "eval_every", optional=True)
    if eval_every is not None and eval_data is None:
      raise ConfigError(f"eval_every={eval_every} needs eval_data to evaluate.")
    evaluation = {"global_batch_size": eval_global_batch_size or global_batch_size, "steps": eval_steps}
    iterator = self._train_iterator(data, global_batch_size)
    if self._global_step >= steps:
      logging.info("The global step is %d, already at steps=%d: nothing to train.", self._global_step, steps)
      return dict(self._last_train_results)
    loop = self._train_loop(global_batch_size)
    evaluated_step = None
    with preemption.SigtermWatch() as sigterm:
      try:
        loop_start = time.perf_counter()
        while self._global_step < steps:
          values = loop(iterator, self._loop_size(steps, eval_every), sigterm.received)
          seconds = time.perf_counter() - loop_start
          steps_run = int(values[0])
          self._global_step += steps_run
          loss = float(values[1])
          if not math.isfinite(loss):
            raise FloatingPointError(
                f"The training loss became {loss} at step {self._global_step}; training stopped there and no "
                f"checkpoint holds weights from that step on. Lower the learning rate, set clipnorm, or check "
                f"the data for NaN or inf values.")
          results = {"loss": loss, **dict(zip(self._metric_names, values[4:].tolist()))}
          self._last_train_results = results
          self._reporter.train_loop(
              step=self._global_step, total_steps=steps, results=results, learning_rate=float(values[3]),
              steps_per_sec=steps_run / seconds, examples_per_sec=steps_run * global_batch_size / seconds)
          if values[2] > 0:
            self._save_and_exit()
          if eval_every is not None and self._global_step % eval_every == 0:
            self.evaluate(eval_data, **evaluation)
            evaluated_step = self._global_step
          if self._checkpoint_every is not None and self._global_step % self._checkpoint_every == 0:
            self._save()
          loop_start = time.perf_counter()
        if eval_data is not None and evaluated_step != self._global_step:
          self.evaluate(eval_data, **evaluation)
        if self._checkpoints is not None and self._saved_step != self._global_step:
          self._save()
      finally:
        self._reporter.flush()
    return dict(self._last_train_results)

  def evaluate(self, data, *, global_batch_size, steps=None):
    """Evaluates the model on `data`, counting every example exactly once.

    Each input pipeline is padded with zero-weight examples to full batches
    (static shapes, as TPUs and XLA need), so a final partial batch and a
    dataset smaller than the replica count are handled; the padding counts
    nowhere.

    Args:
      data: as for `train`, finite unless `steps` is given.
      global_batch_size: examples per step over all replicas; a multiple of
        the replica count.
      steps: None for all of `data`, or at most this many global batches.

    Returns:
      A dict: `loss` (the sample-weighted per-example loss summed, over the
      number of examples; regularization not included), every metric by its
      name (floats), and `num_examples` (an int).

    Raises:
      ConfigError: an argument or the data is invalid (e.g. infinite data
        without `steps`).
    """
    distributed_input.check_global_batch_size(self._strategy, global_batch_size)
    checks.positive_int(steps, "steps", optional=True)
    dataset, batch_spec, num_pipelines = distributed_input.for_evaluation(
        self._strategy, data, global_batch_size, bounded=steps is not None)
    self._prepare(batch_spec[0])
    if self._eval_loop is None:
      self._eval_loop = loops.EvalLoop(
          strategy=self._strategy, model=self._model, task_loss=self._task.loss, metrics=self._metrics,
          num_input_pipelines=num_pipelines, xla=self._xla)
    start = time.perf_counter()
    values = self._eval_loop(iter(dataset), steps or _ALL_STEPS)
    results = {"loss": float(values[0]), **dict(zip(self._metric_names, values[2:].tolist())),
               "num_examples": int(values[1])}
    self._reporter.evaluation(step=self._global_step, results=results, seconds=time.perf_counter() - start)
    self._reporter.flush()
    self._last_eval_results = results
    return dict(results)

  def export(self, path, *, data=None):
    """Writes the model as a SavedModel with a `serving_default` signature (see `exporting`).

    Args:
      path: the SavedModel directory.
      data: optional, as for `evaluate`: its features give the input shape
        of a model that builds lazily and has not seen a batch yet.

    Returns:
      `path`.

    Raises:
      ConfigError: the model's input shape is unknown (a model that builds
        lazily, before any train or evaluate, and no `data`).
    """
    self._prepare(None if data is None else distributed_input.features_spec(data))
    features_spec = self._features_spec or _input_spec(self._model)
    if not self._ready or features_spec is None:
      raise ConfigError(
          "export needs the model's input shape, which this model does not know yet: call train or evaluate "
          "first, pass export(path, data=...), or give the model an input in model_fn (keras.Input).")
    exporting.export_saved_model(self._strategy, self._model, features_spec, path)
    logging.info("Exported a SavedModel at step %d to %s.", self._global_step, path)
    return path

  def _prepare(self, features_spec):
    """Builds model and optimizer variables in scope (once), then restores the latest checkpoint.

    A model that builds lazily is called once on zeros shaped like one
    per-replica batch of `features_spec`, so that no variable is created
    while a step is traced.
    """
    if features_spec is not None and self._features_spec is None:
      self._features_spec = features_spec
    if self._ready:
      return
    with self._strategy.scope():
      if not self._model.built:
        if features_spec is None:
          return
        self._model(tf.nest.map_structure(_zeros, features_spec), training=False)
      if not self._optimizer.built:
        self._optimizer.build(self._model.trainable_variables)
    self._ready = True
    if self._checkpoints is not None and self._checkpoints.restore_latest():
      self._global_step = int(self._step.numpy())
      self._saved_step = self._global_step

  def _train_iterator(self, data, global_batch_size):
    """Returns the distributed iterator over `data`; the same one again when `train` gets the same data.

    So consecutive `train` calls in one process continue the data stream
    where the last one stopped (and skip rebuilding the input pipeline).
    """
    key = (id(data), global_batch_size)
    if self._train_input is None or self._train_input[0] != key:
      dataset, batch_spec = distributed_input.for_training(self._strategy, data, global_batch_size)
      self._prepare(batch_spec[0])
      self._train_input = (key, data, iter(dataset))
    return self._train_input[2]

  def _train_loop(self, global_batch_size):
    loop = self._train_loops.get(global_batch_size)
    if loop is None:
      loop = self._train_loops[global_batch_size] = loops.TrainLoop(
          strategy=self._strategy, model=self._model, optimizer=self._optimizer, task_loss=self._task.loss,
          metrics=self._metrics, step=self._step, global_batch_size=global_batch_size,
          steps_per_loop=self._steps_per_loop, xla=self._xla, clipnorm=self._clipnorm,
          loss_scale=isinstance(self._optimizer, keras.optimizers.LossScaleOptimizer))
    return loop

  def _loop_size(self, steps, eval_every):
    """Steps for the next loop: `steps_per_loop`, cut at the end and at evaluation and checkpoint steps."""
    size = min(self._steps_per_loop, steps - self._global_step)
    for every in (eval_every, self._checkpoint_every):
      if every is not None:
        size = min(size, every - self._global_step % every)
    return size

  def _save(self):
    """Writes a checkpoint at the current step, after checking the weights are finite."""
    if self._weights_finite is None:
      variables = [v.value if isinstance(v, keras.Variable) else v for v in self._model.weights]
      floating = [v for v in variables if v.dtype.is_floating]
      self._weights_finite = tf.function(
          lambda: tf.reduce_all([tf.reduce_all(tf.math.is_finite(v)) for v in floating]))
    if not self._weights_finite():
      raise FloatingPointError(
          f"The model's weights are not finite at step {self._global_step}; not writing a checkpoint. "
          f"Lower the learning rate, set clipnorm, or check the data for NaN or inf values.")
    self._checkpoints.save(self._global_step)
    self._saved_step = self._global_step

  def _save_and_exit(self):
    """Ends the process after a SIGTERM reached any worker: checkpoint (if there is a model_dir), then exit."""
    logging.warning("SIGTERM received: saving a checkpoint at step %d and exiting.", self._global_step)
    if self._checkpoints is not None and self._saved_step != self._global_step:
      self._save()
    self._reporter.flush()
    raise SystemExit(preemption.EXIT_CODE)


def _check_strategy(strategy):
  if not isinstance(strategy, tf.distribute.Strategy):
    raise ConfigError(
        f"strategy must be a tf.distribute.Strategy (e.g. from strategies.create), got {type(strategy).__name__}.")
  if isinstance(strategy, tf.distribute.experimental.ParameterServerStrategy):
    raise ConfigError(
        "The Trainer does not run ParameterServerStrategy: its steps are scheduled onto workers by a "
        "tf.distribute.experimental.coordinator.ClusterCoordinator, not run by one synchronous loop. "
        "Use multi_worker_mirrored to train on several workers, or Keras model.fit, which supports "
        "ParameterServerStrategy.")


def _is_tpu(strategy):
  return isinstance(strategy, (tf.distribute.TPUStrategy, tf.distribute.experimental.TPUStrategy))


def _checked_metric_names(metrics):
  names = []
  for metric in metrics:
    if not isinstance(metric, keras.metrics.Metric):
      raise ConfigError(f"Task.metrics() must return keras.metrics.Metric objects, got {metric!r}.")
    if metric.name in _RESERVED_NAMES or metric.name in names:
      raise ConfigError(
          f"Metric name {metric.name!r} is {'reserved' if metric.name in _RESERVED_NAMES else 'used twice'}; "
          f"give each metric a unique name other than {', '.join(_RESERVED_NAMES)}.")
    names.append(metric.name)
  return names


def _zeros(spec):
  return tf.zeros([1 if d is None else d for d in spec.shape], spec.dtype)


def _input_spec(model):
  """The features spec of a model that declares its input (keras.Input), else None."""
  inputs = getattr(model, "inputs", None)
  if not inputs or len(inputs) != 1:
    return None
  return tf.TensorSpec(inputs[0].shape, inputs[0].dtype)
