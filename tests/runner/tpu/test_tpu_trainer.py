"""The Trainer as a TPU runs it, proven under jit_compile=True on logical CPUs.

The compiled loop holds device work only (summaries, progress and Python
stay between loops), one trace serves every loop length, every tensor of
the train and evaluation steps has a static shape (evaluation pads), and
`steps_per_loop` defaults high on a TPU.
"""

import json

import pytest
import tensorflow as tf

import runner
from runner.config import run_config as config_lib
from runner.tpu import check as tpu_check
from runner.tpu import rules as tpu_rules
from runner.training import steps_per_loop
from testlib import trainer_testlib

# Ops that do host work: Python, printing, summaries. None may sit inside the compiled loop.
HOST_WORK = set(tpu_rules.PYTHON_OPS) | {
    "PrintV2",
    "StringFormat",
    "WriteScalarSummary",
    "WriteSummary",
    "WriteHistogramSummary",
    "WriteImageSummary",
    "WriteAudioSummary",
    "WriteRawProtoSummary",
    "FlushSummaryWriter",
    "CreateSummaryFileWriter",
}
GLOBAL_BATCH = 16


def _unknown_shapes(traced):
  """The tensors of the traced replica steps whose shape is not static (handles and Assert messages aside)."""
  return [
      (op.name, t.shape)
      for op in tpu_rules.walk(traced)
      for t in op.outputs
      if t.dtype not in (tf.resource, tf.variant, tf.string) and not t.shape.is_fully_defined()
  ]


def test_the_compiled_train_loop_holds_device_work_only(tmp_path, cpu_devices):
  strategy = tpu_check.RecordingMirroredStrategy(cpu_devices(2))
  trainer = trainer_testlib.make_trainer(strategy, model_dir=str(tmp_path), steps_per_loop=5, jit_compile=True)
  trainer.train(trainer_testlib.classification_data(), global_batch_size=GLOBAL_BATCH, steps=12)
  traced = strategy.take_traced()
  assert len(traced) == 1  # one trace of the loop serves its calls of 5, 5 and 2 steps
  loop_body = traced[0][0]
  loop_ops = list(tpu_rules.walk([(loop_body, loop_body.get_operations())]))
  assert sorted({op.type for op in loop_ops} & HOST_WORK) == []
  xla_clusters = [op for op in loop_ops if "_XlaMustCompile" in op.node_def.attr and op.get_attr("_XlaMustCompile")]
  assert len(xla_clusters) == 2  # each replica's forward and backward pass
  assert tpu_rules.op_problem(traced, trainer.model, "the train step") is None
  assert _unknown_shapes(traced) == []
  with open(tmp_path / "metrics.jsonl", encoding="utf-8") as f:
    rows = [json.loads(line) for line in f]
  assert [row["step"] for row in rows if row["split"] == "train"] == [5, 10, 12]  # reported by Python, per loop
  assert list((tmp_path / "summaries" / "train").iterdir())


def test_evaluation_pads_to_static_shapes(cpu_devices):
  strategy = tpu_check.RecordingMirroredStrategy(cpu_devices(4))
  trainer = trainer_testlib.make_trainer(strategy, jit_compile=True)
  results = trainer.evaluate(trainer_testlib.classification_data(13), global_batch_size=8)
  assert results["num_examples"] == 13  # 6 full batches of 2 per replica, the 7th padded with 3 zero weights
  traced = strategy.take_traced()
  assert len(traced) == 1
  assert tpu_rules.op_problem(traced, trainer.model, "the evaluation step") is None
  assert _unknown_shapes(traced) == []


def test_steps_per_loop_defaults_to_auto_whose_fixed_value_is_high_on_a_tpu():
  trainer_config = config_lib.default_config().trainer
  assert trainer_config.steps_per_loop is None
  cadences = (trainer_config.eval_every, trainer_config.checkpoint_every)
  assert steps_per_loop.fixed_auto(cadences, tpu=False) == steps_per_loop.DEFAULT == 100
  assert steps_per_loop.fixed_auto(cadences, tpu=True) == steps_per_loop.ON_TPU == 1000


@pytest.mark.parametrize(
    "eval_every, checkpoint_every, on_cpu, on_tpu",
    [
        (500, None, 100, 500),
        (None, 3000, 100, 1000),
        (300, 200, 100, 100),
        (150, None, 75, 150),
        (7, None, 7, 7),
    ],
)
def test_auto_steps_per_loop_divides_the_evaluation_and_checkpoint_steps(eval_every, checkpoint_every, on_cpu, on_tpu):
  assert steps_per_loop.fixed_auto((eval_every, checkpoint_every), tpu=False) == on_cpu
  assert steps_per_loop.fixed_auto((eval_every, checkpoint_every), tpu=True) == on_tpu


def test_a_run_on_one_worker_keeps_auto_to_measure_it_and_records_it_unset(tmp_path):
  config = {
      "strategy": {"name": "one_device"},
      "data": {"num_examples": 256, "num_eval_examples": 64},
      "model": {"hidden_units": (8,)},
      "trainer": {"train_steps": 20},
  }
  result = runner.run(config, str(tmp_path))
  assert result.config.trainer.steps_per_loop is None
  with open(tmp_path / "config.json", encoding="utf-8") as f:
    assert json.load(f)["trainer"]["steps_per_loop"] is None
  with open(tmp_path / "metrics.jsonl", encoding="utf-8") as f:
    train_steps = [row["step"] for row in map(json.loads, f) if row["split"] == "train"]
  assert train_steps[0] == steps_per_loop.FIRST and train_steps[-1] == 20  # Measured loops: the first has 1 step.
  assert isinstance(
      steps_per_loop.resolve(None, strategy=result.strategy, cadences=(None, None)), steps_per_loop.MeasuredStepsPerLoop
  )
  assert steps_per_loop.resolve(7, strategy=result.strategy, cadences=(None, None)).size == 7
