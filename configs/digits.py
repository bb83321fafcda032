"""The default example: scikit-learn's handwritten digits (offline) and an MLP.

1797 8x8 images, a fixed seeded 80/20 split (1437 train, 360 test), pixels
scaled to [0, 1]. Reaches >= 0.95 test accuracy in seconds on a laptop CPU,
with any strategy.

Variants, as `--config=configs/digits.py:VARIANT`:
  tpu   a Cloud TPU: strategy 'tpu', mixed_bfloat16, 500 steps per loop and a
        global batch of 256 (divisible by 8, 16 or 32 TPU cores).
"""

import ml_collections

from strategies import ConfigError


def get_config(variant=""):
  """Returns the digits config; `variant` '' (the default) or 'tpu'."""
  config = ml_collections.ConfigDict()
  config.mode = "train_and_eval"
  config.data = ml_collections.ConfigDict(
      {
          "name": "digits",
          "global_batch_size": 64,
          "test_fraction": 0.2,
          "seed": 0,
      }
  )
  config.model = ml_collections.ConfigDict(
      {
          "name": "mlp",
          "hidden_units": (256, 128),
          "num_outputs": 10,
      }
  )
  config.task = ml_collections.ConfigDict({"name": "classification"})
  config.optimizer = ml_collections.ConfigDict(
      {
          "name": "adam",
          "learning_rate": 2e-3,
          "schedule": "cosine",
      }
  )
  config.trainer = ml_collections.ConfigDict(
      {
          "train_steps": 1000,
          "eval_every": 500,  # steps_per_loop stays auto: measured, up to 500 steps per loop.
          "seed": 0,
      }
  )
  if variant == "tpu":
    config.strategy = ml_collections.ConfigDict({"name": "tpu"})
    config.data.global_batch_size = 256
    config.optimizer.learning_rate = 4e-3
    config.trainer.precision = "mixed_bfloat16"
  elif variant:
    raise ConfigError(f"configs/digits.py has no variant {variant!r}; variants: '' (default), 'tpu'.")
  return config
