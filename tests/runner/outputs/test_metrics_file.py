"""`metrics.jsonl` on a remote workdir (`ram://` standing for `gs://`): parts written once, read back in order."""

import json
import os

import pytest
import tensorflow as tf

from runner.outputs import metrics_file
from runner.outputs import reports


def _objects(directory):
  """{path: bytes} of every file under `directory` (through `tf.io.gfile`)."""
  found = {}
  for root, _, files in tf.io.gfile.walk(directory):
    for name in files:
      with tf.io.gfile.GFile(os.path.join(root, name), "rb") as f:
        found[os.path.join(root, name)] = f.read()
  return found


def _row(step, split="train", loss=1.0):
  return {"split": split, "step": step, "loss": loss}


@pytest.mark.parametrize("appended", [1, 50])
def test_appending_rows_writes_their_bytes_only_however_long_the_file(tmp_path, appended):
  """After 2,000 rows, appending N rows writes one new object of exactly those rows; no object is rewritten."""
  workdir = f"ram://{tmp_path}/work"
  earlier = metrics_file.Appender(workdir)
  for step in range(1, 2001):
    earlier.append(_row(step))
    if step % 500 == 0:
      earlier.flush()
  before = _objects(workdir)
  assert len(before) == 4 and sum(map(len, before.values())) == sum(
      len(json.dumps(_row(step)) + "\n") for step in range(1, 2001)
  )
  appender = metrics_file.Appender(workdir)
  new_rows = [_row(step) for step in range(2001, 2001 + appended)]
  for row in new_rows:
    appender.append(row)
  appender.flush()
  after = _objects(workdir)
  assert {path: after[path] for path in before} == before  # Every earlier object byte for byte, none removed.
  written = {path: data for path, data in after.items() if path not in before}
  assert list(written.values()) == ["".join(json.dumps(row) + "\n" for row in new_rows).encode()]
  (part,) = written
  assert os.path.basename(part).startswith(f"{2001:012d}-{2000 + appended:012d}-")
  assert metrics_file.rows(workdir) == [_row(step) for step in range(1, 2001 + appended)]


def test_rows_are_kept_until_a_flush_or_a_minute_then_written_as_one_part(tmp_path, monkeypatch):
  workdir = f"ram://{tmp_path}/work"
  appender = metrics_file.Appender(workdir)
  appender.append(_row(10))
  appender.append(_row(20))
  assert metrics_file.rows(workdir) == []  # Nothing written yet: a part per flush, not per row.
  monkeypatch.setattr(metrics_file.Appender, "PART_SECONDS", 0.0)
  appender.append(_row(30))
  assert metrics_file.rows(workdir) == [_row(10), _row(20), _row(30)]
  assert len(tf.io.gfile.listdir(f"{workdir}/{metrics_file.PARTS_DIRECTORY}")) == 1


def test_a_resumed_run_drops_the_remote_rows_past_its_checkpoint_and_keeps_an_evaluators(tmp_path, caplog):
  """As `test_rows_of_an_evaluator_survive_the_trainers_rewrite_of_metrics_jsonl`, on `ram://`."""
  workdir = f"ram://{tmp_path}/work"
  killed_run = reports.Reporter(workdir, is_chief=True)
  for step, flush in ((10, True), (20, False), (30, True), (40, True)):  # Killed after 40; checkpoint at 20.
    _train_row(killed_run, step, loss=1.0)
    if flush:
      killed_run.flush()
  evaluator = reports.Reporter(workdir, is_chief=True)
  evaluator.evaluation(step=10, results={"loss": 0.5, "num_examples": 8}, seconds=0.1)
  evaluator.flush()
  parts = sorted(tf.io.gfile.listdir(f"{workdir}/{metrics_file.PARTS_DIRECTORY}"))
  assert [part[:25] for part in parts] == [
      "000000000010-000000000010",
      "000000000010-000000000010",  # The evaluator's, written later: after the trainer's part of step 10.
      "000000000020-000000000030",
      "000000000040-000000000040",
  ]
  resumed = reports.Reporter(workdir, is_chief=True)
  resumed.resume_at(20)
  with caplog.at_level("INFO", logger="absl"):
    _train_row(resumed, 30, loss=2.0)  # Drops the rows past 20: the part of step 40, the row of 30 from its part.
  assert [message for message in caplog.messages if message.startswith("Dropped")] == [
      f"Dropped 2 row(s) of {workdir}/metrics_parts past step 20, written by a run that stopped before its next "
      "checkpoint: this run trains those steps again."
  ]
  resumed.flush()
  evaluator.evaluation(step=20, results={"loss": 0.25, "num_examples": 8}, seconds=0.1)
  evaluator.flush()
  _train_row(resumed, 40, loss=2.0)
  resumed.flush()
  assert [(row["split"], row["step"], row["loss"]) for row in metrics_file.rows(workdir)] == [
      ("train", 10, 1.0),
      ("eval", 10, 0.5),
      ("train", 20, 1.0),
      ("eval", 20, 0.25),
      ("train", 30, 2.0),
      ("train", 40, 2.0),
  ]
  assert reports.train_results_at(workdir, 40) == {"loss": 2.0}
  assert reports.eval_results_at(workdir, 20) == {"loss": 0.25, "num_examples": 8}
  assert reports.eval_results_at(workdir, 30) == {}


def test_a_metrics_jsonl_of_an_earlier_version_is_read_before_the_parts(tmp_path):
  workdir = f"ram://{tmp_path}/work"
  tf.io.gfile.makedirs(workdir)
  with tf.io.gfile.GFile(f"{workdir}/{metrics_file.FILE_NAME}", "w") as f:
    f.write(json.dumps(_row(10)) + "\n" + json.dumps(_row(20)) + "\n" + '{"split": "tr')  # Cut short by a kill.
  appender = metrics_file.Appender(workdir)
  appender.append(_row(20, loss=2.0))
  appender.flush()
  assert metrics_file.rows(workdir) == [_row(10), _row(20), _row(20, loss=2.0)]
  metrics_file.drop_rows_past(workdir, 10)
  assert metrics_file.rows(workdir) == [_row(10)]
  with tf.io.gfile.GFile(f"{workdir}/{metrics_file.FILE_NAME}") as f:
    assert f.read() == json.dumps(_row(10)) + "\n"
  assert tf.io.gfile.listdir(f"{workdir}/{metrics_file.PARTS_DIRECTORY}") == []


def _train_row(reporter, step, *, loss):
  reporter.train_loop(
      step=step, total_steps=40, results={"loss": loss}, learning_rate=0.1, steps_per_sec=1.0, examples_per_sec=8.0
  )
