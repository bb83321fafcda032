"""Keeps the Bazel BUILD file and setup.py's requirements true.

BUILD is Starlark, a Python subset, so it is read with `ast`. Checked: every
Python file of the project is in exactly one target; every test file has a
py_test; every label names a defined target; every `requirement(...)` names a
distribution that setup.py declares; a target's project deps are exactly the
targets its sources import (a py_test also gets the conftest); every
third-party module its sources import, anywhere in them (under `try:`, in a
function), is the `requirement(...)` of its distribution (`DISTRIBUTIONS`); and
the deps have no cycle, which Bazel refuses. setup.py is read through
`egg_info`, the metadata pip installs from.

A package face (`runner/__init__.py`) depends on its modules, never the
reverse: modules import each other directly (`from runner.training import loops`),
not through the face, so the graph stays acyclic.
"""

import ast
import os
import re
import subprocess
import sys
import textwrap

import pytest

from testlib import paths

REPO = paths.REPO
PROJECT_DIRS = ("runner", "strategies", "configs", "tests", "benchmarks")
TESTLIB = "testlib"  # The tests' helpers, imported as `from testlib import trainer_testlib` (tests/ is on sys.path).
RULES = ("py_library", "py_binary", "py_test")
CONFTEST = "tests_conftest"
# The distribution of every third-party module the project imports (the longest matching prefix of its dotted name
# counts). A module neither here, nor the standard library's, nor the project's fails the import check.
DISTRIBUTIONS = {
    "absl": "absl-py",
    "filelock": "filelock",
    "google.protobuf": "protobuf",
    "keras": "keras",
    "ml_collections": "ml-collections",
    "numpy": "numpy",
    "portpicker": "portpicker",
    "pytest": "pytest",
    "ray": "ray",
    "sklearn": "scikit-learn",
    "tensorboard": "tensorboard",
    "tensorboard_plugin_profile": "tensorboard-plugin-profile",
    "tensorflow": "tensorflow",
    "tensorflow_datasets": "tensorflow-datasets",
    "tensorflow_gnn": "tensorflow-gnn",
    "tf_keras": "tf-keras",
    "xprof": "xprof",
}
# Distributions setup.py cannot declare, installed by the README's test command with `pip install --no-deps`.
NO_DEPS_INSTALLS = {
    "tensorflow-gnn": "its apache-beam and google-vizier are not needed to import it (docs/keras2_and_gnn.md#install)",
}
# (source, module) -> why that import is neither a requirement nor the project's.
OTHER_IMPORTS = {
    (
        "benchmarks/contenders.py",
        "orbit",
    ): "optional, installed by hand: tf-models-official pins an older TensorFlow (contenders.OPTIONAL_MODULES)",
    ("tests/runner/data/test_data_providers.py", "sharded_records"): "a user's data module the test writes",
    ("tests/runner/test_run.py", "plugins"): "a user's module of functions the test writes",
}


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
  """A test's helper module (`testlib.trainer_testlib`, in tests/testlib/) imported from a file of tests/, or None."""
  if not src.startswith("tests/") or module.split(".")[0] != TESTLIB:
    return None
  path = "tests/" + module.replace(".", "/")
  for candidate in (path + ".py", path + "/__init__.py"):
    if os.path.exists(os.path.join(REPO, candidate)):
      return candidate
  return None


def _project_file(src, module):
  """The project file of `module` as imported by `src`, or None when it is not ours."""
  return _module_file(module) or _test_helper_file(src, module)


def _source(src):
  with open(os.path.join(REPO, src), encoding="utf-8") as f:
    return f.read()


def _parse(src):
  return ast.parse(_source(src), src)


def _imported_files(src):
  """The project files `src` imports: by import statements, and a package face's lazy `_PUBLIC` modules."""
  tree = _parse(src)
  files = {_module_file(module) for module in _lazy_modules(tree)}
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      files |= {_project_file(src, alias.name) for alias in node.names}
    elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
      submodules = {_project_file(src, f"{node.module}.{alias.name}") for alias in node.names}
      files |= submodules if None not in submodules else submodules | {_project_file(src, node.module)}
  return files - {None}


def _imported_modules(tree):
  """The absolute modules a parsed file imports, anywhere in it: a.b for `import a.b` and `from a.b import c`."""
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      yield from (alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
      yield node.module


def third_party_imports(src, tree):
  """Returns ({module: distribution} of the third-party modules `tree` imports, [modules of no known origin]).

  A module is the project's (a top-level folder of PROJECT_DIRS, or `testlib` from tests/), the standard
  library's (`sys.stdlib_module_names`), explained in OTHER_IMPORTS, or the distribution of its longest
  prefix in DISTRIBUTIONS; any other module is of no known origin.
  """
  found, unknown = {}, []
  for module in _imported_modules(tree):
    top = module.split(".")[0]
    ours = top in PROJECT_DIRS or (top == TESTLIB and src.startswith("tests/"))
    if ours or top in sys.stdlib_module_names or (src, module) in OTHER_IMPORTS:
      continue
    prefixes = [".".join(module.split(".")[:n]) for n in range(module.count(".") + 1, 0, -1)]
    distribution = next((DISTRIBUTIONS[p] for p in prefixes if p in DISTRIBUTIONS), None)
    if distribution is None:
      unknown.append(module)
    else:
      found[module] = distribution
  return found, unknown


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
  tests = [f for f in _project_files() if re.match(r"tests/(\w+/)*test_\w+\.py$", f)]
  assert tests and sorted(set(tests) - test_srcs) == []


def test_every_label_names_a_defined_target():
  for name, target in TARGETS.items():
    for label in target["deps"] + [d for d in target["data"] if d.startswith(":")]:
      assert label.startswith(":") and label[1:] in TARGETS, f"{name} depends on undefined {label!r}"


def test_every_helper_script_a_test_starts_is_its_data():
  scripts = {
      os.path.basename(target["srcs"][0]): name
      for name, target in TARGETS.items()
      if target["rule"] == "py_binary" and target["srcs"][0].startswith("tests/testlib/")
  }
  assert "tests_testlib_flags_script" in scripts.values()
  for name, target in TARGETS.items():
    sources = "".join(_source(src) for src in target["srcs"])
    started = {f":{binary}" for script, binary in scripts.items() if f'"{script}"' in sources}
    lacking = sorted(started - set(target["data"]))
    assert not lacking, f"{name} starts the scripts of {lacking}; add them to its data"


def _declared_requirements(tmp_path, **environ):
  """Returns {section: [distribution names]} of setup.py, '' being install_requires."""
  subprocess.run(
      [sys.executable, "setup.py", "-q", "egg_info", "--egg-base", str(tmp_path)],
      cwd=REPO,
      env={**os.environ, **environ},
      check=True,
      capture_output=True,
  )
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
  declared = {d for names in _declared_requirements(tmp_path).values() for d in names} | set(NO_DEPS_INSTALLS)
  for name, target in TARGETS.items():
    for requirement in target["requirements"]:
      assert requirement.lower() in declared, f"{name}: {requirement!r} is not in setup.py"


def undeclared_imports(name, target, parse=_parse):
  """Returns the messages of what `target`'s sources import that BUILD or DISTRIBUTIONS does not declare.

  Args:
    name: the target's name.
    target: the target as `_targets` reads it.
    parse: src -> its parsed module.

  Returns:
    One message per source with an unknown or an undeclared third-party import; none when all is declared.
  """
  declared = {requirement.lower() for requirement in target["requirements"]}
  messages = []
  for src in target["srcs"]:
    found, unknown = third_party_imports(src, parse(src))
    if unknown:
      messages.append(
          f"{src} imports {sorted(unknown)}, neither the project's nor the standard library's nor in "
          "tests/project/test_build.py's DISTRIBUTIONS: add each to DISTRIBUTIONS with its distribution, "
          f'to {name}\'s deps in BUILD as requirement("<distribution>"), and to setup.py'
      )
    missing = {module: d for module, d in found.items() if d not in declared}
    if missing:
      messages.append(f"{name}: BUILD lacks the requirement(...) of what {src} imports: {missing}")
  return messages


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_every_third_party_import_is_a_requirement_of_its_target(name):
  messages = undeclared_imports(name, TARGETS[name])
  assert not messages, "\n".join(messages)


def test_every_other_import_is_still_imported():
  stale = sorted((src, module) for src, module in OTHER_IMPORTS if module not in set(_imported_modules(_parse(src))))
  assert not stale, f"OTHER_IMPORTS lists imports no longer made: {stale}"


def test_every_known_distribution_is_declared_by_setup_py(tmp_path):
  declared = {d for names in _declared_requirements(tmp_path).values() for d in names}
  assert sorted(set(DISTRIBUTIONS.values()) - declared - set(NO_DEPS_INSTALLS)) == []


def test_what_setup_py_cannot_declare_is_installed_by_the_test_command():
  with open(os.path.join(REPO, ".ci", "run"), encoding="utf-8") as ci:
    installs = re.findall(r"pip install --no-deps (\S+?)==", ci.read())
  assert sorted(installs) == sorted(NO_DEPS_INSTALLS)


def test_planted_undeclared_imports_are_found():
  planted = textwrap.dedent("""\
      try:
        import yaml
      except ImportError:
        yaml = None


      def _digits():
        from sklearn import datasets
        import matplotlib.pyplot as plt
        return datasets, plt
      """)
  src = "runner/outputs/checkpoints.py"
  target = TARGETS["runner_outputs_checkpoints"]
  assert undeclared_imports("runner_outputs_checkpoints", target) == []
  messages = undeclared_imports(
      "runner_outputs_checkpoints", target, parse=lambda path: ast.parse(_source(path) + planted)
  )
  assert len(messages) == 2, messages
  assert "['matplotlib.pyplot', 'yaml']" in messages[0] and "DISTRIBUTIONS" in messages[0] and src in messages[0]
  assert "{'sklearn': 'scikit-learn'}" in messages[1] and "runner_outputs_checkpoints" in messages[1]
  found, unknown = third_party_imports("tests/runner/test_planted.py", ast.parse("from testlib import paths"))
  assert (found, unknown) == ({}, [])
  assert third_party_imports("benchmarks/planted.py", ast.parse("from testlib import paths")) == ({}, ["testlib"])


def test_setup_py_declares_the_extras_of_the_design(tmp_path):
  declared = _declared_requirements(tmp_path)
  assert {"tensorflow", "absl-py", "ml-collections"} <= set(declared[""])
  assert {"pytest", "portpicker", "tensorboard"} <= set(declared["test"])
  assert declared["examples"] == ["scikit-learn"]
  assert declared["tpu"] == ["tensorflow-tpu"]
  assert declared["tensorboard"] == ["tensorboard", "tensorboard-plugin-profile"]
  assert declared["ray"] == ["ray"] and "ray" in declared["test"]


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
  assert (
      declared == imported
  ), f"{name}: deps lack {sorted(imported - declared)} and need not list {sorted(declared - imported)}"


def find_cycle(targets):
  """Returns one dependency cycle of `targets` as a list of names (first == last), or None."""
  graph = {name: [label[1:] for label in target["deps"]] for name, target in targets.items()}
  visiting, done = [], set()

  def visit(name):
    if name in visiting:
      return visiting[visiting.index(name) :] + [name]
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
