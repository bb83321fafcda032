"""What stops a `Trainer.train` call early, as the error a user reads."""

from collections.abc import Iterator
import contextlib
from typing import Any

import tensorflow as tf

from runner.data import checks as data_checks
from runner.training import parameter_server_loops
from runner.training import run_state
from strategies import description
from strategies import peers
from strategies.errors import ConfigError


@contextlib.contextmanager
def user_errors(
    state: run_state.RunState,
    strategy: tf.distribute.Strategy,
    coordinator: Any,
    data: Any,
    label_range: Any,
    steps: int,
    global_batch_size: int,
) -> Iterator[None]:
  """Inside, what stops training early becomes the error a user reads.

  Args:
    state: the Trainer's `RunState`.
    strategy: the strategy it trains under.
    coordinator: under parameter servers its `ClusterCoordinator`, else None.
    data: the training data (`pipeline.PreparedData`).
    label_range: the `LabelRange` its labels are checked against, or None.
    steps: the step the call trains to.
    global_batch_size: examples per step over all replicas.

  Raises:
    ConfigError: the data ran out (the steps taken are saved first).
    DataError: a batch could not be read or parsed, or held a label
      outside `label_range`, NaN or inf (see `data_checks.step_error`).
    ClusterError: a peer (or under parameter servers a ps task) is gone.
  """
  first_step = state.step
  try:
    yield
  except tf.errors.OutOfRangeError:
    step = state.read_step()
    saved = ""
    if state.checkpoints is not None and step > (state.checkpoints.saved_step or 0):
      state.checkpoints.save(step)
      saved = f" Those steps are saved in a checkpoint at step {step}."
    raise ConfigError(
        f"The training data ran out at step {step} of {steps} ({step - first_step} step(s) in this call): it gave no "
        f"further full batch of {global_batch_size} examples although the Trainer repeats it. It is empty, or it "
        f"cannot be iterated twice (e.g. a one-shot Python generator); make it repeatable.{saved}"
    ) from None
  except data_checks.LabelsOutOfRangeError as e:
    raise data_checks.step_error(e, data.provider, label_range, step=e.step, purpose="training") from None
  except (tf.errors.InvalidArgumentError, tf.errors.DataLossError) as e:
    step = int(state.step_variable.numpy()) + 1
    raise data_checks.step_error(e, data.provider, label_range, step=step, purpose="training") from None
  except peers.PEER_ERRORS as e:
    saved_step = None if state.checkpoints is None else state.checkpoints.saved_step
    if coordinator is not None:
      raise parameter_server_loops.lost_ps(e, strategy, step=state.step, saved_step=saved_step) from None
    if description.is_single_worker(strategy):
      raise
    raise peers.lost(e, cluster_resolver=strategy.cluster_resolver, step=state.step, saved_step=saved_step) from None
