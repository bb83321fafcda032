"""TFDS datasets by name (`config.data.name = 'tfds:NAME'`): a prepared split read as `TFRecordFiles`.

TFDS prepares a dataset once into a data directory (`tfds build NAME --data_dir=DIR`); a run reads it there
and downloads nothing. The builder's info (`tfds.builder(NAME, data_dir=...)`) gives a split's files and
their example counts (`info.splits[SPLIT].file_instructions`, TFDS's API for reading its files in one's own
pipeline; a slice such as 'train[90%:]' is a part of some files), and `info.features.deserialize_example`
decodes a record as `tfds.load` would. So the stream is `TFRecordFiles`': sharded by file as
`tfds.ReadConfig(input_context=...)` shards (pipeline i of n reads files i, i + n, ...; by example where a
split has fewer files than pipelines, or with `config.data.sharding='data'`), each epoch in the files' order,
and resumed at any step in constant time from TFDS's counts: nothing is counted, and no file of a round before
the position is opened. A damaged file is the same one-line `DataError` as for `TFRecordFiles`.
"""

from collections.abc import Callable, Sequence
import os
from typing import Any

import tensorflow as tf
import tensorflow_datasets as tfds

from runner.data import providers
from strategies.checks import did_you_mean
from strategies.errors import ConfigError


class TFDSFiles(providers.TFRecordFiles):
  """The files of a TFDS split (or of a slice of one) as `TFRecordFiles`, with TFDS's example counts.

  Each file is read from the first to the last example its file instruction
  takes (`skip`, `take`); the counts a resumed stream starts from are the
  instructions', known without reading a file.
  """

  def __init__(self, instructions: Sequence[Any], parse_fn: Callable[[tf.Tensor], Any], *, what: str) -> None:
    """Checks that every file of `instructions` (TFDS `FileInstruction`s) exists; `what` names the split.

    Raises:
      DataError: a file is missing.
    """
    paths = [os.fspath(instruction.filename) for instruction in instructions]
    try:
      super().__init__(paths, parse_fn)
    except ConfigError:  # Not one of them is there.
      self.files = []
    missing = sorted(set(paths) - set(self.files))
    if missing:
      raise providers.DataError(
          f"{what}: {len(missing)} of its {len(paths)} file(s) are missing, e.g. {missing[0]!r}; prepare the "
          "dataset again (download_and_prepare)."
      )
    self.file_pattern = what  # How messages name the files.
    slices = {path: (instruction.skip, instruction.take) for path, instruction in zip(paths, instructions)}
    self._skips, self._takes = ([slices[path][i] for path in self.files] for i in (0, 1))

  def record_counts(self, files: Sequence[str]) -> list[int]:
    """As `TFRecordFiles.record_counts`, from TFDS's counts: nothing is read."""
    return [self._takes[self.files.index(path)] for path in files]

  def _has_records(self, files: Sequence[str], at_least: int) -> bool:
    return sum(self.record_counts(files)) >= at_least

  def _records(self, path: Any) -> tf.data.Dataset:
    """The examples of the file `path` (a string or a scalar string tensor) that its instruction takes."""
    index = tf.argmax(tf.cast(tf.equal(tf.constant(self.files), path), tf.int32))
    skip, take = (tf.gather(tf.constant(values, tf.int64), index) for values in (self._skips, self._takes))
    return tf.data.TFRecordDataset(path).skip(skip).take(take)  # TFDS writes no compressed files.


def dataset(config: Any, split: str, preprocess: Callable[..., Any] | None = None) -> TFDSFiles:
  """Returns the split of the TFDS dataset that `config.name` ('tfds:NAME') names, prepared in `config.tfds_data_dir`.

  Args:
    config: `config.data` with the fields of 'tfds:NAME' (docs/config.md).
    split: 'train' (`config.train_split`) or 'eval' (`config.eval_split`).
    preprocess: None, or `fn(features, labels)` applied to each example, returning
      `(features, labels[, sample_weight])`.

  Raises:
    ConfigError: TFDS has no dataset NAME (or not that version or config), it is not prepared
      in the data directory (the message gives the command that prepares it) or not as TFRecord files, the split does
      not exist (the message lists the splits), or a key is not one of the dataset's features (the
      message lists them), or no keys are given and the dataset has no supervised keys.
  """
  name, data_dir = config.name.partition(":")[2], config.tfds_data_dir
  where = data_dir or "TFDS's default data_dir"

  def prepare(**options: str) -> str:
    """The command that prepares the dataset in data_dir."""
    arguments = "".join(f", {key}={value!r}" for key, value in {"data_dir": data_dir, **options}.items() if value)
    return f'`python -c "import tensorflow_datasets as tfds; tfds.builder({name!r}{arguments}).download_and_prepare()"`'

  try:
    builder = tfds.builder(name, data_dir=data_dir)
  except tfds.core.DatasetNotFoundError:  # Neither TFDS's nor prepared in data_dir, or not in that version or config.
    base = name.split(":")[0].split("/")[0]
    prepared = sorted(  # 'NAME/VERSION' or 'NAME/CONFIG/VERSION'.
        os.path.relpath(os.path.dirname(path), data_dir)
        for depth in ("*/*", "*/*/*")
        for path in (tf.io.gfile.glob(os.path.join(data_dir, depth, "dataset_info.json")) if data_dir else [])
    )
    known = tfds.list_builders(with_community_datasets=False) + [variant.split("/")[0] for variant in prepared]
    raise ConfigError(
        f"config.data.name={config.name!r}: TFDS has no dataset {name!r}, and none is prepared in {where}."
        f"{did_you_mean(base, known) if base not in known else ''}"
        + (f" Prepared there: {', '.join(prepared) or 'none'}." if data_dir else "")
    ) from None
  except (AssertionError, ValueError) as e:  # A version or config the dataset does not have.
    raise ConfigError(f"config.data.name={config.name!r}: {' '.join(str(e).split())}") from None
  if not builder.is_prepared():
    tfds_build = f"tfds build {name}" + (f" --data_dir={data_dir}" if data_dir else "")
    raise ConfigError(
        f"The TFDS dataset {name!r} is not prepared in {where} (a run downloads nothing): prepare it with "
        f"{prepare()} (or `{tfds_build}`, which needs apache-beam)."
    )
  info, field = builder.info, "train_split" if split == "train" else "eval_split"
  if info.file_format not in (None, tfds.core.FileFormat.TFRECORD):
    raise ConfigError(
        f"The TFDS dataset {name!r} is stored as {info.file_format.value} files; a run reads TFDS's default, "
        f"tfrecord: prepare it so with {prepare(file_format='tfrecord')}."
    )
  try:
    files = info.splits[config[field]].file_instructions
  except (KeyError, ValueError) as e:
    raise ConfigError(
        f"config.data.{field}={config[field]!r} is not a split of {name!r} ({' '.join(str(e).split())}); its splits: "
        f"{', '.join(info.splits)} (slices such as 'train[90%:]' and sums such as 'train+test' work too)."
    ) from None
  keys = _keys(info, config.feature_key, config.label_key, name)
  features = info.features

  def parse(record: tf.Tensor) -> Any:
    example = features.deserialize_example(record)
    element = tf.nest.map_structure(lambda key: example[key], keys)
    return preprocess(*element) if preprocess else element

  return TFDSFiles(files, parse, what=f"{config.name} split {config[field]!r}")


def _keys(info: Any, feature_key: str | None, label_key: str | None, name: str) -> Any:
  """The keys of the features and the labels: those given, else the dataset's supervised keys.

  Raises:
    ConfigError: a key given is not a feature, or a key is not given and the dataset has no supervised keys.
  """
  names = sorted(info.features.keys())
  for field, key in (("feature_key", feature_key), ("label_key", label_key)):
    if key is not None and key not in names:
      raise ConfigError(
          f"config.data.{field}={key!r} is not a feature of {name!r}.{did_you_mean(key, names)} Its features: "
          f"{', '.join(names)}."
      )
  if info.supervised_keys is None:
    if feature_key is None or label_key is None:
      raise ConfigError(
          f"The TFDS dataset {name!r} has no supervised keys: set config.data.feature_key and config.data.label_key "
          f"to two of its features: {', '.join(names)}."
      )
    return feature_key, label_key
  supervised = info.supervised_keys
  return (
      supervised[0] if feature_key is None else feature_key,
      supervised[1] if label_key is None else label_key,
      *supervised[2:],
  )
