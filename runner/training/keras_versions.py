"""The two Kerases a Trainer trains: Keras 3 (`keras`) and Keras 2 (`tf_keras`), and the calls where they differ.

Which one a run uses is read from the objects `model_fn` and `optimizer_fn`
return (`isinstance` with each Keras's public classes), never from a flag.
Keras 3 is always importable (a requirement); `tf_keras` is looked at only
when it is already imported, which it is once a tf_keras object exists, so a
Keras 3 run never imports it.

Where they differ, for a custom loop (docs/keras2_and_gnn.md#what-differs):

| | Keras 3 | tf_keras |
|---|---|---|
| apply gradients | `optimizer.apply(grads, variables)` | `optimizer.apply_gradients(zip(grads, variables))` |
| loss scaling | `scale_loss(loss)`; `apply` unscales | `get_scaled_loss(loss)`, `get_unscaled_gradients(grads)` |
| optimizer built | `optimizer.built` | its `build` returns at once when built |
| next step's learning rate | `optimizer.learning_rate` | the schedule at `iterations` (not the last step's rate) |
| output spec | `compute_output_spec(KerasTensor)` | a functional model's `output`, else `compute_output_signature` |

Both sum the gradients over replicas inside their apply, as the Trainer's
loss (scaled by the global batch) expects.
"""

from collections.abc import Iterator
import contextlib
import dataclasses
import importlib
import sys
from typing import Any

import tensorflow as tf

from runner import keras_workarounds
from strategies.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class KerasVersion:
  """One Keras, by the module that holds it.

  Attributes:
    name: how messages name it, e.g. "tf_keras (Keras 2)".
    module_name: its top-level module, 'keras' or 'tf_keras'.
  """

  name: str
  module_name: str

  @property
  def module(self) -> Any:
    """The Keras module (imported on first use)."""
    return importlib.import_module(self.module_name)

  def is_instance(self, value: Any, class_path: str) -> bool:
    """Whether `value` is an instance of the module's class at `class_path` (False while it is not imported)."""
    found = sys.modules.get(self.module_name)
    for name in class_path.split("."):
      found = getattr(found, name, None)
    return isinstance(found, type) and isinstance(value, found)

  def scales_loss(self, optimizer: Any) -> bool:
    """Whether `optimizer` is this Keras's `LossScaleOptimizer`."""
    return isinstance(optimizer, self.module.mixed_precision.LossScaleOptimizer)

  def scaled_loss(self, optimizer: Any, loss: tf.Tensor) -> tf.Tensor:
    """The loss to differentiate under a `LossScaleOptimizer`: `loss` times its current scale."""
    return optimizer.scale_loss(loss) if self is KERAS_3 else optimizer.get_scaled_loss(loss)

  def gradients_to_apply(self, optimizer: Any, gradients: list[Any]) -> list[Any]:
    """Gradients of the scaled loss, as this Keras's `LossScaleOptimizer` wants them (tf_keras: unscaled first)."""
    return gradients if self is KERAS_3 else optimizer.get_unscaled_gradients(gradients)

  def loss_scale(self, optimizer: Any) -> Any:
    """The factor by which `gradients_to_apply`'s result is too large: the loss scale (Keras 3), else 1."""
    return optimizer.dynamic_scale if self is KERAS_3 else 1.0

  def apply(self, optimizer: Any, gradients: list[Any], variables: list[Any]) -> None:
    """Applies `gradients` (each replica's, summed over replicas by the optimizer) to `variables`."""
    if self is KERAS_3:
      optimizer.apply(gradients, variables)
    else:
      optimizer.apply_gradients(zip(gradients, variables))

  def learning_rate(self, optimizer: Any) -> Any:
    """The learning rate the optimizer's next step uses (tf_keras's `learning_rate` is its last step's)."""
    schedule = None if self is KERAS_3 else keras_workarounds.tf_keras_learning_rate(optimizer)
    if isinstance(schedule, self.module.optimizers.schedules.LearningRateSchedule):
      return schedule(optimizer.iterations)
    return optimizer.learning_rate

  def optimizer_variables(self, optimizer: Any) -> list[Any]:
    """Every variable of a built `optimizer`: step count, slots, the rest (Keras 3: a property; tf_keras: a call)."""
    return list(optimizer.variables if self is KERAS_3 else optimizer.variables())

  def build_optimizer(self, optimizer: Any, variables: list[Any]) -> None:
    """Makes `optimizer`'s slot variables for `variables` unless it has them (tf_keras's `build` checks that itself)."""
    if self is not KERAS_3 or not optimizer.built:
      optimizer.build(variables)

  def outputs_spec(self, model: Any, features_spec: Any) -> Any:
    """The spec of `model`'s outputs for a batch of `features_spec` (a nest of specs), or None if it cannot tell.

    Computed symbolically: nothing runs.
    """
    try:
      if self is KERAS_3:
        keras_tensor = self.module.KerasTensor
        outputs = model.compute_output_spec(
            tf.nest.map_structure(lambda s: keras_tensor(s.shape, s.dtype), features_spec)
        )
      elif hasattr(model, "output"):  # A functional tf_keras model: its declared outputs.
        outputs = model.output
      else:  # A subclassed one has none.
        outputs = model.compute_output_signature(features_spec)
      return tf.nest.map_structure(lambda t: tf.TensorSpec(t.shape, t.dtype), outputs)
    except (ValueError, TypeError, NotImplementedError, AttributeError, RuntimeError):
      return None


KERAS_3 = KerasVersion(name="Keras 3", module_name="keras")
TF_KERAS = KerasVersion(name="tf_keras (Keras 2)", module_name="tf_keras")
VERSIONS = (KERAS_3, TF_KERAS)


def of(value: Any) -> KerasVersion | None:
  """The Keras whose model, optimizer or metric `value` is; None for anything else."""
  kinds = ("Model", "optimizers.Optimizer", "metrics.Metric")
  return next((v for v in VERSIONS if any(v.is_instance(value, kind) for kind in kinds)), None)


def is_model(value: Any) -> bool:
  """Whether `value` is a model of either Keras."""
  return any(version.is_instance(value, "Model") for version in VERSIONS)


def is_optimizer(value: Any) -> bool:
  """Whether `value` is an optimizer of either Keras."""
  return any(version.is_instance(value, "optimizers.Optimizer") for version in VERSIONS)


def is_metric(value: Any) -> bool:
  """Whether `value` is a metric of either Keras (a task's metrics may be of either, whatever the model's)."""
  return any(version.is_instance(value, "metrics.Metric") for version in VERSIONS)


def legacy_optimizer(optimizer: Any) -> tuple[str, str] | None:
  """`(its name, what to use instead)` for a tf_keras legacy optimizer (`tf_keras.optimizers.legacy`), else None.

  The Trainer takes the current optimizers of either Keras, which the legacy
  ones (OptimizerV2) are not.
  """
  if not TF_KERAS.is_instance(optimizer, "optimizers.legacy.Optimizer"):
    return None
  module, name = TF_KERAS.module, type(optimizer).__name__
  if getattr(module.optimizers.legacy, name, None) is type(optimizer) and hasattr(module.optimizers, name):
    return f"tf_keras.optimizers.legacy.{name}", f"tf_keras.optimizers.{name} (it takes the same arguments)"
  return f"{name} (a tf_keras.optimizers.legacy.Optimizer)", "a subclass of tf_keras.optimizers.Optimizer"


def of_model_and_optimizer(model: Any, optimizer: Any) -> KerasVersion:
  """The one Keras that `model` and `optimizer` both belong to.

  Raises:
    ConfigError: they belong to different Kerases (the message names both
      and the optimizer to use instead).
  """
  model_version, optimizer_version = of(model), of(optimizer)
  if model_version is None or model_version is not optimizer_version:
    named = [getattr(version, "name", "non-Keras") for version in (model_version, optimizer_version)]
    raise ConfigError(
        f"model_fn made a {named[0]} model but optimizer_fn made a {named[1]} optimizer ({type(optimizer).__name__}); "
        f"both must be of one Keras. Make the optimizer with the model's Keras, e.g. "
        f"{(model_version or KERAS_3).module_name}.optimizers.{type(optimizer).__name__}."
    )
  return model_version


@contextlib.contextmanager
def dtype_policies(precision: str) -> Iterator[None]:
  """Sets the global dtype policy of Keras 3 and, when it is imported, of tf_keras, inside the block only.

  The module of a tf_keras `model_fn` imports tf_keras (before the Trainer
  calls it); one that imports it only inside `model_fn` gets float32 layers.
  """
  kerases = [v.module.mixed_precision for v in VERSIONS if v is KERAS_3 or v.module_name in sys.modules]
  previous = [mixed_precision.global_policy() for mixed_precision in kerases]
  try:
    for mixed_precision in kerases:
      mixed_precision.set_global_policy(precision)
    yield
  finally:
    for mixed_precision, policy in zip(kerases, previous):
      mixed_precision.set_global_policy(policy)
