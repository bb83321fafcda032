"""`metrics.jsonl`: its two layouts, its rows appended, read back, and dropped past a step.

A local workdir has one file, `WORKDIR/metrics.jsonl`, appended to row by
row: each row is one append under the file's lock (`fcntl.flock`), so a
trainer and the evaluator beside it (`runner.training.continuous_eval`) can
both append, and each row is on disk when its append returns.

A remote workdir (a URL: `gs://`, `s3://`, `hdfs://`, `ram://`, ...) has the
rows in parts instead: `WORKDIR/metrics_parts/FIRST-LAST-TIME-ID.jsonl`, one
object per batch of rows, written once and never appended to. Object
storage cannot append: `tf.io.gfile`'s append mode on `gs://` uploads the
whole object again at every flush, so the cost of a row grew with the file.
A part costs what its rows weigh. FIRST and LAST are the steps of its first
and last rows when written (12 digits; a part whose later rows were dropped,
see `drop_rows_past`, keeps its name), TIME the nanoseconds since the epoch
when it was written (19 digits), ID random; so the parts in name order hold
the rows in step order, and a writer's rows in the order it wrote them. Writers never
share a part, so a trainer and an evaluator can write beside each other on
object storage too. `gcloud storage cat 'gs://BUCKET/WORKDIR/metrics_parts/*'`
prints every row. A `metrics.jsonl` left in a remote workdir by an earlier
version is read first, before the parts.

`rows` reads both layouts.
"""

from collections.abc import Mapping
import fcntl
import json
import os
import re
import time
from typing import Any, IO
import uuid

from absl import logging
import tensorflow as tf

from runner.workdir import atomic_files
from runner.workdir import remote

FILE_NAME = "metrics.jsonl"
PARTS_DIRECTORY = "metrics_parts"
_PART = re.compile(r"^(\d+)-(\d+)-(\d+)-[0-9a-f]+\.jsonl$")


def rows(model_dir: str, *, step: int | None = None) -> list[Any]:
  """Returns the rows of the metrics of `model_dir` that parse (a line cut short by a kill does not), in order.

  Args:
    model_dir: the workdir, local or remote.
    step: None for every row; else the rows of the parts that may hold rows
      of this step are read (on a local workdir, the whole file), so a caller
      needing one step reads little of a long run's metrics.

  Returns:
    The parsed JSON values, in the order described in the module docstring.
  """
  lines = _lines(os.path.join(model_dir, FILE_NAME))
  for path, first, last in _parts(model_dir):
    if step is None or first <= step <= last:
      lines += _lines(path)
  return [row for row in map(_parsed, lines) if row is not None]


class Appender:
  """Appends rows to the metrics of one workdir: to `metrics.jsonl` if local, as parts if remote.

  Local: each row is on disk when `append` returns. Remote: rows are kept
  and written as one part at `flush`, or once the oldest kept row is
  `PART_SECONDS` old, so a process killed without a flush loses at most
  that much of its rows (a rerun trains the steps past its checkpoint again
  and writes theirs).
  """

  PART_SECONDS = 60.0

  def __init__(self, model_dir: str) -> None:
    """Initializes the `Appender` of `model_dir` (made when the first row is written)."""
    self._dir = model_dir
    self._file: IO[str] | None = None  # The local metrics.jsonl, kept open across rows.
    self._kept: list[tuple[int, str]] = []  # Remote: (step, line) not written yet.
    self._kept_since = 0.0
    self._last_time_ns = 0

  def append(self, row: Mapping[str, Any]) -> None:
    """Appends `row`, a JSON object with an int `step`."""
    line = json.dumps(row) + "\n"
    if remote.is_remote(self._dir):
      self._kept_since = self._kept_since if self._kept else time.monotonic()
      self._kept.append((int(row["step"]), line))
      if time.monotonic() - self._kept_since >= self.PART_SECONDS:
        self.flush()
      return
    if self._file is None:
      os.makedirs(self._dir, exist_ok=True)
    # Kept open across rows (reopened when another writer replaced the file); a `with` would reopen it for every row.
    self._file = _locked_current(os.path.join(self._dir, FILE_NAME), self._file)
    try:
      self._file.write(line)
      self._file.flush()
    finally:
      fcntl.flock(self._file, fcntl.LOCK_UN)

  def flush(self) -> None:
    """Writes the rows not written yet (remote: as one new part; a local row is written when appended)."""
    if not self._kept:
      return
    steps = [step for step, _ in self._kept]
    self._last_time_ns = max(time.time_ns(), self._last_time_ns + 1)  # A writer's parts sort in its order.
    name = f"{min(steps):012d}-{max(steps):012d}-{self._last_time_ns:019d}-{uuid.uuid4().hex[:8]}.jsonl"
    tf.io.gfile.makedirs(os.path.join(self._dir, PARTS_DIRECTORY))
    with tf.io.gfile.GFile(os.path.join(self._dir, PARTS_DIRECTORY, name), "w") as f:
      f.write("".join(line for _, line in self._kept))
    self._kept = []

  def close(self) -> None:
    """Closes the local file (rows kept for a part stay kept: `flush` writes them)."""
    if self._file is not None:
      self._file.close()
      self._file = None


def drop_rows_past(model_dir: str, step: int) -> None:
  """Removes the rows past `step` (and a last line cut short) from the metrics of `model_dir`, if it has any.

  A file is replaced whole (`atomic_files`): a reader or a crash sees its old
  rows or its new ones, never a mix. A local `metrics.jsonl` is locked from
  its read to its rename, so no other writer's row is lost. Remote parts
  whose first row is past `step` are removed (read first, to count their
  rows); a part with rows on both sides is replaced by one without the
  later rows; other parts are neither read nor written. Appenders open on the old file reopen the new
  one at their next row.
  """
  path = os.path.join(model_dir, FILE_NAME)
  parts = os.path.join(model_dir, PARTS_DIRECTORY)
  dropped = {path: 0, parts: 0}
  if remote.is_remote(path):
    dropped[path] = _replace_without_rows_past(path, step, _lines(path))
  elif os.path.exists(path):
    with _locked_current(path, None, mode="rb") as f:  # No row is appended from the read to the rename.
      dropped[path] = _replace_without_rows_past(path, step, f.read().splitlines(keepends=True))
  for part, first, last in _parts(model_dir):
    if first > step:
      dropped[parts] += len(_lines(part))
      tf.io.gfile.remove(part)
    elif last > step:
      dropped[parts] += _replace_without_rows_past(part, step, _lines(part))
  for where, count in dropped.items():
    if count:
      logging.info(
          f"Dropped {count} row(s) of {where} past step {step}, written by a run that stopped before its next "
          "checkpoint: this run trains those steps again."
      )


def _replace_without_rows_past(path: str, step: int, lines: list[bytes]) -> int:
  """Replaces the file at `path`, whose `lines` these are, without its rows past `step`; returns the lines dropped."""
  kept = []
  for line in lines:
    row = _parsed(line)
    if isinstance(row, dict) and isinstance(row.get("step"), int) and row["step"] > step:
      continue
    if not line.endswith(b"\n"):  # The last line, cut short by a crash unless it parses.
      if row is None:
        continue
      line += b"\n"
    kept.append(line)
  if kept != lines:
    atomic_files.replace_all({path: b"".join(kept)})
  return len(lines) - len(kept)


def _parts(model_dir: str) -> list[tuple[str, int, int]]:
  """`(path, first step, last step)` of the parts of the metrics of `model_dir`, by first step, then time written."""
  directory = os.path.join(model_dir, PARTS_DIRECTORY)
  found = []
  for name in tf.io.gfile.listdir(directory) if tf.io.gfile.isdir(directory) else []:
    if match := _PART.match(name.rstrip("/")):  # Other names (a temporary file of `atomic_files`) are not parts.
      first, last, written_ns = map(int, match.groups())
      found.append((first, written_ns, os.path.join(directory, name), last))
  return [(path, first, last) for first, _, path, last in sorted(found)]


def _locked_current(path: str, opened: IO[Any] | None, *, mode: str = "a") -> IO[Any]:
  """Returns the local file at `path` open in `mode` and locked (`fcntl.flock`), reusing `opened` if it still is it.

  A file replaced while the lock was awaited (by another writer's
  `drop_rows_past`) is closed, and the new file at `path` is opened and
  locked. The lock is released by `fcntl.flock(f, fcntl.LOCK_UN)` or by
  closing the file. With mode "a" the file is made if missing.
  """
  while True:
    if opened is None or opened.closed:
      opened = open(path, mode) if "b" in mode else open(path, mode, encoding="utf-8")  # noqa: SIM115
    fcntl.flock(opened, fcntl.LOCK_EX)
    try:
      if os.path.samestat(os.fstat(opened.fileno()), os.stat(path)):
        return opened
    except FileNotFoundError:  # Renamed away, the new file not there yet: open it once it is.
      pass
    opened.close()


def _lines(path: str) -> list[bytes]:
  """The lines of the file at `path` as bytes, each with its newline (a last line cut short without); [] if none."""
  if not tf.io.gfile.exists(path):
    return []
  with tf.io.gfile.GFile(path, "rb") as f:
    return f.read().splitlines(keepends=True)


def _parsed(line: bytes) -> Any:
  """The JSON value of `line`, or None if it is not one."""
  try:
    return json.loads(line)
  except ValueError:
    return None
