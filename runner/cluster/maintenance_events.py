"""GCE maintenance events and preemption notices: on a Compute Engine VM, they stop training as SIGTERM does.

A TPU VM or a GPU VM about to be stopped for host maintenance, and a spot
(preemptible) VM about to be reclaimed, say so on the VM's metadata server:
`instance/maintenance-event` turns from `NONE` to
`TERMINATE_ON_HOST_MAINTENANCE`, `instance/preempted` from `FALSE` to `TRUE`.
While a training loop runs, `watching` long-polls both keys
(`?wait_for_change=true`, header `Metadata-Flavor: Google`), each from a
daemon thread, and at either notice calls `on_notice` once: the Trainer notes
it as SIGTERM (`stop_signals.StopSignals.note`), so the run saves at the end
of the current loop and exits 143. `MIGRATE_ON_HOST_MAINTENANCE` (a live
migration, which the VM and training survive) and values this module does
not know are logged and training goes on.

Off GCE nothing happens: no thread, no network call. Whether this is a GCE VM
is decided from the machine alone: the metadata server named by
`GCE_METADATA_IP` (as TensorFlow's failure handling reads it) or
`GCE_METADATA_HOST` (as Google's client libraries read it), else
`metadata.google.internal` where the DMI data in `/sys/class/dmi/id` names a
Google VM. An unreachable server, or one that answers without the
`Metadata-Flavor: Google` header, never stops training: one warning, and the
watch retries with back-off.
"""

from collections.abc import Callable, Iterator, Mapping
import contextlib
import dataclasses
import http.client
import os
import re
import socket
import threading
import urllib.parse

from absl import logging

HOST_VARIABLES = ("GCE_METADATA_IP", "GCE_METADATA_HOST")  # In the order they are read.
DEFAULT_HOST = "metadata.google.internal"
DMI_DIR = "/sys/class/dmi/id"
# The keys watched: what each holds with nothing coming, and the value that stops training.
MAINTENANCE_EVENT = "instance/maintenance-event"
PREEMPTED = "instance/preempted"
QUIET_VALUES = {MAINTENANCE_EVENT: "NONE", PREEMPTED: "FALSE"}
STOP_VALUES = {MAINTENANCE_EVENT: "TERMINATE_ON_HOST_MAINTENANCE", PREEMPTED: "TRUE"}
_NOTICES = {MAINTENANCE_EVENT: "GCE maintenance event", PREEMPTED: "GCE preemption notice"}
_HOST_PORT = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9][A-Za-z0-9.-]*)(:[0-9]{1,5})?")
_CONNECT_SECONDS = 2.0  # A metadata server is on the VM's own link; how long `close` may wait for a connect.
_READ_MARGIN_SECONDS = 10.0  # Past the server's own `timeout_sec`, before a silent connection counts as lost.


def metadata_host(environ: Mapping[str, str] | None = None, *, dmi_dir: str = DMI_DIR) -> str | None:
  """Returns the metadata server's `host[:port]`, or None where this is no GCE VM; makes no network call.

  Args:
    environ: the environment (default `os.environ`): the first of
      `GCE_METADATA_IP` and `GCE_METADATA_HOST` that is set and not empty
      names the server.
    dmi_dir: where the machine's DMI data is read: without either variable,
      a `product_name` of `Google Compute Engine` or a `bios_vendor` of
      `Google` means `metadata.google.internal`.

  Returns:
    The server's `host` or `host:port`; None without either variable on a
    machine whose DMI data names no Google VM, or where the variable is not
    a `host[:port]` (then one warning says so).
  """
  environ = os.environ if environ is None else environ
  for variable in HOST_VARIABLES:
    if not (value := environ.get(variable, "")):
      continue
    if _HOST_PORT.fullmatch(value):
      return value
    logging.warning(
        f"{variable}={value!r} is not a host or host:port (such as 169.254.169.254 or 127.0.0.1:8080): GCE "
        "maintenance events and preemption notices are not watched."
    )
    return None
  on_gce = _dmi(dmi_dir, "product_name") == "Google Compute Engine" or _dmi(dmi_dir, "bios_vendor") == "Google"
  return DEFAULT_HOST if on_gce else None


def _dmi(dmi_dir: str, name: str) -> str | None:
  try:
    with open(os.path.join(dmi_dir, name), encoding="utf-8", errors="replace") as f:
      return f.read().strip()
  except OSError:  # No such file: a container without /sys/class/dmi, or another OS.
    return None


@contextlib.contextmanager
def watching(on_notice: Callable[[], None]) -> Iterator["Watch | None"]:
  """Inside, a GCE maintenance event or preemption notice for this VM calls `on_notice()` once.

  Args:
    on_notice: called from the watch's thread at the first notice that stops
      training, after one warning line that names it.

  Yields:
    The `Watch` (its threads end on the way out), or None off GCE (see
    `metadata_host`): no thread is started and no request made.
  """
  host = metadata_host()
  watch = None if host is None else Watch(host=host, on_notice=on_notice)
  try:
    yield watch
  finally:
    if watch is not None:
      watch.close()


class _MetadataAnswerError(Exception):
  """An answer that is no metadata server's value: no `Metadata-Flavor: Google` header, or a status other than 200."""


@dataclasses.dataclass(kw_only=True, eq=False)
class Watch:
  """Long-polls `instance/maintenance-event` and `instance/preempted`, one daemon thread each, until `close`.

  Each thread reads its key, then asks again with `wait_for_change=true` and
  the `last_etag` of the answer before, so that no change in between is
  missed. A stopping value (`STOP_VALUES`) calls `on_notice` once for the
  watch, and that thread ends. A failed request (refused, timed out, a
  status other than 200, no `Metadata-Flavor: Google` header in the answer)
  is logged once for the watch and retried after a wait that doubles, from
  `first_retry_seconds` up to `max_retry_seconds`. The threads start when it
  is made (`watching` makes it with the defaults).

  Attributes:
    host: the metadata server, `host` or `host:port`.
    on_notice: called once, from a watch thread, at the first stopping notice.
    wait_seconds: the `timeout_sec` of each long poll: the server answers
      with the value unchanged after that long.
    first_retry_seconds: the wait before retrying after a first failure.
    max_retry_seconds: the longest wait between retries.
  """

  host: str
  on_notice: Callable[[], None]
  wait_seconds: int = 60
  first_retry_seconds: float = 1.0
  max_retry_seconds: float = 60.0

  def __post_init__(self) -> None:
    self._closed = threading.Event()
    self._lock = threading.Lock()  # Guards the fields below, and `_closed` against a request being opened.
    self._said: set[str] = set()  # What was said once for the watch: 'notice', 'failure'.
    self._open: dict[str, socket.socket] = {}  # The socket of each request in progress, by key.
    self._threads = [
        threading.Thread(target=self._watch, args=(key,), name=f"gce-watch:{key}", daemon=True) for key in STOP_VALUES
    ]
    for thread in self._threads:
      thread.start()

  def close(self) -> None:
    """Ends the threads: a long poll in progress is cut off; returns once they have ended."""
    with self._lock:
      self._closed.set()
      for open_socket in self._open.values():
        with contextlib.suppress(OSError):
          open_socket.shutdown(socket.SHUT_RDWR)  # The thread's read returns at once.
    for thread in self._threads:
      thread.join()

  def _watch(self, key: str) -> None:
    """Reads `key`, then long-polls it until a stopping value or `close`."""
    etag = value = None  # value None: not read yet, so the next request reads at once.
    retry_seconds = self.first_retry_seconds
    while not self._closed.is_set():
      try:
        new_value, etag = self._read(key, etag, wait=value is not None)
      except (OSError, http.client.HTTPException, _MetadataAnswerError, UnicodeDecodeError) as e:
        if self._first("failure"):  # Not once closed: the error is the cut-off request's.
          reason = e if isinstance(e, _MetadataAnswerError) else f"{type(e).__name__}: {e}"
          logging.warning(
              f"Cannot watch GCE maintenance events at the metadata server {self.host} ({key}: {reason}): training "
              f"goes on, and the watch retries, waiting up to {self.max_retry_seconds:g} s between tries."
          )
        self._closed.wait(retry_seconds)
        retry_seconds = min(self.max_retry_seconds, 2 * retry_seconds)
        continue
      retry_seconds = self.first_retry_seconds
      if new_value == STOP_VALUES[key]:
        if self._first("notice"):
          logging.warning(
              f"{_NOTICES[key]} on this VM ({key} = {new_value}): the run stops at the end of this loop as on "
              "SIGTERM, with a checkpoint saved."
          )
          self.on_notice()
        return
      if new_value not in (value, QUIET_VALUES[key]):
        logging.warning(
            f"{_NOTICES[key]} on this VM ({key} = {new_value}): not one that stops the VM; training goes on."
        )
      value = new_value

  def _first(self, what: str) -> bool:
    """Whether `what` ('notice', 'failure') happens for the first time in this watch, which is not closed."""
    with self._lock:
      first = what not in self._said and not self._closed.is_set()
      self._said.add(what)
      return first

  def _read(self, key: str, etag: str | None, *, wait: bool) -> tuple[str, str | None]:
    """Returns the value of `key` and its ETag: at once, or with `wait` once it differs from `etag`'s.

    Raises:
      OSError, http.client.HTTPException: the request failed, or the watch was closed.
      _MetadataAnswerError: the answer lacks `Metadata-Flavor: Google`, or its status is not 200.
    """
    query = ""
    if wait:
      fields = {"wait_for_change": "true", "timeout_sec": self.wait_seconds}
      query = "?" + urllib.parse.urlencode(fields if etag is None else {**fields, "last_etag": etag})
    connection = http.client.HTTPConnection(self.host, timeout=_CONNECT_SECONDS)
    try:
      connection.connect()
      with self._lock:
        if self._closed.is_set():
          raise OSError("the watch was closed")
        self._open[key] = connection.sock  # Kept: http.client may drop it from the connection before the body's end.
      connection.sock.settimeout(self.wait_seconds + _READ_MARGIN_SECONDS)
      connection.request("GET", f"/computeMetadata/v1/{key}{query}", headers={"Metadata-Flavor": "Google"})
      response = connection.getresponse()
      body = response.read()
    finally:
      with self._lock:
        self._open.pop(key, None)
      connection.close()
    if response.getheader("Metadata-Flavor") != "Google":
      raise _MetadataAnswerError("its answer lacks the header Metadata-Flavor: Google, so it is no metadata server")
    if response.status != 200:
      raise _MetadataAnswerError(f"it answered {response.status} {response.reason}")
    return body.decode("utf-8").strip(), response.getheader("ETag")
