"""`python -m runner.launch`: the multi-worker launcher (`runner.cluster.launcher`) under its public name."""

from runner.cluster import launcher

if __name__ == "__main__":
  launcher.run_main()
