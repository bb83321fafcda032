"""TensorFlow's log output on the command line: start-up chatter hidden, real errors and warnings kept.

TensorFlow's C++ runtime prints INFO lines when it loads (oneDNN, CUDA stubs,
CPU features), twice since two of its libraries log on their own, and on a
machine without a GPU an E-level `failed call to cuInit` line. These come
before its logging is set up and ignore `TF_CPP_MIN_LOG_LEVEL`. The CLI applies
that level to them itself: a user's (from 1 on, never noisier than leaving it
unset), else QUIET_LEVEL; only level 0 shows everything as TensorFlow prints it.
"""

from collections.abc import Callable, Iterator
import contextlib
import importlib.abc
import importlib.machinery
import importlib.util
import logging
import os
import re
import sys
import tempfile
import types
from typing import Any

from absl import logging as absl_logging

LEVEL_VARIABLE = "TF_CPP_MIN_LOG_LEVEL"
QUIET_LEVEL = "2"  # C++ INFO and WARNING hidden; ERROR and FATAL shown.

# Start-up lines that say nothing is wrong. Anything else printed while TensorFlow loads, at the level or above, is
# replayed.
_STARTUP_CHATTER = re.compile(
    r"^WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR$"
    r"|^I\d{4} .*\] oneDNN custom operations are on\."
    r"|^I\d{4} .*cudart_stub\.cc:\d+\] Could not find cuda drivers on your machine"
    r"|^I\d{4} .*cpu_feature_guard\.cc:\d+\] This TensorFlow binary is optimized"
    r"|^To enable the following instructions: .* rebuild TensorFlow with the appropriate compiler flags\.$"
)
_NO_GPU_CUINIT = re.compile(r"^E\d{4} .*\] failed call to cuInit: ")
_SEVERITY = re.compile(r"^([IWEF])\d{4} ")  # A C++ log line: INFO, WARNING, ERROR, FATAL are levels 0 to 3.
_TENSORFLOW_DIR = f"{os.sep}tensorflow{os.sep}"
_TFGNN_MAPPING_WARNING = re.compile(r"Mapping types may not work well with tf\.nest\. .*'tensorflow_gnn\.")


def quiet_start() -> bool:
  """Hides TensorFlow's start-up chatter from its first import on, importing nothing; returns whether it will.

  Call it before anything imports TensorFlow. Unless the user set
  `TF_CPP_MIN_LOG_LEVEL`, it sets it to QUIET_LEVEL. At a level from 1 on it
  arranges that TensorFlow's first import, whoever asks for it (the runner
  once it needs a device, or a user's module as the config loads), runs with
  the known start-up lines and the C++ lines below the level dropped, and
  lists the physical devices; then TensorFlow's Python logger stays at
  WARNING. Every other line printed meanwhile is written to stderr as it was.
  At level 0 (the user's) it changes nothing. A command line that never needs
  TensorFlow (`--help`, a config error) never loads it. Logical devices are
  not initialized, so `strategies.virtual_cpus` still works after the import.
  """
  level = os.environ.setdefault(LEVEL_VARIABLE, QUIET_LEVEL)
  minimum = int(level) if level.strip().isdigit() else 0  # TensorFlow reads what is not a number as 0.
  if minimum == 0:
    return False
  if "tensorflow" in sys.modules:
    _quiet(sys.modules["tensorflow"], lambda: None, minimum)
  else:
    sys.meta_path.insert(0, _QuietFirstImport(minimum))
  return True


def _quiet(tensorflow_module: types.ModuleType, load: Callable[[], object], minimum: int) -> None:
  """Runs `load` (TensorFlow's import) and lists the devices, dropping chatter and C++ lines below `minimum`."""
  with _filtered_stderr(lambda line: _is_chatter(line, minimum)):
    load()
    tensorflow_module.config.list_physical_devices()  # Loads the device platforms: the cuInit line comes here.
  tensorflow_logger = logging.getLogger("tensorflow")  # tf_logging, which has a handler of its own.
  tensorflow_logger.setLevel(logging.WARNING)
  tensorflow_logger.addFilter(without_tensorflow_info)
  absl_logging.get_absl_handler().addFilter(without_tensorflow_info)  # TensorFlow code that logs through absl.


class _QuietFirstImport(importlib.abc.MetaPathFinder):
  """On `sys.meta_path`, makes the first import of `tensorflow` a quiet one, then steps aside.

  It finds the package's spec and has the spec's own loader run the package inside `_quiet`.
  """

  def __init__(self, minimum: int) -> None:
    self._minimum = minimum

  def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
    del path, target  # The top-level package only.
    if fullname != "tensorflow":
      return None
    sys.meta_path.remove(self)
    spec = importlib.util.find_spec(fullname)
    if spec is not None and spec.loader is not None:
      run = spec.loader.exec_module
      spec.loader.exec_module = lambda module: _quiet(module, lambda: run(module), self._minimum)  # type: ignore
    return spec


def without_tensorflow_info(record: logging.LogRecord) -> bool:
  """A logging filter: drops INFO (and DEBUG) records logged from TensorFlow's own Python code.

  Also TensorFlow's warning that `tf.nest` meets a read-only mapping of TF-GNN's (a `GraphTensor`'s
  features), which TF-GNN's own layers cause and a user cannot act on.
  """
  if _TENSORFLOW_DIR not in record.pathname:
    return True
  return record.levelno >= logging.WARNING and not _TFGNN_MAPPING_WARNING.match(record.getMessage())


def _is_chatter(line: str, minimum: int = int(QUIET_LEVEL)) -> bool:
  """Whether a line printed while TensorFlow loads is dropped at the C++ log level `minimum` (from 1 on)."""
  severity = _SEVERITY.match(line)
  if _STARTUP_CHATTER.search(line) or (severity and "IWEF".index(severity[1]) < minimum):
    return True
  return bool(_NO_GPU_CUINIT.search(line)) and not os.path.exists("/dev/nvidiactl")


@contextlib.contextmanager
def _filtered_stderr(is_dropped: Callable[[str], bool]) -> Iterator[None]:
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
      lines = captured.read().decode(errors="replace").splitlines(keepends=True)
      sys.stderr.write("".join(line for line in lines if not is_dropped(line.rstrip("\n"))))
      sys.stderr.flush()
