"""Stop signals during training: the handlers are the Trainer's only while it trains, and a stop during the final
evaluation ends the process with its status after the checkpoint (a real signal to this process).

What a signal does to a run (save, exit status, resume) is tested with real
processes in test_fault_tolerance.py.
"""

import json
import os
import signal
import threading

import pytest
import tensorflow as tf

import runner
from runner.outputs import checkpoints
from testlib import trainer_testlib


def test_train_puts_the_previous_sigterm_and_sigint_handlers_and_wakeup_fd_back():
  def previous(signum, frame):
    del signum, frame

  old = {signum: signal.signal(signum, previous) for signum in (signal.SIGTERM, signal.SIGINT)}
  read, write = os.pipe()
  os.set_blocking(write, False)
  old_fd = signal.set_wakeup_fd(write)
  try:
    trainer = trainer_testlib.make_trainer(tf.distribute.OneDeviceStrategy("/cpu:0"))
    trainer.train(trainer_testlib.classification_data(16), global_batch_size=8, steps=1)
    assert signal.getsignal(signal.SIGTERM) is previous and signal.getsignal(signal.SIGINT) is previous
    assert signal.set_wakeup_fd(old_fd) == write  # The Trainer's signal watch gave the descriptor back,
    assert "stop-signal-watch" not in [thread.name for thread in threading.enumerate()]  # and its thread ended.
  finally:
    for signum, handler in old.items():
      signal.signal(signum, handler)
    os.close(read)
    os.close(write)


class _StoppedWhileEvaluating(runner.data.DatasetProvider):
  """Evaluation data that sends `signum` to this process once, when the final evaluation first asks for its input."""

  def __init__(self, signum):
    self.signum = signum

  def get_dataset(self, input_context):
    if self.signum is not None:
      signum, self.signum = self.signum, None  # Once: a second Ctrl-C would abort at once.
      os.kill(os.getpid(), signum)
    return trainer_testlib.classification_data(24, seed=1)


@pytest.mark.parametrize("signum, status", [(signal.SIGTERM, 143), (signal.SIGINT, 130)], ids=["sigterm", "sigint"])
def test_a_stop_during_the_final_evaluation_ends_with_its_status_after_the_checkpoint(tmp_path, signum, status):
  trainer = trainer_testlib.make_trainer(
      tf.distribute.OneDeviceStrategy("/cpu:0"), model_dir=str(tmp_path), steps_per_loop=2
  )
  with pytest.raises(SystemExit) as exited:
    trainer.train(
        trainer_testlib.classification_data(64), global_batch_size=8, steps=4, eval_data=_StoppedWhileEvaluating(signum)
    )
  assert exited.value.code == status
  assert checkpoints.latest_step(str(tmp_path)) == 4
  with open(tmp_path / "metrics.jsonl", encoding="utf-8") as f:
    rows = [json.loads(line) for line in f]
  assert [(row["split"], row["step"]) for row in rows] == [("train", 2), ("train", 4), ("eval", 4)]
  assert rows[-1]["num_examples"] == 24  # The evaluation ran to its end: its row is whole.
