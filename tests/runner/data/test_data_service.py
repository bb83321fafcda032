"""config.data.service: training input made by a tf.data service's workers, in this process.

The dispatcher and workers here are TensorFlow's own servers on 127.0.0.1
(`tf.data.experimental.service.DispatchServer`, `WorkerServer`), started in
the pytest process, which saves a TensorFlow import per server; the servers
as processes (`python -m runner.data_service`), started by `runner.launch
--data_workers` and one of them killed mid-run, are in
tests/runner/cluster/test_launch.py.
"""

import ipaddress
import os
import time

import numpy as np
import portpicker
import pytest
import tensorflow as tf

import runner
from runner import data_service as server
from runner.config import run_config
from runner.data import pipeline
from runner.data import providers
from runner.data import service as service_lib
from strategies.errors import ClusterError
from strategies.errors import ConfigError
from testlib import paths

SYNTHETIC = os.path.join(paths.REPO, "configs", "synthetic.py")
STEPS = 6


class Servers:
  """A dispatcher and its workers on 127.0.0.1, in this process, serving while this object lives."""

  def __init__(self):
    self.port = portpicker.pick_unused_port()
    self.address = f"grpc://127.0.0.1:{self.port}"
    config = tf.data.experimental.service.DispatcherConfig(port=self.port)
    self.servers = [tf.data.experimental.service.DispatchServer(config)]
    self.worker_addresses = []
    self.add_worker()

  def add_worker(self):
    port = portpicker.pick_unused_port()
    self.worker_addresses.append(f"127.0.0.1:{port}")
    config = tf.data.experimental.service.WorkerConfig(
        dispatcher_address=f"127.0.0.1:{self.port}", worker_address=self.worker_addresses[-1], port=port
    )
    self.servers.append(tf.data.experimental.service.WorkerServer(config))


# The servers serve until the process ends: a training iterator freed after its dispatcher stopped (the suite
# leaves cycles to the end, `gc.disable()`) would wait for the dispatcher to answer.
_SERVING = []


@pytest.fixture(scope="module")
def servers():
  made = Servers()
  for address in [made.address.removeprefix("grpc://"), *made.worker_addresses]:
    assert ipaddress.ip_address(address.rpartition(":")[0]).is_loopback
  _SERVING.append(made)
  return made


def _config(**data):
  overrides = {
      "mode": "train",
      "data.num_examples": 256,
      "data.global_batch_size": 32,
      "trainer.train_steps": STEPS,
      "trainer.steps_per_loop": 3,
      **{f"data.{field}": value for field, value in data.items()},
  }
  return runner.load_config(SYNTHETIC, overrides)


def test_bad_service_fields_are_one_line_naming_what_is_valid():
  cases = {
      ("service", "127.0.0.1:5050"): (
          "config.data.service='127.0.0.1:5050' is not a tf.data service dispatcher's address: give None or "
          "'grpc://HOST:PORT', e.g. 'grpc://127.0.0.1:5050' (python -m runner.data_service "
          "--dispatcher=127.0.0.1:5050 starts one)."
      ),
      ("service_mode", "distributed_epochs"): (
          "config.data.service_mode='distributed_epochs' is not valid. Did you mean 'distributed_epoch'? Valid: "
          "parallel_epochs, distributed_epoch."
      ),
  }
  for (field, value), message in cases.items():
    with pytest.raises(ConfigError) as error:
      _config(**{field: value})
    assert str(error.value) == message
  config = _config(service="grpc://127.0.0.1:5050").to_dict()
  config["strategy"]["name"] = "parameter_server"
  with pytest.raises(ConfigError) as error:
    run_config.validate(config)
  assert str(error.value) == service_lib.NOT_UNDER_PARAMETER_SERVERS


def test_with_one_worker_training_and_resuming_through_the_service_equal_local_input(servers, tmp_path):
  """parallel_epochs and one service worker: the batches of local input, so the same weights, resumed or not."""
  assert len(servers.worker_addresses) == 1  # This test runs before the one that adds a worker.
  local = runner.run(_config(), str(tmp_path / "local"), quiet=True)
  served = _config(service=servers.address)
  halfway = served.to_dict()
  halfway["trainer"]["train_steps"] = STEPS // 2
  assert runner.run(halfway, str(tmp_path / "served"), quiet=True).global_step == STEPS // 2
  resumed = runner.run(served, str(tmp_path / "served"), quiet=True)
  assert resumed.global_step == local.global_step == STEPS
  assert resumed.train_metrics["loss"] == local.train_metrics["loss"]
  for got, want in zip(resumed.model.get_weights(), local.model.get_weights(), strict=True):
    np.testing.assert_array_equal(got, want)


def test_in_distributed_epoch_each_batch_is_made_once_by_one_of_two_workers(servers):
  """distributed_epoch on two workers: the batches read are distinct batches of the local stream, near its order."""
  servers.add_worker()
  data = providers.InMemory(np.arange(64, dtype=np.float32)[:, None], np.zeros(64, np.int32), shuffle=True, seed=1)
  strategy = tf.distribute.get_strategy()
  position = {  # The local stream's batches (2 epochs and more; each epoch a new order) by their examples.
      tuple(batch[0].numpy().ravel()): at for at, batch in enumerate(pipeline.for_training(strategy, data, 8).take(24))
  }
  assert len(position) == 24
  service = service_lib.DataService(address=servers.address, mode="distributed_epoch")
  batches = iter(pipeline.for_training(strategy, data, 8, service=service))
  read = [position[tuple(next(batches)[0].numpy().ravel())] for _ in range(16)]
  assert len(set(read)) == 16 and max(read) < 24 and set(range(8)) <= set(read), read


def test_a_dispatcher_that_does_not_answer_ends_training_with_a_cluster_error_naming_it():
  """A ClusterError: exit status 170 (`runner.exit_codes.CLUSTER`), transient, on the command line."""
  address = f"grpc://127.0.0.1:{portpicker.pick_unused_port()}"
  service = service_lib.DataService(address=address, timeout_seconds=1)
  data = providers.InMemory(np.zeros((8, 1), np.float32), np.zeros(8, np.int32))
  start = time.monotonic()
  with pytest.raises(ClusterError) as error:
    pipeline.for_training(tf.distribute.get_strategy(), data, 8, service=service)
  assert 1 <= time.monotonic() - start < 5
  port = address.rpartition(":")[2]
  assert str(error.value) == (
      f"The tf.data service dispatcher at {address} (config.data.service) accepted no connection within 1 s "
      f"(config.strategy.timeout_seconds). Start it (python -m runner.data_service --dispatcher=127.0.0.1:{port}) "
      "or give its address; a restart of the run resumes from its last checkpoint."
  )


def test_a_server_with_bad_flags_is_refused_before_it_starts():
  """`python -m runner.data_service` prints each as one `error:` line and exits 2."""
  cases = [
      ({"dispatcher": None, "worker": None}, "Give one of --dispatcher=HOST:PORT and --worker=DISPATCHER_HOST:PORT."),
      (
          {"dispatcher": "127.0.0.1:1", "worker": "127.0.0.1:1"},
          "Give one of --dispatcher=HOST:PORT and --worker=DISPATCHER_HOST:PORT.",
      ),
      ({"dispatcher": None, "worker": "grpc://127.0.0.1"}, "--worker='127.0.0.1' is not an address HOST:PORT."),
      (
          {"dispatcher": "127.0.0.1:5050", "worker": None, "port": 5051},
          "--port is the worker's; a dispatcher listens on the port of --dispatcher=HOST:PORT.",
      ),
  ]
  for flags, message in cases:
    with pytest.raises(ConfigError) as error:
      server.serve(**{"port": 0, "host": None, **flags})
    assert str(error.value) == message
