"""tf-runner: one ml-collections config to a distributed TensorFlow training run.

The public names load on first use (PEP 562), so that `python -m runner` can
quiet TensorFlow's start-up before anything imports it.
"""

from strategies import lazy_names

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
    "config_fields": "runner.config.declared_fields",
    "load_config": "runner.config.run_config",
    "run": "runner.from_config",
    "RunResult": "runner.from_config",
}
__all__ = sorted(_PUBLIC)

__getattr__, __dir__ = lazy_names.module_hooks(__name__, _PUBLIC)
