"""What a TPU rejects that a CPU accepts: the dtypes, shapes and ops of a TPU step, checked on a CPU.

A TPU runs each replica's step as one XLA program: it receives dense
tensors of static shape from the host (the input batch) and computes with
ops whose output shapes are known when the program is compiled. A CPU is
more forgiving: TensorFlow runs strings, ragged tensors and Python there,
and XLA on a CPU even compiles ops whose output shape depends on the data
(`tf.unique`, `tf.boolean_mask`), which a TPU program cannot hold. The rules:

- a tensor reaching the device (each part of a dataset element) is a dense
  tensor of static shape and of a dtype in `TPU_DTYPES`;
- no op of a replica step runs Python (`PYTHON_OPS`), has a data-dependent
  output shape (`DATA_DEPENDENT_SHAPE_OPS`), or makes a tensor of a dtype a
  TPU does not compute in (`NOT_TPU_DTYPES`: strings, 64-bit floats).

int64 passes: XLA emulates it on a TPU with pairs of 32-bit words (exact,
slower), and integer features read from TFRecords arrive as int64; cast them
to int32 in the input pipeline for speed. float64 does not: a TPU has no
64-bit floating point, and XLA's emulation covers only some ops.
"""

from collections.abc import Iterable, Iterator, Mapping, Sequence
import re
from typing import Any

import tensorflow as tf

from runner.data import checks as data_checks
from strategies import tensorflow_workarounds

# Dtypes a TPU computes in and takes from the host (int64 and uint64 emulated with 32-bit words).
TPU_DTYPES = (
    tf.bfloat16,
    tf.float16,
    tf.float32,
    tf.complex64,
    tf.bool,
    tf.int8,
    tf.int16,
    tf.int32,
    tf.int64,
    tf.uint8,
    tf.uint16,
    tf.uint32,
    tf.uint64,
)
# Dtypes an op of a TPU step must not make, and why; the fix for a dataset element.
NOT_TPU_DTYPES = {
    tf.string: (
        "a TPU has no strings",
        "map strings to numbers in the input pipeline (e.g. keras.layers.StringLookup or "
        "tf.strings.to_hash_bucket_fast in dataset.map)",
    ),
    tf.float64: ("a TPU has no 64-bit floating point", "cast to float32 (or bfloat16) in the input pipeline"),
    tf.complex128: ("a TPU has no 64-bit floating point", "cast to complex64 in the input pipeline"),
}
# Op type -> the TensorFlow API that makes it. A TPU program cannot call back into Python.
PYTHON_OPS = {
    "EagerPyFunc": "tf.py_function",
    "PyFunc": "tf.numpy_function",
    "PyFuncStateless": "tf.numpy_function(stateful=False)",
}
# Op type (without a version suffix such as V2) -> the API that makes it. Their output shapes depend on the data.
DATA_DEPENDENT_SHAPE_OPS = {
    "Where": "tf.boolean_mask, or tf.where with one argument",
    "Unique": "tf.unique",
    "UniqueWithCounts": "tf.unique_with_counts",
    "DynamicPartition": "tf.dynamic_partition",
    "ListDiff": "tf.compat.v1.setdiff1d",
    "NonMaxSuppression": "tf.image.non_max_suppression",
    "DenseToDenseSetOperation": "tf.sets",
    "DenseToSparseSetOperation": "tf.sets",
}
# A composite tensor in a dataset element -> how to make it dense.
_COMPOSITE_FIXES = {
    tf.RaggedTensorSpec: (
        " Pad or truncate it to a fixed length in the input pipeline (e.g. ragged.to_tensor(shape=[N]) after "
        "ragged[:N])."
    ),
    tf.SparseTensorSpec: " Make it dense in the input pipeline (tf.sparse.to_dense with a fixed dense_shape).",
}
_ELEMENT_PARTS = ("features", "labels", "sample_weight")
_VERSION = re.compile(r"V\d+$")
_UNIQUIFIED = re.compile(r"_\d+$")  # TensorFlow makes a reused name scope 'dense' into 'dense_1'.


def element_problem(element_spec: Any, data_name: str) -> str | None:
  """Returns what a TPU would reject in a dataset element, or None.

  Args:
    element_spec: the spec of one unbatched element, `(features, labels)` or
      `(features, labels, sample_weight)`.
    data_name: the data in messages, e.g. 'the training data'.

  Returns:
    None, or one sentence naming the part of the element (e.g. "the training
    data's features['title']"), what a TPU rejects in it, and the fix.
  """
  for part, spec in zip(_ELEMENT_PARTS, element_spec):
    for path, leaf in data_checks.leaves(spec):
      where = f"{data_name}'s {part}{path}"
      if not isinstance(leaf, tf.TensorSpec):
        fix = _COMPOSITE_FIXES.get(type(leaf), "")
        kind = ("tf." if fix else "") + type(leaf).__name__.removesuffix("Spec")  # E.g. TF-GNN's GraphTensor.
        return f"{where} is a {kind} ({leaf}): a TPU takes only dense tensors of static shape.{fix}"
      if leaf.dtype not in TPU_DTYPES:
        reason, fix = NOT_TPU_DTYPES.get(leaf.dtype, (f"a TPU does not take {leaf.dtype.name}", "cast it"))
        names = ", ".join(dtype.name for dtype in TPU_DTYPES)
        return f"{where} is {leaf.dtype.name}: {reason}; {fix}. TPU dtypes: {names}."
      if not leaf.shape.is_fully_defined():
        return (
            f"{where} has shape {_shape(leaf.shape)}: a TPU compiles each step for static shapes, so every "
            "example must have the same shape. Pad or truncate to a fixed shape in the input pipeline (or "
            "tf.ensure_shape where the shape is known)."
        )
  return None


def op_problem(traced: Iterable[tuple[Any, Sequence[Any]]], model: Any, step_name: str) -> str | None:
  """Returns what a TPU would reject among the ops of a replica step, or None.

  Args:
    traced: `(graph, ops)` pairs: the ops a replica step added to a graph
      being traced; the functions they call (XLA clusters, loops, branches)
      are searched too.
    model: the Keras model, to name the layer an op came from.
    step_name: the step in messages, e.g. 'the train step'.

  Returns:
    None, or one sentence naming the first offending op, the API that makes
    it, where it came from (a layer of the model, or the loss, metrics or
    optimizer outside it) and the fix.
  """
  layers = _layers_by_name(model)
  for op in walk(traced):
    where = _location(op, layers)
    if op.type in PYTHON_OPS:
      return (
          f"{step_name} runs op {op.type} ({PYTHON_OPS[op.type]}) {where}: it calls Python, which a TPU "
          "program cannot. Write it with TensorFlow ops, or do the Python work in the input pipeline."
      )
    if (api := DATA_DEPENDENT_SHAPE_OPS.get(_VERSION.sub("", op.type))) is not None:
      shapes = ", ".join(_shape(t.shape) for t in op.outputs)
      return (
          f"{step_name} runs op {op.type} ({api}) {where}: its output shape "
          f"{shapes} depends on the data, and a TPU compiles each step for static shapes. Keep the shape "
          "fixed, e.g. multiply by a 0/1 mask (tf.where(mask, x, 0)) instead of dropping elements."
      )
    for output in op.outputs:
      if output.dtype in NOT_TPU_DTYPES and not _only_asserted(output):
        reason, _ = NOT_TPU_DTYPES[output.dtype]
        return (
            f"{step_name} makes a {output.dtype.name} tensor in op {op.type} {where}: {reason}. Compute in "
            "float32, bfloat16 or int32, and do string work in the input pipeline."
        )
  return None


def walk(traced: Iterable[tuple[Any, Sequence[Any]]]) -> Iterator[Any]:
  """Yields the ops of `traced`, `(graph, ops)` pairs, and of the functions they call, recursively.

  The ops come in the order they were made, the ops of a called function
  (an XLA cluster, a loop body or condition, a branch) right after its call.
  """
  seen = set()

  def ops_of(graph: Any, ops: Sequence[Any]) -> Iterator[Any]:
    for op in ops:
      yield op
      for value in op.node_def.attr.values():  # The functions `op` calls.
        for name in [value.func.name] if value.HasField("func") else [f.name for f in value.list.func]:
          body = tensorflow_workarounds.called_function_graph(graph, name)
          if body is not None and name not in seen:
            seen.add(name)
            yield from ops_of(body, body.get_operations())

  for graph, ops in traced:
    yield from ops_of(graph, ops)


def _layers_by_name(model: Any) -> dict[str, Any]:
  """{name: layer} for the model and the layers of its (nested) models; a layer's own sublayers go by its name."""
  layers, todo = {}, [model]
  while todo:
    layer = todo.pop()
    if layer.name not in layers:
      layers[layer.name] = layer
      todo.extend(getattr(layer, "layers", ()))
  return layers


def _location(op: Any, layers: Mapping[str, Any]) -> str:
  """Where `op` came from: the innermost layer in its name scope, else outside the model's layers."""
  for scope in reversed(op.name.split("/")[:-1]):
    for name in (scope, _UNIQUIFIED.sub("", scope)):
      if name in layers:
        layer = layers[name]
        return f"in layer {name!r} ({type(layer).__name__}) of the model"
  return f"outside the model's layers (in the task's loss, a metric or the optimizer; op name {op.name!r})"


def _only_asserted(tensor: Any) -> bool:
  """Whether only Assert ops read `tensor` (their messages): XLA drops Assert, so its strings never reach a TPU."""
  return all(consumer.type == "Assert" for consumer in tensor.consumers())


def _shape(shape: Any) -> str:
  return str(tuple(shape.as_list())) if shape.rank is not None else "(unknown rank)"
