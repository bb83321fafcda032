"""The sharding policies of input pipelines, the values of `config.data.sharding` and a provider's `sharding`.

'file': pipeline i of n reads files i, i + n, ...; 'data': every pipeline
reads everything and keeps examples i, i + n, ...; 'auto': 'file' when there
are at least as many files as pipelines, else 'data'. Data without files is
sharded by example whatever the policy. Imports no TensorFlow, so the config
checks use it before TensorFlow loads; the providers are in `runner.data`.
"""

SHARDING = ("auto", "file", "data")
