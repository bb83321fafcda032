"""Vertex AI's output directories (the metric its tuning reads: `runner.outputs.hypertune`).

A Vertex AI custom job with a base output directory (and each trial of a
hyperparameter tuning job) names, in every replica, where its outputs go:
`AIP_CHECKPOINT_DIR`, `AIP_TENSORBOARD_LOG_DIR` and `AIP_MODEL_DIR`. A run
given no workdir (`runner.run(config)`, the command line without `--workdir`)
follows them (`output_dirs`): each one set takes the outputs it names, as
any other remote workdir (`gs://`, through `tf.io.gfile`); unset, those stay
where they are without it.
"""

import os
from typing import NamedTuple
import uuid

import tensorflow as tf

from strategies.errors import ConfigError
from strategies.errors import first_line

# The variables, the `OutputDirs` field each sets and what goes there.
_VARIABLES = {
    "AIP_CHECKPOINT_DIR": ("workdir", "the workdir: config.json, metrics.jsonl, checkpoints/"),
    "AIP_TENSORBOARD_LOG_DIR": ("summary_dir", "the TensorBoard summaries: train/, eval/"),
    "AIP_MODEL_DIR": ("export_dir", "the SavedModel exported when training ends"),
}


class OutputDirs(NamedTuple):
  """Where a run's outputs go; None: the default without Vertex (see the fields).

  Attributes:
    workdir: `AIP_CHECKPOINT_DIR`: the workdir (config.json,
      config_history.jsonl, metrics.jsonl, checkpoints/, best/, exports/);
      None: a new temporary directory.
    summary_dir: `AIP_TENSORBOARD_LOG_DIR`: the TensorBoard summaries
      (`train/`, `eval/`); None: `WORKDIR/summaries`.
    export_dir: `AIP_MODEL_DIR`: the SavedModel a training run exports when
      it ends (and mode 'export' writes); None: no export after training,
      mode 'export' writes `WORKDIR/export`.
    variables: `{variable: path}` of the Vertex variables these come from.
  """

  workdir: str | None = None
  summary_dir: str | None = None
  export_dir: str | None = None
  variables: dict[str, str] = {}

  def describe(self) -> list[str]:
    """One line per Vertex variable in use: its name, its path and what goes there."""
    return [f"{name}={path}: {_VARIABLES[name][1]}" for name, path in self.variables.items()]


def output_dirs(workdir: str | None) -> OutputDirs:
  """`OutputDirs(workdir)` for a workdir given; without one, those the Vertex variables set (unset or empty: None)."""
  if workdir is not None:
    return OutputDirs(workdir)
  variables = {name: os.environ[name] for name in _VARIABLES if os.environ.get(name)}
  return OutputDirs(**{_VARIABLES[name][0]: path for name, path in variables.items()}, variables=variables)


def check_writable(dirs: OutputDirs) -> None:
  """Makes each Vertex directory in `dirs` and checks that a file can be written there.

  Raises:
    ConfigError: one cannot be made or written; the message names its variable and path.
  """
  for name, path in dirs.variables.items():
    probe = os.path.join(path, f".write-test-{uuid.uuid4().hex}")
    try:
      tf.io.gfile.makedirs(path)
      with tf.io.gfile.GFile(probe, "w") as f:
        f.write("")
      tf.io.gfile.remove(probe)
    except (tf.errors.OpError, OSError) as e:
      reason = first_line(getattr(e, "message", None) or str(e))
      raise ConfigError(
          f"{name}={path!r} cannot be written ({reason}); the run puts its outputs there when no workdir is "
          "given: fix the job's output directory, or give --workdir."
      ) from None
