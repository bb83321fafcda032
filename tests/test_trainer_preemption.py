"""Stop signals during training: the handlers are the Trainer's only while it trains.

What a signal does to a run (save, exit status, resume) is tested with real
processes in test_fault_tolerance.py.
"""

import os
import signal
import threading

import tensorflow as tf

import trainer_testlib


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
