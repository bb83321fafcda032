"""The data path: input providers, the checks of the user's data, and the pipeline to per-replica batches.

Public here (PEP 562, loaded on first use): `DatasetProvider` (the interface, from `runner.interfaces`), its providers
`DatasetShards`, `InMemory`, `FromFunction` and `TFRecordFiles`, and `DataError`.
"""

from strategies import lazy_names

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
