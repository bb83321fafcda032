"""TensorFlow's log output on the command line: start-up chatter hidden, real errors and warnings kept.

TensorFlow's C++ runtime prints INFO lines when it loads (oneDNN, CUDA stubs,
CPU features), twice since two of its libraries log on their own, and on a
machine without a GPU an E-level `failed call to cuInit` line. Some of these
come before its logging is set up and ignore `TF_CPP_MIN_LOG_LEVEL`. A user who
sets `TF_CPP_MIN_LOG_LEVEL` themselves gets TensorFlow's output untouched.
"""

import contextlib
import logging
import os
import re
import sys
import tempfile

from absl import logging as absl_logging

LEVEL_VARIABLE = "TF_CPP_MIN_LOG_LEVEL"
QUIET_LEVEL = "2"  # C++ INFO and WARNING hidden; ERROR and FATAL shown.

# Start-up lines that say nothing is wrong. Anything else printed while TensorFlow loads is replayed.
_STARTUP_CHATTER = re.compile("|".join([
    r"^WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR$",
    r"^I\d{4} .*\] oneDNN custom operations are on\.",
    r"^I\d{4} .*cudart_stub\.cc:\d+\] Could not find cuda drivers on your machine",
    r"^I\d{4} .*cpu_feature_guard\.cc:\d+\] This TensorFlow binary is optimized",
    r"^To enable the following instructions: .* rebuild TensorFlow with the appropriate compiler flags\.$",
]))
_NO_GPU_CUINIT = re.compile(r"^E\d{4} .*\] failed call to cuInit: ")
_TENSORFLOW_DIR = f"{os.sep}tensorflow{os.sep}"


def quiet_start():
  """Imports TensorFlow and lists its physical devices with the start-up chatter hidden; returns whether it did.

  Call it before anything imports TensorFlow. Unless the user set
  `TF_CPP_MIN_LOG_LEVEL`, it sets it to QUIET_LEVEL, keeps TensorFlow's Python
  logger at WARNING, and drops the known start-up lines (the cuInit error
  only on a machine without an NVIDIA device). Every other line printed
  meanwhile is written to stderr as it was. Logical devices are not
  initialized, so `strategies.virtual_cpus` still works after it.
  """
  if os.environ.get(LEVEL_VARIABLE) is not None:
    return False
  os.environ[LEVEL_VARIABLE] = QUIET_LEVEL
  with _filtered_stderr(_is_chatter):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    tf.config.list_physical_devices()  # Loads the device platforms: the cuInit line comes here.
  logging.getLogger("tensorflow").setLevel(logging.WARNING)  # tf_logging, which has a handler of its own.
  absl_logging.get_absl_handler().addFilter(without_tensorflow_info)  # TensorFlow code that logs through absl.
  return True


def without_tensorflow_info(record):
  """A logging filter: drops INFO (and DEBUG) records logged from TensorFlow's own Python code."""
  return record.levelno >= logging.WARNING or _TENSORFLOW_DIR not in record.pathname


def _is_chatter(line):
  if _STARTUP_CHATTER.search(line):
    return True
  return bool(_NO_GPU_CUINIT.search(line)) and not os.path.exists("/dev/nvidiactl")


@contextlib.contextmanager
def _filtered_stderr(is_dropped):
  """Captures file descriptor 2 inside the block, then writes back every line `is_dropped` rejects."""
  sys.stderr.flush()
  saved = os.dup(2)
  with tempfile.TemporaryFile(mode="w+b") as captured:
    os.dup2(captured.fileno(), 2)
    try:
      yield
    finally:
      sys.stderr.flush()
      os.dup2(saved, 2)
      os.close(saved)
      captured.seek(0)
      kept = [line for line in captured.read().decode(errors="replace").splitlines(keepends=True)
              if not is_dropped(line.rstrip("\n"))]
      sys.stderr.write("".join(kept))
      sys.stderr.flush()
