"""Keeps the Bazel BUILD file and setup.py's requirements true.

BUILD is Starlark, a Python subset, so it is read with `ast`. Checked: every
Python file of the project is in exactly one target; every test file has a
py_test; every label names a defined target; every `requirement(...)` names a
distribution that setup.py declares; a target's project deps are exactly the
targets its sources import (a py_test also gets the conftest); and the deps
have no cycle, which Bazel refuses. setup.py is read through `egg_info`, the
metadata pip installs from.

A package face (`runner/__init__.py`) depends on its modules, never the
reverse: modules import each other directly (`from runner.training import loops`),
not through the face, so the graph stays acyclic.
"""

import ast
import os
import re
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROJECT_DIRS = ("runner", "strategies", "configs", "tests", "benchmarks")
RULES = ("py_library", "py_binary", "py_test")
CONFTEST = "tests_conftest"


def _targets():
  """Returns {name: {'rule', 'srcs', 'deps', 'data', 'requirements'}} from BUILD."""
  with open(os.path.join(REPO, "BUILD"), encoding="utf-8") as f:
    tree = ast.parse(f.read(), "BUILD")
  targets = {}
  for node in tree.body:
    call = node.value if isinstance(node, ast.Expr) else None
    if not (isinstance(call, ast.Call) and getattr(call.func, "id", None) in RULES):
      continue
    fields = {kw.arg: kw.value for kw in call.keywords}
    name = ast.literal_eval(fields["name"])
    assert name not in targets, f"target {name!r} is defined twice"
    deps = fields.get("deps", ast.List(elts=[]))
    targets[name] = {
        "rule": call.func.id,
        "srcs": ast.literal_eval(fields.get("srcs", ast.List(elts=[]))),
        "data": ast.literal_eval(fields.get("data", ast.List(elts=[]))),
        "deps": [ast.literal_eval(d) for d in deps.elts if isinstance(d, ast.Constant)],
        "requirements": [ast.literal_eval(d.args[0]) for d in deps.elts if isinstance(d, ast.Call)],
    }
  return targets


def _project_files():
  found = []
  for top in PROJECT_DIRS:
    for root, _, files in os.walk(os.path.join(REPO, top)):
      found += [os.path.relpath(os.path.join(root, f), REPO) for f in files if f.endswith(".py")]
  return sorted(found)


def _module_file(module):
  """Maps a dotted project module to its file, or None when it is not ours."""
  if module.split(".")[0] not in PROJECT_DIRS:
    return None
  path = module.replace(".", "/")
  for candidate in (path + ".py", path + "/__init__.py"):
    if os.path.exists(os.path.join(REPO, candidate)):
      return candidate
  return None


def _test_helper_file(src, module):
  """A test's helper module imported by its bare name (`import trainer_testlib`, from tests/), or None."""
  path = f"tests/{module}.py"
  if src.startswith("tests/") and "." not in module and os.path.exists(os.path.join(REPO, path)):
    return path
  return None


def _imported_files(src):
  """The project files `src` imports: by import statements, and a package face's lazy `_PUBLIC` modules."""
  with open(os.path.join(REPO, src), encoding="utf-8") as f:
    tree = ast.parse(f.read(), src)
  files = {_module_file(module) for module in _lazy_modules(tree)}
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      files |= {_module_file(alias.name) or _test_helper_file(src, alias.name) for alias in node.names}
    elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
      submodules = {_module_file(f"{node.module}.{alias.name}") for alias in node.names}
      files |= submodules if None not in submodules else submodules | {_module_file(node.module)}
  return files - {None}


def _lazy_modules(tree):
  """The module names of a module-level `_PUBLIC = {name: "package.module", ...}` (see runner/__init__.py)."""
  for node in tree.body:
    if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["_PUBLIC"]:
      return set(ast.literal_eval(node.value).values())
  return set()


TARGETS = _targets()


def test_every_project_file_is_in_exactly_one_target():
  owners = {}
  for name, target in TARGETS.items():
    for src in target["srcs"]:
      owners.setdefault(src, []).append(name)
  missing = [f for f in _project_files() if f not in owners]
  assert not missing, f"BUILD lists no target for {missing}"
  doubled = {f: names for f, names in owners.items() if len(names) > 1}
  assert not doubled, f"files in several targets: {doubled}"
  gone = [f for f in owners if not os.path.exists(os.path.join(REPO, f))]
  assert not gone, f"BUILD names files that do not exist: {gone}"


def test_every_test_file_has_a_py_test():
  test_srcs = {s for t in TARGETS.values() if t["rule"] == "py_test" for s in t["srcs"]}
  tests = [f for f in _project_files() if re.match(r"tests/test_\w+\.py$", f)]
  assert tests and sorted(set(tests) - test_srcs) == []


def test_every_label_names_a_defined_target():
  for name, target in TARGETS.items():
    for label in target["deps"] + [d for d in target["data"] if d.startswith(":")]:
      assert label.startswith(":") and label[1:] in TARGETS, f"{name} depends on undefined {label!r}"


def _declared_requirements(tmp_path, **environ):
  """Returns {section: [distribution names]} of setup.py, '' being install_requires."""
  subprocess.run([sys.executable, "setup.py", "-q", "egg_info", "--egg-base", str(tmp_path)],
                 cwd=REPO, env={**os.environ, **environ}, check=True, capture_output=True)
  section, declared = "", {"": []}
  with open(tmp_path / "tf_runner.egg-info" / "requires.txt", encoding="utf-8") as f:
    for line in filter(None, map(str.strip, f)):
      if line.startswith("["):
        section = line.strip("[]")
        declared[section] = []
      else:
        declared[section].append(re.match(r"[\w.-]+", line).group().lower())
  return declared


def test_every_requirement_is_declared_by_setup_py(tmp_path):
  declared = {d for names in _declared_requirements(tmp_path).values() for d in names}
  for name, target in TARGETS.items():
    for requirement in target["requirements"]:
      assert requirement.lower() in declared, f"{name}: {requirement!r} is not in setup.py"


def test_setup_py_declares_the_extras_of_the_design(tmp_path):
  declared = _declared_requirements(tmp_path)
  assert {"tensorflow", "absl-py", "ml-collections"} <= set(declared[""])
  assert {"pytest", "portpicker", "tensorboard"} <= set(declared["test"])
  assert declared["examples"] == ["scikit-learn"]
  assert declared["tpu"] == ["tensorflow-tpu"]
  assert declared["tensorboard"] == ["tensorboard", "tensorboard-plugin-profile"]


def test_a_tpu_vm_install_does_not_pull_the_cpu_wheel(tmp_path):
  declared = _declared_requirements(tmp_path, TF_RUNNER_TENSORFLOW="tensorflow-tpu")
  assert "tensorflow-tpu" in declared[""]
  everything = {d for names in declared.values() for d in names}
  assert "tensorflow" not in everything


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_project_deps_are_exactly_the_imported_targets(name):
  owner = {src: t for t, target in TARGETS.items() for src in target["srcs"]}
  target = TARGETS[name]
  imported = {owner.get(f) for src in target["srcs"] for f in _imported_files(src)} - {name}
  if target["rule"] == "py_test":
    imported.add(CONFTEST)  # pytest loads it; no test imports it.
  declared = {label[1:] for label in target["deps"]}
  assert declared == imported, (
      f"{name}: deps lack {sorted(imported - declared)} and need not list {sorted(declared - imported)}")


def find_cycle(targets):
  """Returns one dependency cycle of `targets` as a list of names (first == last), or None."""
  graph = {name: [label[1:] for label in target["deps"]] for name, target in targets.items()}
  visiting, done = [], set()

  def visit(name):
    if name in visiting:
      return visiting[visiting.index(name):] + [name]
    if name in done:
      return None
    visiting.append(name)
    for dep in graph.get(name, ()):
      cycle = visit(dep)
      if cycle:
        return cycle
    visiting.pop()
    done.add(name)
    return None

  for name in sorted(graph):
    cycle = visit(name)
    if cycle:
      return cycle
  return None


def test_the_deps_have_no_cycle():
  cycle = find_cycle(TARGETS)
  assert cycle is None, f"BUILD has a dependency cycle, which Bazel refuses: {' -> '.join(cycle)}"


def test_a_planted_cycle_is_found():
  planted = {name: dict(target, deps=list(target["deps"])) for name, target in TARGETS.items()}
  planted["runner_outputs_checkpoints"]["deps"].append(":runner")  # runner -> ... -> checkpoints -> runner
  cycle = find_cycle(planted)
  assert cycle is not None and cycle[0] == cycle[-1]
  assert {"runner", "runner_outputs_checkpoints"} <= set(cycle)
  assert find_cycle({"a": {"deps": [":b"]}, "b": {"deps": [":a"]}}) in (["a", "b", "a"], ["b", "a", "b"])
  assert find_cycle({"a": {"deps": [":b"]}, "b": {"deps": []}}) is None
