"""Export: a SavedModel whose `serving_default` signature gives the model's predictions."""

from typing import Any
import warnings

import tensorflow as tf

from runner.outputs import worker_files
from runner.training import loops


def export_saved_model(strategy: tf.distribute.Strategy, model: Any, features_spec: Any, path: str) -> str:
  """Writes `model` as a SavedModel at `path` (on the chief; other workers write to a deleted temporary dir).

  The `serving_default` signature takes the features (one tensor named
  `features`, or a dict's tensors by key) with any batch size and returns a
  dict: `{"outputs": tensor}` for a single output, `{"outputs_<i>": ...}` for
  a list, the model's own keys for a dict. Floating outputs are float32. The
  SavedModel loads with `tf.saved_model.load` alone, without this package.

  A signature takes dense tensors only, so with composite features (ragged,
  sparse, a TF-GNN `GraphTensor`) the function is given as the SavedModel's
  attribute `serve` instead (`tf.saved_model.load(path).serve(features)`; a
  `GraphTensor` needs `tensorflow_gnn` imported to load it).

  Args:
    strategy: the `tf.distribute.Strategy` of the model's variables.
    model: a built Keras model.
    features_spec: the spec nest of one batch of features.
    path: the SavedModel directory.

  Returns:
    `path` on the chief, else the deleted temporary directory.
  """
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
  with worker_files.destination(strategy, path) as written:
    with warnings.catch_warnings():  # Composite specs: "loading ... will require that this type be imported".
      warnings.filterwarnings("ignore", "Encoding a StructuredValue with type", UserWarning)
      tf.saved_model.save(module, written, signatures=None if composite else {"serving_default": serve})
  return written
