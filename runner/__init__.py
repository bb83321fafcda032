"""tf-runner: one ml-collections config to a distributed TensorFlow training run."""

from runner import data
from runner.config import load_config
from runner import tasks
from runner.tasks import Task
from runner.trainer import Trainer
from runner.experiment import RunResult, run
