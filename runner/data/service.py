"""Training input on a tf.data service: `config.data.service` and `service_mode`, and what each mode keeps.

With a dispatcher's address, each input pipeline's training batches are
made by the service's workers (`tf.data.experimental.service.distribute`,
applied in `runner.data.pipeline.for_training`); evaluation input stays
local, as the service could repeat or lose examples and evaluation counts
each once. Imports no TensorFlow, so the config checks use it before
TensorFlow loads. docs/clusters.md#the-tfdata-service says how to start one.
"""

import dataclasses
import re

from strategies import checks
from strategies import schema
from strategies.errors import ConfigError

MODES = ("parallel_epochs", "distributed_epoch")
NOT_UNDER_PARAMETER_SERVERS = (
    "config.data.service does not apply under parameter_server (its workers read their own input); choose another "
    "strategy, or config.data.service=None."
)
_ADDRESS = re.compile(r"^grpc://[^\s/:]+:\d+$")
# What each mode keeps of exact resume and of "every example once per epoch" (the run's first log line says it).
_KEEPS = {
    "parallel_epochs": (
        "every service worker makes the whole stream: with one worker the batches of local input (exact resume, every "
        "example once per epoch); with more, each batch comes from each worker, in no fixed order (neither holds)"
    ),
    "distributed_epoch": (
        "the workers share the stream's source in splits: every example once per epoch (less the splits of a worker "
        "that dies, and a few batches around a stop); exact resume only with one worker (more finish out of order)"
    ),
}


def check_address(value: str | None, what: str) -> str | None:
  """Returns `value` if it is None or a dispatcher's address `grpc://HOST:PORT`.

  Raises:
    ConfigError: naming `what` and the valid form.
  """
  if value is not None and not (isinstance(value, str) and _ADDRESS.match(value)):
    raise ConfigError(
        f"{what}={value!r} is not a tf.data service dispatcher's address: give None or 'grpc://HOST:PORT', e.g. "
        "'grpc://127.0.0.1:5050' (python -m runner.data_service --dispatcher=127.0.0.1:5050 starts one)."
    )
  return value


@dataclasses.dataclass(frozen=True, kw_only=True)
class DataService:
  """The tf.data service a Trainer's training input runs on (the Trainer's `data_service`).

  Attributes:
    address: the dispatcher, `grpc://HOST:PORT`.
    mode: the processing mode, one of `MODES` (what each keeps: `describe`).
    timeout_seconds: the longest wait for the dispatcher to accept a
      connection when a training input starts (None: no limit).

  Raises:
    ConfigError: from the constructor, naming the first invalid field.
  """

  address: str
  mode: str = MODES[0]
  timeout_seconds: float | None = schema.DEFAULTS["timeout_seconds"]  # config.strategy.timeout_seconds' default

  def __post_init__(self) -> None:
    check_address(self.address, "address")
    checks.one_of(self.mode, MODES, "mode")
    checks.positive_number(self.timeout_seconds, "timeout_seconds", optional=True)

  def describe(self) -> str:
    """One line: where the training input runs, in which mode, and what that keeps."""
    return f"training input on the tf.data service at {self.address}, {self.mode}: {_KEEPS[self.mode]}"
