"""Processes of a multi-process job: the launcher, parameter-server tasks, stop signals and ending a process."""
