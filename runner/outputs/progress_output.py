"""Where the progress lines go when `runner.run` or a `runner.Trainer` is called from Python, and `quiet`.

The progress lines (one per train loop, one per evaluation, checkpoints) are
absl INFO logs. Under `python -m runner`, absl's app shows them on stderr.
A Python program that calls `runner.run` or a Trainer's methods has not set
up absl logging, so Python's default (WARNING and above) would drop them;
`shown` makes them appear the same way for the length of the call and leaves
logging as it was.
"""

from collections.abc import Iterator
import contextlib
import logging as python_logging
import sys

from absl import logging

from runner.outputs import tensorflow_logs

_open = False  # Whether a `shown` block is open in this process: the outermost decides.


@contextlib.contextmanager
def shown(*, quiet: bool) -> Iterator[None]:
  """Shows (or, with `quiet`, hides) the absl INFO progress lines while the block runs; restores logging after.

  Not quiet: absl's verbosity is raised to INFO if it is lower, and when no
  logging handler is set up at all (a plain Python program), a stderr handler
  with absl's formatter goes on the root logger for the block, as absl's own
  does under `absl.app.run`: the lines come out once, in the CLI's format
  (absl alone would call `logging.basicConfig()` and print `INFO:absl:...`),
  with TensorFlow's own INFO lines hidden as the CLI hides them. A program
  that configured logging keeps its handlers. Quiet: only warnings and errors.

  Inside another `shown` block (a Trainer's method under `runner.run`) the
  outer block's choice holds and this one changes nothing.
  """
  global _open
  if _open:
    yield
    return
  verbosity = logging.get_verbosity()
  logging.set_verbosity(logging.WARNING if quiet else max(verbosity, logging.INFO))  # absl: INFO 0, WARNING -1.
  handler = None
  if not quiet and not logging.get_absl_logger().hasHandlers():  # Its own, or its ancestors' while it propagates.
    handler = python_logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.PythonFormatter())
    handler.addFilter(tensorflow_logs.without_tensorflow_info)
    python_logging.root.addHandler(handler)
  _open = True
  try:
    yield
  finally:
    _open = False
    if handler is not None:
      python_logging.root.removeHandler(handler)
    logging.set_verbosity(verbosity)
