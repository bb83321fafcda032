"""The exit statuses of `python -m runner` and `python -m runner.launch`: what ended the run, and whether to retry.

0 is done. 1-127 are permanent: a restart would fail the same way, so an orchestrator must not retry them.
128-255 are transient: a stop signal (128 + the signal; the run saved a checkpoint that a restart resumes from),
a lost or never-arriving peer, or a workdir that could not be reached; a restart of the job resumes from the last
checkpoint. Kubeflow's `restartPolicy: ExitCode`, a SLURM script's requeue and `runner.launch --max_restarts` all
retry exactly the transient ones (`is_transient`). docs/clusters.md has the table.
"""

import signal

DONE = 0
BUG = 1  # An unexpected exception: Python's own status for one, with its traceback.
USER_ERROR = 2  # A bad config, flag or data: one `error:` line.
NON_FINITE = 3  # A step's loss or gradients were not finite; the last checkpoint is finite.
CLUSTER = 170  # A peer could not be reached, never came, or stopped answering; restarting the job resumes it.
UNREACHABLE = 171  # The workdir's filesystem could not be reached (no network, storage down); a retry may reach it.
STOPPED_BY: dict[int, int] = {signal.SIGTERM: 128 + signal.SIGTERM, signal.SIGINT: 128 + signal.SIGINT}  # 143, 130
PERMANENT = {BUG: "a bug", USER_ERROR: "a user error", NON_FINITE: "a non-finite step"}


def is_transient(status: int) -> bool:
  """Whether a task that ended with `status` should be started again (from its last checkpoint).

  Args:
    status: an exit status, or a `subprocess` return code (-N: killed by signal N, as a shell's 128 + N).
  """
  return status < 0 or status >= 128
