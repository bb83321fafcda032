"""A package's public names loaded on first use (PEP 562), so that importing the package imports nothing heavy."""

from collections.abc import Callable, Mapping
import importlib
import sys
from typing import Any


def module_hooks(package: str, public: Mapping[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
  """Returns the module-level `(__getattr__, __dir__)` for `package` that load its `public` names on first use.

  Args:
    package: the package's name (its `__name__`).
    public: each public name -> the module that defines it; a submodule's
      own name maps to itself (e.g. `"data": "runner.data"`).
  """

  def __getattr__(name: str) -> Any:  # noqa: N807
    if name not in public:
      raise AttributeError(f"module {package!r} has no attribute {name!r}")
    module = importlib.import_module(public[name])
    value = module if public[name] == f"{package}.{name}" else getattr(module, name)
    setattr(sys.modules[package], name, value)  # Later lookups find it without this hook.
    return value

  def __dir__() -> list[str]:  # noqa: N807
    return sorted(set(vars(sys.modules[package])) | set(public))

  return __getattr__, __dir__
