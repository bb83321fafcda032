"""What a Trainer trains: the model, its optimizer, the task's metrics and the global step, made in a strategy scope.

And their build from the first data the model is given, checked against it.
"""

from collections.abc import Callable
from typing import Any

from absl import logging
import tensorflow as tf

from runner import interfaces
from runner.data import checks as data_checks
from runner.data import pipeline as input_pipeline
from runner.training import keras_versions
from runner.training import options as trainer_options
from runner.training import parameter_server_loops
from runner.training import scoped_settings
from strategies import sharded_variables
from strategies.errors import ConfigError


class ModelParts:
  """The Keras objects and the step variable of one Trainer, all made in its strategy's scope, and their build.

  Attributes:
    model: the Keras model `model_fn` returned (its variables built by `build`).
    optimizer: the optimizer `optimizer_fn` returned; under 'mixed_float16'
      wrapped in its Keras's `LossScaleOptimizer` unless it is one.
    metrics: the task's metrics.
    step: the global step, an int64 variable read from the first replica.
    keras_version: the Keras of the model and the optimizer (Keras 3 or tf_keras).
    ready: the model's and optimizer's variables are built.
    features_spec: the spec of a batch of the features the model was first
      given (batch dimension None), or None.
    outputs_spec: the spec of the model's outputs for such a batch, once built.
  """

  def __init__(self, *, model: Any, optimizer: Any, metrics: list[Any], step: tf.Variable, keras_version: Any) -> None:
    self.model = model
    self.optimizer = optimizer
    self.metrics = metrics
    self.step = step
    self.keras_version: keras_versions.KerasVersion = keras_version
    self.ready = False
    self.features_spec: Any = None
    self.outputs_spec: Any = None

  @property
  def loss_scaled(self) -> bool:
    """The optimizer scales the loss (mixed precision): it skips steps with non-finite gradients itself."""
    return self.keras_version.scales_loss(self.optimizer)

  def build(self, strategy: tf.distribute.Strategy, features_spec: Any) -> bool:
    """Builds the model's and optimizer's variables in `strategy.scope()`, once; returns whether this call built them.

    A model that builds lazily is called once on zeros shaped like one batch
    of `features_spec` (a nest of `tf.TensorSpec`, batch dimension first),
    so that no variable is made while a step is traced; without a spec such
    a model stays unbuilt (False). Under parameter servers the variables'
    shards are logged.
    """
    if features_spec is not None and self.features_spec is None:
      self.features_spec = features_spec
    if self.ready:
      return False
    with strategy.scope():
      if not self.model.built:
        if features_spec is None:
          return False
        zeros = tf.nest.map_structure(
            lambda s: tf.zeros([1 if d is None else d for d in s.shape], s.dtype), features_spec
        )
        self.model(zeros, training=False)
      self.keras_version.build_optimizer(self.optimizer, self.model.trainable_variables)
    self.ready = True
    if parameter_server_loops.is_parameter_server(strategy):
      logging.info("parameter_server: %s.", sharded_variables.describe(self.model.weights))
    return True

  def features_of(self, data: Any, preprocess: Callable[[Any], Any] | None) -> Any:
    """Checks the features of `data` (a `PreparedData`) against the model; returns the spec of a batch the model takes.

    With the task's `preprocess`, the preprocessed features (checked when the model is called on them).

    Raises:
      DataError: the features do not fit the model.
    """
    if preprocess is not None:
      return input_pipeline.preprocessed_spec(preprocess, data.features_spec)
    expected = data_checks.features_expected(self.model, self.features_spec)
    data_checks.check_features(data.element_spec, expected, purpose=data.purpose)
    data_checks.check_one_tensor_for_sequential(data.element_spec, self.model, purpose=data.purpose)
    return data.features_spec

  def label_range(self, data: Any, features_spec: Any, task: interfaces.Task) -> Any:
    """Returns the `LabelRange` of `data`'s labels for the task and the model's outputs (None: no check per batch).

    Raises:
      DataError: the task cannot score these labels against the model's outputs.
    """
    if self.outputs_spec is None and self.ready:
      self.outputs_spec = self.keras_version.outputs_spec(self.model, features_spec)
    return data_checks.label_range(data.element_spec, self.outputs_spec, task, purpose=data.purpose)


def make(
    strategy: tf.distribute.Strategy,
    *,
    model_fn: Callable[[], Any],
    optimizer_fn: Callable[[], Any],
    task: interfaces.Task,
    precision: str,
    seed: int | None,
) -> ModelParts:
  """Calls `model_fn`, `optimizer_fn` and `task.metrics` in `strategy.scope()`, under `precision` and `seed`.

  `model_fn` is called before `optimizer_fn`. Both Kerases are taken: Keras 3
  and tf_keras (Keras 2), told apart by the objects made.

  Raises:
    ConfigError: `model_fn` or `optimizer_fn` returned something else than
      a Keras model or optimizer (a tf_keras legacy optimizer is named with
      the one to use instead), the two are of different Kerases, or the
      metrics' names are unusable.
  """
  if precision == "mixed_float16":
    _warn_if_float16_on_cpu(strategy)
  with strategy.scope(), scoped_settings.random_seed(seed):
    with keras_versions.dtype_policies(precision):
      expected = "a keras.Model. A tf_keras.Model (Keras 2) works too"
      model = trainer_options.made(model_fn(), keras_versions.is_model, role="model_fn", fn=model_fn, expected=expected)
    optimizer = optimizer_fn()
    legacy = keras_versions.legacy_optimizer(optimizer)
    expected = "a keras.optimizers.Optimizer. One of tf_keras.optimizers (Keras 2) works too"
    if legacy is not None:
      expected = f"a current optimizer, not the legacy {legacy[0]}: use {legacy[1]}"
    trainer_options.made(
        optimizer, keras_versions.is_optimizer, role="optimizer_fn", fn=optimizer_fn, expected=expected
    )
    keras_version = keras_versions.of_model_and_optimizer(model, optimizer)
    if precision == "mixed_float16" and not keras_version.scales_loss(optimizer):
      optimizer = keras_version.module.mixed_precision.LossScaleOptimizer(optimizer)
    metrics = task.metrics()
    if keras_versions.is_metric(metrics) or not isinstance(metrics, (list, tuple)):
      raise ConfigError(f"Task.metrics() must return a list of Keras metrics, got {metrics!r}; e.g. [metric].")
    step = tf.Variable(
        0, dtype=tf.int64, trainable=False, name="global_step", aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA
    )
  trainer_options.metric_names(metrics)
  return ModelParts(model=model, optimizer=optimizer, metrics=list(metrics), step=step, keras_version=keras_version)


def is_tpu(strategy: tf.distribute.Strategy) -> bool:
  """Whether `strategy` runs its steps on TPUs (compiled with XLA whatever `jit_compile` says)."""
  return isinstance(strategy, (tf.distribute.TPUStrategy, tf.distribute.experimental.TPUStrategy))


def _warn_if_float16_on_cpu(strategy: tf.distribute.Strategy) -> None:
  """Logs a warning when precision 'mixed_float16' trains on replicas without a GPU (nor a TPU).

  Not under parameter servers: the chief does not see the workers' devices. The
  default strategy lists no devices: it runs where TensorFlow places ops.
  """
  if is_tpu(strategy) or parameter_server_loops.is_parameter_server(strategy):
    return
  try:
    devices = strategy.extended.worker_devices
  except RuntimeError:
    devices = [device.name for device in tf.config.list_logical_devices()]
  if any(tf.DeviceSpec.from_string(device).device_type == "GPU" for device in devices):
    return
  logging.warning(
      "precision='mixed_float16' without a GPU: the replicas train on CPU, where float16 math is emulated on most "
      "CPUs (slower than float32) and adds loss scaling. Use precision='float32' on CPUs, or 'mixed_bfloat16' on a "
      "TPU or a CPU with AVX512_BF16 or AMX."
  )
