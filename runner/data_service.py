"""`python -m runner.data_service --dispatcher=HOST:PORT | --worker=DISPATCHER [--port=P] [--host=H]`: a server.

The servers a run with `config.data.service` reads its training input from
(docs/clusters.md#the-tfdata-service): a dispatcher
(`tf.data.experimental.service.DispatchServer`) on PORT, or a worker
(`WorkerServer`) that registers with the dispatcher at DISPATCHER
(`HOST:PORT` or `grpc://HOST:PORT`), serves on port P (0: a free one) and
tells the runs to reach it at H:P (H: this machine's name). TensorFlow's
servers listen on every interface; HOST and H are only the names they are
reached at. `runner.launch --data_workers=N` starts these on 127.0.0.1.

It prints one line once it serves (`dispatcher serving at grpc://HOST:PORT`,
`worker serving at H:P for grpc://DISPATCHER`) and serves until SIGTERM or
Ctrl-C, then says so in one line and exits 0. Bad flags, or a server that
cannot start (its port taken), are one `error:` line and exit 2.
"""

from runner.outputs import tensorflow_logs

tensorflow_logs.quiet_start()  # Before TensorFlow loads.

from collections.abc import Sequence
import signal
import socket
import sys
from typing import Any

from absl import app
from absl import flags
import portpicker
import tensorflow as tf

from runner import exit_codes
from runner.cluster import process_exit
from strategies.errors import ConfigError
from strategies.errors import first_line
from strategies.errors import print_error_line

_DISPATCHER = flags.DEFINE_string("dispatcher", None, "Serve a dispatcher reached at HOST:PORT (it listens on PORT).")
_WORKER = flags.DEFINE_string("worker", None, "Serve a worker of the dispatcher at [grpc://]HOST:PORT.")
_PORT = flags.DEFINE_integer("port", 0, "The worker's port (0: a free one).", lower_bound=0)
_HOST = flags.DEFINE_string("host", None, "The name runs reach the worker at; default: this machine's name.")
_STOPS = (signal.SIGTERM, signal.SIGINT)


def serve(*, dispatcher: str | None, worker: str | None, port: int, host: str | None) -> tuple[Any, str]:
  """Starts the server the flags name (see the module docstring).

  Returns:
    `(server, the line that says where it serves)`; the server serves while it is referenced.

  Raises:
    ConfigError: not exactly one of `dispatcher` and `worker`, an address
      that is not `[grpc://]HOST:PORT`, or a server that cannot start.
  """
  if (dispatcher is None) == (worker is None):
    raise ConfigError("Give one of --dispatcher=HOST:PORT and --worker=DISPATCHER_HOST:PORT.")
  address = (dispatcher or worker or "").removeprefix("grpc://")
  name, _, number = address.rpartition(":")
  if not name or not number.isdigit():
    raise ConfigError(f"--{'dispatcher' if dispatcher else 'worker'}={address!r} is not an address HOST:PORT.")
  if dispatcher is not None and port:
    raise ConfigError("--port is the worker's; a dispatcher listens on the port of --dispatcher=HOST:PORT.")
  service = tf.data.experimental.service
  try:
    if dispatcher is not None:
      return (
          service.DispatchServer(service.DispatcherConfig(port=int(number))),
          f"dispatcher serving at grpc://{address}",
      )
    port = port or portpicker.pick_unused_port()  # Chosen here: a WorkerServer does not say which port it took.
    here = f"{host or socket.gethostname()}:{port}"
    server = service.WorkerServer(service.WorkerConfig(dispatcher_address=address, worker_address=here, port=port))
    return server, f"worker serving at {here} for grpc://{address}"
  except (tf.errors.OpError, RuntimeError) as error:
    raise ConfigError(f"The tf.data service server could not start: {first_line(str(error))}") from None


def main(argv: Sequence[str]) -> None:
  """Serves until SIGTERM or Ctrl-C; exits 0 then, 2 on bad input (one `error:` line)."""
  if argv[1:]:
    print_error_line(f"Unexpected arguments {list(argv[1:])}; see --help.")
    process_exit.exit_now(exit_codes.USER_ERROR)
  signal.pthread_sigmask(signal.SIG_BLOCK, _STOPS)  # Before TensorFlow's threads start: only `sigwait` gets them.
  try:
    server, line = serve(dispatcher=_DISPATCHER.value, worker=_WORKER.value, port=_PORT.value, host=_HOST.value)
  except ConfigError as error:
    print_error_line(error)
    process_exit.exit_now(exit_codes.USER_ERROR)
  print(line, flush=True)
  received = signal.sigwait(_STOPS)  # `server` serves until the process ends.
  print(f"{signal.Signals(received).name} received: stopped serving.", file=sys.stderr)
  process_exit.exit_now(exit_codes.DONE)


if __name__ == "__main__":
  app.run(main)
