"""steps_per_loop, tracing, resuming by total steps and interleaved evaluation."""

import json

import numpy as np
import tensorflow as tf

import runner
from testlib import trainer_testlib

GLOBAL_BATCH = 8


class CountingClassification(runner.tasks.Classification):
  """Counts how often `loss` runs in Python, which happens only while a step is traced."""

  def __init__(self):
    super().__init__(from_logits=True)
    self.traces = 0

  def loss(self, labels, outputs):
    self.traces += 1
    return super().loss(labels, outputs)


def _rows(model_dir, split):
  with open(model_dir / "metrics.jsonl", encoding="utf-8") as f:
    return [row for row in map(json.loads, f) if row["split"] == split]


def test_a_shorter_last_loop_and_a_resumed_train_reuse_one_trace(tmp_path):
  task = CountingClassification()
  trainer = trainer_testlib.make_trainer(
      tf.distribute.OneDeviceStrategy("/cpu:0"), task=task, steps_per_loop=3, model_dir=str(tmp_path)
  )
  data = trainer_testlib.classification_data(64)
  trainer.train(data, global_batch_size=GLOBAL_BATCH, steps=7)  # Loops of 3, 3 and 1 steps.
  assert trainer.global_step == 7
  assert task.traces == 1
  # With the checkpoint of step 7 the loops run unchecked (runner.training.loops.RerunChecked): one more trace.
  trainer.train(trainer_testlib.classification_data(64), global_batch_size=GLOBAL_BATCH, steps=9)  # A new iterator.
  assert trainer.global_step == 9
  assert task.traces == 2
  trainer.train(trainer_testlib.classification_data(64), global_batch_size=GLOBAL_BATCH, steps=11)
  assert task.traces == 2
  assert [row["step"] for row in _rows(tmp_path, "train")] == [3, 6, 7, 9, 11]


def test_steps_per_loop_one_traces_no_loop_and_many_steps_trace_one():
  def while_ops(trainer, steps_per_loop):
    (loop,) = trainer._loops.train_loops.values()  # noqa: SLF001
    arguments = [trainer._input.current[2], tf.constant(1), tf.constant([0.0, 0.0])]  # noqa: SLF001
    assert loop.function.experimental_get_tracing_count() == 1
    graph = loop.function.get_concrete_function(*arguments).graph
    assert loop.function.experimental_get_tracing_count() == 1  # The trace that ran, not a new one.
    return [op.type for op in graph.get_operations() if "While" in op.type]

  counts = {}
  for steps_per_loop in (1, 4):
    trainer = trainer_testlib.make_trainer(tf.distribute.OneDeviceStrategy("/cpu:0"), steps_per_loop=steps_per_loop)
    trainer.train(trainer_testlib.classification_data(64), global_batch_size=GLOBAL_BATCH, steps=4)
    counts[steps_per_loop] = len(while_ops(trainer, steps_per_loop))
  assert counts == {1: 0, 4: 1}


def test_steps_is_a_total_so_the_same_call_resumes():
  trainer = trainer_testlib.make_trainer(tf.distribute.OneDeviceStrategy("/cpu:0"), steps_per_loop=2)
  data = trainer_testlib.classification_data(64)
  first = trainer.train(data, global_batch_size=GLOBAL_BATCH, steps=4)
  weights = trainer.model.get_weights()
  assert trainer.train(data, global_batch_size=GLOBAL_BATCH, steps=4) == first  # Already there: no step.
  assert trainer.global_step == 4
  for got, want in zip(trainer.model.get_weights(), weights):
    np.testing.assert_array_equal(got, want)
  trainer.train(data, global_batch_size=GLOBAL_BATCH, steps=5)
  assert trainer.global_step == 5


def test_loops_stop_at_evaluations_which_run_every_eval_every_steps_and_at_the_end(tmp_path):
  trainer = trainer_testlib.make_trainer(
      tf.distribute.OneDeviceStrategy("/cpu:0"), steps_per_loop=4, model_dir=str(tmp_path)
  )
  trainer.train(
      trainer_testlib.classification_data(64),
      global_batch_size=GLOBAL_BATCH,
      steps=7,
      eval_data=trainer_testlib.classification_data(20, seed=1),
      eval_every=3,
  )
  assert [row["step"] for row in _rows(tmp_path, "train")] == [3, 6, 7]
  evaluations = _rows(tmp_path, "eval")
  assert [row["step"] for row in evaluations] == [3, 6, 7]
  assert {row["num_examples"] for row in evaluations} == {20}
