"""`python -m runner.launch` and the console script `tf-runner-launch`: the launcher (`runner.cluster.launcher`)."""

from runner.cluster.launcher import run_main

__all__ = ["run_main"]

if __name__ == "__main__":
  run_main()
