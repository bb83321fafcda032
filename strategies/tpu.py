"""Cloud TPUs: naming a TPU, finding one cheaply, and TPUStrategy.

A TPU is named the ways TensorFlow documents for `TPUClusterResolver`:
  ''               the TPU in the TPU_NAME (or KUBE_GOOGLE_CLOUD_TPU_ENDPOINTS)
                   environment variable, else this machine's TPU on a TPU VM;
  'local'          this machine's TPU (a TPU VM): no remote connection;
  'my-tpu'         a Cloud TPU by name, looked up through the Cloud TPU API
                   (zone and project come from the GCE metadata server
                   unless given);
  'grpc://h:8470'  a TPU worker's address.
Whether a TPU is there is decided from local facts only (environment
variables, /dev/accel* or /dev/vfio/* device files and an installed libtpu);
a remote TPU is contacted only when the strategy is created for it.
"""

import glob
import importlib.util
import os
import socket
import urllib.parse

from absl import logging
import numpy as np
import tensorflow as tf

from strategies import checks
from strategies.errors import ConfigError

TPU_ENVIRONMENT_VARIABLES = ("TPU_NAME", "KUBE_GOOGLE_CLOUD_TPU_ENDPOINTS")
LOCAL_TPU_DEVICE_FILES = ("/dev/accel[0-9]*", "/dev/vfio/[0-9]*")
DMI_PRODUCT_NAME_FILE = "/sys/class/dmi/id/product_name"
GRPC_CONNECT_TIMEOUT_SECONDS = 5

HOW_TO_NAME_A_TPU = (
    "Name the TPU: --config.strategy.tpu=local (or --tpu=local) on a TPU VM, a Cloud TPU name "
    "such as --config.strategy.tpu=my-tpu, or a worker address such as "
    "--config.strategy.tpu=grpc://10.0.0.2:8470; or set TPU_NAME.")

# TPU identity ('local', a name or a grpc:// address) -> its tf.tpu.experimental.Topology.
# TensorFlow must connect to and initialize a TPU system once per process;
# initializing again would wipe the TPU's memory under existing strategies.
_INITIALIZED_TPU_SYSTEMS = {}


def tpu_from_environment():
  """Returns the TPU named by TPU_NAME or KUBE_GOOGLE_CLOUD_TPU_ENDPOINTS, or None."""
  for variable in TPU_ENVIRONMENT_VARIABLES:
    if os.environ.get(variable):
      return os.environ[variable]
  return None


def local_tpu_present():
  """Returns whether this machine is a TPU VM: TPU device files and libtpu are there."""
  has_devices = any(glob.glob(pattern) for pattern in LOCAL_TPU_DEVICE_FILES)
  has_runtime = importlib.util.find_spec("libtpu") is not None or bool(os.environ.get("TPU_LIBRARY_PATH"))
  return has_devices and has_runtime


def reachable_tpu():
  """Returns the TPU that `tpu=''` would use ('local' or the environment's), or None; never blocks."""
  from_environment = tpu_from_environment()
  if from_environment:
    return from_environment
  return "local" if local_tpu_present() else None


class TPUStrategy(tf.distribute.TPUStrategy):
  """`tf.distribute.TPUStrategy` on a named TPU, connected and initialized once per process."""

  def __init__(self, tpu="", *, zone=None, project=None, computation_shape=None, num_replicas=None,
               spmd_xla_partitioning=False):
    """Builds the strategy; every argument is checked first.

    Args:
      tpu: '', 'local', a Cloud TPU name or 'grpc://host:port' (module doc).
      zone: the Cloud TPU's zone, for a TPU name.
      project: the Cloud TPU's project, for a TPU name.
      computation_shape: cores per replica along each topology axis, e.g.
        [1, 1, 1, 2] for model parallelism over two cores; with
        `num_replicas` it builds the DeviceAssignment.
      num_replicas: number of model replicas; by default as many as fit.
      spmd_xla_partitioning: passed as `experimental_spmd_xla_partitioning`.

    Raises:
      ConfigError: no TPU is reachable under that name (within seconds), the
        name cannot be resolved, or the shape does not fit the TPU.
    """
    if computation_shape is not None:
      computation_shape = _checked_shape(computation_shape)
    checks.positive_int(num_replicas, "num_replicas", optional=True)
    checks.boolean(spmd_xla_partitioning, "spmd_xla_partitioning")
    tpu = _tpu_identity(tpu, zone, project)
    resolver = _resolver(tpu, zone, project)
    topology = _initialize_once(tpu, resolver)
    device_assignment = None
    if computation_shape is not None or num_replicas is not None:
      device_assignment = _device_assignment(topology, computation_shape, num_replicas)
    super().__init__(resolver, experimental_device_assignment=device_assignment,
                     experimental_spmd_xla_partitioning=spmd_xla_partitioning)
    self.tpu = tpu


def _checked_shape(computation_shape):
  """Returns `computation_shape` as a list of positive ints, or raises ConfigError."""
  if (not isinstance(computation_shape, (list, tuple)) or not computation_shape or not all(
      checks.is_int(n) and n >= 1 for n in computation_shape)):
    raise ConfigError(
        f"computation_shape must be a list of positive ints, one per TPU mesh axis, such as "
        f"[1, 1, 1, 2]; got {computation_shape!r}.")
  return list(computation_shape)


def _tpu_identity(tpu, zone, project):
  """Returns 'local', a TPU name or a grpc:// address, after the cheap local checks."""
  if tpu is None:
    tpu = ""
  if not isinstance(tpu, str):
    raise ConfigError(f"tpu must be a string ('', 'local', a TPU name or grpc://host:port), got {tpu!r}.")
  if not tpu:
    tpu = reachable_tpu()
    if tpu is None:
      raise ConfigError(
          "strategy 'tpu' with tpu='' found no TPU: TPU_NAME is not set and this machine has no "
          f"TPU devices ({', '.join(LOCAL_TPU_DEVICE_FILES)}) with libtpu installed. {HOW_TO_NAME_A_TPU}")
  if (tpu == "local" or tpu.startswith("grpc://")) and (zone or project):
    raise ConfigError(
        f"zone and project look up a Cloud TPU by name; tpu={tpu!r} does not use them. Remove them, "
        "or name the TPU instead.")
  if tpu == "local":
    if not local_tpu_present():
      raise ConfigError(
          f"tpu='local' but this machine is not a TPU VM (no {' or '.join(LOCAL_TPU_DEVICE_FILES)} "
          f"device files with libtpu installed). {HOW_TO_NAME_A_TPU}")
  elif tpu.startswith("grpc://"):
    _check_listening(tpu)
  elif not _on_google_cloud() and not (zone and project):
    raise ConfigError(
        f"tpu={tpu!r} is a Cloud TPU name, and this machine is not on Google Cloud, so zone and project "
        f"must be given (--config.strategy.zone, --config.strategy.project) to look it up. {HOW_TO_NAME_A_TPU}")
  return tpu


def _check_listening(address):
  """Raises ConfigError unless something accepts TCP connections at grpc://host:port."""
  parsed = urllib.parse.urlsplit(address)
  try:
    host, port = parsed.hostname, parsed.port
  except ValueError:
    host = port = None
  if not host or not port:
    raise ConfigError(f"tpu={address!r} is not a grpc://host:port address such as grpc://10.0.0.2:8470.")
  try:
    with socket.create_connection((host, port), timeout=GRPC_CONNECT_TIMEOUT_SECONDS):
      pass
  except OSError as e:
    raise ConfigError(
        f"No TPU is reachable at tpu={address!r}: {e.strerror or e} (waited at most "
        f"{GRPC_CONNECT_TIMEOUT_SECONDS} s). {HOW_TO_NAME_A_TPU}") from None


def _on_google_cloud():
  """Returns whether the GCE metadata server can tell a TPU's zone and project (local facts only)."""
  if os.environ.get("GCE_METADATA_HOST") or os.environ.get("GCE_METADATA_IP"):
    return True
  try:
    with open(DMI_PRODUCT_NAME_FILE, encoding="utf-8") as f:
      return "Google" in f.read()
  except OSError:
    return False


def _resolver(tpu, zone, project):
  try:
    return tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu, zone=zone, project=project)
  except Exception as e:  # pylint: disable=broad-except  # the Cloud TPU client raises many kinds.
    raise ConfigError(f"Could not resolve tpu={tpu!r}: {type(e).__name__}: {e}. {HOW_TO_NAME_A_TPU}") from e


def _initialize_once(tpu, resolver):
  """Connects to a remote TPU and initializes its system, once per process; returns the topology."""
  if tpu not in _INITIALIZED_TPU_SYSTEMS:
    try:
      if tpu != "local":
        tf.config.experimental_connect_to_cluster(resolver)
      _INITIALIZED_TPU_SYSTEMS[tpu] = tf.tpu.experimental.initialize_tpu_system(resolver)
    except (tf.errors.OpError, ValueError, RuntimeError) as e:
      raise ConfigError(f"Could not initialize the TPU system of tpu={tpu!r}: {e}. {HOW_TO_NAME_A_TPU}") from e
    logging.info("Initialized TPU system %r: mesh shape %s.", tpu, _INITIALIZED_TPU_SYSTEMS[tpu].mesh_shape)
  return _INITIALIZED_TPU_SYSTEMS[tpu]


def _device_assignment(topology, computation_shape, num_replicas):
  """Returns the DeviceAssignment placing `num_replicas` blocks of `computation_shape` cores."""
  rank = len(topology.mesh_shape)
  shape = computation_shape or [1] * rank
  if len(shape) != rank:
    raise ConfigError(
        f"computation_shape={shape} needs {rank} entries, one per axis of the TPU mesh {list(topology.mesh_shape)}.")
  if num_replicas is None:
    num_replicas = topology.num_tasks * topology.num_tpus_per_task // int(np.prod(shape))
  try:
    return tf.tpu.experimental.DeviceAssignment.build(
        topology, computation_shape=np.array(shape, dtype=np.int32), num_replicas=num_replicas)
  except ValueError as e:
    raise ConfigError(
        f"computation_shape={shape} with num_replicas={num_replicas} does not fit the TPU mesh "
        f"{list(topology.mesh_shape)}: {e}") from e
