"""The data path: input providers, the checks of the user's data, and the pipeline to per-replica batches.

Public here (PEP 562, loaded on first use): `DatasetProvider` (the interface, from `runner.interfaces`), its providers
`DatasetShards`, `InMemory`, `FromFunction` and `TFRecordFiles`, and `DataError`.
"""

import typing

from strategies import lazy_names

if typing.TYPE_CHECKING:  # The type checker sees the public names with their types; at run time they load lazily.
  from runner.data.providers import DataError as DataError
  from runner.data.providers import DatasetShards as DatasetShards
  from runner.data.providers import FromFunction as FromFunction
  from runner.data.providers import InMemory as InMemory
  from runner.data.providers import TFRecordFiles as TFRecordFiles
  from runner.interfaces import DatasetProvider as DatasetProvider

_PUBLIC = {
    "DataError": "runner.data.providers",
    "DatasetProvider": "runner.interfaces",
    "DatasetShards": "runner.data.providers",
    "FromFunction": "runner.data.providers",
    "InMemory": "runner.data.providers",
    "TFRecordFiles": "runner.data.providers",
}
__all__ = sorted(_PUBLIC)

__getattr__, __dir__ = lazy_names.module_hooks(__name__, _PUBLIC)
