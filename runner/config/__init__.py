"""The run config: its schema, loading and checks (`run_config`), and the names it resolves to functions (`registry`).

`runner.config.default_config()`, `validate(config)` and `load_config(path, overrides)` are `run_config`'s.
"""

from runner.config.run_config import default_config as default_config
from runner.config.run_config import load_config as load_config
from runner.config.run_config import validate as validate
