"""The "auto" steps per loop: the sizes it picks from recorded times (no timing is measured here)."""

import pytest
import tensorflow as tf

import runner
from runner.training import steps_per_loop
from testlib import trainer_testlib


def _after(auto, *loops):
  """Records `loops` of (steps, seconds, host seconds) and returns the size after each."""
  sizes = []
  for steps, seconds, host in loops:
    auto.record_loop(steps=steps, seconds=seconds, host_seconds=host)
    sizes.append(auto.size)
  return sizes


def test_the_first_loop_has_one_step_then_the_size_keeps_the_host_under_two_percent():
  auto = steps_per_loop.MeasuredStepsPerLoop()
  assert auto.size == steps_per_loop.FIRST == 1
  auto.record_call_overhead(0.001)
  # A 1 ms call and 250 us steps: 1 ms / (0.02 / 0.98 * 250 us) = 196 -> 200. With 1 ms of actions between
  # loops too: 2 ms / (0.02 / 0.98 * 250 us) = 392 -> 500.
  assert _after(auto, (1, 0.00125, None), (200, 0.051, 0.001)) == [200, 500]
  assert auto.step_seconds == pytest.approx(0.00025)
  assert (2 * 0.001) / (2 * 0.001 + 500 * 0.00025) < steps_per_loop.OVERHEAD_SHARE


def test_a_slow_step_keeps_progress_at_least_every_ten_seconds():
  auto = steps_per_loop.MeasuredStepsPerLoop()
  auto.record_call_overhead(0.5)  # A costly call would want 50 steps of 0.5 s...
  assert _after(auto, (1, 1.0, None)) == [20]  # ...but 20 steps take the 10 s most between reports.
  assert _after(auto, (20, 60.5, 0.0)) == [2]  # 3 s steps: 3 steps would fit; 2 is the nice number below.


def test_a_tiny_step_reaches_the_most_and_the_size_moves_only_for_a_factor_of_two():
  auto = steps_per_loop.MeasuredStepsPerLoop()
  auto.record_call_overhead(0.002)
  assert _after(auto, (1, 0.00201, None)) == [steps_per_loop.MOST]
  auto = steps_per_loop.MeasuredStepsPerLoop()
  auto.record_call_overhead(0.001)
  sizes = _after(auto, (1, 0.0015, None), (100, 0.051, 0.0), (100, 0.06, 0.0), (100, 0.021, 0.0))
  # 500 us steps want 100 steps; 590 us still 100 (a size within a factor of two stays); 200 us want 500.
  assert sizes == [100, 100, 100, 500]


def test_the_call_cost_is_fitted_from_loops_of_different_sizes():
  auto = steps_per_loop.MeasuredStepsPerLoop()
  auto.record_call_overhead(0.0005)
  # The first loop (input start-up) is left out of the fit; a warm 1-step loop of 2.5 ms then says 2 ms steps
  # (after the 0.5 ms zero-step call): 1 ms of host / (0.02 / 0.98 * 2 ms) = 25 -> 50. (The first alone wants 2.)
  assert _after(auto, (1, 0.02, None), (1, 0.0025, 0.0005)) == [2, 50]
  # 50 steps in 22.5 ms: the line through (1, 2.5 ms) and (50, 22.5 ms) has 20/49 ms steps and a call of
  # 2.5 - 20/49 = 2.09 ms, four times the zero-step call: (2.09 + 0.5) ms / (0.02 / 0.98 * 0.408 ms) = 311 -> 500.
  assert _after(auto, (50, 0.0225, 0.0005)) == [500]
  assert auto._call == pytest.approx(0.0025 - 0.02 / 49) and auto.step_seconds == pytest.approx(0.02 / 49)
  # Later loops of one size keep the fit: the size stays.
  assert _after(auto, (500, 0.206, 0.0005), (500, 0.21, 0.0005)) == [500, 500]


def test_a_fit_never_puts_a_call_below_a_zero_step_call():
  auto = steps_per_loop.MeasuredStepsPerLoop()
  auto.record_call_overhead(0.001)
  _after(auto, (1, 0.01, None), (1, 0.0011, 0.0), (100, 0.2, 0.0))  # The line's intercept would be negative.
  assert auto._call == 0.001


@pytest.mark.parametrize(
    "cadences, expected",
    [((300, None), 300), ((None, 250), 250), ((300, 200), 100), ((70, None), 70), ((1000, 400), 200)],
)
def test_sizes_divide_the_evaluation_and_checkpoint_steps(cadences, expected):
  auto = steps_per_loop.MeasuredStepsPerLoop(cadences=cadences)
  auto.record_call_overhead(0.001)
  assert _after(auto, (1, 0.0012, None)) == [expected]  # 200 us steps alone would want 500 (or the most).


class LoopEnds(runner.actions.Action):
  """Notes the step at which every loop ended."""

  def __init__(self):
    self.steps = []

  def __call__(self, loop):
    self.steps.append(loop.step)


def test_a_trainer_with_auto_starts_with_one_step_and_ends_loops_at_evaluations():
  loop_ends = LoopEnds()
  trainer = trainer_testlib.make_trainer(
      tf.distribute.OneDeviceStrategy("/cpu:0"), steps_per_loop="auto", actions=[loop_ends]
  )
  trainer.train(
      trainer_testlib.classification_data(64),
      global_batch_size=8,
      steps=60,
      eval_data=trainer_testlib.classification_data(16),
      eval_every=25,
  )
  ends = loop_ends.steps
  assert trainer.global_step == 60
  assert ends[0] == steps_per_loop.FIRST and ends[-1] == 60
  # Loops end where evaluations are due, and once the size has settled at multiples of it, a divisor of 25 (the
  # evaluation's cadence): 5 or 25, as a tiny model's step is far shorter than 49 times a loop's host time.
  assert {25, 50} <= set(ends)
  assert all(end % 5 == 0 for end in ends if 25 <= end < 60), ends
  # A second train call goes on at the size the first settled on (5 or 25), not at one step again.
  loop_ends.steps.clear()
  trainer.train(
      trainer_testlib.classification_data(64),
      global_batch_size=8,
      steps=110,
      eval_data=trainer_testlib.classification_data(16),
      eval_every=25,
  )
  assert loop_ends.steps[0] in (65, 75), loop_ends.steps
