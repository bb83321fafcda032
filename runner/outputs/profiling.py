"""A TensorFlow profiler trace of chosen training steps, written where TensorBoard's Profile tab finds it.

`ProfileWindow(first=5, last=10, logdir=...)` makes train loops end after
step 4 and after step 10, starts `tf.profiler.experimental` before the loop
that runs step 5 and stops it after the loop that ends at step 10. The trace
goes to `logdir/plugins/profile/<session>/<host>.xplane.pb`; with `logdir` a
run's summary directory (`model_dir/summaries/train`), `tensorboard
--logdir=model_dir` lists it in the Profile tab (from the
`tensorboard-plugin-profile` package) under run `summaries/train/<session>`.
`check_steps` imports no TensorFlow (config checks use it before it loads).
"""

from typing import Any

from absl import logging

from strategies import checks
from strategies.errors import ConfigError


def check_steps(steps: Any, what: str = "profile_steps") -> tuple[int, int] | None:
  """Returns `steps` as a `(first, last)` tuple of ints, 1 <= first <= last, or None for None.

  Raises:
    ConfigError: anything else, naming `what`.
  """
  if steps is None:
    return None
  pair = isinstance(steps, (tuple, list)) and len(steps) == 2 and all(checks.is_int(step) for step in steps)
  if not pair or not 1 <= steps[0] <= steps[1]:
    raise ConfigError(
        f"{what} must be None or a pair of steps (first, last) with 1 <= first <= last, e.g. (5, 10), "
        f"got {steps!r}."
    )
  return (int(steps[0]), int(steps[1]))


class ProfileWindow:
  """Profiles global steps `first` to `last` (both included) of training, once.

  The controller asks `loop_size` where loops must end, and calls `before_loop`
  and `after_loop` around each loop, and `close` when training ends (normally
  or by an exception: a started trace is then stopped and kept).
  """

  def __init__(self, *, first: int, last: int, logdir: str) -> None:
    """Initializes the `ProfileWindow`.

    Args:
      first: the first global step to profile (1-based; `check_steps` checked the pair).
      last: the last global step to profile.
      logdir: where the profiler writes its `plugins/profile` directory.
    """
    self._first, self._last, self._logdir = first, last, logdir
    self._active = self._done = False

  def loop_size(self, step: int, size: int, steps_per_loop: int) -> int:
    """Returns `size` (the steps of the next loop from `step`), cut so loops end after `first - 1` and `last`.

    After the window, the next loop ends at a multiple of `steps_per_loop`,
    so that loops fall back in step.
    """
    for boundary in (self._first - 1, self._last):
      if step < boundary < step + size:
        return boundary - step
    return min(size, steps_per_loop - step % steps_per_loop) if step >= self._last else size

  def before_loop(self, step: int) -> None:
    """Starts the profiler if the loop starting after global step `step` is the window's first."""
    if self._done or self._active:
      return
    if step >= self._first:
      logging.warning(
          f"profile_steps=({self._first}, {self._last}): training resumed at step {step}, past step {self._first}; "
          f"no profile is taken. Choose steps after {step} to profile this run."
      )
      self._done = True
    elif step == self._first - 1:
      import tensorflow as tf  # noqa: PLC0415

      tf.profiler.experimental.start(self._logdir)
      self._active = True

  def after_loop(self, step: int) -> None:
    """Stops the profiler once the loop that ended at global step `step` reached the window's last step."""
    if step >= self._last:
      self.close(step)

  def close(self, step: int) -> None:
    """Stops a running trace (training ended at global step `step`, at `last` or before)."""
    if not self._active:
      return
    import tensorflow as tf  # noqa: PLC0415

    tf.profiler.experimental.stop()
    self._active, self._done = False, True
    logging.info(
        f"Profiled steps {self._first} to {min(step, self._last)} into {self._logdir}/plugins/profile; TensorBoard's "
        "Profile tab opens it (pip install 'tf-runner[tensorboard]')."
    )
