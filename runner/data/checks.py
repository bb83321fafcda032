"""The user's data against the model and the task: each mistake found is one `DataError` line.

What is checked, and when:
- once per dataset, from its element spec alone, before the model is built or
  a step traced (`check_features`): a dataset that is already batched, ragged
  or variable-length features where the model needs a fixed shape, and
  features whose shape does not fit the model's input; and several features
  (a dict, a tuple) for a `keras.Sequential` model, which takes one tensor
  (`check_one_tensor_for_sequential`);
- once per dataset, from the element spec and the model's outputs
  (`label_range`): labels the task cannot score, as the task says
  (`runner.Task.check_labels`), and the range their values must lie in;
- in every step, from the batch's smallest and largest label (a few scalar
  ops, reduced with the loss; see `runner.training.loops`): a label outside that range,
  such as a class id the model has no output for. The step stops training;
  `step_error` then reads the data again to name an example and its label;
- at the step that meets it, a file that cannot be read or a record that
  cannot be parsed (`step_error`): for `runner.data.TFRecordFiles`, the file
  and the record are found by reading the files again, on this error path
  only. Data read before the first step (whether it holds a record; the
  record counts a resume starts from) fails the same way, at the first step;
- evaluation data that holds no examples (`no_evaluation_examples_error`):
  before training where that is known cheaply (`providers.holds_no_examples`),
  else when an evaluation counts none.

Values that are not finite are found inside the step (see `runner.training.loops`).
"""

from collections.abc import Callable, Iterator, Sequence
import re
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from runner.data import providers as data_lib
from strategies.errors import ConfigError

DataError = data_lib.DataError


class LabelsOutOfRangeError(DataError):
  """A batch held a label outside the range the task gave (`label_range`), found inside a compiled loop.

  The loop can tell only that some label was outside, and at which step; the
  Trainer replaces this error by `step_error`'s, which names the label.

  Attributes:
    step: the training step whose batch held it (None: an evaluation's).
  """

  def __init__(self, step: int | None) -> None:
    where = "an evaluation batch" if step is None else f"the batch of step {step}"
    super().__init__(f"A label outside the valid range in {where}.")
    self.step = step


_READ_AT_ONCE = 4096  # Records (or labels) per batch where the data is read again to name a mistake.
_LABELS_READ = 1_000_000
_ANNOTATIONS = re.compile(r"\{\{[^}]*\}\}|\[Op:[^\]]*\].*$")
_PARSER_REASON = re.compile(  # The reasons of TensorFlow's Example parser.
    r"(Feature|Key): [^\n]*(required but could not be found|Data types don't match|"
    r"Can't parse serialized Example|values != expected)[^\n]*"
)
_BATCHED = (
    "The Trainer batches the data itself; return an unbatched dataset of one example per element (drop the "
    ".batch(...))."
)
_PAD = "Pad or cut them to a fixed length in the dataset (e.g. ragged.to_tensor(shape=[N]) or tf.sparse.to_dense)."
# First layers of a keras.Sequential model that take one tensor (the built-in models start with Flatten).
_ONE_TENSOR_LAYERS = (
    keras.layers.Flatten,
    keras.layers.Dense,
    keras.layers.Conv1D,
    keras.layers.Conv2D,
    keras.layers.Conv3D,
    keras.layers.Embedding,
)


def declared_features_spec(model: Any) -> Any:
  """Returns the per-example features spec a model declares (`keras.Input`), or None.

  A nest like the model's inputs, each a `tf.TensorSpec` (or, for a tf_keras
  `Input(type_spec=...)`, a composite spec) without the batch dimension; None
  for a model that builds from its first batch.
  """
  try:
    structure = model.input  # A functional model's inputs, in their structure (a dict, a list, a tensor).
  except (AttributeError, ValueError):
    structure = None
  if structure is None:
    inputs = getattr(model, "inputs", None)  # A Sequential model with keras.Input: a list of one.
    if not inputs:
      return None
    structure = inputs[0] if len(inputs) == 1 else list(inputs)

  def per_example(symbolic_input: Any) -> Any:
    batched = getattr(symbolic_input, "type_spec", None)  # tf_keras; Keras 3's inputs are dense.
    if batched is None or not is_composite(batched):
      return tf.TensorSpec(symbolic_input.shape[1:], symbolic_input.dtype)
    return tf.data.Dataset.from_generator(lambda: iter(()), output_signature=batched).unbatch().element_spec

  return tf.nest.map_structure(per_example, structure)


def check_features(element_spec: Any, expected: Any, *, purpose: str) -> None:
  """Checks the features of one element against what the model takes.

  Args:
    element_spec: the spec of one element, `(features, labels[, sample_weight])`.
    expected: the per-example features spec the model takes (declared, or the
      one it was built from), or None for a model that builds from its first
      batch and has not yet.
    purpose: what the data is for, e.g. "training".

  Raises:
    DataError: the dataset is batched, the features' structure or keys
      differ from the model's inputs, a feature is ragged or has a length
      that varies where the model needs a fixed one, or a feature's shape
      does not fit the model's input. The message names the element spec (or
      the keys) and the model's input.
  """
  features, where = element_spec[0], f"The {purpose} data"
  if all(
      isinstance(s, tf.TensorSpec) and s.shape.rank and s.shape[0] is None for s in tf.nest.flatten(element_spec[:2])
  ):
    raise DataError(
        f"{where} looks batched: every part of its elements has a first dimension of unknown size (element spec "
        f"{_spec(element_spec)}). {_BATCHED}"
    )
  if expected is None:
    for path, spec in leaves(features):
      if is_composite(spec):
        raise DataError(
            f"{where}'s features{path} are {_kind(spec)} ({_spec(spec)}), but the Trainer batches dense tensors of "
            f"one shape for a model that builds from its first batch. {_PAD[:-1]}, or declare "
            "the model's input (keras.Input(type_spec=...) in tf_keras), which may be composite."
        )
      if not spec.shape.is_fully_defined():
        raise DataError(
            f"{where}'s features{path} have shape {_shape(spec.shape)} per example, of varying length, and the "
            "model builds from its first batch, so it needs one fixed shape. Give every example the same shape "
            "in the dataset (pad or cut, then tf.ensure_shape), or declare the model's input with keras.Input."
        )
    return
  try:
    tf.nest.assert_same_structure(features, expected, check_types=False)
  except (ValueError, TypeError):
    raise DataError(
        f"{where}'s features are {_spec(features)} per example, but the model takes {_spec(expected)}: their "
        "structures differ."
    ) from None
  named, wanted = [path for path, _ in leaves(features)], [path for path, _ in leaves(expected)]
  if named != wanted:
    raise DataError(
        f"{where}'s features have the keys {_keys(named)}, but the model's inputs are named {_keys(wanted)}. Give "
        "the features the keys of the model's inputs in the dataset, or name the inputs as the features."
    )
  for (path, spec), want in zip(leaves(features), tf.nest.flatten(expected)):
    if is_composite(spec) or is_composite(want):
      if not (is_composite(spec) and is_composite(want) and want.is_compatible_with(spec)):
        pad = f" {_PAD}" if is_composite(spec) and not is_composite(want) else ""
        raise DataError(
            f"{where}'s features{path} are {_kind(spec)} ({_spec(spec)}) per example, but the model's input takes "
            f"{_kind(want)} ({_spec(want)}).{pad}"
        )
      continue
    got = f"{where}'s features{path} have shape {_shape(spec.shape)} per example"
    if spec.shape.rank == want.shape.rank + 1 and want.shape.is_compatible_with(spec.shape[1:]):
      raise DataError(
          f"{got}, one dimension more than the model's input {_shape(want.shape)}: the dataset looks batched. "
          + _BATCHED
      )
    if not want.shape.is_compatible_with(spec.shape):
      raise DataError(f"{got} (element spec {_spec(element_spec)}), but the model's input takes {_shape(want.shape)}.")
    if (spec.dtype == tf.string) != (want.dtype == tf.string):
      raise DataError(
          f"{where}'s features{path} are {spec.dtype.name}, but the model's input takes {want.dtype.name}. Convert "
          "them in the dataset (e.g. tf.strings.to_number), or give the model an input of that dtype."
      )
    if any(have is None and need is not None for have, need in zip(spec.shape, want.shape)):
      raise DataError(
          f"{got}, of varying length, but the model's input takes the fixed shape {_shape(want.shape)}. Pad or cut "
          "every example to that shape in the dataset (then tf.ensure_shape)."
      )


def check_one_tensor_for_sequential(element_spec: Any, model: Any, *, purpose: str) -> None:
  """Checks that a `keras.Sequential` model starting with a one-tensor layer gets one tensor of features.

  The built-in models start with `Flatten`; Keras fails deep inside it on a
  dict, tuple or list of features. A Sequential model whose first layer is
  another one (e.g. the user's own layer, which may take a dict) is not
  checked here.

  Raises:
    DataError: `model` is a `keras.Sequential` whose first layer is one of
      `_ONE_TENSOR_LAYERS`, and the features are a dict, tuple or list; the
      message names the model, the dict's keys (or the parts) and what to do.
  """
  features = element_spec[0]
  if not (
      isinstance(model, keras.Sequential)
      and model.layers
      and isinstance(model.layers[0], _ONE_TENSOR_LAYERS)
      and tf.nest.is_nested(features)
  ):
    return
  if isinstance(features, dict):
    got = f"a dict with the keys {', '.join(repr(key) for key in sorted(features))}"
  else:
    got = f"a {type(features).__name__} of {len(features)} part(s)"
  raise DataError(
      f"The {purpose} data's features are {got} ({_spec(features)} per example), but the model {model.name!r} is a "
      "keras.Sequential, which takes one tensor: combine the parts in the dataset (tf.concat after flattening each), "
      "or use a functional keras.Model with one keras.Input per part (as an import path in config.model.name)."
  )


def label_range(element_spec: Any, outputs_spec: Any, task: Any, *, purpose: str) -> Any:
  """Returns the task's `runner.tasks.LabelRange` for these labels and outputs, or None (no per-batch check).

  Raises:
    DataError: the task cannot score labels of this spec against these
      outputs (`Task.check_labels`); the message starts with the data's purpose.
    ConfigError: the task cannot score these outputs at all, whatever the
      labels (`Task.check_labels`' message does not start with "labels").
  """
  if outputs_spec is None:
    return None
  try:
    return task.check_labels(element_spec[1], outputs_spec)
  except ConfigError as e:
    if not str(e).startswith("labels"):
      raise
    raise DataError(f"The {purpose} data's {e}") from None


def features_expected(model: Any, features_spec: Any) -> Any:
  """The per-example features `model` takes, or None before it is built.

  They are the declared ones (`declared_features_spec`), or those of
  `features_spec` (a batch's) once the model was built from them.
  """
  declared = declared_features_spec(model)
  if declared is None and features_spec is not None and model.built:
    declared = tf.nest.map_structure(lambda s: tf.TensorSpec(s.shape[1:], s.dtype), features_spec)
  return declared


def no_evaluation_examples_error() -> DataError:
  """Returns the DataError for evaluation data that holds no example."""
  return DataError(
      "The evaluation data holds no examples: its loss and metrics would be zeros over 0 examples. Give it at least "
      "one example (under runner.run: what config.data's dataset returns for split 'eval'), or evaluate nothing "
      "(mode 'train')."
  )


def step_error(error: Exception, data: Any, valid_labels: Any, *, step: int | None, purpose: str) -> DataError:
  """Returns the DataError that `error`, raised while stepping through `data`, stands for; re-raises another error.

  The data is read again, on this error path only, to name what is wrong: a
  damaged TFRecord file and its first bad record (the files of a
  `runner.data.TFRecordFiles`, or those a plain `tf.data.TFRecordDataset`
  pipeline holds as constants in its graph); a record `parse_fn` rejects,
  its file and number with TensorFlow's reason (for a plain pipeline, the
  Example parser's reason); an example whose label is outside
  `valid_labels` (in the first `_LABELS_READ`).

  Args:
    error: a `tf.errors.DataLossError` (a file cannot be read), a
      `tf.errors.InvalidArgumentError` (a record cannot be parsed, or an op
      met a label outside the range), or a `LabelsOutOfRangeError`.
    data: the `runner.data.DatasetProvider` that was read.
    valid_labels: the `LabelRange` of the labels, or None.
    step: the step that met it (for evaluation: None).
    purpose: what the data is for, e.g. "training".
  """
  at = f" at step {step}" if step is not None else ""
  try:  # A damaged file, met here or while reading the data again, is named by the `except` below.
    if isinstance(error, tf.errors.DataLossError):
      raise error
    if isinstance(error, tf.errors.InvalidArgumentError):
      not_parsed = _parse_error(error, data, f"The {purpose} data cannot be parsed{at}")
      if not_parsed is not None:
        return not_parsed
    found = _first_label_outside(data, valid_labels)
  except tf.errors.DataLossError as damaged:
    bad = _first_failing(*_files_of(data))  # None: the file cannot be told; TensorFlow's reason alone.
    what = f"{bad[0]} is damaged at record {bad[1]} (counting from 0; {bad[2]})" if bad else _reason(damaged.message)
    return DataError(
        f"The {purpose} data cannot be read{at}: {what}. Replace or re-write that file, or leave it out of the data."
    )
  if found is None and not isinstance(error, LabelsOutOfRangeError):
    raise error  # Not a label outside the range (on a CPU, TensorFlow's loss op may raise for one).
  where = f"The {purpose} data's batch of step {step}" if step is not None else f"The {purpose} data"
  example = (
      f"example {found[0]} of the data (counting from 0) has label {found[1]}"
      if found
      else f"the first {_LABELS_READ:,} examples of the data have none, so it is further on"
  )
  return DataError(
      f"{where} holds a label outside the task's range: {example}, but labels must be {valid_labels.describe()}."
  )


def _first_label_outside(data: Any, valid_labels: Any) -> tuple[int, Any] | None:
  """Returns `(example number, label)` of the first label of `data` outside `valid_labels` (if any), or None."""
  if valid_labels is None:
    return None
  dataset = data.get_dataset(tf.distribute.InputContext())
  first = 0
  for batch in dataset.map(lambda *element: element[1]).take(_LABELS_READ).batch(_READ_AT_ONCE).as_numpy_iterator():
    values = batch.reshape(len(batch), -1)
    bad = (values < valid_labels.low) | (values >= valid_labels.high)
    if valid_labels.integer:
      bad |= values != np.floor(values)
    rows = np.flatnonzero(bad.any(axis=1))
    if rows.size:
      return first + int(rows[0]), values[rows[0]][bad[rows[0]]][0].item()
    first += len(batch)
  return None


def _parse_error(error: Exception, data: Any, where: str) -> DataError | None:
  """Returns the DataError for records that `data`'s parse function rejects, or None for another error.

  For `TFRecordFiles`, the file, the record and TensorFlow's reason (which names the feature); for another
  pipeline, the Example parser's reason and the files the dataset's graph names.
  """
  if isinstance(data, data_lib.TFRecordFiles):
    found = _first_failing(data.files, data.compression_type, data.parse_fn)
    if found is None:
      return None
    return DataError(
        f"{where}: {found[0]}, record {found[1]} (counting from 0): {found[2].rstrip('.')}. Write the files with "
        "the features parse_fn reads, or change the features it reads."
    )
  said = _PARSER_REASON.search(getattr(error, "message", str(error)))
  if said is None:
    return None
  files, _ = _files_of(data)
  in_files = f" in a record of {', '.join(files)}" if files else ""
  return DataError(
      f"{where}: TensorFlow's Example parser says{in_files}: {' '.join(said.group().split()).rstrip('.')}. Write the "
      "files with the features the parse function reads, or change the features it reads "
      "(runner.data.TFRecordFiles names the file and record)."
  )


def _files_of(data: Any) -> tuple[Sequence[str], str | None]:
  """Returns `(paths, compression type)` of the TFRecord files `data` reads, where they can be told; else ([], None).

  A `TFRecordFiles`' files; for other data, the existing files named by string
  constants in the graph of its dataset (a pipeline built on
  `tf.data.TFRecordDataset(files)` holds them so, in its main graph or its
  functions' graphs).
  """
  if isinstance(data, data_lib.TFRecordFiles):
    return data.files, data.compression_type
  variant = tf.data.experimental.to_variant(data.get_dataset(tf.distribute.InputContext()))
  try:
    graph = tf.compat.v1.GraphDef.FromString(tf.raw_ops.DatasetToGraphV2(input_dataset=variant).numpy())
  except (TypeError, ValueError, tf.errors.OpError):
    return [], None
  strings = []
  for node in [*graph.node, *(node for function in graph.library.function for node in function.node_def)]:
    if node.op == "Const" and node.attr["value"].tensor.dtype == tf.string.as_datatype_enum:
      strings += [value.decode(errors="replace") for value in tf.make_ndarray(node.attr["value"].tensor).ravel()]
  paths = [s for s in dict.fromkeys(strings) if ("/" in s or "." in s) and tf.io.gfile.exists(s)]
  compression_type = next((s for s in strings if s in ("GZIP", "ZLIB")), None)
  return [path for path in paths if not tf.io.gfile.isdir(path)], compression_type


def _first_failing(
    files: Sequence[str], compression_type: str | None, parse_fn: Callable[..., Any] | None = None
) -> tuple[str, int, str] | None:
  """Returns `(path, record number, TensorFlow's reason)` of the first record that cannot be read or parsed.

  Reads `files` in order, in batches, then the failing batch record by
  record: without `parse_fn` for the first record that cannot be read
  (`tf.errors.DataLossError`), with it for the first one it rejects
  (`tf.errors.InvalidArgumentError`). None when there is none.
  """
  error_type = tf.errors.DataLossError if parse_fn is None else tf.errors.InvalidArgumentError
  for path in files:
    records, good = tf.data.TFRecordDataset(path, compression_type=compression_type), 0
    try:
      for batch in (records if parse_fn is None else records.map(parse_fn)).batch(_READ_AT_ONCE):
        good += int(tf.shape(tf.nest.flatten(batch)[0])[0])
    except error_type:
      try:
        for record in records.skip(good):
          if parse_fn is not None:
            parse_fn(record)
          good += 1
      except error_type as e:
        return path, good, _reason(e.message)
  return None


def leaves(nest: Any, path: str = "") -> Iterator[tuple[str, Any]]:
  """Yields `(path, leaf)` for each leaf of a nest of dicts (keys sorted), tuples and lists.

  The path is '' for a single leaf, else like "['title']", "[0]" or "[0]['ids']".
  """
  if isinstance(nest, dict):
    for key in sorted(nest):
      yield from leaves(nest[key], f"{path}[{key!r}]")
  elif isinstance(nest, (list, tuple)):
    for index, part in enumerate(nest):
      yield from leaves(part, f"{path}[{index}]")
  else:
    yield path, nest


def _keys(paths: list[str]) -> str:
  """The paths of `leaves`, for messages: "'a', 'b'" for a dict's keys, "[0]['a'], ..." deeper."""
  return ", ".join(path[1:-1] if path.count("[") == 1 else path for path in paths)


def is_composite(spec: Any) -> bool:
  """Whether `spec` is the spec of a composite tensor (ragged, sparse, an extension type such as a GraphTensor)."""
  return not isinstance(spec, tf.TensorSpec)


def _kind(spec: Any) -> str:
  """'dense', 'ragged', 'sparse' or e.g. 'a GraphTensor', for messages."""
  if not is_composite(spec):
    return "dense"
  return {tf.RaggedTensorSpec: "ragged", tf.SparseTensorSpec: "sparse"}.get(
      type(spec), f"a {type(spec).__name__.removesuffix('Spec')}"
  )


def _shape(shape: Any) -> str:
  return str(tuple(shape.as_list())) if shape.rank is not None else "(unknown rank)"


def _spec(spec: Any) -> str:
  return str(spec).replace("\n", " ")


def _reason(message: str) -> str:
  """TensorFlow's reason in an error message, without its node and op annotations.

  A graph's error puts the reason last, after a 'Graph execution error:'
  header and the stack of the op that failed.
  """
  lines = [" ".join(_ANNOTATIONS.sub("", line).split()) for line in message.strip().splitlines()]
  lines = [line for line in lines if any(character.isalnum() for character in line)]  # Not a bare "[[]]".
  return lines[-1] if lines else "no reason given"
