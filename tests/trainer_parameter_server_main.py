"""Builds a Trainer on a real ParameterServerStrategy (run by tests/test_trainer_errors.py, not by pytest).

With TF_CONFIG naming this process the chief of a localhost cluster, it starts
the worker and ps servers in-process, creates the strategy, tries to build a
Trainer on it and prints the ConfigError message as the last line.
"""

import json
import os
import sys

import tensorflow as tf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import parameter_server_script  # pylint: disable=g-import-not-at-top
import strategies  # pylint: disable=g-import-not-at-top
import trainer_testlib  # pylint: disable=g-import-not-at-top


def main():
  servers = parameter_server_script.start_servers(json.loads(os.environ["TF_CONFIG"])["cluster"])
  strategy = tf.distribute.experimental.ParameterServerStrategy(
      tf.distribute.cluster_resolver.TFConfigClusterResolver())
  try:
    trainer_testlib.make_trainer(strategy)
  except strategies.ConfigError as error:
    print(f"{len(servers)} servers", flush=True)
    print(error, flush=True)


if __name__ == "__main__":
  main()
