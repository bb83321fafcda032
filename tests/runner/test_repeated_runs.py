"""`runner.run` called again and again in one process (a sweep): nothing of a finished run stays alive.

One child process (a fresh TensorFlow, with Python's garbage collector on, as in a user's sweep) calls `runner.run`
six times under one_device (one more than TensorFlow's retracing warning needs), never collecting itself, and reports
after each call what outlived its run. It then ends as `python -m runner` does (`process_exit.exit_now`), skipping the
interpreter's teardown (seconds of tf.data's).
"""

import json
import sys
import textwrap

import pytest

from testlib import paths
from testlib import process_testlib

CALLS = 6
_CHILD = textwrap.dedent("""
    import gc, json, logging, os, sys, weakref

    import keras
    import tensorflow as tf
    import runner
    from runner.cluster import process_exit
    from runner.training import trainer as trainer_lib

    retracing = []

    class Retracing(logging.Handler):
      def emit(self, record):
        if "retracing" in record.getMessage():
          retracing.append(record.getMessage()[:200])

    for name in ("tensorflow", "absl", ""):
      logging.getLogger(name).addHandler(Retracing())

    def open_files():
      names = []
      for fd in os.listdir("/proc/self/fd"):
        try:
          names.append(os.path.basename(os.readlink(f"/proc/self/fd/{fd}")))
        except FileNotFoundError:  # The listing's own descriptor, closed by now.
          pass
      return sorted(names)

    def alive(*kinds):
      # How many objects of each of `kinds` are alive, from one walk over the objects the collector tracks.
      objects = gc.get_objects()
      return [sum(isinstance(o, kind) for o in objects) for kind in kinds]

    config = {
        "mode": "train_and_eval",
        "strategy": {"name": "one_device"},
        "data": {"name": "synthetic", "global_batch_size": 16, "num_examples": 64, "num_eval_examples": 32},
        "model": {"hidden_units": (8,)},
        "trainer": {"train_steps": 4, "steps_per_loop": 2, "checkpoint_every": 2},
    }
    rows = []
    references = []
    for call in range(1, int(sys.argv[1]) + 1):
      result = runner.run(config, quiet=True)
      references.append((weakref.ref(result.model), weakref.ref(result.strategy)))
      loss = result.train_metrics["loss"]
      del result
      trainers, optimizers, strategies = alive(trainer_lib.Trainer, keras.optimizers.Optimizer, tf.distribute.Strategy)
      rows.append(
          {
              "call": call,
              "loss": loss,
              "threads": len(os.listdir("/proc/self/task")),
              "open_files": open_files(),
              "trainers": trainers,
              "optimizers": optimizers,
              "strategies": strategies,
              "models_alive": [call for call, (model, _) in enumerate(references, 1) if model() is not None],
              "strategies_alive": [call for call, (_, strategy) in enumerate(references, 1) if strategy() is not None],
          }
      )
    print(json.dumps({"rows": rows, "retracing": retracing}))
    process_exit.exit_now(0)
    """)


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
  """The child's report: a row per call (threads, live Trainers, optimizers, strategies) and the retracing warnings."""
  child = process_testlib.Process(
      [sys.executable, "-c", _CHILD, str(CALLS)],
      env=paths.subprocess_environment(),
      logs=tmp_path_factory.mktemp("sweep"),
  )
  status, stdout, stderr = child.wait()
  assert status == 0, stderr[-3000:]
  return json.loads(stdout.strip().splitlines()[-1])


def test_each_run_frees_the_one_before_it_without_the_caller_collecting(sweep):
  rows = sweep["rows"]
  assert [row["call"] for row in rows] == list(range(1, CALLS + 1))
  assert all(row["loss"] > 0 for row in rows)  # Each call trained.
  for row in rows:
    # `runner.run` collects when the next run starts: only the run just ended may still be in memory.
    assert row["trainers"] <= 1, row  # None once the Trainer has no reference cycle.
    assert row["optimizers"] == 1, row
    assert row["models_alive"] == [row["call"]], row
    # Its strategy, and the one before, which the last traced loop's graph still refers to until the next collection.
    assert set(row["strategies_alive"]) <= {row["call"] - 1, row["call"]}, row
    assert row["strategies"] <= rows[1]["strategies"], row  # TensorFlow's default strategies, made once, and those.


def test_no_run_leaves_a_file_open(sweep):
  open_files = [row["open_files"] for row in sweep["rows"]]
  assert all(files == open_files[0] for files in open_files), open_files
  assert not any(name == "metrics.jsonl" or name.startswith("events.out") for name in open_files[-1]), open_files[-1]


def test_the_thread_count_stops_growing_after_the_third_call(sweep):
  threads = [row["threads"] for row in sweep["rows"]]
  # The first calls start TensorFlow's own pools (inter-op, tf.data); after them a run leaves no thread behind.
  assert threads[CALLS - 1] <= threads[2], threads


def test_no_retracing_warning_in_six_calls(sweep):
  assert sweep["retracing"] == []
