"""The exit statuses of `python -m runner` and `python -m runner.launch`: what ended the run, and whether to retry.

0 is done. 1-127 are permanent: a restart would fail the same way, so an orchestrator must not retry them. 128-255
are transient: 128 + the signal that stopped the run, which saved a checkpoint a restart resumes from. docs/cli.md has
the table.
"""

import signal

DONE = 0
BUG = 1  # An unexpected exception: Python's own status for one, with its traceback.
USER_ERROR = 2  # A bad config, flag or data: one `error:` line.
NON_FINITE = 3  # A step's loss or gradients were not finite; the last checkpoint is finite.
CLUSTER = 4  # A peer could not be reached or stopped answering; restarting the job resumes it.
STOPPED_BY: dict[int, int] = {signal.SIGTERM: 128 + signal.SIGTERM, signal.SIGINT: 128 + signal.SIGINT}  # 143, 130

# What a restart repeats, so `runner.launch --max_restarts` does not restart it.
NOT_RESTARTED = {USER_ERROR: "a user error", NON_FINITE: "a non-finite step"}
