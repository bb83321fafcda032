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

The logic that needs no TPU is in plain functions and classes, testable
anywhere: `resolve_name` and `name_form` (which name form: 'local', 'address'
or 'name'), `topology` (each TPU system initialized once per process) and
`device_assignment` (a `computation_shape` checked against a topology).
"""

from collections.abc import Callable, Sequence
import glob
import importlib.util
import math
import os
import socket
import threading
from typing import Any

from absl import logging
import numpy as np
import tensorflow as tf

from strategies import checks
from strategies.errors import ConfigError

TPU_ENVIRONMENT_VARIABLES = ("TPU_NAME", "KUBE_GOOGLE_CLOUD_TPU_ENDPOINTS")
LOCAL_TPU_DEVICE_FILES = ("/dev/accel[0-9]*", "/dev/vfio/[0-9]*")
DMI_PRODUCT_NAME_FILE = "/sys/class/dmi/id/product_name"
GRPC_CONNECT_TIMEOUT_SECONDS = 5
MESH_AXES = ("x", "y", "z", "core")  # The axes of a TPU topology's mesh_shape, as TensorFlow reports it.

HOW_TO_NAME_A_TPU = (
    "Name the TPU: --config.strategy.tpu=local (or --tpu=local) on a TPU VM, a Cloud TPU name such as my-tpu, or "
    "a worker address such as grpc://10.0.0.2:8470; or set TPU_NAME."
)


def local_tpu_present() -> bool:
  """Returns whether this machine is a TPU VM: TPU device files and libtpu are there."""
  has_runtime = importlib.util.find_spec("libtpu") is not None or bool(os.environ.get("TPU_LIBRARY_PATH"))
  return has_runtime and any(glob.glob(pattern) for pattern in LOCAL_TPU_DEVICE_FILES)


def reachable_tpu() -> str | None:
  """Returns the TPU that `tpu=''` would use (TPU_NAME's, KUBE_GOOGLE_CLOUD_TPU_ENDPOINTS's or 'local'), or None.

  Never blocks: it reads the environment and the device files only.
  """
  named = [os.environ[variable] for variable in TPU_ENVIRONMENT_VARIABLES if os.environ.get(variable)]
  return named[0] if named else "local" if local_tpu_present() else None


def resolve_name(tpu: str | None) -> str:
  """Returns the TPU that `tpu` names: itself, or for '' (or None) the environment's TPU or 'local'.

  Raises:
    ConfigError: `tpu` is not a string, or it is '' and no TPU is reachable.
  """
  if not isinstance(tpu, (str, type(None))):
    raise ConfigError(f"tpu must be a string ('', 'local', a TPU name or grpc://host:port), got {tpu!r}.")
  found = tpu or reachable_tpu()
  if found is None:
    raise ConfigError(
        "strategy 'tpu' with tpu='' found no TPU: TPU_NAME is not set and this machine has no "
        f"TPU devices ({', '.join(LOCAL_TPU_DEVICE_FILES)}) with libtpu installed. {HOW_TO_NAME_A_TPU}"
    )
  return found


def name_form(tpu: str) -> str:
  """Returns how `TPUClusterResolver` reaches a resolved TPU name (see `resolve_name`).

  'local' (this TPU VM's chips, no connection), 'address' (a grpc://host:port
  worker) or 'name' (a Cloud TPU looked up through the Cloud TPU API, the only
  form that uses a zone and a project).
  """
  return "local" if tpu == "local" else "address" if tpu.startswith("grpc://") else "name"


# This process's TPU systems, by resolved TPU name: each is connected and initialized once (initializing it
# again would wipe the TPU's memory under the strategies already using it). A failed initialization is not kept.
SYSTEMS: dict[str, tf.tpu.experimental.Topology] = {}
_SYSTEMS_LOCK = threading.Lock()


def topology(
    tpu: str, resolver: tf.distribute.cluster_resolver.TPUClusterResolver, initialize: Callable[..., Any] | None = None
) -> tf.tpu.experimental.Topology:
  """Returns the topology of TPU `tpu` (a resolved name), initializing its system on the first call only.

  Args:
    tpu: the resolved TPU name, the key in `SYSTEMS`.
    resolver: its `TPUClusterResolver`.
    initialize: `fn(tpu, resolver) -> Topology`; by default it connects to a
      remote TPU (a name or a grpc:// address) and runs
      `tf.tpu.experimental.initialize_tpu_system`.

  Raises:
    ConfigError: the initialization failed.
  """
  with _SYSTEMS_LOCK:
    if tpu not in SYSTEMS:
      try:
        SYSTEMS[tpu] = (initialize or _connect_and_initialize)(tpu, resolver)
      except (tf.errors.OpError, ValueError, RuntimeError) as e:
        raise ConfigError(f"Could not initialize the TPU system of tpu={tpu!r}: {e}. {HOW_TO_NAME_A_TPU}") from e
      logging.info("Initialized TPU system %r: mesh shape %s.", tpu, list(SYSTEMS[tpu].mesh_shape))
    return SYSTEMS[tpu]


def _connect_and_initialize(
    tpu: str, resolver: tf.distribute.cluster_resolver.TPUClusterResolver
) -> tf.tpu.experimental.Topology:
  if name_form(tpu) != "local":
    tf.config.experimental_connect_to_cluster(resolver)
  return tf.tpu.experimental.initialize_tpu_system(resolver)


class TPUStrategy(tf.distribute.TPUStrategy):
  """`tf.distribute.TPUStrategy` on a named TPU, connected and initialized once per process."""

  def __init__(
      self,
      tpu: str | None = "",
      *,
      zone: str | None = None,
      project: str | None = None,
      computation_shape: Sequence[int] | None = None,
      num_replicas: int | None = None,
      spmd_xla_partitioning: bool = False,
  ) -> None:
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
    shape = computation_shape
    if shape is not None and (
        not isinstance(shape, (list, tuple)) or not shape or not all(checks.is_int(n) and n >= 1 for n in shape)
    ):
      raise ConfigError(
          f"computation_shape must be a list of positive ints, one per mesh axis, such as [1, 1, 1, 2]; got {shape!r}."
      )
    checks.positive_int(num_replicas, "num_replicas", optional=True)
    checks.boolean(spmd_xla_partitioning, "spmd_xla_partitioning")
    tpu = resolve_name(tpu)
    _check_reachable(tpu, zone, project)
    try:
      resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu, zone=zone, project=project)
    except Exception as e:  # the Cloud TPU client raises many kinds.
      raise ConfigError(f"Could not resolve tpu={tpu!r}: {type(e).__name__}: {e}. {HOW_TO_NAME_A_TPU}") from e
    system = topology(tpu, resolver)
    assignment = None if shape is None and num_replicas is None else device_assignment(system, shape, num_replicas)
    super().__init__(
        resolver, experimental_device_assignment=assignment, experimental_spmd_xla_partitioning=spmd_xla_partitioning
    )
    self.tpu = tpu


def _check_reachable(tpu: str, zone: str | None, project: str | None) -> None:
  """Raises ConfigError unless the cheap local checks say TPU `tpu` (a resolved name) can be reached."""
  form = name_form(tpu)
  if (zone or project) and form != "name":
    raise ConfigError(f"zone and project look up a Cloud TPU by name; tpu={tpu!r} does not use them: remove them.")
  if form == "local" and not local_tpu_present():
    raise ConfigError(
        f"tpu='local' but this machine is not a TPU VM (no {' or '.join(LOCAL_TPU_DEVICE_FILES)} "
        f"device files with libtpu installed). {HOW_TO_NAME_A_TPU}"
    )
  if form == "address":
    host, _, port = tpu.removeprefix("grpc://").rpartition(":")
    if not host or not port.isdigit():
      raise ConfigError(f"tpu={tpu!r} is not a grpc://host:port address such as grpc://10.0.0.2:8470.")
    try:
      socket.create_connection((host.strip("[]"), int(port)), timeout=GRPC_CONNECT_TIMEOUT_SECONDS).close()
    except OSError as e:
      raise ConfigError(
          f"No TPU is reachable at tpu={tpu!r}: {e.strerror or e} (waited at most 5 s). {HOW_TO_NAME_A_TPU}"
      ) from None
  if form == "name" and not (zone and project) and not _on_google_cloud():
    raise ConfigError(
        f"tpu={tpu!r} is a Cloud TPU name, and this machine is not on Google Cloud, so zone and project "
        f"must be given (--config.strategy.zone, --config.strategy.project) to look it up. {HOW_TO_NAME_A_TPU}"
    )


def _on_google_cloud() -> bool:
  """Returns whether the GCE metadata server can tell a TPU's zone and project (local facts only)."""
  if os.environ.get("GCE_METADATA_HOST") or os.environ.get("GCE_METADATA_IP"):
    return True
  try:
    with open(DMI_PRODUCT_NAME_FILE, encoding="utf-8") as f:
      return "Google" in f.read()
  except OSError:
    return False


def device_assignment(
    topology: tf.tpu.experimental.Topology,
    computation_shape: Sequence[int] | None = None,
    num_replicas: int | None = None,
) -> tf.tpu.experimental.DeviceAssignment:
  """Returns the DeviceAssignment placing `num_replicas` blocks of `computation_shape` cores on `topology`.

  Replicas are whole blocks: along each mesh axis `mesh // shape` of them
  fit, so at most the product of those fit (fewer than cores / block size
  when a shape does not divide the mesh).

  Args:
    topology: a `tf.tpu.experimental.Topology` (from initializing the TPU
      system, or built from `mesh_shape` and `device_coordinates`).
    computation_shape: cores per replica along each mesh axis (x, y, z,
      core), a list of positive ints; None means one core per replica.
    num_replicas: the replicas to place; None means as many as fit.

  Raises:
    ConfigError: the shape has the wrong number of axes, is larger than the
      mesh along an axis, or `num_replicas` blocks of it do not fit.
  """
  mesh = [int(n) for n in topology.mesh_shape]
  shape = list(computation_shape) if computation_shape is not None else [1] * len(mesh)
  cores = topology.num_tasks * topology.num_tpus_per_task
  where = f"the TPU mesh {mesh} ({', '.join(MESH_AXES)}; {cores} cores)"
  if len(shape) != len(mesh):
    raise ConfigError(f"computation_shape={shape} needs {len(mesh)} entries, one per axis of {where}.")
  for axis, asked, present in zip(MESH_AXES, shape, mesh):
    if asked > present:
      raise ConfigError(
          f"computation_shape={shape} does not fit {where}: along axis {axis} it asks for {asked} cores, "
          f"the mesh has {present}."
      )
  fitting = math.prod(m // s for m, s in zip(mesh, shape))
  if num_replicas is None:
    num_replicas = fitting
  elif num_replicas > fitting:
    raise ConfigError(
        f"computation_shape={shape} with num_replicas={num_replicas} needs {num_replicas * math.prod(shape)} "
        f"cores, and only {fitting} replica(s) of that shape fit {where}. Use num_replicas <= {fitting} or "
        "a smaller computation_shape."
    )
  return tf.tpu.experimental.DeviceAssignment.build(
      topology, computation_shape=np.array(shape, dtype=np.int32), num_replicas=num_replicas
  )
