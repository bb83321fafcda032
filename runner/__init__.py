"""tf-runner: one ml-collections config to a distributed TensorFlow training run."""

from runner import data
