"""Generated data and an MLP: needs nothing beyond TensorFlow, trains in seconds.

Labels come from a fixed random linear teacher over 16 Gaussian features
(10 classes), so the model can learn them; a quick end-to-end check of a
machine, a strategy or a cluster.

Variants, as `--config=configs/synthetic.py:VARIANT`:
  regression   real-valued targets, task 'regression', one model output.
"""

import ml_collections

from strategies import ConfigError


def get_config(variant=""):
  """Returns the synthetic config; `variant` '' (the default) or 'regression'."""
  config = ml_collections.ConfigDict()
  config.mode = "train_and_eval"
  config.data = ml_collections.ConfigDict(
      {
          "name": "synthetic",
          "global_batch_size": 64,
          "num_examples": 2048,
          "num_eval_examples": 512,
          "num_features": 16,
          "num_classes": 10,
          "seed": 0,
      }
  )
  config.model = ml_collections.ConfigDict({"name": "mlp", "hidden_units": (64,), "num_outputs": 10})
  config.task = ml_collections.ConfigDict({"name": "classification"})
  config.optimizer = ml_collections.ConfigDict({"name": "adam", "learning_rate": 3e-3})
  config.trainer = ml_collections.ConfigDict({"train_steps": 200, "steps_per_loop": 50, "seed": 0})
  if variant == "regression":
    config.data.regression = True
    config.model.num_outputs = 1
    config.task.name = "regression"
  elif variant:
    raise ConfigError(f"configs/synthetic.py has no variant {variant!r}; variants: '' (default), 'regression'.")
  return config
