"""The `auto` strategy: what this machine has, decided without waiting on the network."""

import dataclasses

from strategies import devices
from strategies import tpu


@dataclasses.dataclass(frozen=True)
class Choice:
  """The strategy `auto` picks: a name from `strategies.names()` and why."""

  name: str
  reason: str


def choose() -> Choice:
  """Returns the Choice for this process.

  A reachable TPU (TPU_NAME set, or this machine is a TPU VM) gives `tpu`;
  more than one GPU gives `mirrored` over them; one GPU gives `one_device` on
  it; on a CPU-only host, more than one logical CPU (`virtual_cpus`) gives
  `mirrored` over them, else `one_device` on '/cpu:0'.
  """
  reachable = tpu.reachable_tpu()
  if reachable:
    return Choice("tpu", f"a TPU is reachable ({reachable!r})")
  gpus = devices.logical_devices("GPU")
  if len(gpus) > 1:
    return Choice("mirrored", f"no TPU, {len(gpus)} GPUs")
  if gpus:
    return Choice("one_device", "no TPU, one GPU")
  cpus = devices.logical_devices("CPU")
  if len(cpus) > 1:
    return Choice("mirrored", f"no TPU or GPU, {len(cpus)} logical CPUs")
  return Choice("one_device", "no TPU or GPU, one CPU")
