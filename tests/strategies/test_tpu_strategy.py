"""TPUStrategy: naming a TPU, failing fast and locally when none is reachable, and a real-TPU run.

The no-TPU tests only ever touch loopback addresses.
"""

import json
import os
import subprocess
import sys

import portpicker
import pytest

import strategies
from strategies import factory
from strategies import tpu as tpu_lib
from testlib import paths

TIMEOUT_SECONDS = 300
no_local_tpu = pytest.mark.skipif(tpu_lib.local_tpu_present(), reason="this machine is a TPU VM")


@pytest.fixture
def no_tpu_environment(monkeypatch):
  for variable in tpu_lib.TPU_ENVIRONMENT_VARIABLES + ("GCE_METADATA_HOST", "GCE_METADATA_IP"):
    monkeypatch.delenv(variable, raising=False)
  return monkeypatch


def closed_local_address():
  return f"grpc://localhost:{portpicker.pick_unused_port()}"


@no_local_tpu
def test_empty_tpu_name_without_a_tpu_says_how_to_name_one(no_tpu_environment):
  del no_tpu_environment
  with pytest.raises(
      strategies.ConfigError,
      match=r"strategy 'tpu' with tpu='' found no TPU: TPU_NAME is not set .* Name the TPU: "
      r"--config.strategy.tpu=local .* on a TPU VM, a Cloud TPU name .*grpc://10.0.0.2:8470",
  ):
    strategies.create({"name": "tpu"})


@no_local_tpu
def test_local_tpu_on_a_machine_without_one(no_tpu_environment):
  del no_tpu_environment
  with pytest.raises(strategies.ConfigError, match=r"tpu='local' but this machine is not a TPU VM"):
    strategies.TPUStrategy("local")


def test_grpc_address_where_nothing_listens_fails_within_seconds(no_tpu_environment):
  del no_tpu_environment
  address = closed_local_address()
  with pytest.raises(
      strategies.ConfigError, match=rf"No TPU is reachable at tpu='{address}': .*\(waited at most 5 s\). Name the TPU"
  ):
    strategies.create({"name": "tpu", "tpu": address})


@pytest.mark.parametrize("address", ["grpc://localhost", "grpc://:8470", "grpc://localhost:port"])
def test_malformed_grpc_address(address):
  with pytest.raises(strategies.ConfigError, match=r"is not a grpc://host:port address such as grpc://10.0.0.2:8470"):
    strategies.TPUStrategy(address)


def test_tpu_name_off_google_cloud_needs_zone_and_project(no_tpu_environment, tmp_path):
  product_name = tmp_path / "product_name"
  product_name.write_text("Standard PC\n")
  no_tpu_environment.setattr(tpu_lib, "DMI_PRODUCT_NAME_FILE", str(product_name))
  with pytest.raises(
      strategies.ConfigError,
      match=r"tpu='my-tpu' is a Cloud TPU name, and this machine is not on Google Cloud, so zone "
      r"and project must be given",
  ):
    strategies.create({"name": "tpu", "tpu": "my-tpu"})


def test_tpu_name_whose_lookup_fails(no_tpu_environment):
  # The metadata server TensorFlow asks for the zone and project is a closed loopback port here.
  no_tpu_environment.setenv("GCE_METADATA_HOST", f"127.0.0.1:{portpicker.pick_unused_port()}")
  no_tpu_environment.setenv("no_proxy", "*")
  with pytest.raises(strategies.ConfigError, match=r"Could not resolve tpu='my-tpu': URLError: .* Name the TPU"):
    strategies.TPUStrategy("my-tpu")


@pytest.mark.parametrize(
    "arguments, message",
    [
        (
            {"tpu": "local", "zone": "us-central1-b"},
            r"zone and project look up a Cloud TPU by name; tpu='local' does not use them.",
        ),
        ({"tpu": "grpc://localhost:1", "project": "p"}, r"tpu='grpc://localhost:1' does not use them"),
        (
            {"computation_shape": [1, 0, 1, 1]},
            r"computation_shape must be a list of positive ints, one per mesh "
            r"axis, such as \[1, 1, 1, 2\]; got \[1, 0, 1, 1\].",
        ),
        ({"computation_shape": "1,1,1,2"}, r"computation_shape must be a list of positive ints"),
        ({"num_replicas": 0}, r"num_replicas must be a positive int, got 0."),
        ({"spmd_xla_partitioning": "yes"}, r"spmd_xla_partitioning must be True or False, got 'yes'."),
        ({"tpu": 3}, r"tpu must be a string \('', 'local', a TPU name or grpc://host:port\), got 3."),
    ],
)
def test_bad_tpu_arguments_fail_before_any_connection(no_tpu_environment, arguments, message):
  del no_tpu_environment
  with pytest.raises(strategies.ConfigError, match=message):
    strategies.TPUStrategy(**arguments)


def test_auto_picks_the_tpu_named_in_the_environment_and_fails_fast_when_it_is_not_there(no_tpu_environment):
  address = closed_local_address()
  no_tpu_environment.setenv("TPU_NAME", address)
  assert factory.choose() == ("tpu", f"a TPU is reachable ({address!r})")
  with pytest.raises(strategies.ConfigError, match=rf"No TPU is reachable at tpu='{address}'"):
    strategies.create({"name": "auto"})


@no_local_tpu
def test_auto_without_a_tpu_does_not_choose_tpu(no_tpu_environment):
  del no_tpu_environment
  assert factory.choose()[0] == "mirrored"


@pytest.mark.tpu
@pytest.mark.skipif(tpu_lib.reachable_tpu() is None, reason="no TPU is reachable (TPU_NAME unset, not a TPU VM)")
def test_real_tpu_runs_a_strategy(subprocess_env):
  # A TPU system belongs to one process, so the real TPU is used from a child process, which loads libtpu
  # even when pytest runs with TPU_LOAD_LIBRARY=0 (as docs/cloud_tpu.md says) to stay off the TPU itself.
  script = os.path.join(paths.TESTLIB, "flags_script.py")
  env = {k: v for k, v in subprocess_env.items() if k != "TPU_LOAD_LIBRARY"}
  result = subprocess.run(
      [sys.executable, script, "--strategy=tpu"],
      env=env,
      capture_output=True,
      text=True,
      timeout=TIMEOUT_SECONDS,
      check=False,
  )
  assert result.returncode == 0, result.stderr[-3000:]
  report = json.loads(result.stdout.splitlines()[-1])
  n = report["replicas"]
  assert n >= 1 and report["all_reduce_sum"] == report["variable"] == n * (n + 1) / 2
  assert report["strategy"].startswith(f"tpu: {n} replica")
