"""SIGTERM during training: a checkpoint at the step reached, then exit; the old handler comes back."""

import json
import os
import signal
import subprocess
import sys
import time

import tensorflow as tf

import trainer_testlib

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "trainer_sigterm_main.py")


def _train_rows(path):
  if not os.path.exists(path):
    return []
  with open(path, encoding="utf-8") as f:
    return [json.loads(line) for line in f if line.endswith("\n")]


def test_sigterm_saves_a_checkpoint_at_the_step_reached_and_exits(tmp_path, subprocess_env):
  model_dir = tmp_path / "model_dir"
  process = subprocess.Popen([sys.executable, SCRIPT, str(model_dir)], env=subprocess_env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
  try:
    deadline = time.monotonic() + 120
    while len(_train_rows(model_dir / "metrics.jsonl")) < 3:
      assert process.poll() is None, process.stderr.read()[-3000:]
      assert time.monotonic() < deadline, "training did not start in time"
      time.sleep(0.2)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=60)
  finally:
    process.kill()
  assert process.returncode == 128 + signal.SIGTERM, stderr[-3000:]
  last_step = _train_rows(model_dir / "metrics.jsonl")[-1]["step"]
  assert tf.train.latest_checkpoint(str(model_dir / "checkpoints")).endswith(f"ckpt-{last_step}")
  assert f"Stopped by SIGTERM: saved a checkpoint at step {last_step} (" in stderr


def test_train_puts_the_previous_sigterm_handler_back():
  def previous(signum, frame):
    del signum, frame

  old = signal.signal(signal.SIGTERM, previous)
  try:
    trainer = trainer_testlib.make_trainer(tf.distribute.OneDeviceStrategy("/cpu:0"))
    trainer.train(trainer_testlib.classification_data(16), global_batch_size=8, steps=1)
    assert signal.getsignal(signal.SIGTERM) is previous
  finally:
    signal.signal(signal.SIGTERM, old)
