"""tf-runner: one ml-collections config to a distributed TensorFlow training run.

The public names load on first use (PEP 562), so that `python -m runner` can
quiet TensorFlow's start-up before anything imports it.
"""

import typing

from strategies import lazy_names

if typing.TYPE_CHECKING:  # The type checker sees the public names with their types; at run time they load lazily.
  from runner import actions as actions
  from runner import data as data
  from runner import interfaces as interfaces
  from runner import tasks as tasks
  from runner.config.registry import config_fields as config_fields
  from runner.config.run_config import load_config as load_config
  from runner.from_config import run as run
  from runner.from_config import RunResult as RunResult
  from runner.interfaces import Task as Task
  from runner.tpu.check import check_tpu as check_tpu
  from runner.tpu.check import TPUCheckResult as TPUCheckResult
  from runner.training.trainer import Trainer as Trainer

# Public name -> the module that defines it (a module's own name: the module itself).
_PUBLIC = {
    "actions": "runner.actions",
    "data": "runner.data",
    "interfaces": "runner.interfaces",
    "tasks": "runner.tasks",
    "Task": "runner.interfaces",
    "TPUCheckResult": "runner.tpu.check",
    "Trainer": "runner.training.trainer",
    "check_tpu": "runner.tpu.check",
    "config_fields": "runner.config.registry",
    "load_config": "runner.config.run_config",
    "run": "runner.from_config",
    "RunResult": "runner.from_config",
}
__all__ = sorted(_PUBLIC)

__getattr__, __dir__ = lazy_names.module_hooks(__name__, _PUBLIC)
