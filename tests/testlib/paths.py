"""Where the tests find the repository and the helper scripts they start as child processes."""

import os

TESTLIB = os.path.dirname(os.path.abspath(__file__))
"""This folder: the helper scripts (`agreement_main.py`, `flags_script.py`, ...)."""

REPO = os.path.dirname(os.path.dirname(TESTLIB))
"""The repository root, whose `runner`, `strategies` and `configs` the tests and their child processes use."""


def subprocess_environment():
  """Environment for a child Python process that imports this repository (TensorFlow's C++ logs at warnings)."""
  env = dict(os.environ)
  env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
  env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
  return env
