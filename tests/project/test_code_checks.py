"""The code checks of pyproject.toml pass: the linter (ruff), the formatter (pyink) and the type checker (mypy).

Each runs as its own process on the repository, the way a developer runs it
(`ruff check .`, `pyink --check .`, `mypy`), and a failure shows its output.
A planted mistake per tool shows that the project's configuration checks
what it says: a lint finding, a file that is not formatted, a function
without type hints in `strategies`.
"""

import os
import re
import subprocess
import sys

import pytest

from testlib import paths

REPO = paths.REPO
CONFIG = os.path.join(REPO, "pyproject.toml")
PLANTED = "strategies/planted.py"  # Where a planted file claims to be: the rules of `strategies` apply to it.

CHECKS = {
    "ruff": ["check", "--no-cache", "."],
    "pyink": ["--check", "."],
    "mypy": [],  # The files and options are in pyproject.toml.
}


def _run(tool, arguments, *, cwd=REPO, stdin=None):
  """Runs `python -m tool arguments` in `cwd`; returns `(exit status, stdout and stderr together)`."""
  result = subprocess.run(
      [sys.executable, "-m", tool, *arguments],
      cwd=cwd,
      input=stdin,
      capture_output=True,
      text=True,
      check=False,
      env={**os.environ, "NO_COLOR": "1"},
  )
  return result.returncode, result.stdout + result.stderr


@pytest.mark.parametrize("tool", sorted(CHECKS))
def test_the_repository_passes(tool, tmp_path):
  arguments = CHECKS[tool] + (["--cache-dir", str(tmp_path / "mypy")] if tool == "mypy" else [])
  status, output = _run(tool, arguments)
  assert status == 0, f"`{tool} {' '.join(arguments)}` found problems (exit {status}):\n{output}"


def test_the_linter_finds_an_unused_import_and_a_long_line():
  source = f'"""A module."""\n\nimport os\n\nLINE = "{"x" * 120}"\n'
  status, output = _run(
      "ruff", ["check", "--no-cache", "--config", CONFIG, "--stdin-filename", PLANTED, "-"], stdin=source
  )
  assert status == 1, output
  assert re.findall(r"\b(F401|E501)\b", output) == ["F401", "E501"], output


def test_the_formatter_wants_two_space_indentation():
  four_spaces = '"""A module."""\n\n\ndef f():\n    return 1\n'
  status, output = _run("pyink", ["--config", CONFIG, "--check", "--stdin-filename", PLANTED, "-"], stdin=four_spaces)
  assert status == 1, output
  two_spaces = four_spaces.replace("    return", "  return")
  assert _run("pyink", ["--config", CONFIG, "--check", "--stdin-filename", PLANTED, "-"], stdin=two_spaces)[0] == 0


def test_the_type_checker_wants_type_hints_in_strategies(tmp_path):
  package = tmp_path / "strategies"
  package.mkdir()
  (package / "__init__.py").write_text("")
  (package / "planted.py").write_text(
      "def public(value):\n  return value\n\n\ndef typed(value: int) -> str:\n  return value\n"
  )
  status, output = _run(
      "mypy",
      ["--config-file", CONFIG, "--cache-dir", str(tmp_path / "cache"), os.path.join("strategies", "planted.py")],
      cwd=tmp_path,
  )
  assert status == 1, output
  assert re.findall(r"planted\.py:(\d+): error: .*\[([\w-]+)\]", output) == [
      ("1", "no-untyped-def"),
      ("6", "return-value"),
  ], output
