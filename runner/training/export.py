"""Export: a SavedModel whose `serving_default` signature gives the model's predictions."""

from typing import Any
import warnings

import tensorflow as tf

from runner.data import checks as data_checks
from runner.data import pipeline as input_pipeline
from runner.outputs import worker_files
from runner.training import ema
from runner.training import loops
from strategies.errors import ConfigError


def export_saved_model(strategy: tf.distribute.Strategy, parts: Any, path: str) -> str:
  """Writes a Trainer's model as a SavedModel at `path` (on the chief; other workers write to a deleted temporary dir).

  The `serving_default` signature takes the features (one tensor named
  `features`, or a dict's tensors by key) with any batch size and returns a
  dict: `{"outputs": tensor}` for a single output, `{"outputs_<i>": ...}` for
  a list, the model's own keys for a dict. Floating outputs are float32. The
  SavedModel loads with `tf.saved_model.load` alone, without this package.
  It holds the moving average of the weights when the optimizer keeps one
  (`ema.averaged_weights`).

  A signature takes dense tensors only, so with composite features (ragged,
  sparse, a TF-GNN `GraphTensor`) the function is given as the SavedModel's
  attribute `serve` instead (`tf.saved_model.load(path).serve(features)`; a
  `GraphTensor` needs `tensorflow_gnn` imported to load it).

  Args:
    strategy: the `tf.distribute.Strategy` of the model's variables.
    parts: the Trainer's `model_parts.ModelParts`: the model, and the
      features it was built from (else those its `keras.Input` declares).
    path: the SavedModel directory.

  Returns:
    `path` on the chief, else the deleted temporary directory.

  Raises:
    ConfigError: the model's input shape is unknown (a model that builds
      lazily, before any data).
  """
  model, declared = parts.model, data_checks.declared_features_spec(parts.model)
  features_spec = parts.features_spec or (None if declared is None else input_pipeline.batch_spec(declared))
  if not parts.ready or features_spec is None:
    raise ConfigError(
        "export needs the model's input shape, which this model does not know yet: call train or evaluate "
        "first, pass export(path, data=...), or give the model an input in model_fn (keras.Input)."
    )
  composite = not all(isinstance(spec, tf.TensorSpec) for spec in tf.nest.flatten(features_spec))
  if composite:
    signature = features_spec
  elif isinstance(features_spec, dict):
    signature = {
        key: tf.TensorSpec([None] + spec.shape[1:], spec.dtype, name=key) for key, spec in features_spec.items()
    }
  else:
    signature = tf.nest.map_structure(
        lambda spec: tf.TensorSpec([None] + spec.shape[1:], spec.dtype, name="features"), features_spec
    )

  @tf.function(input_signature=[signature])
  def serve(features: Any) -> Any:
    outputs = loops.float32_outputs(model(features, training=False))
    if isinstance(outputs, dict):
      return outputs
    if isinstance(outputs, (list, tuple)):
      return {f"outputs_{i}": output for i, output in enumerate(outputs)}
    return {"outputs": outputs}

  module = tf.Module()
  module.model = model
  module.serve = serve
  with ema.averaged_weights(strategy, parts), worker_files.destination(strategy, path) as written:
    with warnings.catch_warnings():  # Composite specs: "loading ... will require that this type be imported".
      warnings.filterwarnings("ignore", "Encoding a StructuredValue with type", UserWarning)
      tf.saved_model.save(module, written, signatures=None if composite else {"serving_default": serve})
  return written
