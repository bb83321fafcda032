"""What a run leaves behind: metrics.jsonl, TensorBoard scalars, progress lines."""

import glob
import json
import logging
import os

import keras
import pytest
import tensorflow as tf

import trainer_testlib

GLOBAL_BATCH = 8


def _scalars(event_dir):
  """Returns {tag: [(step, value), ...]} from the event files in `event_dir`."""
  found = {}
  for path in sorted(glob.glob(os.path.join(event_dir, "events.out.tfevents.*"))):
    for event in tf.compat.v1.train.summary_iterator(path):
      for value in event.summary.value:
        assert value.metadata.plugin_data.plugin_name == "scalars"
        found.setdefault(value.tag, []).append((event.step, float(tf.make_ndarray(value.tensor))))
  return found


class _Messages(logging.Handler):

  def __init__(self):
    super().__init__(logging.INFO)
    self.messages = []

  def emit(self, record):
    self.messages.append(record.getMessage())


@pytest.fixture(name="run", scope="module")
def fixture_run(tmp_path_factory):
  """Trains 4 steps in loops of 2 with a decaying learning rate, evaluating every 2 steps."""
  model_dir = tmp_path_factory.mktemp("model_dir")
  schedule = keras.optimizers.schedules.ExponentialDecay(0.1, decay_steps=1, decay_rate=0.5)
  trainer = trainer_testlib.make_trainer(
      tf.distribute.OneDeviceStrategy("/cpu:0"), model_dir=str(model_dir), steps_per_loop=2,
      optimizer_fn=lambda: keras.optimizers.SGD(schedule))
  absl_logger, handler = logging.getLogger("absl"), _Messages()
  level = absl_logger.level
  absl_logger.setLevel(logging.INFO)
  absl_logger.addHandler(handler)
  try:
    results = trainer.train(trainer_testlib.classification_data(64), global_batch_size=GLOBAL_BATCH, steps=4,
                            eval_data=trainer_testlib.classification_data(20, seed=1), eval_every=2)
  finally:
    absl_logger.removeHandler(handler)
    absl_logger.setLevel(level)
  return model_dir, results, handler.messages


def test_metrics_jsonl_has_one_row_per_train_loop_and_per_evaluation(run):
  model_dir, results, _ = run
  with open(model_dir / "metrics.jsonl", encoding="utf-8") as f:
    rows = [json.loads(line) for line in f]
  assert [(row["split"], row["step"]) for row in rows] == [("train", 2), ("eval", 2), ("train", 4), ("eval", 4)]
  train, evaluation = rows[2], rows[3]
  assert set(train) == {"split", "step", "loss", "accuracy", "steps_per_sec", "examples_per_sec"}
  assert {key: train[key] for key in results} == results
  assert train["examples_per_sec"] == pytest.approx(train["steps_per_sec"] * GLOBAL_BATCH)
  assert set(evaluation) == {"split", "step", "loss", "accuracy", "num_examples"}
  assert evaluation["num_examples"] == 20


def test_tensorboard_scalars_for_train_and_eval(run):
  model_dir, results, _ = run
  train = _scalars(model_dir / "summaries" / "train")
  assert set(train) == {"loss", "accuracy", "learning_rate", "steps_per_sec", "examples_per_sec"}
  assert [step for step, _ in train["loss"]] == [2, 4]
  assert train["loss"][-1][1] == pytest.approx(results["loss"])
  # The optimizer's current learning rate: the schedule at the optimizer's iteration count.
  assert train["learning_rate"] == [(2, pytest.approx(0.1 * 0.5**2)), (4, pytest.approx(0.1 * 0.5**4))]
  evaluation = _scalars(model_dir / "summaries" / "eval")
  assert set(evaluation) == {"loss", "accuracy", "num_examples"}
  assert evaluation["num_examples"] == [(2, 20.0), (4, 20.0)]


def test_one_progress_line_per_loop(run):
  _, _, messages = run
  progress = [m for m in messages if m.startswith("step ")]
  assert len(progress) == 2
  assert progress[1].startswith("step 4/4: loss ")
  for part in ("accuracy ", " steps/s, ", " examples/s, ETA 0:00:00"):
    assert part in progress[1]
  assert sum(m.startswith("eval at step ") for m in messages) == 2
