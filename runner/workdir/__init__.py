"""The workdir as a whole: one run at a time, its config history, and leaving it as found when a run fails."""
