"""Actions after each train loop: the user's own, their cadence and order, early stopping, bad input."""

import json

import pytest
import tensorflow as tf

import runner
from runner.training import options as trainer_options
from strategies.errors import ConfigError
from testlib import trainer_testlib

GLOBAL_BATCH = 8


class Recorder(runner.actions.Action):
  """Notes what it sees after each loop it runs at."""

  def __init__(self, every_steps=None):
    self.every_steps = every_steps
    self.seen = []

  def __call__(self, loop):
    self.seen.append((loop.step, loop.total_steps, dict(loop.train_results), loop.eval_results, loop.is_chief))


class StopBelowLoss(runner.actions.Action):
  """The custom action of docs/trainer.md."""

  def __init__(self, threshold):
    self.threshold = threshold

  def __call__(self, loop):
    if loop.train_results["loss"] < self.threshold:
      loop.stop()


class StopAt(runner.actions.Action):

  def __init__(self, at_step):
    self.at_step = at_step

  def __call__(self, loop):
    loop.stop(self.at_step)


def _one_device():
  return tf.distribute.OneDeviceStrategy("/cpu:0")


def _train(trainer, steps, **options):
  return trainer.train(trainer_testlib.classification_data(64), global_batch_size=GLOBAL_BATCH, steps=steps, **options)


def test_an_action_runs_after_every_loop_with_the_loops_results():
  recorder = Recorder()
  trainer = trainer_testlib.make_trainer(_one_device(), steps_per_loop=3, actions=[recorder])
  results = _train(trainer, 7)
  assert [seen[0] for seen in recorder.seen] == [3, 6, 7]
  assert all(seen[1] == 7 and seen[4] is True and seen[3] is None for seen in recorder.seen)
  assert recorder.seen[-1][2] == results and set(results) == {"loss", "accuracy"}


def test_every_steps_cuts_loops_and_runs_only_at_its_multiples():
  every_two, every_loop = Recorder(every_steps=2), Recorder()
  trainer = trainer_testlib.make_trainer(_one_device(), steps_per_loop=3, actions=[every_two, every_loop])
  _train(trainer, 7)
  assert [seen[0] for seen in every_two.seen] == [2, 4, 6]
  assert [seen[0] for seen in every_loop.seen] == [2, 4, 6, 7]  # Loops of 3 are cut at multiples of 2.


def test_actions_see_the_evaluation_of_their_step(tmp_path):
  recorder = Recorder()
  trainer = trainer_testlib.make_trainer(_one_device(), steps_per_loop=2, actions=[recorder])
  _train(trainer, 4, eval_data=trainer_testlib.classification_data(20, seed=1), eval_every=4)
  assert recorder.seen[0][3] is None
  assert recorder.seen[1][3] == trainer.last_eval_metrics and recorder.seen[1][3]["num_examples"] == 20


def test_a_custom_action_ends_training_normally_with_a_checkpoint(tmp_path):
  stop = StopBelowLoss(threshold=10.0)  # Any finite first loss is below it.
  trainer = trainer_testlib.make_trainer(_one_device(), model_dir=str(tmp_path), steps_per_loop=2, actions=[stop])
  _train(trainer, 100, eval_data=trainer_testlib.classification_data(20, seed=1))
  assert trainer.global_step == 2
  assert tf.train.latest_checkpoint(str(tmp_path / "checkpoints")).endswith("ckpt-2")
  rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  assert [(row["split"], row["step"]) for row in rows] == [("train", 2), ("eval", 2)]


def test_stop_at_a_later_step_cuts_the_loop_there():
  trainer = trainer_testlib.make_trainer(_one_device(), steps_per_loop=4, actions=[StopAt(6)])
  _train(trainer, 100)
  assert trainer.global_step == 6


def test_early_stopping_stops_after_patience_evaluations_without_improvement():
  early = runner.actions.EarlyStopping(metric="accuracy", mode="max", patience=2, min_delta=2.0)
  recorder = Recorder()
  trainer = trainer_testlib.make_trainer(_one_device(), steps_per_loop=1, actions=[early, recorder])
  _train(trainer, 50, eval_data=trainer_testlib.classification_data(20, seed=1), eval_every=2)
  # No accuracy can improve by 2.0: the first evaluation (step 2) sets the best, steps 4 and 6 miss it.
  assert trainer.global_step == 6
  assert early.evaluations_without_improvement == 2
  assert early.best == [seen[3] for seen in recorder.seen if seen[0] == 2][0]["accuracy"]


def test_early_stopping_keeps_going_while_the_metric_improves():
  early = runner.actions.EarlyStopping(metric="loss", mode="min", patience=1)
  trainer = trainer_testlib.make_trainer(_one_device(), steps_per_loop=1, actions=[early])
  _train(trainer, 6, eval_data=trainer_testlib.classification_data(64), eval_every=2)
  assert trainer.global_step == 6  # SGD with momentum on its own training data: the loss falls at every evaluation.
  assert early.evaluations_without_improvement == 0


def test_early_stopping_on_a_metric_the_evaluation_lacks_names_what_it_has():
  early = runner.actions.EarlyStopping(metric="acuracy", mode="max")
  trainer = trainer_testlib.make_trainer(_one_device(), actions=[early])
  with pytest.raises(
      ConfigError,
      match=r"EarlyStopping watches 'acuracy', which the evaluation does not report\. "
      r"Did you mean 'accuracy'\? It reports: loss, accuracy, num_examples\.",
  ):
    _train(trainer, 4, eval_data=trainer_testlib.classification_data(20, seed=1), eval_every=2)


@pytest.mark.parametrize(
    "arguments, message",
    [
        (dict(mode="maximum"), r"mode='maximum' is not valid\. Did you mean 'max'\? Valid: min, max\."),
        (dict(patience=0), r"patience must be a positive int, got 0\."),
        (dict(min_delta=-0.1), r"min_delta must be a number >= 0, got -0\.1\."),
    ],
)
def test_bad_early_stopping_arguments(arguments, message):
  with pytest.raises(ConfigError, match=message):
    runner.actions.EarlyStopping(**arguments)


@pytest.mark.parametrize(
    "actions, message",
    [
        (Recorder(), r"actions must be a list of runner\.actions\.Action objects, got <"),
        ([lambda loop: None], r"actions must be a list of runner\.actions\.Action objects, got \[<function"),
        ([Recorder(every_steps=0)], r"Recorder\.every_steps must be a positive int, got 0\."),
    ],
)
def test_bad_actions_are_refused_when_the_trainer_is_made(actions, message):
  with pytest.raises(ConfigError, match=message):
    trainer_testlib.make_trainer(_one_device(), actions=actions)


def test_loop_end_stop_refuses_a_bad_step():
  loop = runner.actions.LoopEnd(
      step=4,
      total_steps=10,
      train_results={"loss": 1.0},
      steps_per_sec=1.0,
      examples_per_sec=1.0,
      learning_rate=0.1,
      stop_signal=None,
      is_chief=True,
  )
  with pytest.raises(ConfigError, match=r"at_step must be a positive int, got 'soon'\."):
    loop.stop("soon")
  loop.stop(8)
  loop.stop(6)
  assert loop.stop_at == 6


def test_trainer_options_are_frozen_and_checked_when_made():
  options = trainer_options.TrainerOptions(steps_per_loop=5, actions=[Recorder()])
  assert isinstance(options.actions, tuple) and options.steps_per_loop == 5
  with pytest.raises(AttributeError):
    options.steps_per_loop = 6
  with pytest.raises(ConfigError, match=r"checkpoint_every=10 needs a model_dir"):
    trainer_options.TrainerOptions(checkpoint_every=10)
