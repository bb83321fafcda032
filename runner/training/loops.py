"""The inner loops: per-replica steps and the `tf.function`s that run many of them per call.

Each loop returns one vector per call (a single host transfer); its layout is
defined, and decoded into a named result, here and nowhere else.

A `TrainLoop` checks every step (the batch's finiteness, the labels' range,
the gradients' finiteness), or, given the variables to check (`state`),
runs its steps unchecked and checks once per loop that the summed loss and
those variables are finite. `RerunChecked` runs the unchecked loop once a
checkpoint exists to fall back to; when a loop is not finite (or raised
part-way with a state that is not), it restores the checkpoint saved last
and runs the steps from there to the loop's end again from the same batches
with the checked loop, which stops at the first bad step and names it as it
always does. No copy of the variables is kept.
"""

from collections.abc import Callable, Mapping, Sequence
import dataclasses
import functools
import math
import signal
from typing import Any

import tensorflow as tf

from runner.data import checks as data_checks
from runner.training import keras_versions
from strategies import sharded_variables
from strategies.errors import ConfigError

SUM = tf.distribute.ReduceOp.SUM


def float32_outputs(outputs: Any) -> Any:
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
    bad_step: None when every step was finite; else the last step's loss
      and checks by name (`loss`, `gradients`, `features`, `labels`,
      `label_range`, each finite exactly when its part of the step was).
  """

  steps_run: int
  loss: float
  learning_rate: float
  metrics: dict[str, float]
  stop_signal: int | None = None
  bad_step: Mapping[str, float] | None = None

  @property
  def results(self) -> dict[str, float]:
    """`{"loss": loss, <metric>: value, ...}`, what reports and actions see."""
    return {"loss": self.loss, **self.metrics}

  def raise_problems(self, *, step: int) -> None:
    """Raises what the loop found wrong at its last step, the global step being `step`; returns when it was fine.

    Raises:
      data_checks.LabelsOutOfRangeError: the batch held a label outside the
        loop's `valid_labels` (the Trainer names it).
      DataError: the batch held NaN or inf values; the message names the
        step and whether the features or the labels held them.
      FloatingPointError: the loss or gradients were not finite, the batch
        being finite (the training diverged); the message names the step.
    """
    bad = self.bad_step
    if bad is None:
      return
    if not math.isfinite(bad["label_range"]):
      raise data_checks.LabelsOutOfRangeError(step)
    data = [part for part in ("features", "labels") if not math.isfinite(bad[part])]
    if data:
      raise data_checks.DataError(
          f"The training data's {' and '.join(data)} hold NaN or inf values in the batch of step "
          f"{step}; training stopped there, and no checkpoint holds weights from that step on. Find them with "
          "tf.debugging.check_numerics in the dataset, or leave such examples out (dataset.filter)."
      )
    loss = bad["loss"]
    what = (
        f"the loss became {loss}"
        if not math.isfinite(loss)
        else f"the gradients became non-finite (the loss was {loss:.4g})"
    )
    raise FloatingPointError(
        f"Training stopped at step {step}: {what}; the batch's features and labels are finite, so the training "
        "diverged. No checkpoint holds weights from that step on. Lower the learning rate "
        "(config.optimizer.learning_rate), set a gradient bound (config.optimizer.clipnorm), or use float32 precision."
    )


# What one step of a checked loop gives, summed over replicas: the loss, 1 per replica (which counts the steps), and
# four checks, each finite when its part of the step was: the gradients, the batch's features, its labels, and the
# labels' range (see `TrainLoop`). Under several workers, also the replicas whose worker noted SIGTERM / SIGINT. An
# unchecked loop sums the loss, the 1 and the range check per replica, and adds the sum of every variable it checks.
_VALUES = ("loss", "replicas", "gradients", "features", "labels", "label_range")
_STOP_VALUES = ("sigterm", "sigint")
_UNCHECKED_VALUES = ("loss", "replicas", "label_range", "state")


def own_function(fn: Callable[..., Any], **options: Any) -> Any:
  """Returns `tf.function(fn, **options)`, whose traces TensorFlow counts for it alone.

  TensorFlow counts a function's traces by its Python code, to warn about a function made anew in a loop; each
  Trainer of a sweep makes its loops anew and traces them once, which is not retracing. A `functools.partial`
  has no code of its own, so it is counted apart (it keeps `fn`'s name for traces and profiles).
  """
  own = functools.partial(fn)
  own.__name__ = getattr(fn, "__name__", "function")  # type: ignore[attr-defined]
  return tf.function(own, **options)


class TrainLoop:
  """Runs training steps: `steps_per_loop` of them inside one `tf.function` call.

  Without `looping` the function runs one step, with no loop around it.
  With it, it runs `num_steps` steps (a tensor argument, so a shorter
  last loop reuses the same trace) in a `tf.while_loop` over the distributed
  iterator, stopping at the first step that was not finite. The iterator is
  an argument, not a capture: a function that captures an iterator and
  applies a Keras optimizer is never freed (TF 2.21), which would leak the
  iterator's threads with every Trainer.

  A step adds as little to the hand-written step as it can, since on a small
  model every op costs (docs/benchmarks.md#what-the-per-step-checks-cost): each replica
  packs its loss with four sums that are finite exactly when its gradients,
  its batch's features and its labels are, and its labels lie in
  `valid_labels` (a log of 1 or 0); the vector is summed over replicas, added
  to a running total in a variable (not a loop variable, each of which costs
  several ops per step), and a step whose vector is not finite ends the loop
  by moving the loop counter to its end. As steps before it were finite, the
  totals then tell what was not. The global step advances once per call by
  the steps run, also when the data runs out or a step raises part-way: the
  call reads the totals then and advances it before passing the error on.

  With `state` the loop is unchecked (`RerunChecked` runs it): each replica
  adds its loss, 1 and (with `valid_labels`) its label check to a variable of
  its own (`ON_READ`, summed when read), with no cross-replica reduction
  beyond the optimizer's; it runs all `num_steps` steps, and its result's
  `bad_step` says only whether the summed loss or a variable of `state` is
  not finite at the loop's end (see `finite_sum`): it holds its totals.

  A worker's stop request (a SIGTERM or SIGINT was noted) is summed over
  workers with each step's values when there are several workers, so every
  worker learns of any request after the same call at no extra
  communication; a single worker knows its own.

  A call returns one float32 vector, fetched to the host in one transfer
  (the totals, the last step's values, the learning rate, the metrics),
  decoded into a `TrainLoopResult`. The metrics are reset at the start of
  each call, so they describe that call's steps.
  """

  def __init__(
      self,
      *,
      strategy: tf.distribute.Strategy,
      model: Any,
      optimizer: Any,
      task_loss: Callable[[Any, Any], Any],
      metrics: Sequence[Any],
      step: tf.Variable,
      global_batch_size: int,
      looping: bool,
      xla: bool,
      clipnorm: float | None,
      loss_scale: bool,
      keras_version: keras_versions.KerasVersion = keras_versions.KERAS_3,
      valid_labels: Any = None,
      multi_worker: bool = False,
      state: Sequence[Any] | None = None,
      micro_batches: int = 1,
  ) -> None:
    """Initializes the `TrainLoop`.

    Args:
      strategy: the `tf.distribute.Strategy` the variables were made under.
      model: a built Keras model, made in `strategy.scope()`.
      optimizer: a built optimizer of the model's Keras, made in `strategy.scope()`.
      task_loss: `fn(labels, float32_outputs) -> per-example loss [batch]`.
      metrics: Keras metrics made in scope, updated per replica.
      step: the global step variable, advanced by the steps run.
      global_batch_size: examples per step over all replicas.
      looping: build the function that runs `num_steps` steps per call;
        False builds the loop-free function of one step.
      xla: compile with XLA each replica's whole step when there is one
        replica, else each replica's forward and backward pass.
      clipnorm: None, or the bound on the global norm of the summed gradient.
      loss_scale: the optimizer is its Keras's `LossScaleOptimizer` (which
        skips steps with non-finite gradients by itself, so those do not
        stop training).
      keras_version: the Keras of the model and optimizer (Keras 3 or tf_keras).
      valid_labels: None, or the `runner.tasks.LabelRange` every label must
        lie in; a step whose batch holds another stops training. Pass None
        where the task's loss fails by itself on such a label (an op error).
      multi_worker: other workers take part, so stop requests are summed
        over workers in the steps.
      state: None (every step checked), or the variables an unchecked loop
        checks finite at its end (looping on one worker only).
      micro_batches: k, the gradient accumulation steps: a step's forward
        and backward pass runs over k slices of each replica's batch in turn
        (`_accumulated`), which `global_batch_size` is a multiple of.
    """
    self._strategy = strategy
    self._model = model
    self._optimizer = optimizer
    self._task_loss = task_loss
    self._metrics = metrics
    self._step = step
    self._global_batch_size = global_batch_size
    self._micro_batches = micro_batches
    self._clipnorm = clipnorm
    self._loss_scale = loss_scale
    self._keras = keras_version
    self._valid_labels = valid_labels
    self._looping = looping
    self._state = None if state is None else [v for v in state if tf.as_dtype(v.dtype).is_floating]
    self._names = _UNCHECKED_VALUES if state is not None else _VALUES + (_STOP_VALUES if multi_worker else ())
    # One replica has no cross-replica sum inside its step, so XLA can compile all of it, the optimizer's update,
    # the checks and the metrics included; with more, the forward and backward pass (`_split_step`).
    self._step_fn: Callable[..., Any] = self._replica_step
    if xla and strategy.num_replicas_in_sync == 1 and not multi_worker:
      self._step_fn = own_function(self._replica_step, jit_compile=True)
    elif xla:
      self._forward_backward = own_function(functools.partial(self._replica_step, update=False), jit_compile=True)
      self._step_fn = self._split_step
    if state is None:
      with tf.init_scope():  # Plain variables of this host, also when made in a strategy's scope.
        self._totals = tf.Variable(tf.zeros([len(self._names)]), trainable=False, name="train_loop_totals")
        self._last = tf.Variable(tf.zeros([len(self._names)]), trainable=False, name="train_loop_last_step")
    else:
      with strategy.scope():  # [loss, replicas, label range] per replica, summed over the replicas when read.
        self._totals = tf.Variable(
            tf.zeros([3]),
            trainable=False,
            synchronization=tf.VariableSynchronization.ON_READ,
            aggregation=tf.VariableAggregation.SUM,
            name="unchecked_loop_sums",
        )
      self._finite_sums = own_function(lambda: tf.concat([self._totals.read_value(), [self._state_sum()]], 0))
    self.function = own_function(self._steps)

  def __call__(self, iterator: Any, num_steps: int, stop_signal: int | None) -> TrainLoopResult:
    """Runs `num_steps` steps (1 when looping is off) from `iterator`; returns a `TrainLoopResult`.

    Args:
      iterator: the distributed training iterator.
      num_steps: the steps to run.
      stop_signal: None, or the signal this worker noted (SIGTERM or SIGINT).

    Raises:
      tf.errors.OpError: as a step raised it (e.g. `OutOfRangeError`: the
        data ran out); the global step counts the steps before it.
    """
    stop = tf.constant([float(stop_signal == signal.SIGTERM), float(stop_signal == signal.SIGINT)])
    try:
      return self._decoded(self.function(iterator, tf.constant(num_steps, tf.int32), stop).numpy())
    except tf.errors.OpError:
      self._step.assign_add(self._steps_in(self._totals.numpy()))
      raise

  def trace(self, iterator: Any) -> bool:
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
      self.function(iterator, tf.constant(0, tf.int32), tf.zeros([2]))
    else:
      self.function.get_concrete_function(iterator, tf.constant(1, tf.int32), tf.zeros([2]))
    return True

  def finite_so_far(self) -> bool:
    """Whether an unchecked loop's loss summed so far and every variable are finite (after a call raised part-way)."""
    return bool(math.isfinite(float(self._finite_sums().numpy().sum())))

  def _state_sum(self) -> tf.Tensor:
    return finite_sum([tf.convert_to_tensor(v) for v in self._state or ()])

  def _steps_in(self, totals: Any) -> int:
    # A replica that raised part-way counts one step less (unchecked loops): the steps every replica finished.
    return int(math.floor(float(totals[1]) / self._strategy.num_replicas_in_sync + 1e-6))

  def _decoded(self, vector: Any) -> TrainLoopResult:
    size = len(self._names)
    totals = dict(zip(self._names, vector[:size].tolist()))
    if self._state is None:  # The last step's values follow the totals.
      last, vector = dict(zip(self._names, vector[size : 2 * size].tolist())), vector[2 * size :]
    else:  # Unchecked: its totals tell whether `RerunChecked` runs it again.
      last, vector = totals, vector[size:]
    steps_run = self._steps_in(list(totals.values()))
    return TrainLoopResult(
        steps_run=steps_run,
        loss=totals["loss"] / steps_run if steps_run else math.nan,
        learning_rate=float(vector[0]),
        metrics={metric.name: value for metric, value in zip(self._metrics, vector[1:].tolist())},
        stop_signal=(
            signal.SIGINT if totals.get("sigint", 0) > 0 else signal.SIGTERM if totals.get("sigterm", 0) > 0 else None
        ),
        bad_step=None if all(math.isfinite(value) for value in last.values()) else last,
    )

  def _steps(self, iterator: Any, num_steps: tf.Tensor, stop: tf.Tensor) -> tf.Tensor:
    """Runs `num_steps` steps (one, with no loop around it, when not looping); returns the call's vector."""
    for metric in self._metrics:
      metric.reset_state()
    self._totals.assign(tf.zeros_like(self._totals))

    def step(i: tf.Tensor) -> tf.Tensor:
      values = self._strategy.run(self._step_fn, args=(next(iterator), stop))
      if self._state is not None:  # Each replica added its values to its own totals.
        return i + 1
      values = self._strategy.reduce(SUM, values, axis=None)
      self._totals.assign_add(values)
      self._last.assign(values)
      return tf.where(tf.math.is_finite(tf.reduce_sum(values)), i + 1, num_steps)

    if self._looping:
      tf.while_loop(lambda i: i < num_steps, step, [tf.constant(0)])
    else:
      step(tf.constant(0))
    totals = self._totals.read_value()  # Read after the steps: a step that raised (e.g. on a bad label) adds nothing.
    replicas = self._strategy.num_replicas_in_sync
    self._step.assign_add(tf.cast(tf.math.floor(totals[1] / replicas + 1e-6), self._step.dtype))
    if self._state is not None:
      return self._results(tf.concat([totals, [self._state_sum()]], axis=0), tf.zeros([0]))
    return self._results(totals, self._last.read_value())

  def _results(self, totals: tf.Tensor, last: tf.Tensor) -> tf.Tensor:
    learning_rate = tf.cast(self._keras.learning_rate(self._optimizer), tf.float32)
    return tf.concat([totals, last, tf.stack([learning_rate] + [_scalar(m) for m in self._metrics])], axis=0)

  def _replica_step(self, batch: Sequence[Any], stop: tf.Tensor, update: bool = True) -> Any:
    """One replica's step: forward and backward pass (`_gradients`; `_accumulated` over micro-batches), then `_updated`.

    With `update=False` only the forward and backward pass: it returns
    `(loss, outputs, gradients)` (XLA compiles that alone on several replicas).
    """
    loss, outputs, gradients = (self._accumulated if self._micro_batches > 1 else self._gradients)(batch)
    if not update:
      return loss, outputs, gradients
    return self._updated(batch, stop, loss, outputs, gradients)

  def _gradients(self, batch: Sequence[Any]) -> tuple[tf.Tensor, Any, list[Any]]:
    """`(loss, outputs, gradients)` of `batch` under `tf.GradientTape`, the loss averaged over the global batch."""
    features, labels = batch[0], batch[1]
    sample_weight = batch[2] if len(batch) == 3 else None
    with tf.GradientTape() as tape:
      outputs = float32_outputs(self._model(features, training=True))
      per_example_loss = self._task_loss(labels, outputs)
      if sample_weight is None:  # `tf.nn.compute_average_loss` without its assertions, a dozen ops a step fewer.
        loss = tf.reduce_sum(per_example_loss) / self._global_batch_size
      else:
        loss = tf.nn.compute_average_loss(
            per_example_loss,
            sample_weight=tf.cast(sample_weight, per_example_loss.dtype),
            global_batch_size=self._global_batch_size,
        )
      if self._model.losses:  # Each of k micro-batches adds 1/k of it: a step adds the regularization once.
        extra = tf.add_n([tf.cast(extra, tf.float32) for extra in self._model.losses])
        loss += tf.nn.scale_regularization_loss(extra if self._micro_batches == 1 else extra / self._micro_batches)
      objective = self._keras.scaled_loss(self._optimizer, loss) if self._loss_scale else loss
    return loss, outputs, sharded_variables.gradients(tape, objective, self._model.trainable_variables)

  def _accumulated(self, batch: Sequence[Any]) -> tuple[tf.Tensor, Any, list[Any]]:
    """`_gradients` of the replica's batch as the sums over its `micro_batches` equal slices, run one after another.

    Each slice's loss is averaged over the global batch, so the sums are the
    batch's loss and gradients (sparse ones summed dense), and the slices'
    outputs are joined into the batch's. The first slice runs before a
    `tf.while_loop` over the others (its results give the loop's structure),
    which starts after its gradients and runs one iteration at a time: one
    slice's activations are alive at a time.
    """
    size = self._global_batch_size // self._strategy.num_replicas_in_sync // self._micro_batches

    def gradients_of(i: Any) -> tuple[tf.Tensor, Any, list[Any]]:
      examples = i * size + tf.range(size)  # Of static size, as XLA needs.
      loss, outputs, gradients = self._gradients(tf.nest.map_structure(lambda t: tf.gather(t, examples), batch))
      return loss, outputs, [None if g is None else tf.convert_to_tensor(g) for g in gradients]

    loss, outputs, gradients = gradients_of(0)
    present = [j for j, g in enumerate(gradients) if g is not None]

    def add(i: tf.Tensor, loss: tf.Tensor, sums: list[tf.Tensor], arrays: list[Any]) -> tuple[Any, ...]:
      more_loss, more_outputs, more = gradients_of(i)
      arrays = [array.write(i, o) for array, o in zip(arrays, tf.nest.flatten(more_outputs))]
      return i + 1, loss + more_loss, [total + more[j] for total, j in zip(sums, present)], arrays

    with tf.control_dependencies([gradients[j] for j in present]):
      first = tf.identity(1)
    flat = tf.nest.flatten(outputs)
    arrays = [tf.TensorArray(o.dtype, size=self._micro_batches).write(0, o) for o in flat]
    _, loss, sums, arrays = tf.while_loop(
        lambda i, *_: i < self._micro_batches,
        add,
        (first, loss, [gradients[j] for j in present], arrays),
        parallel_iterations=1,
    )
    for j, total in zip(present, sums):
      gradients[j] = total
    joined = [tf.reshape(array.stack(), tf.concat([[-1], tf.shape(o)[1:]], 0)) for array, o in zip(arrays, flat)]
    return loss, tf.nest.pack_sequence_as(outputs, joined), gradients

  def _split_step(self, batch: Sequence[Any], stop: tf.Tensor) -> Any:
    """A replica's step whose forward and backward pass XLA compiles, and whose update (with its all-reduce) not."""
    return self._updated(batch, stop, *self._forward_backward(batch, stop))

  def _updated(self, batch: Sequence[Any], stop: tf.Tensor, loss: tf.Tensor, outputs: Any, gradients: list[Any]) -> Any:
    """Applies the gradients and updates the metrics; returns the step's values (see `_VALUES`).

    An unchecked loop's replica adds its values to its own totals instead,
    and returns nothing.
    """
    self.apply(gradients)
    sample_weight = batch[2] if len(batch) == 3 else None
    for metric in self._metrics:
      metric.update_state(batch[1], outputs, sample_weight=sample_weight)
    if self._state is not None:
      self._totals.assign_add(tf.stack([loss, 1.0, self.label_check(batch[1])]))
      return None
    values = tf.stack([loss, 1.0, *self.checks(batch, gradients)])
    return tf.concat([values, stop], axis=0) if len(self._names) > len(_VALUES) else values

  def checks(self, batch: Sequence[Any], gradients: list[Any]) -> tuple[tf.Tensor, ...]:
    """A step's checks, each finite exactly when its part is fine: the gradients, features, labels and label range."""
    return (
        # A LossScaleOptimizer skips steps with non-finite gradients by itself: they do not stop training.
        tf.constant(0.0) if self._loss_scale else finite_sum([g for g in gradients if g is not None]),
        finite_sum(tf.nest.flatten(batch[0], expand_composites=True)),
        finite_sum([batch[1]]),
        self.label_check(batch[1]),
    )

  def label_check(self, labels: tf.Tensor) -> tf.Tensor:
    """0.0 when every label lies in `valid_labels` (or there are none to check), else -inf."""
    if self._valid_labels is None:
      return tf.constant(0.0)
    return tf.math.log(tf.cast(labels_in(labels, self._valid_labels), tf.float32))

  def apply(self, gradients: list[Any]) -> None:
    """Applies one replica's `gradients` (under loss scaling, unscaled first; clipped with `clipnorm`).

    Each replica scales its own gradient by the same factor, so the sum the
    optimizer forms is the clipped sum. Under loss scaling, a non-finite
    gradient on any replica is made non-finite on all of them, so every
    replica skips the same steps.
    """
    if self._loss_scale:
      gradients = self._keras.gradients_to_apply(self._optimizer, gradients)
    clip = self._clipnorm is not None
    if clip or (self._loss_scale and self._strategy.num_replicas_in_sync > 1):
      context = tf.distribute.get_replica_context()
      present = [g for g in gradients if g is not None]
      if clip:
        norm = tf.linalg.global_norm(context.all_reduce(SUM, present))
        if self._loss_scale:
          norm /= tf.cast(self._keras.loss_scale(self._optimizer), norm.dtype)
        factor = self._clipnorm / tf.maximum(norm, self._clipnorm)
        poison = tf.where(tf.math.is_finite(norm), 0.0, float("nan"))
      else:
        local_bad = 1.0 - tf.cast(tf.reduce_all([tf.reduce_all(tf.math.is_finite(g)) for g in present]), tf.float32)
        factor = 1.0
        poison = tf.where(context.all_reduce(SUM, local_bad) > 0, float("nan"), 0.0)
      gradients = [None if g is None else g * tf.cast(factor, g.dtype) + tf.cast(poison, g.dtype) for g in gradients]
    self._keras.apply(self._optimizer, gradients, self._model.trainable_variables)


class RerunChecked:
  """The call contract of `TrainLoop`: loops run unchecked; the steps of one that is not finite run again, checked.

  Loops run checked while `saved_step()` is None (no checkpoint to fall back
  to). After that, a loop whose summed loss or final variables are not
  finite, or that raised part-way with a state that was not finite, is run
  again: `restore_saved` restores the checkpoint saved last (waiting for one
  being written), and the checked loop runs from its step to the loop's end
  on the same batches (a new iterator from `rewind`, which is used from then
  on), stopping at the first bad step with its usual result. A loop that
  raised with a finite state raises as it did: the global step counts the
  steps before the error, as a checked loop's would. No copy of the
  variables is kept.
  """

  def __init__(
      self,
      *,
      unchecked: TrainLoop,
      checked: Callable[[], TrainLoop],
      step: tf.Variable,
      rewind: Callable[[int], Any],
      saved_step: Callable[[], int | None],
      restore_saved: Callable[[], int],
  ) -> None:
    """Initializes the `RerunChecked`.

    Args:
      unchecked: the loop (a `TrainLoop` with `state`) that runs every call once a checkpoint exists.
      checked: returns the checked loop.
      step: the global step variable.
      rewind: `rewind(step)` returns a distributed iterator whose first batch
        is that of global step `step` (`train_input.training_iterator`).
      saved_step: returns the step of the checkpoint saved last, or None.
      restore_saved: restores that checkpoint; returns its step.
    """
    self._unchecked = unchecked
    self._checked = checked
    self._step = step
    self._rewind = rewind
    self._saved_step = saved_step
    self._restore_saved = restore_saved
    self._rewound: tuple[Any, Any] | None = None  # (an iterator, the rewound one used in its place)

  def __call__(self, iterator: Any, num_steps: int, stop_signal: int | None) -> TrainLoopResult:
    """Runs `num_steps` steps from `iterator`; returns a `TrainLoopResult` (see the class doc).

    Its `steps_run` counts from the global step before the call; `stop_signal`
    is as for `TrainLoop` (one worker: the controller reads it itself).

    Raises:
      tf.errors.OpError: as a step raised it; the global step counts the
        steps before it.
    """
    given = iterator
    if self._rewound is not None and self._rewound[0] is given:
      iterator = self._rewound[1]
    if self._saved_step() is None:
      return self._checked()(iterator, num_steps, stop_signal)
    end = int(self._step.numpy()) + num_steps
    try:
      result = self._unchecked(iterator, num_steps, None)
      if result.bad_step is None:
        return result
    except tf.errors.OpError:
      if self._unchecked.finite_so_far():
        raise
    restored = self._restore_saved()
    self._rewound = (given, self._rewind(restored))
    result = self._checked()(self._rewound[1], end - restored, stop_signal)
    return dataclasses.replace(result, steps_run=restored + result.steps_run - (end - num_steps))

  def trace(self, iterator: Any) -> bool:
    """Traces the loop's function that the next call runs (see `TrainLoop.trace`); whether it was traced now."""
    return (self._checked() if self._saved_step() is None else self._unchecked).trace(iterator)


class EvalLoop:
  """Evaluates a padded distributed dataset (see `input_pipeline.for_evaluation`) in one call.

  The call runs steps until the real examples are used up (or `max_steps`),
  and returns the results, fetched as one float64 vector `[loss,
  num_examples, labels_out_of_range, *metric_results]`. Metrics are reset at
  the start of each call.

  The function is traced without AutoGraph, as Keras traces its own steps
  (converting the loop and the step's code lengthens every first
  evaluation), so the loop is an explicit `tf.while_loop`. The task's loss alone is still
  converted, as in training: it is a `tf.function` of its own, so a loss
  with Python control flow on tensors evaluates as it trains.
  """

  def __init__(
      self,
      *,
      strategy: tf.distribute.Strategy,
      model: Any,
      task_loss: Callable[[Any, Any], Any],
      metrics: Sequence[Any],
      num_input_pipelines: int,
      xla: bool,
      valid_labels: Any = None,
  ) -> None:
    """Initializes the `EvalLoop`.

    Args:
      strategy: as for `TrainLoop`.
      model: as for `TrainLoop`.
      task_loss: as for `TrainLoop`.
      metrics: as for `TrainLoop`.
      num_input_pipelines: the dataset's input pipelines; with one, the first
        step that sees padding is the last one.
      xla: compile each replica's forward pass with XLA.
      valid_labels: as for `TrainLoop`.
    """
    self._strategy = strategy
    self._model = model
    self._task_loss = own_function(task_loss)
    self._metrics = metrics
    self._single_pipeline = num_input_pipelines == 1
    self._valid_labels = valid_labels
    self._forward = lambda features: self._model(features, training=False)
    if xla:
      self._forward = own_function(self._forward, jit_compile=True)
    self.function = own_function(self._evaluate, autograph=False)

  def __call__(self, iterator: Any, max_steps: int) -> dict[str, float]:
    """Evaluates up to `max_steps` batches of `iterator` (to its end).

    Returns:
      `{"loss": float, <metric>: float, ..., "num_examples": int}`; `loss` is
      the weighted sum of per-example losses over the number of real examples.

    Raises:
      data_checks.LabelsOutOfRangeError: a real example's label lay outside
        `valid_labels` (the Trainer names it).
    """
    values = self.function(iterator, tf.constant(max_steps, tf.int64)).numpy()
    if values[2] > 0:
      raise data_checks.LabelsOutOfRangeError(None)
    return {
        "loss": float(values[0]),
        **{metric.name: float(value) for metric, value in zip(self._metrics, values[3:])},
        "num_examples": int(values[1]),
    }

  def _evaluate(self, iterator: Any, max_steps: tf.Tensor) -> tf.Tensor:
    for metric in self._metrics:
      metric.reset_state()
    replicas = float(self._strategy.num_replicas_in_sync)

    def step(steps: tf.Tensor, unused_done: tf.Tensor, totals: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
      # [weighted loss sum, real examples, replicas with a full batch, replicas with any real example,
      #  replicas with a label outside valid_labels]
      sums = self._strategy.reduce(SUM, self._strategy.run(self._replica_step, args=(next(iterator),)), axis=None)
      done = (sums[3] == 0.0) | (sums[2] < replicas) if self._single_pipeline else sums[3] == 0.0
      return steps + 1, done, totals + tf.cast(tf.gather(sums, [0, 1, 4]), tf.float64)

    _, _, totals = tf.while_loop(  # totals: [weighted loss sum, real examples, labels outside valid_labels]
        lambda steps, done, _: tf.logical_not(done) & (steps < max_steps),
        step,
        [tf.constant(0, tf.int64), tf.constant(False), tf.zeros([3], tf.float64)],
    )
    loss = totals[0] / tf.maximum(totals[1], 1.0)
    return tf.stack([loss, totals[1], totals[2]] + [tf.cast(_scalar(metric), tf.float64) for metric in self._metrics])

  def _replica_step(self, batch: Sequence[Any]) -> Any:
    features, labels, weight, mask = batch
    outputs = float32_outputs(self._forward(features))
    per_example_loss = self._task_loss(labels, outputs)
    for metric in self._metrics:
      metric.update_state(labels, outputs, sample_weight=weight)
    real = tf.reduce_sum(mask)
    return tf.stack(
        [
            tf.reduce_sum(tf.cast(per_example_loss, tf.float32) * weight),
            real,
            tf.cast(real == tf.cast(tf.shape(mask)[0], tf.float32), tf.float32),
            tf.cast(real > 0.0, tf.float32),
            1.0 - tf.cast(labels_in(labels, self._valid_labels, mask=mask), tf.float32),
        ]
    )


def finite_sum(tensors: Sequence[Any]) -> tf.Tensor:
  """The sum of every floating tensor of `tensors` in float32 (0.0 when there is none): finite iff they all are.

  One op per tensor, far fewer than checking each element's finiteness; a
  sum overflows only past 3.4e38, which a training step never reaches unless
  it diverged. A `tf.IndexedSlices` (a sparse gradient) is summed by its values.
  """
  values = [t.values if isinstance(t, tf.IndexedSlices) else t for t in tensors]
  sums = [tf.reduce_sum(tf.cast(t, tf.float32)) for t in values if t.dtype.is_floating]
  if not sums:
    return tf.constant(0.0)
  return sums[0] if len(sums) == 1 else tf.add_n(sums)


def labels_in(labels: tf.Tensor, valid_labels: Any, mask: tf.Tensor | None = None) -> tf.Tensor:
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


def _scalar(metric: Any) -> tf.Tensor:
  result = metric.result()
  if result.shape.rank != 0:
    raise ConfigError(
        f"Metric {metric.name!r} gives a result of shape {result.shape}; the Trainer reports scalar metrics "
        "only. Return metrics with scalar results from Task.metrics()."
    )
  return tf.cast(result, tf.float32)
