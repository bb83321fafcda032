"""The TPU wrapper's logic, proven without a TPU: name forms, one initialization per TPU, device assignments.

Topologies are real `tf.tpu.experimental.Topology` objects built from a mesh
shape and device coordinates, as TensorFlow allows without hardware; the
resolvers are real `TPUClusterResolver`s for the forms that need no network.
"""

import numpy as np
import pytest
import tensorflow as tf

import strategies
from strategies import tpu as tpu_lib


def topology(mesh_shape):
  """A one-host topology with a device at every point of `mesh_shape` (x, y, z, core)."""
  x, y, z, cores = mesh_shape
  coordinates = [[i, j, k, c] for k in range(z) for j in range(y) for i in range(x) for c in range(cores)]
  return tf.tpu.experimental.Topology(
      mesh_shape=list(mesh_shape), device_coordinates=np.array([coordinates], dtype=np.int32)
  )


V3_8 = (2, 2, 1, 2)  # 4 chips of 2 cores: 8 cores
V4_8 = (2, 2, 1, 1)  # 4 chips of 1 (mega)core


@pytest.fixture
def no_tpu_environment(monkeypatch):
  for variable in tpu_lib.TPU_ENVIRONMENT_VARIABLES:
    monkeypatch.delenv(variable, raising=False)
  return monkeypatch


@pytest.mark.parametrize("name, form", [("local", "local"), ("my-tpu", "name"), ("grpc://10.0.0.2:8470", "address")])
def test_name_form_of_each_name_form(name, form):
  assert tpu_lib.name_form(name) == form


def test_an_empty_name_is_the_environments_tpu(no_tpu_environment):
  no_tpu_environment.setenv("TPU_NAME", "grpc://10.0.0.2:8470")
  assert tpu_lib.resolve_name("") == tpu_lib.resolve_name(None) == "grpc://10.0.0.2:8470"
  assert tpu_lib.name_form(tpu_lib.resolve_name("")) == "address"
  no_tpu_environment.setenv("TPU_NAME", "my-tpu")
  assert tpu_lib.name_form(tpu_lib.resolve_name("")) == "name"
  assert tpu_lib.resolve_name("local") == "local"  # a given name is kept as it is


@pytest.mark.skipif(tpu_lib.local_tpu_present(), reason="this machine is a TPU VM")
def test_an_empty_name_without_any_tpu_says_how_to_name_one(no_tpu_environment):
  del no_tpu_environment
  with pytest.raises(strategies.ConfigError, match=r"tpu='' found no TPU: .* Name the TPU: "):
    tpu_lib.resolve_name("")


def test_the_resolvers_of_the_forms_that_need_no_network():
  local = tf.distribute.cluster_resolver.TPUClusterResolver(tpu="local")
  assert local.master() == "" and local.cluster_spec().as_dict() == {}  # no cluster to connect to
  address = tf.distribute.cluster_resolver.TPUClusterResolver(tpu="grpc://10.0.0.2:8470")
  assert address.master() == "grpc://10.0.0.2:8470"
  assert address.cluster_spec().as_dict() == {"worker": ["10.0.0.2:8470"]}


class CountingInitializer:
  """Stands in for the TPU hardware: returns a v3-8 topology and counts the calls, failing first if told."""

  def __init__(self, failures=0):
    self.calls = []
    self.failures = failures

  def __call__(self, tpu, resolver):
    self.calls.append((tpu, resolver))
    if self.failures:
      self.failures -= 1
      raise tf.errors.UnavailableError(None, None, "Socket closed")
    return topology(V3_8)


def test_each_tpu_system_is_initialized_once_per_process(monkeypatch):
  monkeypatch.setattr(tpu_lib, "SYSTEMS", {})
  initialize = CountingInitializer()
  first = tpu_lib.topology("local", "resolver 1", initialize)
  assert tpu_lib.topology("local", "resolver 2", initialize) is first  # a second strategy on the same TPU reuses it
  other = tpu_lib.topology("grpc://10.0.0.2:8470", "resolver 3", initialize)
  assert other is not first and list(other.mesh_shape) == list(V3_8)
  assert initialize.calls == [("local", "resolver 1"), ("grpc://10.0.0.2:8470", "resolver 3")]
  assert set(tpu_lib.SYSTEMS) == {"local", "grpc://10.0.0.2:8470"}


def test_a_failed_initialization_is_an_error_and_is_tried_again(monkeypatch):
  monkeypatch.setattr(tpu_lib, "SYSTEMS", {})
  initialize = CountingInitializer(failures=1)
  with pytest.raises(
      strategies.ConfigError, match=r"Could not initialize the TPU system of tpu='my-tpu': Socket closed. Name the TPU"
  ):
    tpu_lib.topology("my-tpu", None, initialize)
  assert "my-tpu" not in tpu_lib.SYSTEMS
  assert list(tpu_lib.topology("my-tpu", None, initialize).mesh_shape) == list(V3_8)
  assert len(initialize.calls) == 2


@pytest.mark.parametrize(
    "mesh, shape, num_replicas, replicas, cores_per_replica",
    [
        (V3_8, None, None, 8, 1),  # data parallelism: one core per replica
        (V3_8, [1, 1, 1, 2], None, 4, 2),  # both cores of a chip per replica
        (V3_8, [2, 1, 1, 2], None, 2, 4),
        (V3_8, [1, 1, 1, 2], 2, 2, 2),  # fewer replicas than fit
        (V3_8, [2, 2, 1, 2], None, 1, 8),  # one replica over the whole slice
        (V4_8, [1, 2, 1, 1], None, 2, 2),
        ((3, 3, 1, 1), [2, 2, 1, 1], None, 1, 4),  # whole blocks only: 1, not 9 // 4 = 2
    ],
)
def test_device_assignment_places_whole_blocks(mesh, shape, num_replicas, replicas, cores_per_replica):
  assignment = tpu_lib.device_assignment(topology(mesh), shape, num_replicas)
  assert (assignment.num_replicas, assignment.num_cores_per_replica) == (replicas, cores_per_replica)
  used = [tuple(c) for replica in assignment.core_assignment.tolist() for c in replica]
  assert len(used) == len(set(used)) == replicas * cores_per_replica  # no core is used twice


def test_each_replica_of_a_device_assignment_is_one_block_of_the_shape():
  assignment = tpu_lib.device_assignment(topology(V3_8), [1, 1, 1, 2], None)
  for replica in assignment.core_assignment.tolist():
    assert [c[:3] for c in replica] == [replica[0][:3]] * 2  # one chip
    assert sorted(c[3] for c in replica) == [0, 1]  # both of its cores


@pytest.mark.parametrize(
    "mesh, shape, num_replicas, message",
    [
        (
            V3_8,
            [1, 1, 2],
            None,
            r"computation_shape=\[1, 1, 2\] needs 4 entries, one per axis of the TPU mesh \[2, 2, 1, 2\] "
            r"\(x, y, z, core; 8 cores\).",
        ),
        (
            V3_8,
            [1, 1, 1, 4],
            None,
            r"computation_shape=\[1, 1, 1, 4\] does not fit the TPU mesh \[2, 2, 1, 2\] \(x, y, z, core; 8 cores\): "
            r"along axis core it asks for 4 cores, the mesh has 2.",
        ),
        (
            V3_8,
            [1, 1, 1, 2],
            8,
            r"computation_shape=\[1, 1, 1, 2\] with num_replicas=8 needs 16 cores, and only 4 replica\(s\) of that "
            r"shape fit the TPU mesh \[2, 2, 1, 2\] \(x, y, z, core; 8 cores\). Use num_replicas <= 4",
        ),
        (V3_8, None, 9, r"computation_shape=\[1, 1, 1, 1\] with num_replicas=9 needs 9 cores, and only 8 replica"),
        # A 2x2 block on a 3x3 mesh: 9 cores would hold 2 blocks by count, but only 1 fits.
        (
            (3, 3, 1, 1),
            [2, 2, 1, 1],
            2,
            r"with num_replicas=2 needs 8 cores, and only 1 replica\(s\) of that shape fit "
            r"the TPU mesh \[3, 3, 1, 1\] \(x, y, z, core; 9 cores\)",
        ),
    ],
)
def test_device_assignment_that_does_not_fit_says_why(mesh, shape, num_replicas, message):
  with pytest.raises(strategies.ConfigError, match=message):
    tpu_lib.device_assignment(topology(mesh), shape, num_replicas)
