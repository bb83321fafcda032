"""GCE maintenance events and preemption notices stop training as SIGTERM does; off GCE nothing is asked.

A real metadata server on 127.0.0.1 (`testlib.metadata_server`), reached
through `GCE_METADATA_IP`, answers the watch's real requests; the training
runs are real Trainer runs in this process, whose stop ends in the same
`SystemExit(143)` as SIGTERM's (test_trainer_preemption.py).
"""

import json
import logging
import re
import socket
import threading

import pytest
import tensorflow as tf

import runner
from runner.cluster import maintenance_events
from runner.outputs import checkpoints
from testlib import metadata_server
from testlib import trainer_testlib

MAINTENANCE = maintenance_events.MAINTENANCE_EVENT
PREEMPTED = maintenance_events.PREEMPTED
QUIET = {MAINTENANCE: "NONE", PREEMPTED: "FALSE"}
WATCH_THREADS = [f"gce-watch:{MAINTENANCE}", f"gce-watch:{PREEMPTED}"]


@pytest.fixture
def server():
  serving = metadata_server.MetadataServer(QUIET)
  yield serving
  serving.close()


@pytest.fixture
def refusing_address():
  """`127.0.0.1:PORT` of a socket bound but not listening: a connection there is refused."""
  with socket.socket() as bound:
    bound.bind(("127.0.0.1", 0))
    yield f"127.0.0.1:{bound.getsockname()[1]}"


@pytest.fixture
def metadata_ip(monkeypatch):
  """Sets `GCE_METADATA_IP` to the address given (and clears `GCE_METADATA_HOST`)."""
  monkeypatch.delenv("GCE_METADATA_HOST", raising=False)
  return lambda address: monkeypatch.setenv("GCE_METADATA_IP", address)


class _AtStep(runner.interfaces.Action):
  """Calls `fn()` after the loop that ends at `step`; records the watch's threads after every loop."""

  def __init__(self, step, fn):
    self.step = step
    self.fn = fn
    self.watch_threads = []

  def __call__(self, loop):
    self.watch_threads.append(_watch_threads())
    if loop.step == self.step:
      self.fn()


def _watch_threads():
  return sorted(thread.name for thread in threading.enumerate() if thread.name.startswith("gce-watch:"))


def _wait_for(condition, what):
  """Waits until `condition()` holds, checking every 10 ms; fails after a minute."""
  pause = threading.Event()
  for _ in range(metadata_server.WAIT_TIMEOUT_SECONDS * 100):
    if condition():
      return
    pause.wait(0.01)
  raise AssertionError(f"waited in vain for {what}")


def _warnings(caplog):
  return [r.getMessage() for r in caplog.records if r.name == "absl" and r.levelno == logging.WARNING]


def _train(action, *, steps, model_dir=None):
  trainer = trainer_testlib.make_trainer(
      tf.distribute.OneDeviceStrategy("/cpu:0"), model_dir=model_dir, steps_per_loop=1, actions=[action]
  )
  return trainer.train(trainer_testlib.classification_data(64), global_batch_size=8, steps=steps)


@pytest.mark.parametrize(
    "key, value, notice",
    [
        (MAINTENANCE, "TERMINATE_ON_HOST_MAINTENANCE", "GCE maintenance event"),
        (PREEMPTED, "TRUE", "GCE preemption notice"),
    ],
    ids=["maintenance_event", "preempted"],
)
def test_a_notice_saves_at_the_end_of_the_loop_and_exits_143_as_sigterm(
    server, metadata_ip, tmp_path, caplog, key, value, notice
):
  metadata_ip(server.address)

  def notice_after_step_2():
    server.wait_until(lambda: server.polling(MAINTENANCE) and server.polling(PREEMPTED), "both keys long-polled")
    server.set(key, value)
    # The watch notes the stop, then its thread for the key ends; the next loop (step 3) carries the stop.
    _wait_for(lambda: f"gce-watch:{key}" not in _watch_threads(), "the notice noted")

  action = _AtStep(2, notice_after_step_2)
  with caplog.at_level(logging.WARNING, logger="absl"), pytest.raises(SystemExit) as exited:
    _train(action, steps=8, model_dir=str(tmp_path))

  assert exited.value.code == 143
  assert checkpoints.latest_step(str(tmp_path)) == 3
  with open(tmp_path / "metrics.jsonl", encoding="utf-8") as f:
    assert [json.loads(line)["step"] for line in f] == [1, 2, 3]
  warnings = _warnings(caplog)
  assert len(warnings) == 2, warnings
  assert warnings[0] == (
      f"{notice} on this VM ({key} = {value}): the run stops at the end of this loop as on SIGTERM, with a "
      "checkpoint saved."
  )
  assert re.fullmatch(r"Stopped by SIGTERM: saved a checkpoint at step 3 \(.*ckpt-3\); .*", warnings[1]), warnings[1]
  # The watch's threads ran while training did, and none outlives it.
  assert action.watch_threads[0] == WATCH_THREADS
  assert _watch_threads() == []
  # The key that changed: read once, then one long poll from the first answer's ETag, which the change answered.
  first, poll = server.requests_for(key)
  assert first.query == {}
  assert poll.query == {"wait_for_change": "true", "timeout_sec": "60", "last_etag": "etag-1"}
  assert all(request.flavored for request in server.requests)
  # The other key's long poll was cut off as the watch ended (the server would have answered after 60 s).
  server.join_answers()
  (other,) = set(QUIET) - {key}
  assert server.poll_endings == [(key, "changed"), (other, "client gone")]


def test_a_live_migration_is_logged_and_training_goes_on(server, metadata_ip, caplog):
  metadata_ip(server.address)

  def migrate_after_step_2():
    server.wait_until(lambda: server.polling(MAINTENANCE), "the maintenance event long-polled")
    server.set(MAINTENANCE, "MIGRATE_ON_HOST_MAINTENANCE")
    server.wait_until(lambda: len(server.requests_for(MAINTENANCE)) == 3, "the next long poll after the change")

  with caplog.at_level(logging.WARNING, logger="absl"):
    results = _train(_AtStep(2, migrate_after_step_2), steps=5)

  assert set(results) == {"loss", "accuracy"}
  assert _warnings(caplog) == [
      f"GCE maintenance event on this VM ({MAINTENANCE} = MIGRATE_ON_HOST_MAINTENANCE): not one that stops the VM; "
      "training goes on."
  ]
  assert server.requests_for(MAINTENANCE)[2].query["last_etag"] == "etag-2"  # It polls on from the change.


def test_off_gce_no_thread_starts_and_no_request_is_made(server, monkeypatch):
  monkeypatch.delenv("GCE_METADATA_IP", raising=False)
  monkeypatch.delenv("GCE_METADATA_HOST", raising=False)
  if maintenance_events.metadata_host() is not None:
    pytest.skip("this machine is a GCE VM (its DMI data says so): here the watch runs")
  action = _AtStep(2, lambda: None)

  _train(action, steps=4)

  assert action.watch_threads == [[], [], [], []]
  assert server.requests == []


@pytest.mark.parametrize("failure", ["refused", "no_header"])
def test_a_server_that_refuses_or_is_no_metadata_server_never_stops_training(
    metadata_ip, refusing_address, caplog, tmp_path, failure
):
  if failure == "no_header":
    bad_server = metadata_server.MetadataServer(QUIET, flavor_header=False)
    address = bad_server.address
    # After step 2 each key has been asked twice, the second time after the watch's first wait of 1 s.
    action = _AtStep(2, lambda: bad_server.wait_until(lambda: len(bad_server.requests) >= 4, "the watch's retries"))
    reason = "its answer lacks the header Metadata-Flavor: Google, so it is no metadata server"
  else:
    bad_server, address = None, refusing_address
    action = _AtStep(2, lambda: None)
    reason = "ConnectionRefusedError: [Errno 111] Connection refused"
  metadata_ip(address)
  try:
    with caplog.at_level(logging.WARNING, logger="absl"):
      results = _train(action, steps=4, model_dir=str(tmp_path))
  finally:
    if bad_server is not None:
      bad_server.close()

  assert set(results) == {"loss", "accuracy"}
  assert checkpoints.latest_step(str(tmp_path)) == 4
  (warning,) = _warnings(caplog)
  assert re.fullmatch(
      rf"Cannot watch GCE maintenance events at the metadata server {re.escape(address)} "
      rf"\(instance/(maintenance-event|preempted): {re.escape(reason)}\): training goes on, and the watch retries, "
      r"waiting up to 60 s between tries\.",
      warning,
  ), warning
  if bad_server is not None:
    assert all(request.flavored for request in bad_server.requests)
  assert _watch_threads() == []


def test_failures_are_logged_once_and_retried_with_back_off(caplog):
  unknown_keys = metadata_server.MetadataServer({})  # Every key: 404, with the header.
  noticed = []
  try:
    with caplog.at_level(logging.WARNING, logger="absl"):
      watch = maintenance_events.Watch(
          host=unknown_keys.address,
          on_notice=lambda: noticed.append(True),
          first_retry_seconds=0.01,
          max_retry_seconds=0.04,
      )
      unknown_keys.wait_until(lambda: len(unknown_keys.requests) >= 20, "20 tries")
      watch.close()
  finally:
    unknown_keys.close()

  assert noticed == []
  (warning,) = _warnings(caplog)
  assert re.fullmatch(
      r"Cannot watch GCE maintenance events at the metadata server 127\.0\.0\.1:\d+ \(instance/"
      r"(maintenance-event|preempted): it answered 404 Not Found\): training goes on, and the watch retries, waiting "
      r"up to 0\.04 s between tries\.",
      warning,
  ), warning
  assert {request.key for request in unknown_keys.requests} == {MAINTENANCE, PREEMPTED}
  assert not any(request.waits for request in unknown_keys.requests)  # Never read: each try reads at once.
  assert _watch_threads() == []


def test_a_sweep_of_runs_grows_no_thread(server, metadata_ip, tmp_path):
  metadata_ip(server.address)
  config = {
      "mode": "train",
      "strategy": {"name": "one_device"},
      "data": {"name": "synthetic", "global_batch_size": 16, "num_examples": 64},
      "model": {"hidden_units": (8,)},
      "trainer": {"train_steps": 2, "steps_per_loop": 1},
  }
  before = set(threading.enumerate())

  for run in range(2):
    assert runner.run(config, str(tmp_path / str(run)), quiet=True).global_step == 2
    server.join_answers()  # The run's long polls ended with it: its watch cut them off.

  assert set(threading.enumerate()) == before
  assert {request.key for request in server.requests} <= {MAINTENANCE, PREEMPTED}
  assert all(request.flavored for request in server.requests)
  assert {ending for _, ending in server.poll_endings} <= {"client gone"}


@pytest.mark.parametrize(
    "environ, host",
    [
        ({"GCE_METADATA_IP": "127.0.0.1:8080", "GCE_METADATA_HOST": "metadata.example:80"}, "127.0.0.1:8080"),
        ({"GCE_METADATA_IP": "", "GCE_METADATA_HOST": "metadata.example:80"}, "metadata.example:80"),
        ({"GCE_METADATA_HOST": "169.254.169.254"}, "169.254.169.254"),
        ({"GCE_METADATA_IP": "[::1]:8080"}, "[::1]:8080"),
        ({}, None),
    ],
    ids=["ip_first", "empty_ip_skipped", "host", "ipv6", "neither"],
)
def test_the_server_is_named_by_gce_metadata_ip_else_gce_metadata_host(tmp_path, environ, host):
  assert maintenance_events.metadata_host(environ, dmi_dir=str(tmp_path)) == host  # An empty DMI folder: no VM.


@pytest.mark.parametrize(
    "files, host",
    [
        ({"product_name": "Google Compute Engine\n", "bios_vendor": "Google\n"}, "metadata.google.internal"),
        ({"bios_vendor": "Google\n"}, "metadata.google.internal"),
        ({"product_name": "Google Compute Engine\n"}, "metadata.google.internal"),
        ({"product_name": "Standard PC (Q35 + ICH9, 2009)\n", "bios_vendor": "SeaBIOS\n"}, None),
        ({}, None),
    ],
    ids=["gce_vm", "google_bios", "gce_product", "another_vm", "no_dmi"],
)
def test_without_the_variables_a_gce_vm_is_known_by_its_dmi_data(tmp_path, files, host):
  for name, text in files.items():
    (tmp_path / name).write_text(text)
  assert maintenance_events.metadata_host({}, dmi_dir=str(tmp_path)) == host


@pytest.mark.parametrize("value", ["http://169.254.169.254", "127.0.0.1:port", "host/path"])
def test_a_variable_that_is_no_host_and_port_is_one_warning_and_no_watch(tmp_path, caplog, value):
  with caplog.at_level(logging.WARNING, logger="absl"):
    assert maintenance_events.metadata_host({"GCE_METADATA_IP": value}, dmi_dir=str(tmp_path)) is None
  assert _warnings(caplog) == [
      f"GCE_METADATA_IP={value!r} is not a host or host:port (such as 169.254.169.254 or 127.0.0.1:8080): GCE "
      "maintenance events and preemption notices are not watched."
  ]
