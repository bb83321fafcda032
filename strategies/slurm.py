"""The cluster of a SLURM job step: every task's role and address from SLURM's environment, on CPU or GPU nodes.

(Being written: see issue 24, item 1.)
"""

from collections.abc import Mapping

from strategies import cluster_view


def is_multi_task_step(environ: Mapping[str, str]) -> bool:
  """Whether this process is one task of a SLURM step (`srun`) of more than one task."""
  tasks = environ.get("SLURM_STEP_NUM_TASKS") or environ.get("SLURM_NTASKS") or ""
  return "SLURM_PROCID" in environ and tasks.isdigit() and int(tasks) > 1


def cluster(environ: Mapping[str, str], *, num_ps: int | None) -> cluster_view.Cluster:
  """Returns the step's cluster: task 0 is the chief; see the module docstring."""
  raise NotImplementedError("strategies.slurm.cluster is being written (issue 24).")
