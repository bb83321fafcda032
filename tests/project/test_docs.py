"""Keeps the docs true: README.md and docs/*.md document every public name, their links lead
somewhere, and the README's quickstart is what CI runs.
"""

import ast
import functools
import glob
import os
import re
import subprocess
import sys

import runner
from runner.config import run_config as config_lib
import strategies
from testlib import paths

REPO = paths.REPO
README_MAX_LINES = 300
DOCS_PAGES = (
    "config",
    "strategies",
    "trainer",
    "cli",
    "fault_tolerance",
    "multi_worker",
    "parameter_server",
    "cloud_tpu",
    "tensorboard",
    "benchmarks",
    "development",
)  # the README links each
PUBLIC_NAMES = (
    "runner.Trainer",
    "runner.run",
    "runner.RunResult",
    "runner.load_config",
    "runner.Task",
    "runner.check_tpu",
    "runner.TPUCheckResult",
    "runner.config_fields",
    "runner.tasks.Classification",
    "runner.tasks.Regression",
    "runner.data.DatasetProvider",
    "runner.actions.Action",
    "runner.actions.EarlyStopping",
    "strategies.create",
    "strategies.default_config",
    "strategies.names",
    "strategies.describe",
    "strategies.virtual_cpus",
    "strategies.flags.define_flags",
    "strategies.flags.create_from_flags",
)


def _read(path):
  with open(os.path.join(REPO, path), encoding="utf-8") as f:
    return f.read()


DOC_FILES = ["README.md"] + sorted(os.path.relpath(p, REPO) for p in glob.glob(os.path.join(REPO, "docs", "*.md")))
README = _read("README.md")
ALL_DOCS = "\n".join(_read(path) for path in DOC_FILES)


def _quickstart_commands():
  section = README.split("## Quickstart", 1)[1].split("\n## ", 1)[0]
  block = re.search(r"```sh\n(.*?)```", section, re.S).group(1)
  return [line for line in block.splitlines() if line.strip()]


def _relative_links(path):
  """Yields the targets of `path`'s relative Markdown links, without '#anchor', relative to the repository."""
  text = re.sub(r"```.*?```", "", _read(path), flags=re.S)  # code is not Markdown
  for target in re.findall(r"\]\(([^)\s]+)\)", text):
    target = target.split("#", 1)[0]
    if target and "://" not in target and not target.startswith("mailto:"):
      yield os.path.normpath(os.path.join(os.path.dirname(path), target))


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


def test_readme_is_short_and_links_every_docs_page():
  assert len(README.splitlines()) <= README_MAX_LINES
  linked = set(_relative_links("README.md"))
  missing = [
      page
      for page in DOCS_PAGES
      if not os.path.isfile(os.path.join(REPO, "docs", f"{page}.md")) or f"docs/{page}.md" not in linked
  ]
  assert not missing, f"docs pages missing or not linked from the README: {missing}"


def test_every_relative_link_points_at_a_file():
  broken = [
      (path, target)
      for path in DOC_FILES
      for target in _relative_links(path)
      if not os.path.exists(os.path.join(REPO, target))
  ]
  assert not broken, f"links to nothing: {broken}"


def test_every_repository_path_in_code_names_a_file_or_folder():
  """`tests/runner/test_cli.py`, `runner/config/` and the like, in backticks, name what is there (after a move too)."""
  pattern = r"`((?:runner|strategies|configs|tests|benchmarks|docs|\.ci)/[\w/.*-]*)`"
  named = [(path, name) for path in DOC_FILES for name in re.findall(pattern, _read(path))]
  assert any(name == "tests/conftest.py" for _, name in named)
  missing = [(path, name) for path, name in named if not glob.glob(os.path.join(REPO, name))]
  assert not missing, f"the docs name paths that are not in the repository: {missing}"


def test_every_config_field_is_documented():
  undocumented = [
      path
      for path in _leaf_fields(config_lib.default_config())
      if f"`{path.rsplit('.', 1)[-1]}`" not in ALL_DOCS and f"`config.{path}`" not in ALL_DOCS
  ]
  assert not undocumented, f"the docs have no row for {undocumented}"


def test_every_strategy_name_and_public_name_is_documented():
  missing = [name for name in list(strategies.names()) + list(PUBLIC_NAMES) if f"`{name}" not in ALL_DOCS]
  assert not missing, f"the docs do not mention {missing}"


def test_every_public_name_exists():
  packages = {"runner": runner, "strategies": strategies}
  missing = []
  for name in PUBLIC_NAMES:
    top, *attributes = name.split(".")
    try:
      functools.reduce(getattr, attributes, packages[top])
    except AttributeError:
      missing.append(name)
  assert not missing, f"documented but not importable: {missing}"


def test_every_example_config_is_documented():
  configs = sorted(f for f in os.listdir(os.path.join(REPO, "configs")) if f.endswith(".py") and f != "__init__.py")
  assert configs and [f for f in configs if f"configs/{f}" not in ALL_DOCS] == []


def _readme_trainer_example(model_dir):
  """The README's Trainer example as a script, with its model_dir (and export) under `model_dir`."""
  section = README.split("## Your own model with the Trainer", 1)[1].split("\n## ", 1)[0]
  script = re.search(r"```python\n(.*?)```", section, re.S).group(1)
  assert script.count('"/tmp/my_run') == 2, script
  return script.replace('"/tmp/my_run', f'"{model_dir}')


_ABSL_LINE = re.compile(r"^[IWE]\d{4} [\d:.]+ +\d+ \w+\.py:\d+\] ")


def test_the_readmes_trainer_example_shows_progress_and_a_rerun_says_it_has_nothing_to_train(tmp_path, subprocess_env):
  script = tmp_path / "example.py"
  script.write_text(_readme_trainer_example(tmp_path / "my_run"))
  runs = [
      subprocess.run(
          [sys.executable, str(script)],
          env=subprocess_env,
          cwd=tmp_path,
          capture_output=True,
          text=True,
          timeout=300,
          check=False,
      )
      for _ in range(2)
  ]
  for run in runs:
    assert run.returncode == 0, run.stderr[-3000:]
    assert "INFO:absl" not in run.stderr  # The CLI's format, not Python logging's default.
  first, second = (
      [line.split("] ", 1)[1] for line in run.stderr.splitlines() if _ABSL_LINE.match(line)] for run in runs
  )  # absl's lines from Python, not TensorFlow's C++ start-up lines.
  assert [line.split(":")[0] for line in first if line.startswith("step ")] == [
      f"step {step}/400" for step in range(50, 401, 50)
  ]
  assert sum(line.startswith("eval at step ") for line in first) == 2
  assert f"Exported a SavedModel at step 400 to {tmp_path}/my_run/saved_model." in first
  assert second == [
      f"Restored {tmp_path}/my_run/checkpoints/ckpt-400.",
      f"Nothing to train: the checkpoint in {tmp_path}/my_run is at step 400 >= steps=400.",
      f"Exported a SavedModel at step 400 to {tmp_path}/my_run/saved_model.",
  ]
  results = [ast.literal_eval(run.stdout.strip()) for run in runs]
  assert set(results[0]) == {"loss", "accuracy"} and results[1] == results[0]  # Step 400's row of metrics.jsonl.
