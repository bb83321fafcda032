"""Keeps the README true: its quickstart is what CI runs, and every public name is documented."""

import functools
import os
import re

import runner
from runner import config as config_lib
import strategies

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _read(path):
  with open(os.path.join(REPO, path), encoding="utf-8") as f:
    return f.read()


README = _read("README.md")


def _quickstart_commands():
  section = README.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
  block = re.search(r"```sh\n(.*?)```", section, re.S).group(1)
  return [line for line in block.splitlines() if line.strip()]


def _leaf_fields(config, prefix=""):
  for key, value in config.items():
    if hasattr(value, "items"):
      yield from _leaf_fields(value, f"{prefix}{key}.")
    else:
      yield f"{prefix}{key}"


def test_quickstart_is_two_commands_one_for_the_example_one_for_the_tests():
  example, tests = _quickstart_commands()
  assert "python -m runner --config=configs/digits.py" in example and '".[examples]"' in example
  assert "pytest" in tests and '".[test]"' in tests


def test_ci_runs_the_readmes_test_command():
  ci_commands = [line.strip() for line in _read(".ci/run").splitlines()]
  assert _quickstart_commands()[1] in ci_commands


def test_every_config_field_is_documented():
  undocumented = [path for path in _leaf_fields(config_lib.default_config())
                  if f"`{path.rsplit('.', 1)[-1]}`" not in README and f"`config.{path}`" not in README]
  assert not undocumented, f"README has no row for {undocumented}"


def test_every_strategy_name_and_public_name_is_documented():
  names = list(strategies.names()) + [
      "runner.Trainer", "runner.run", "runner.RunResult", "runner.load_config", "runner.Task",
      "runner.tasks.Classification", "runner.tasks.Regression", "runner.data.DatasetProvider",
      "strategies.create", "strategies.default_config", "strategies.names", "strategies.describe",
      "strategies.virtual_cpus", "strategies.flags.define_flags", "strategies.flags.create_from_flags"]
  missing = [name for name in names if f"`{name}" not in README]
  assert not missing, f"README does not mention {missing}"
  packages = {"runner": runner, "strategies": strategies}
  for name in names[len(strategies.names()):]:
    top, *attributes = name.split(".")
    assert functools.reduce(getattr, attributes, packages[top]), name


def test_every_example_config_is_in_the_readme():
  configs = sorted(f for f in os.listdir(os.path.join(REPO, "configs")) if f.endswith(".py") and f != "__init__.py")
  assert configs and [f for f in configs if f"configs/{f}" not in README] == []
