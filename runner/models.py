"""Built-in models, each called as `fn(config.model)` and returning an unbuilt Keras model.

The models build on their first batch, so they take any feature shape; they
flatten the features first. The output layer computes in float32 under a
mixed-precision policy, so logits and the loss keep full precision.

Their checks import no TensorFlow (Keras imports it), so a config's mistakes
are found before it loads; building a model imports Keras.
"""

from collections.abc import Callable
from typing import Any

from strategies import checks
from strategies.errors import ConfigError

# Activation names that every Keras 3 accepts: `check_mlp` takes them without importing Keras.
KERAS_ACTIVATIONS = frozenset(
    "elu exponential gelu hard_sigmoid leaky_relu linear log_softmax mish relu relu6 selu sigmoid silu softmax "
    "softplus softsign tanh".split()
)


def mlp(config: Any) -> Any:
  """A multi-layer perceptron: Dense+activation (+Dropout) per hidden layer, then Dense.

  Args:
    config: `config.model` with `hidden_units` (a tuple of layer widths),
      `activation`, `dropout` (a rate in [0, 1)) and `num_outputs`.
  """
  return _layers(config, config.hidden_units, "mlp")


def linear(config: Any) -> Any:
  """A linear model (logistic regression for classification).

  Args:
    config: `config.model` with `num_outputs`.
  """
  return _layers(config, (), "linear")


def _layers(config: Any, hidden_units: tuple[int, ...], name: str) -> Any:
  import keras  # noqa: PLC0415

  layers = [keras.layers.Flatten()]
  for units in hidden_units:
    layers.append(keras.layers.Dense(units, activation=config.activation))
    if config.dropout:
      layers.append(keras.layers.Dropout(config.dropout))
  layers.append(keras.layers.Dense(config.num_outputs, dtype="float32"))
  return keras.Sequential(layers, name=name)


def check_mlp(config: Any) -> None:
  """Raises ConfigError for an `mlp` config that cannot build."""
  check_linear(config)
  for units in config.hidden_units:
    checks.positive_int(units, f"Each of config.model.hidden_units={config.hidden_units!r}")
  if not 0.0 <= config.dropout < 1.0:
    raise ConfigError(f"config.model.dropout must be in [0, 1), got {config.dropout!r}.")
  if config.activation in KERAS_ACTIVATIONS:
    return
  import keras  # noqa: PLC0415  # A name of a newer Keras, or not one.

  try:
    keras.activations.get(config.activation)
  except ValueError:
    raise ConfigError(
        f"config.model.activation={config.activation!r} is not a Keras activation; "
        "use a name such as 'relu', 'gelu', 'tanh' or 'silu'."
    ) from None


def check_linear(config: Any) -> None:
  """Raises ConfigError for a `linear` config that cannot build."""
  checks.positive_int(config.num_outputs, "config.model.num_outputs")


# Name -> (function, its own config fields with their defaults, its check).
BUILTINS: dict[str, tuple[Callable[..., Any], dict[str, Any], Callable[..., None]]] = {
    "mlp": (mlp, {"num_outputs": 10, "hidden_units": (128,), "activation": "relu", "dropout": 0.0}, check_mlp),
    "linear": (linear, {"num_outputs": 10}, check_linear),
}
