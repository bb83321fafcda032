"""tf-runner: one ml-collections config to a distributed TensorFlow training run.

The public names load on first use (PEP 562), so that `python -m runner` can
quiet TensorFlow's start-up before anything imports it.
"""

from strategies import lazy_names

# Public name -> the module that defines it (a module's own name: the module itself).
_PUBLIC = {
    "actions": "runner.actions",
    "data": "runner.data",
    "tasks": "runner.tasks",
    "Task": "runner.tasks",
    "TPUCheckResult": "runner.tpu_check",
    "Trainer": "runner.trainer",
    "check_tpu": "runner.tpu_check",
    "config_fields": "runner.own_fields",
    "load_config": "runner.config",
    "run": "runner.run_lib",
    "RunResult": "runner.run_lib",
}
__all__ = sorted(_PUBLIC)

__getattr__, __dir__ = lazy_names.module_hooks(__name__, _PUBLIC)
