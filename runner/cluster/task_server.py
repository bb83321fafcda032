"""The worker and ps tasks of a parameter-server cluster: serve until the coordinator is done.

Every task of a parameter-server job runs the same `python -m runner`
command; only `TF_CONFIG` differs. The chief coordinates (it trains, see
`parameter_server_loops`); a `worker` or `ps` task instead starts a
`tf.distribute.Server` and serves. TensorFlow has no call that ends a
server, and `Server.join()` never returns, so a serving task watches the
chief: it probes the chief's port with a TCP connect every `POLL_SECONDS`
and, once it has seen the chief up, exits 0 when the port refuses
connections on two probes in a row (the coordinator finished, failed or
was stopped; its own exit status says which). The probe needs nothing but
the cluster addresses (no shared files, so a `gs://` workdir works the
same). Tasks may start in any order: a server waits for the chief at most
`config.strategy.timeout_seconds` (None: forever), as the chief waits for
the servers, then fails with a `ClusterError` (exit 170, transient): a task restarted
after the coordinator finished must not serve forever.

SIGTERM asks a serving task to stop once the coordinator no longer needs
it: it serves on while the chief's port answers (the chief, stopped too,
saves its checkpoint through the servers) and then exits with 143, at once
if the chief is not up. So a SIGTERM to every task at once (a cluster
manager, or `runner.launch`'s tasks when the launcher dies) still saves.
Ctrl-C ends a serving task at once with 130; a SIGTERM after the first
changes nothing. Each says so in one line on stderr.
"""

from collections.abc import Callable
import signal
import sys
import time

from absl import logging
import tensorflow as tf

from runner import exit_codes
from runner.cluster import process_exit
from runner.cluster import stop_signals
from strategies import cluster as cluster_lib
from strategies import peers
from strategies.errors import ClusterError
from strategies.errors import ConfigError

POLL_SECONDS = 2.0


def describe(found: cluster_lib.Cluster) -> str:
  """One line on what this task does, e.g. 'serve as worker:0 of a parameter-server cluster (chief: host:port)'."""
  return (
      f"serve as {found.task_type}:{found.task_id} of a parameter-server cluster until the coordinator "
      f"({_chief_address(found)}) is done"
  )


def serve(found: cluster_lib.Cluster, timeout_seconds: float | None) -> None:
  """Starts this task's `tf.distribute.Server` and serves until the coordinator is done (see the module docstring).

  Prints one line saying so. Returns when the chief's port has closed.
  After a SIGTERM it serves while the chief is up, then exits with 143;
  Ctrl-C ends the process at once (130).

  Args:
    found: the cluster, with this task a worker or ps task of it
      (`runner.cluster.roles`).
    timeout_seconds: the longest wait for the chief to come up; None waits
      forever.

  Raises:
    ConfigError: the cluster has no chief, or the server cannot start (e.g.
      its port is taken).
    ClusterError: the chief did not come up within `timeout_seconds`.
    SystemExit: 143, the coordinator done after a SIGTERM.
  """
  resolver = found.resolver()
  spec = resolver.cluster_spec()
  chief = _chief_address(found)
  num_workers = len(spec.job_tasks("worker")) if "worker" in spec.jobs else 0
  me = f"{resolver.task_type}:{resolver.task_id}"
  # On a small machine a worker needs more inter-op threads than the functions it runs at once, or it can hang.
  config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=max(4, num_workers + 2))
  stopped: list[int] = []  # The SIGTERM that asked this task to stop once the coordinator is done.

  def on_signal(signum: int, frame: object) -> None:  # For the process's life: a serving task ends with its server.
    del frame
    if signum == signal.SIGINT:
      sys.stderr.write(
          f"{stop_signals.NAMES[signum]} received: {me} stopped serving at once (the coordinator "
          "writes the checkpoints; it fails if a ps task it needs is gone).\n"
      )
      process_exit.exit_now(exit_codes.STOPPED_BY[signum])
    if not stopped:
      stopped.append(signum)
      sys.stderr.write(
          f"SIGTERM received: {me} serves until the coordinator is done (it saves its "
          "checkpoint through the servers), then exits.\n"
      )

  for signum in exit_codes.STOPPED_BY:
    signal.signal(signum, on_signal)
  try:
    server = tf.distribute.Server(
        spec, job_name=resolver.task_type, task_index=resolver.task_id, protocol="grpc", config=config, start=True
    )
  except tf.errors.OpError as error:
    raise ConfigError(
        f"{me} could not start its server at {spec.task_address(resolver.task_type, resolver.task_id)} "
        f"({' '.join(error.message.split())}); check that the port is free and the address is this host's."
    ) from None
  print(f"serving as {me} of a parameter-server cluster until the coordinator ({chief}) is done", flush=True)
  _wait_for_the_coordinator(chief, me, timeout_seconds, stopping=lambda: bool(stopped))
  logging.info("The coordinator (%s) is done (its port closed): %s stops serving.", chief, me)
  del server  # Kept alive until here.
  if stopped:
    raise SystemExit(exit_codes.STOPPED_BY[signal.SIGTERM])


def _chief_address(found: cluster_lib.Cluster) -> str:
  if not found.jobs.get("chief"):
    raise ConfigError(
        f"A parameter-server cluster needs a 'chief' task, the coordinator; {found.source}'s cluster has "
        f"{', '.join(sorted(found.jobs))}. Example TF_CONFIG: "
        '{"cluster": {"chief": ["host0:2222"], "worker": ["host1:2222"], "ps": ["host2:2222"]}, '
        '"task": {"type": "worker", "index": 0}}.'
    )
  return found.jobs["chief"][0]


def _wait_for_the_coordinator(
    chief: str, me: str, timeout_seconds: float | None, *, stopping: Callable[[], bool]
) -> None:
  """Returns once `chief` has accepted a connection and then refused two probes in a row.

  Once `stopping()`, one refused probe is enough, also before the chief was up.
  """
  deadline = None if timeout_seconds is None else time.monotonic() + timeout_seconds
  while not peers.listening(chief):
    if stopping():
      return
    if deadline is not None and time.monotonic() > deadline:
      raise ClusterError(
          f"{me} served for {timeout_seconds:g} s without the coordinator: nothing listens at chief:0 ({chief}). "
          "Start the chief (the same command with its TF_CONFIG), or raise config.strategy.timeout_seconds; if the "
          "chief had already finished, this task has nothing left to do."
      )
    time.sleep(POLL_SECONDS)
  refused = 0
  while refused < (1 if stopping() else 2):
    time.sleep(POLL_SECONDS)
    refused = 0 if peers.listening(chief) else refused + 1
