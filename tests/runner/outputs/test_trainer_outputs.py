"""What a run leaves behind: metrics.jsonl, TensorBoard scalars, progress lines."""

import argparse
import collections
import json
import logging
import re

import keras
import pytest
from tensorboard import context as tensorboard_context
from tensorboard.backend.event_processing import data_ingester
from tensorboard.backend.event_processing import data_provider
from tensorboard.backend.event_processing import plugin_event_multiplexer
from tensorboard.plugins import base_plugin
from tensorboard.plugins.scalar import scalars_plugin
from tensorboard_plugin_profile import profile_plugin_loader
import tensorflow as tf
from tensorflow.tsl.profiler.protobuf import xplane_pb2  # noqa: TID251  # The profile's format: no public API reads it.
from xprof.standalone.tensorboard_shim import base_plugin as profile_base_plugin

from testlib import trainer_testlib

GLOBAL_BATCH = 8


def _scalars_as_tensorboard_shows_them(logdir):
  """Returns {run: {tag: [(step, value), ...]}}: what TensorBoard's scalars plugin serves for `logdir`.

  TensorBoard's own reading path, in process: the event multiplexer with the
  sampling of `tensorboard --logdir` (each subdirectory a run), its data
  provider, and the scalars plugin's tags and scalars handlers, which list
  only summaries the plugin shows.
  """
  multiplexer = plugin_event_multiplexer.EventMultiplexer(
      size_guidance=data_ingester.DEFAULT_SIZE_GUIDANCE, tensor_size_guidance=data_ingester.DEFAULT_TENSOR_SIZE_GUIDANCE
  )
  multiplexer.AddRunsFromDirectory(str(logdir))
  multiplexer.Reload()
  plugin = scalars_plugin.ScalarsPlugin(
      base_plugin.TBContext(data_provider=data_provider.MultiplexerDataProvider(multiplexer, str(logdir)))
  )
  assert plugin.plugin_name == "scalars"
  request = tensorboard_context.RequestContext()
  found = {}
  for run, tags in plugin.index_impl(request, experiment="").items():
    for tag in tags:
      points, _ = plugin.scalars_impl(request, tag, run, "", scalars_plugin.OutputFormat.JSON)
      found.setdefault(run, {})[tag] = [(step, value) for _, step, value in points]
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
      tf.distribute.OneDeviceStrategy("/cpu:0"),
      model_dir=str(model_dir),
      steps_per_loop=2,
      optimizer_fn=lambda: keras.optimizers.SGD(schedule),
  )
  absl_logger, handler = logging.getLogger("absl"), _Messages()
  level = absl_logger.level
  absl_logger.setLevel(logging.INFO)
  absl_logger.addHandler(handler)
  try:
    results = trainer.train(
        trainer_testlib.classification_data(64),
        global_batch_size=GLOBAL_BATCH,
        steps=4,
        eval_data=trainer_testlib.classification_data(20, seed=1),
        eval_every=2,
    )
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


def test_tensorboard_shows_the_train_and_eval_scalars(run):
  model_dir, results, _ = run
  with open(model_dir / "metrics.jsonl", encoding="utf-8") as f:
    rows = [json.loads(line) for line in f]
  shown = _scalars_as_tensorboard_shows_them(model_dir / "summaries")
  assert set(shown) == {"train", "eval"}
  train, evaluation = shown["train"], shown["eval"]
  assert set(train) == {"loss", "accuracy", "learning_rate", "steps_per_sec", "examples_per_sec"}
  assert set(evaluation) == {"loss", "accuracy", "num_examples"}
  for split, scalars in shown.items():  # The values metrics.jsonl holds, at the same steps (as float32).
    for tag, points in scalars.items():
      if tag != "learning_rate":
        assert points == [(row["step"], pytest.approx(row[tag], rel=1e-6)) for row in rows if row["split"] == split]
  assert [step for step, _ in train["loss"]] == [2, 4]
  assert train["loss"][-1][1] == pytest.approx(results["loss"], rel=1e-6)
  # The optimizer's current learning rate: the schedule at the optimizer's iteration count.
  assert train["learning_rate"] == [(2, pytest.approx(0.1 * 0.5**2)), (4, pytest.approx(0.1 * 0.5**4))]
  assert evaluation["num_examples"] == [(2, 20.0), (4, 20.0)]


def test_one_progress_line_per_loop(run):
  _, _, messages = run
  progress = [m for m in messages if m.startswith("step ")]
  assert len(progress) == 2
  assert progress[1].startswith("step 4/4: loss ")
  for part in ("accuracy ", " steps/s, ", " examples/s, ETA 0:00:00"):
    assert part in progress[1]
  assert " | traced in " in progress[0] and "traced" not in progress[1]  # The first loop's tracing, apart.
  assert sum(m.startswith("eval at step ") for m in messages) == 2


def test_profile_steps_trace_exactly_those_steps_where_the_profile_plugin_lists_them(tmp_path):
  trainer = trainer_testlib.make_trainer(
      tf.distribute.OneDeviceStrategy("/cpu:0"), model_dir=str(tmp_path), steps_per_loop=4, profile_steps=(3, 5)
  )
  for steps in (2, 8):  # The checkpoint of step 2 lets the loops after it run unchecked.
    trainer.train(trainer_testlib.classification_data(64), global_batch_size=GLOBAL_BATCH, steps=steps)
  with open(tmp_path / "metrics.jsonl", encoding="utf-8") as f:
    assert [json.loads(line)["step"] for line in f] == [2, 5, 8]  # Loops end before step 3 and after step 5.
  (trace,) = (tmp_path / "summaries" / "train" / "plugins" / "profile").glob("*/*.xplane.pb")
  space = xplane_pb2.XSpace.FromString(trace.read_bytes())
  (host,) = [plane for plane in space.planes if plane.name == "/host:CPU"]
  names = {i: metadata.name for i, metadata in host.event_metadata.items()}
  events = collections.Counter(
      (line.name.split("/")[0], names[event.metadata_id]) for line in host.lines for event in line.events
  )
  # One call of the train loop's function (unchecked: runner.training.loops.RerunChecked), and in it three steps (3, 4
  # and 5): three additions to the loop's totals, then one advance of the global step (by the steps run). Batches read are not counted: the input
  # pipeline's background thread may read one ahead inside the window.
  calls = {
      name: count
      for (line, name), count in events.items()
      if line == "python" and re.fullmatch(r"EagerLocalExecute: __inference__steps_\d+", name)
  }
  assert list(calls.values()) == [1], events
  assert events["tf_Compute", "while/body/_1/while/AssignAddVariableOp:AssignAddVariableOp"] == 3, events
  assert events["tf_Compute", "AssignAddVariableOp:AssignAddVariableOp"] == 1, events
  # TensorBoard's Profile tab (tensorboard-plugin-profile) lists the run and its tools.
  plugin = profile_plugin_loader.ProfilePluginLoader().load(
      profile_base_plugin.TBContext(
          logdir=str(tmp_path / "summaries"), flags=argparse.Namespace(master_tpu_unsecure_channel="")
      )
  )
  (run,) = plugin.generate_runs()
  assert run == f"train/{trace.parent.name}"
  assert {"overview_page", "trace_viewer@", "input_pipeline_analyzer", "framework_op_stats", "memory_profile"} <= set(
      plugin.run_tools_imp(run)
  )


def test_a_run_resumed_past_the_profile_window_takes_no_profile_and_says_so(tmp_path, caplog):
  data = trainer_testlib.classification_data(64)
  first = trainer_testlib.make_trainer(
      tf.distribute.OneDeviceStrategy("/cpu:0"), model_dir=str(tmp_path), steps_per_loop=2
  )
  first.train(data, global_batch_size=GLOBAL_BATCH, steps=4)
  resumed = trainer_testlib.make_trainer(
      tf.distribute.OneDeviceStrategy("/cpu:0"), model_dir=str(tmp_path), steps_per_loop=2, profile_steps=(3, 5)
  )
  with caplog.at_level(logging.WARNING):
    resumed.train(data, global_batch_size=GLOBAL_BATCH, steps=6)
  assert resumed.global_step == 6
  assert (
      "profile_steps=(3, 5): training resumed at step 4, past step 3; no profile is taken. Choose steps after 4 "
      "to profile this run."
  ) in caplog.messages
  assert not (tmp_path / "summaries" / "train" / "plugins").exists()
