"""Where the tests find the repository and the helper scripts they start as child processes."""

import os

TESTLIB = os.path.dirname(os.path.abspath(__file__))
"""This folder: the helper scripts (`agreement_main.py`, `flags_script.py`, ...)."""

REPO = os.path.dirname(os.path.dirname(TESTLIB))
"""The repository root, whose `runner`, `strategies` and `configs` the tests and their child processes use."""
