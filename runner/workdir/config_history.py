"""The run's config in its workdir: the latest one, every one with the step it started at, and what a rerun may change.

`config.json` holds the latest resolved config; `config_history.jsonl` one
JSON object per run: `{"step": the global step it started at, "mode": ...,
"changed": {field: [old, new], ...}, "data_spec": ..., "config": {...}}`.
Both are written only once a run's config is valid and its checkpoint
restored, so a run that fails before that leaves them as they were, and
each is replaced whole (`atomic_files`), never left half-written.

A rerun on a workdir with checkpoints may change how training goes on
(learning rate, steps, evaluation cadence, ...), but not what the checkpoint
holds: the fields in `CHECKPOINT_FIELDS` and the shapes of the training data.
"""

from collections.abc import Mapping
import json
import os
from typing import Any

from absl import logging
import tensorflow as tf

from runner.workdir import atomic_files
from strategies.errors import ConfigError

CONFIG_FILE = "config.json"
HISTORY_FILE = "config_history.jsonl"
# A checkpoint depends on these: a whole section, or one field. Changing them on a workdir with a checkpoint fails.
CHECKPOINT_FIELDS = ("model", "task", "data.name", "optimizer.name", "optimizer.ema_momentum", "trainer.precision")


def latest(workdir: str) -> dict[str, Any] | None:
  """Returns the latest recorded run of `workdir` (a history entry as a dict), or None."""
  lines = [line for line in read_text(os.path.join(workdir, HISTORY_FILE)).splitlines() if line.strip()]
  return json.loads(lines[-1]) if lines else None


def changes(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, list[Any]]:
  """Returns `{dotted field: [old, new]}` for every leaf field that differs between two config dicts."""
  old, new = _flat(_plain(before)), _flat(_plain(after))
  return {
      field: [old.get(field), new.get(field)]
      for field in sorted(set(old) | set(new))
      if old.get(field) != new.get(field)
  }


def check_resumable(previous: Mapping[str, Any] | None, config: Any, data_spec: str, checkpoint: str | None) -> None:
  """Fails when `config` would resume `checkpoint` with something the checkpoint depends on changed.

  Args:
    previous: the workdir's latest recorded run (`latest`), or None.
    config: this run's resolved config (a ConfigDict).
    data_spec: the element spec of this run's training data, as a string.
    checkpoint: the workdir's latest checkpoint path, or None (then any change is fine).

  Raises:
    ConfigError: naming each changed field, its old and new value, and the
      way out (the old values, or a new workdir).
  """
  if previous is None or checkpoint is None:
    return
  blocked = {
      field: values
      for field, values in changes(previous["config"], config.to_dict()).items()
      if any(field == f or field.startswith(f + ".") for f in CHECKPOINT_FIELDS)
  }
  if previous.get("data_spec") not in (None, data_spec):
    blocked["training data elements"] = [previous["data_spec"], data_spec]
  if blocked:
    listed = "; ".join(f"{field}: {old!r} -> {new!r}" for field, (old, new) in blocked.items())
    raise ConfigError(
        f"The workdir's checkpoint {os.path.basename(checkpoint)} was trained with another model, task, optimizer, "
        f"precision or data ({listed}). Rerun with the values it was trained with, or use a new --workdir."
    )


def record(workdir: str, config: Any, *, step: int, data_spec: str, previous: Mapping[str, Any] | None) -> None:
  """Writes `config.json` and appends this run to `config_history.jsonl`; logs what changed in one line.

  Call it on the chief only.

  Args:
    workdir: the run's directory.
    config: the resolved config (a ConfigDict).
    step: the global step the run starts at.
    data_spec: the element spec of the training data, as a string (or None).
    previous: the workdir's latest recorded run, or None.

  Raises:
    ConfigError: a file could not be written (naming the OS error); then
      neither file was changed.
  """
  values = _plain(config.to_dict())
  changed = changes(previous["config"], values) if previous else {}
  if changed:
    listed = ", ".join(f"{field} {old!r} -> {new!r}" for field, (old, new) in changed.items())
    logging.info(f"Resuming at step {step} with a changed config: {listed}.")
  entry = {"step": step, "mode": values.get("mode"), "changed": changed, "data_spec": data_spec, "config": values}
  history = os.path.join(workdir, HISTORY_FILE)
  try:
    atomic_files.replace_all(
        {
            history: read_text(history) + json.dumps(entry, sort_keys=True) + "\n",
            os.path.join(workdir, CONFIG_FILE): json.dumps(values, indent=2, sort_keys=True) + "\n",
        }
    )
  except (OSError, tf.errors.OpError) as e:
    raise ConfigError(
        f"Could not write the run's {CONFIG_FILE} and {HISTORY_FILE} in {workdir} "
        f"({getattr(e, 'message', None) or e}); neither was changed: free some space or fix the "
        "permissions, then run again."
    ) from None


def read_text(path: str) -> str:
  """The text of the file at `path` (local or remote); '' if there is none."""
  if not tf.io.gfile.exists(path):
    return ""
  with tf.io.gfile.GFile(path) as f:
    return f.read()


def _plain(values: Any) -> Any:
  """The config dict as JSON has it (tuples become lists), so that old and new compare alike."""
  return json.loads(json.dumps(values))


def _flat(values: Any, prefix: str = "") -> dict[str, Any]:
  flat = {}
  for key, value in values.items():
    if isinstance(value, dict):
      flat.update(_flat(value, f"{prefix}{key}."))
    else:
      flat[f"{prefix}{key}"] = value
  return flat
