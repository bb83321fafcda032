"""A GCE metadata server on 127.0.0.1 for tests: real HTTP, the protocol's header both ways and its long polls.

`GET /computeMetadata/v1/<key>` answers the key's value with the headers
`Metadata-Flavor: Google` and `ETag`. A request without the header
`Metadata-Flavor: Google` gets 403, as from the real server; an unknown key 404.
With `wait_for_change=true` the answer waits until the value's ETag differs
from `last_etag` (or, without it, from the ETag when the request came), or
`timeout_sec` passed; a long poll whose client went away ends.
"""

import dataclasses
import http.server
import select
import socket
import threading
import time
import urllib.parse

PATH_PREFIX = "/computeMetadata/v1/"
WAIT_TIMEOUT_SECONDS = 60  # How long a test waits for the watch to make its requests before it fails.


@dataclasses.dataclass(frozen=True)
class Request:
  """One request the server received.

  Attributes:
    key: the metadata key, e.g. 'instance/preempted'.
    query: its query's fields, each the last value given.
    flavored: it carried the header `Metadata-Flavor: Google`.
  """

  key: str
  query: dict
  flavored: bool

  @property
  def waits(self):
    return self.query.get("wait_for_change") == "true"


class MetadataServer:
  """Serves `values` (key -> value) on 127.0.0.1 from a thread, until `close`."""

  def __init__(self, values, *, flavor_header=True):
    """Starts the server.

    Args:
      values: the metadata keys and their values.
      flavor_header: False answers without the header `Metadata-Flavor: Google` (no metadata server).
    """
    self.flavor_header = flavor_header
    self.requests = []
    self.poll_endings = []  # (key, 'changed' | 'timed out' | 'client gone' | 'server closing') per long poll.
    self._values = dict(values)
    self._etags = {key: 1 for key in values}
    self._waiting = {key: 0 for key in values}
    self._active = 0
    self._answering_threads = set()
    self._closing = False
    self._changed = threading.Condition()
    server = self

    class Handler(http.server.BaseHTTPRequestHandler):

      def do_GET(self):  # noqa: N802 (http.server's name)
        server._answer(self)  # noqa: SLF001

      def log_message(self, format, *args):  # noqa: A002 (http.server's name)
        del format, args  # Quiet: the test reads `requests`.

    self._http = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    self._http.daemon_threads = True
    self._thread = threading.Thread(target=self._http.serve_forever, args=(0.05,), name="metadata-server", daemon=True)
    self._thread.start()

  @property
  def address(self):
    """`127.0.0.1:PORT`, as `GCE_METADATA_IP` holds it."""
    return f"127.0.0.1:{self._http.server_address[1]}"

  def etag(self, key):
    with self._changed:
      return f"etag-{self._etags[key]}"

  def set(self, key, value):
    """Changes `key`'s value (and its ETag): a long poll on it answers."""
    with self._changed:
      self._values[key] = value
      self._etags[key] += 1
      self._changed.notify_all()

  def requests_for(self, key):
    with self._changed:
      return [request for request in self.requests if request.key == key]

  def wait_until(self, condition, what):
    """Waits until `condition()` holds (checked at each request, change and answer); fails after a minute."""
    with self._changed:
      assert self._changed.wait_for(condition, WAIT_TIMEOUT_SECONDS), f"waited in vain for {what}: {self.requests}"

  def polling(self, key):
    """Whether a long poll on `key` is waiting for a change now."""
    return self._waiting[key] > 0

  def idle(self):
    """Whether no request is being answered."""
    return self._active == 0

  def join_answers(self):
    """Waits until the threads of the answers so far have ended."""
    self.wait_until(self.idle, "the answers to end")
    with self._changed:
      threads, self._answering_threads = self._answering_threads, set()
    for thread in threads:
      thread.join()

  def close(self):
    """Ends every long poll, stops serving and waits for its threads."""
    with self._changed:
      self._closing = True
      self._changed.notify_all()
    self._http.shutdown()
    self._http.server_close()
    self.join_answers()
    self._thread.join()

  def _answer(self, handler):
    url = urllib.parse.urlsplit(handler.path)
    key = url.path.removeprefix(PATH_PREFIX)
    query = dict(urllib.parse.parse_qsl(url.query))
    request = Request(key=key, query=query, flavored=handler.headers.get("Metadata-Flavor") == "Google")
    with self._changed:
      self.requests.append(request)
      self._answering_threads.add(threading.current_thread())
      self._active += 1
      self._changed.notify_all()
    try:
      if not request.flavored:
        self._reply(handler, 403, "Missing Metadata-Flavor:Google header.\n")
      elif not url.path.startswith(PATH_PREFIX) or key not in self._values:
        self._reply(handler, 404, "Not found.\n")
      elif not request.waits or self._waited(handler, key, query):
        with self._changed:
          value, etag = self._values[key], f"etag-{self._etags[key]}"
        self._reply(handler, 200, value, etag=etag)
    finally:
      with self._changed:
        self._active -= 1
        self._changed.notify_all()

  def _waited(self, handler, key, query):
    """Waits for `key` to change; returns False when there is no one left to answer (client gone, closing)."""
    timeout = float(query.get("timeout_sec", 3600))
    deadline = time.monotonic() + timeout
    with self._changed:
      since = query.get("last_etag") or f"etag-{self._etags[key]}"
      self._waiting[key] += 1
      self._changed.notify_all()
      try:
        ending = None
        while ending is None:
          if f"etag-{self._etags[key]}" != since:
            ending = "changed"
          elif time.monotonic() >= deadline:
            ending = "timed out"
          elif _gone(handler.connection):
            ending = "client gone"
          elif self._closing:
            ending = "server closing"
          else:
            self._changed.wait(0.05)
        self.poll_endings.append((key, ending))
      finally:
        self._waiting[key] -= 1
        self._changed.notify_all()
    return ending in ("changed", "timed out")

  def _reply(self, handler, status, body, *, etag=None):
    data = body.encode()
    handler.send_response(status)
    if self.flavor_header:
      handler.send_header("Metadata-Flavor", "Google")
    handler.send_header("Content-Type", "application/text")
    handler.send_header("Content-Length", str(len(data)))
    if etag is not None:
      handler.send_header("ETag", etag)
    handler.end_headers()
    handler.wfile.write(data)


def _gone(connection):
  """Whether the client closed (or shut down) its end of `connection`."""
  readable, _, _ = select.select([connection], [], [], 0)
  if not readable:
    return False
  try:
    return connection.recv(1, socket.MSG_PEEK) == b""
  except OSError:
    return True
