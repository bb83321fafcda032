"""Shared test setup: one TensorFlow process split into logical CPUs.

The split must happen before TensorFlow initializes its devices, so it runs
here, when pytest imports this file, before any test module is collected.
Tests pick 1, 2 or all of these devices for their strategies.
"""

import gc
import os
import shutil
import sys
import tempfile

import pytest

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(TESTS_DIR)
# The repository's packages first; then tests/, for the helpers every test imports as `from testlib import ...`.
for path in (TESTS_DIR, REPO_ROOT):
  if path not in sys.path:
    sys.path.insert(0, path)

# Temporary files of this process and its children go to one folder, removed when the session ends: the
# process ends with `os._exit` (below), which skips the `atexit` handlers that delete AutoGraph's
# generated modules (thousands of `__autograph_generated_file*.py` per suite), and a child killed in a
# test deletes nothing. pytest's own `tmp_path` folders stay where they were, for looking into a failed test.
os.environ.setdefault("PYTEST_DEBUG_TEMPROOT", tempfile.gettempdir())
SESSION_TEMP_DIR = tempfile.mkdtemp(prefix="tf-runner-tests-")
os.environ["TMPDIR"] = tempfile.tempdir = SESSION_TEMP_DIR

from runner.cluster import process_exit  # noqa: E402
import strategies  # noqa: E402
from testlib import paths  # noqa: E402

# The suite never collects reference cycles. A collection deletes every cyclic garbage Trainer of the
# tests before, and with it its tf.data iterators; in TensorFlow 2.21 deleting an iterator whose
# autotuning thread sleeps waits for that thread's timer (up to a minute), so one collection in a
# later test stalled it for 44 s to over 3 min (20.6 min for the suite with collections, 8.9 min
# without, at a peak of 2.1 GiB; docs/development.md#tests). Objects without cycles are still freed at once.
gc.disable()

_EXIT_STATUS = pytest.StashKey[int]()
NUM_LOGICAL_CPUS = 4
LOGICAL_CPUS = strategies.virtual_cpus(NUM_LOGICAL_CPUS)


# The files that take longest (they start the most TensorFlow processes), longest first. They run first:
# `-n 2 --dist loadfile` hands each file whole to whichever worker is free, in the order of the collection
# (pytest.ini turns off xdist's reordering by test count, `--no-loadscope-reorder`), so no long file is left to
# run alone at the end while the other worker has nothing to do.
LONGEST_FILES = (
    "runner/cluster/test_launch.py",
    "runner/cluster/test_slurm.py",
    "runner/cluster/test_fault_tolerance.py",
    "runner/cluster/test_cluster.py",
    "runner/cluster/test_trainer_parameter_server.py",
    "runner/cluster/test_ray_train.py",
    "runner/test_gnn_example.py",
    "runner/test_cli.py",
    "runner/training/test_trainer_tf_keras.py",
    "runner/training/test_unchecked_loops.py",
    "runner/training/test_trainer_multi_worker.py",
    "runner/cluster/test_tfjob_cluster.py",
    "runner/tpu/test_tpu_check.py",
    "runner/outputs/test_async_checkpoints.py",
)


def pytest_collection_modifyitems(items):
  """Puts the tests of `LONGEST_FILES` first, in that order; the others keep theirs."""

  def rank(item):
    path = os.path.relpath(str(item.path), TESTS_DIR)
    return LONGEST_FILES.index(path) if path in LONGEST_FILES else len(LONGEST_FILES)

  items.sort(key=rank)


@pytest.fixture
def cpu_devices():
  """Returns a function n -> the names of the first n logical CPUs."""

  def first(n):
    assert 1 <= n <= NUM_LOGICAL_CPUS, f"tests have {NUM_LOGICAL_CPUS} logical CPUs, asked for {n}"
    return [d.name for d in LOGICAL_CPUS[:n]]

  return first


@pytest.fixture
def subprocess_env():
  """Environment for a child Python process that imports this repository (`paths.subprocess_environment`)."""
  return paths.subprocess_environment()


def pytest_sessionfinish(session, exitstatus):
  """Keeps pytest's exit status for `pytest_unconfigure`.

  The session's leftover tf.data iterators are not deleted (see `gc.disable()`
  above): during interpreter shutdown a deletion can also deadlock.
  """
  session.config.stash[_EXIT_STATUS] = int(exitstatus)


@pytest.hookimpl(tryfirst=True)
def pytest_unconfigure(config):
  """Exits with pytest's status once its report is out, skipping interpreter teardown.

  First among the unconfigure hooks: pytest's own (9.x, unraisableexception)
  runs `gc.collect()` several times, which deletes the leftover iterators.

  The guard for the same TensorFlow shutdown deadlock: whatever still holds
  an iterator (a traced function's closure, a module global) is not deleted.
  The session's temporary folder is removed first.
  """
  shutil.rmtree(SESSION_TEMP_DIR, ignore_errors=True)
  process_exit.exit_now(config.stash.get(_EXIT_STATUS, 0))
