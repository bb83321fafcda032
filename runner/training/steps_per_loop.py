"""Steps per loop: a fixed int, or "auto", chosen from the measured step time.

Every loop is one `tf.function` call, one host round trip and one report, so
a loop costs the host a fixed time on top of its steps: a call's own cost
(dispatch, the result's fetch) and the actions between calls (the progress
report, the stop-request check). With few steps per loop that cost dominates
a small step; with many, progress is reported rarely. "auto"
(`config.trainer.steps_per_loop=None`, or `Trainer(steps_per_loop="auto")`)
measures both and picks the fewest steps per loop that keep the host's share
of a loop under `OVERHEAD_SHARE` (`MeasuredStepsPerLoop`):

- the call's cost: first the time of a call of zero steps (two, after
  tracing); once warm loops of sizes at least `_FIT_SPAN` apart have run,
  the intercept of the line through the smallest and the latest large one's
  times, as a real call costs more than an empty one (its first step wakes
  threads and the input's prefetch); the actions' cost after every loop; the
  step time from every loop (the slope of that line, once there is one);
- one Trainer keeps its measurements across `train` calls, so a later call
  starts at the size the earlier ones settled on;
- the first loop has `FIRST` step(s); each loop after it has
  `ceil(host / (OVERHEAD_SHARE / (1 - OVERHEAD_SHARE) * step))` steps from the
  latest figures, rounded up to 1, 2 or 5 times a power of ten, and changed
  only when the figures call for at least twice or at most half the size;
- at most `MOST` steps, and at most `REPORT_SECONDS` of steps, so progress is
  reported at least about that often;
- where evaluations or checkpoints are due every N steps, a divisor of N (of
  their greatest common divisor), so that loops end at those steps without
  being cut short.

Across several workers every worker must run loops of the same sizes, which
times measured apart would not give: there, and under parameter servers,
"auto" is `DEFAULT` steps per loop (`ON_TPU` under a TPUStrategy), lowered to
the largest divisor of `eval_every` and `checkpoint_every` (`fixed_auto`);
`tpu_check` builds its steps with that value too.
"""

from collections.abc import Iterable
import math
import statistics
from typing import Any, cast

from runner.training import parameter_server_loops
from strategies import description

AUTO = "auto"
FIRST = 1
MOST = 1000
OVERHEAD_SHARE = 0.02
REPORT_SECONDS = 10.0
DEFAULT = 100
ON_TPU = 1000
_FIT_SPAN = 4  # Loop sizes this far apart fit a call's cost (MeasuredStepsPerLoop._fit).
_MOST_SIZES_FITTED = 8  # Loop sizes remembered for that fit; the least recently run go first.


def fixed_auto(cadences: Iterable[int | None], *, tpu: bool) -> int:
  """Returns the fixed "auto" of several workers: `DEFAULT` (`ON_TPU` on a TPU), lowered to a divisor of `cadences`.

  Args:
    cadences: the every-N-steps of evaluations and checkpoints (None: not set).
    tpu: whether the steps run under a TPUStrategy.
  """
  most = ON_TPU if tpu else DEFAULT
  known = [cadence for cadence in cadences if cadence is not None]
  if not known:
    return most
  return _largest_divisor_at_most(math.gcd(*known), most)


def resolve(
    steps_per_loop: int | str | None,
    *,
    strategy: Any,
    cadences: Iterable[int | None],
    measured: "dict[Any, MeasuredStepsPerLoop] | None" = None,
) -> "FixedStepsPerLoop | MeasuredStepsPerLoop":
  """Returns the loop sizes of a `train` call: the one place the option `steps_per_loop` is turned into them.

  Args:
    steps_per_loop: the option: a positive int, or `AUTO` (a config's None).
    strategy: the `tf.distribute.Strategy` the steps run under.
    cadences: the every-N-steps of evaluations and checkpoints (None: not set).
    measured: None, or a dict the caller keeps, cadences -> the
      `MeasuredStepsPerLoop` made for them: a later `train` call then starts
      at the size the earlier ones settled on.

  Returns:
    A `MeasuredStepsPerLoop` for "auto" where one process runs every replica;
    else a `FixedStepsPerLoop`: the option, or `fixed_auto`. Under parameter
    servers a loop is one scheduled function per worker, so its size is that
    many times the per-worker value.
  """
  kind = description.kind(strategy)
  cadences = tuple(cadences)
  if steps_per_loop in (None, AUTO) and kind != "parameter_server" and description.is_single_worker(strategy):
    measured = {} if measured is None else measured
    if cadences not in measured:
      measured[cadences] = MeasuredStepsPerLoop(cadences=cadences)
    return measured[cadences]
  size = fixed_auto(cadences, tpu=kind == "tpu") if steps_per_loop in (None, AUTO) else cast(int, steps_per_loop)
  if kind == "parameter_server":
    size *= parameter_server_loops.num_workers(strategy)
  return FixedStepsPerLoop(size)


class FixedStepsPerLoop:
  """Loops of `size` steps (the last one of a `train` call possibly shorter), the same on every worker.

  It has the interface of `MeasuredStepsPerLoop`, whose measurements it
  ignores, so the controller treats both alike.
  """

  needs_call_overhead = False

  def __init__(self, size: int) -> None:
    """Initializes the `FixedStepsPerLoop`.

    Args:
      size: the steps per loop, a positive int.
    """
    self.size = size
    self.looping = size > 1  # The loop function runs many steps per call (one builds the loop-free function).

  def record_call_overhead(self, seconds: float) -> None:
    """Ignores the measurement: the size is fixed."""

  def record_loop(self, *, steps: int, seconds: float, host_seconds: float | None = None) -> None:
    """Ignores the measurement: the size is fixed."""

  def next_size(self, step: int, end: int) -> int:
    """The steps of the loop that starts at global step `step` of a call that ends at `end`."""
    return min(self.size, end - step)


class MeasuredStepsPerLoop:
  """The steps of the next loop under "auto", from the times the controller records (see the module doc).

  Attributes:
    size: the steps of the next loop.
    most: the most steps a loop may have.
    looping: always True: the loop function runs many steps per call, and a
      call of zero steps times its own cost.
  """

  looping = True

  def __init__(
      self,
      *,
      cadences: Iterable[int | None] = (),
      most: int = MOST,
      overhead_share: float = OVERHEAD_SHARE,
      report_seconds: float = REPORT_SECONDS,
  ) -> None:
    """Initializes the `MeasuredStepsPerLoop`.

    Args:
      cadences: the every-N-steps at which evaluations or checkpoints are due
        (None: not set); loop sizes divide their greatest common divisor.
      most: the most steps per loop.
      overhead_share: the largest share of a loop the host's cost may take.
      report_seconds: the most seconds of steps per loop.
    """
    known = [cadence for cadence in cadences if cadence is not None]
    self._cadence = math.gcd(*known) if known else None
    self.most = most if self._cadence is None else _largest_divisor_at_most(self._cadence, most)
    self._share = overhead_share / (1.0 - overhead_share)
    self._report_seconds = report_seconds
    self._empty_call: float | None = None  # A call of zero steps.
    self._call = 0.0  # A call's own cost: the empty call's, or the fitted one (`_fit`).
    self._between_loops: list[float] = []
    self._loop_seconds: dict[int, list[float]] = {}  # steps -> the seconds of the latest warm loops of that many steps
    self.step_seconds: float | None = None
    self.size = min(FIRST, self.most)

  def next_size(self, step: int, end: int) -> int:
    """The steps of the loop that starts at global step `step` of a call that ends at `end`.

    A loop goes to the next multiple of `size`, as fixed sizes end loops from
    step 0.
    """
    return min(self.size - step % self.size, end - step)

  @property
  def needs_call_overhead(self) -> bool:
    """Whether a call's own cost is still to be recorded (`record_call_overhead`): only once per instance."""
    return self._empty_call is None

  def record_call_overhead(self, seconds: float) -> None:
    """Records the time of a call that runs no step."""
    self._empty_call = self._call = seconds

  def record_loop(self, *, steps: int, seconds: float, host_seconds: float | None = None) -> None:
    """Records a loop of `steps` steps that took `seconds`, and the host's time since the loop before; updates `size`.

    Args:
      steps: the steps the loop ran.
      seconds: the wall time of its call.
      host_seconds: the host's time between the previous call's end and this
        call's start (actions, reports); None for the first loop of a
        `train` call, whose time also holds the input pipeline's start and
        so is not used to fit the call's cost.
    """
    if host_seconds is not None:
      self._between_loops = (self._between_loops + [host_seconds])[-5:]
      if steps:
        self._loop_seconds[steps] = (self._loop_seconds.pop(steps, []) + [seconds])[-5:]  # Now the latest size.
        while len(self._loop_seconds) > _MOST_SIZES_FITTED:  # The least recently run size goes.
          del self._loop_seconds[next(iter(self._loop_seconds))]
    if not steps:
      return
    self._call = self._empty_call or 0.0
    self.step_seconds = max(seconds - self._call, 1e-9) / steps
    self._fit()
    host = self._call + (statistics.median(self._between_loops) if self._between_loops else 0.0)
    cap = min(self.most, max(1, int(self._report_seconds / self.step_seconds)))
    raw = host / (self._share * self.step_seconds)
    wanted = _round_down(cap) if raw > cap else _round_up(raw)
    if self._cadence is not None:
      wanted = min(d for d in _divisors(self._cadence) if d >= min(wanted, self._cadence))
      wanted = wanted if wanted <= cap else _largest_divisor_at_most(self._cadence, cap)
    if not self.size / 2 < wanted < self.size * 2:
      self.size = max(1, wanted)

  def _fit(self) -> None:
    """Sets the call's cost and the step time from the line through a small and a large loop size's median times.

    A call costs more than a call of zero steps: its first step wakes
    threads and the input's prefetch. A line through the times of the
    smallest loop and the latest large one (at least `_FIT_SPAN` times as
    many steps) shows that cost as its intercept, which the small loop pins
    down (a large loop's noise moves it by little); it is never taken below
    the zero-step call's time. Nothing changes until such loops have run.
    """
    small, small_times = min(self._loop_seconds.items(), default=(0, []))
    large = next((size for size in reversed(self._loop_seconds) if small and size >= _FIT_SPAN * small), None)
    if large is None:
      return
    small_seconds, large_seconds = statistics.median(small_times), statistics.median(self._loop_seconds[large])
    step_seconds = (large_seconds - small_seconds) / (large - small)
    if step_seconds > 0:
      self.step_seconds = step_seconds
      self._call = max(small_seconds - small * step_seconds, self._empty_call or 0.0)


_NICE = [factor * 10**power for power in range(8) for factor in (1, 2, 5)]  # 1, 2, 5, 10, 20, 50, ...


def _round_up(steps: float) -> int:
  """The smallest of 1, 2, 5, 10, 20, 50, ... at least `steps`."""
  return next(n for n in _NICE if n >= steps)


def _round_down(steps: float) -> int:
  """The largest of 1, 2, 5, 10, 20, 50, ... at most `steps` (at least 1)."""
  return max(n for n in _NICE if n <= max(steps, 1))


def _divisors(number: int) -> list[int]:
  return [d for d in range(1, number + 1) if number % d == 0]


def _largest_divisor_at_most(number: int, most: int) -> int:
  return max(d for d in _divisors(number) if d <= most)
