"""Built-in datasets, each called as `fn(config.data, split)` with split 'train' or 'eval'.

Each returns a DatasetProvider of unbatched `(features, labels)`: the train
split shuffled (seeded; the Trainer repeats it), the eval split in order.
Their checks import no TensorFlow; making the data does (`runner.data`).
"""

from collections.abc import Callable
import importlib.util
import math
from typing import Any

from ml_collections import config_dict
import numpy as np

from strategies import checks
from strategies.errors import ConfigError


def digits(config: Any, split: str) -> Any:
  """scikit-learn's 1797 8x8 handwritten digits (offline), 10 classes.

  A fixed split: a permutation seeded by `config.seed` puts the first
  `test_fraction` of the examples (rounded up: 360 of 1797 for 0.2) in
  'eval' and the rest in 'train'. Features are the 64 pixel intensities
  scaled to [0, 1]; labels are ints 0..9.

  Args:
    config: `config.data` with `test_fraction` and `seed`.
    split: 'train' or 'eval'.
  """
  from sklearn import datasets as sklearn_datasets  # noqa: PLC0415  Installed: `check_digits` ran first.

  bunch = sklearn_datasets.load_digits()
  features, labels = (bunch.data / 16.0).astype(np.float32), bunch.target.astype(np.int32)
  order = np.random.RandomState(config.seed).permutation(len(labels))
  num_eval = math.ceil(len(labels) * config.test_fraction)
  chosen = order[num_eval:] if split == "train" else order[:num_eval]
  from runner.data import providers as data  # noqa: PLC0415

  return data.InMemory(features[chosen], labels[chosen], shuffle=split == "train", seed=config.seed)


def check_digits(config: Any) -> None:
  """Raises ConfigError for a `digits` config that cannot load, or without scikit-learn (found, not imported)."""
  if not 0.0 < config.test_fraction < 1.0:
    raise ConfigError(f"config.data.test_fraction must be in (0, 1), got {config.test_fraction!r}.")
  if importlib.util.find_spec("sklearn") is None:
    raise ConfigError(
        "Dataset 'digits' needs scikit-learn, which is not installed: "
        "pip install 'tf-runner[examples]' (or pip install scikit-learn)."
    )


def synthetic(config: Any, split: str) -> Any:
  """Generated data: Gaussian features, labels from a fixed random linear teacher.

  The teacher `w` (num_features x num_classes) comes from `config.seed`; each
  split draws its own features from its own seed. A label is
  `argmax(x @ w + noise)`, or with `regression=True` the real vector
  `x @ w[:, :1] + noise` of shape (1,).

  Args:
    config: `config.data` with `num_examples`, `num_eval_examples`,
      `num_features`, `num_classes`, `noise`, `regression`, `shuffle` (the
      training split; a seeded shuffle of each input pipeline's share) and
      `seed`.
    split: 'train' or 'eval'.
  """
  teacher = np.random.RandomState(config.seed).normal(size=(config.num_features, config.num_classes))
  training = split == "train"
  rng = np.random.RandomState(config.seed + (1 if training else 2))
  count = config.num_examples if training else config.num_eval_examples
  features = rng.normal(size=(count, config.num_features)).astype(np.float32)
  if config.regression:
    targets = features @ teacher[:, :1] + config.noise * rng.normal(size=(count, 1))
    labels = targets.astype(np.float32)
  else:
    scores = features @ teacher + config.noise * rng.normal(size=(count, config.num_classes))
    labels = scores.argmax(axis=1).astype(np.int32)
  from runner.data import providers as data  # noqa: PLC0415

  return data.InMemory(features, labels, shuffle=training and config.shuffle, seed=config.seed)


def check_synthetic(config: Any) -> None:
  """Raises ConfigError for a `synthetic` config that cannot generate."""
  for field in ("num_examples", "num_eval_examples", "num_features", "num_classes"):
    checks.positive_int(config[field], f"config.data.{field}")
  if config.noise < 0:
    raise ConfigError(f"config.data.noise must be >= 0, got {config.noise!r}.")


def check_tfds(config: Any) -> None:
  """Raises ConfigError for a 'tfds:NAME' config that cannot load, or without tensorflow-datasets (found, not imported).

  What only TFDS can tell (the dataset, its splits and features) is checked
  when the data is made (`runner.data.tfds_files.dataset`).
  """
  if not config.name.partition(":")[2]:
    raise ConfigError(f"config.data.name={config.name!r} names no TFDS dataset; give 'tfds:NAME', e.g. 'tfds:mnist'.")
  if importlib.util.find_spec("tensorflow_datasets") is None:
    raise ConfigError(
        f'Dataset {config.name!r} needs tensorflow-datasets, which is not installed: pip install -e ".[tfds]" '
        "(or pip install 'tf-runner[tfds]')."
    )
  for field in ("train_split", "eval_split"):
    if not config[field]:
      raise ConfigError(f"config.data.{field} must name a split of the dataset, got {config[field]!r}.")
  if config.preprocess is not None and ":" not in config.preprocess:
    raise ConfigError(
        f"config.data.preprocess must be an import path 'package.module:function', got {config.preprocess!r}."
    )


# The own fields of a TFDS dataset, 'tfds:NAME' (None: TFDS's default data_dir; the supervised keys; no function).
TFDS_FIELDS = {
    "tfds_data_dir": config_dict.placeholder(str),
    "train_split": "train",
    "eval_split": "test",
    "feature_key": config_dict.placeholder(str),
    "label_key": config_dict.placeholder(str),
    "preprocess": config_dict.placeholder(str),
}

# Name -> (function, its own config fields with their defaults, its check).
BUILTINS: dict[str, tuple[Callable[..., Any], dict[str, Any], Callable[..., None]]] = {
    "digits": (digits, {"test_fraction": 0.2, "seed": 0}, check_digits),
    "synthetic": (
        synthetic,
        {
            "num_examples": 2048,
            "num_eval_examples": 512,
            "num_features": 16,
            "num_classes": 10,
            "noise": 0.1,
            "regression": False,
            "shuffle": True,
            "seed": 0,
        },
        check_synthetic,
    ),
}
