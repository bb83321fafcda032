"""Joining a multi-worker cluster without hanging, and naming the peers that are missing.

TensorFlow's own start-up waits for every worker with no deadline, in C++,
holding Python's global lock, after installing a SIGTERM handler (its
preemption notifier) that only logs "SIGTERM caught". So a worker whose peer
never starts waits forever, and neither SIGTERM nor Ctrl-C ends it. `join`
waits in three steps instead:

1. a rendezvous in Python: this task listens on its own port and waits until
   every peer's port accepts a connection, polling, so Ctrl-C and SIGTERM
   work, and past `timeout_seconds` it names the peers that never came;
2. TensorFlow's start-up, with the coordination service's registration
   barrier timing out after `timeout_seconds` (the peers are up by now, so
   this takes a moment; `tensorflow_workarounds.configure_coordination_service`);
3. the SIGTERM disposition from before is put back, taking it from
   TensorFlow's notifier, so a later SIGTERM is not swallowed either.
"""

from collections.abc import Callable, Iterator
import itertools
import os
import re
import signal
import socket
import sys
import threading
import time
import types

from absl import logging
import tensorflow as tf

from strategies import tensorflow_workarounds
from strategies.errors import ClusterError

DEFAULT_TIMEOUT_SECONDS = 300.0
_POLL_SECONDS = 0.5
_PROBE_SECONDS = 2.0
_TASK_NAME = re.compile(r"/job:(\w+)/(?:replica:\d+/)?task:(\d+)")
# The errors of a collective or of the coordination service when a peer is gone or too slow.
PEER_ERRORS = (
    tf.errors.UnavailableError,
    tf.errors.DeadlineExceededError,
    tf.errors.AbortedError,
    tf.errors.CancelledError,
)


def join(
    build: Callable[[], object],
    *,
    cluster_spec: tf.train.ClusterSpec,
    task_type: str,
    task_id: int,
    timeout_seconds: float,
) -> None:
  """Waits for every peer, then runs `build()`, which joins the cluster.

  Args:
    build: a function that creates the multi-worker strategy.
    cluster_spec: the `tf.train.ClusterSpec` of the job.
    task_type: this task's type ("worker", "chief", ...).
    task_id: this task's index among the tasks of its type.
    timeout_seconds: the longest wait for every peer to come.

  Raises:
    ClusterError: this task's port is taken, or a peer did not come within
      `timeout_seconds`; the message names the peers that could not be
      reached.
    KeyboardInterrupt: Ctrl-C while waiting. SIGTERM while waiting ends the
      process with status 143 and one line on stderr.
  """
  previous = signal.getsignal(signal.SIGTERM) if threading.current_thread() is threading.main_thread() else None
  if previous is not None:
    signal.signal(signal.SIGTERM, _terminate_while_waiting)
  try:
    rendezvous(cluster_spec, task_type, task_id, timeout_seconds)
    tensorflow_workarounds.configure_coordination_service(cluster_spec, timeout_seconds)
    try:
      build()
    except PEER_ERRORS:
      raise ClusterError(
          f"{task_type}:{task_id}: the other tasks were up, but did not all join TensorFlow's cluster within "
          f"{timeout_seconds:g} s. {describe_missing(cluster_spec, task_type, task_id)}"
      ) from None
  finally:
    if previous is not None:
      signal.signal(signal.SIGTERM, previous)


def rendezvous(cluster_spec: tf.train.ClusterSpec, task_type: str, task_id: int, timeout_seconds: float) -> None:
  """Listens on this task's port until every peer's port accepts a connection, or raises ClusterError."""
  me = f"{task_type}:{task_id}"
  address = cluster_spec.task_address(task_type, task_id)
  host, _, port = address.rpartition(":")
  waiting = list(_peers(cluster_spec, task_type, task_id))
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:  # Loopback for a loopback address (a one-machine job), else every interface.
      listener.bind(("127.0.0.1" if host.strip("[]") == "localhost" or host.startswith("127.") else "", int(port)))
    except OSError as e:
      raise ClusterError(
          f"{me} cannot listen at {address}: {e.strerror or e}. Another process holds the port; "
          "choose free ports for the cluster."
      ) from None
    listener.listen(64)
    listener.setblocking(False)
    deadline = time.monotonic() + timeout_seconds
    for attempt in itertools.count():
      while True:  # Accept and close the peers' probes, so the backlog never fills.
        try:
          listener.accept()[0].close()
        except (BlockingIOError, InterruptedError):
          break
      waiting = [(name, peer) for name, peer in waiting if not listening(peer)]
      if not waiting:
        return
      if time.monotonic() > deadline:
        raise ClusterError(
            f"{me} waited {timeout_seconds:g} s for the other tasks and gave up: nothing listens at "
            f"{', '.join(f'{name} ({peer})' for name, peer in waiting)}. Start every task (the same command with "
            "its own TF_CONFIG or task_index), or raise config.strategy.timeout_seconds."
        )
      if attempt == 0:
        logging.info("%s: waiting for %s (at most %g s).", me, ", ".join(name for name, _ in waiting), timeout_seconds)
      time.sleep(_POLL_SECONDS)


def lost(
    error: tf.errors.OpError,
    *,
    cluster_resolver: tf.distribute.cluster_resolver.ClusterResolver,
    step: int,
    saved_step: int | None,
) -> ClusterError:
  """Returns the ClusterError for `error`, a collective that failed because a peer died or left.

  Args:
    error: one of PEER_ERRORS, raised by a step or an evaluation.
    cluster_resolver: this worker's cluster resolver.
    step: the last global step this worker completed.
    saved_step: the step of the latest checkpoint, or None.
  """
  me = (cluster_resolver.task_type, cluster_resolver.task_id)
  named = list(dict.fromkeys(f"{job}:{i}" for job, i in _TASK_NAME.findall(error.message) if (job, int(i)) != me))
  if "heartbeat" in error.message:
    what = f"{' and '.join(named) or 'a peer'} stopped sending heartbeats (it crashed, was killed or hangs)"
  elif named:
    what = f"{' and '.join(named)} closed its connection or did not answer"
  else:
    what = f"a collective with the other workers failed ({type(error).__name__})"
  resume = ("from its last checkpoint, at step " + str(saved_step)) if saved_step else "from step 0 (no checkpoint yet)"
  return ClusterError(
      f"{me[0]}:{me[1]} stopped after step {step}: {what}. "
      f"{describe_missing(cluster_resolver.cluster_spec(), *me)} Restart every task with the same command; "
      f"the job resumes {resume}."
  )


def describe_missing(cluster_spec: tf.train.ClusterSpec, task_type: str, task_id: int) -> str:
  """One sentence naming the peers that accept no connection on their port (a quick TCP probe)."""
  missing = [
      f"{name} ({address})" for name, address in _peers(cluster_spec, task_type, task_id) if not listening(address)
  ]
  if missing:
    return f"Nothing listens at {', '.join(missing)}."
  return (
      "Every peer's port answers, so a peer runs with another cluster (check that all tasks have the same "
      "worker list), is still starting, or is stuck."
  )


def _peers(cluster_spec: tf.train.ClusterSpec, task_type: str, task_id: int) -> Iterator[tuple[str, str]]:
  """('job:index', 'host:port') of every task but this one."""
  for job in cluster_spec.jobs:
    for index, address in enumerate(cluster_spec.job_tasks(job)):
      if (job, index) != (task_type, task_id):
        yield f"{job}:{index}", address


def listening(address: str) -> bool:
  """Whether something accepts a TCP connection at `address` ('host:port') within 2 s."""
  host, _, port = address.rpartition(":")
  try:
    with socket.create_connection((host, int(port)), timeout=_PROBE_SECONDS):
      return True
  except (OSError, ValueError):
    return False


def _terminate_while_waiting(signum: int, frame: types.FrameType | None) -> None:
  """SIGTERM while joining: say so and exit with 128 + SIGTERM at once (nothing was written yet)."""
  del frame
  print(
      "error: SIGTERM while waiting for the other tasks to join; stopped before any work.", file=sys.stderr, flush=True
  )
  os._exit(128 + signum)
