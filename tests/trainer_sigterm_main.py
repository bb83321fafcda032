"""A training process for the SIGTERM test (run by tests/test_trainer_preemption.py, not by pytest).

`python tests/trainer_sigterm_main.py MODEL_DIR` trains the tiny test model on
2 logical CPUs for (practically) ever, one step per loop, writing
MODEL_DIR/metrics.jsonl, until a SIGTERM makes it save and exit.
"""

import os
import sys

import strategies

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import trainer_testlib  # pylint: disable=g-import-not-at-top


def main(model_dir):
  strategy = strategies.MirroredStrategy([device.name for device in strategies.virtual_cpus(2)])
  trainer = trainer_testlib.make_trainer(strategy, model_dir=model_dir)
  trainer.train(trainer_testlib.classification_data(), global_batch_size=8, steps=10**9)


if __name__ == "__main__":
  main(sys.argv[1])
