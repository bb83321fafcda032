"""Calls of a traced `tf.function` that skip its per-call argument binding.

A `tf.function` called with a distributed iterator rebuilds the iterator's
type spec and flattens it on every call, Python work that can cost as much as
a whole small training step (what that means at one step per call:
docs/benchmarks.md#throughput). The iterator's type spec never
changes, so `FlatCall` builds it once, takes the iterator's components (its
resource handles) from it at each call, and calls the traced concrete
function with them directly.

The components are not kept between calls: a list that outlived the
iterator would hold the last reference to its resource, whose destructor
would then run in Python's deallocation with the GIL held, and hang waiting
for input threads that need the GIL (seen with `Dataset.from_generator`).
"""

from typing import Any
import weakref

import tensorflow as tf


class FlatCall:
  """Calls `function(fixed, *tensors)` for one fixed first argument (e.g. an iterator), at the cost of the op alone.

  The function is traced for `fixed` and the tensors' specs once, here, and
  `fixed`'s type spec built once; each call passes `fixed`'s components and
  the tensors to the traced concrete function. Where this TensorFlow's
  concrete functions lack the flat call (`_call_flat`, internal API) or
  `fixed` is not a composite tensor, it calls `function` as usual: same
  results, slower.
  """

  def __init__(self, function: Any, fixed: Any, *example_tensors: tf.Tensor) -> None:
    """Initializes the `FlatCall`.

    Args:
      function: a `tf.function`.
      fixed: its first argument, the same in every call.
      *example_tensors: tensors shaped and typed like the other arguments of
        every call.
    """
    self._function = function
    self._fixed = weakref.ref(fixed)
    self._concrete = function.get_concrete_function(fixed, *example_tensors)
    self._spec: Any = getattr(fixed, "_type_spec", None)
    self._flat = (
        hasattr(self._concrete, "_call_flat")
        and hasattr(self._spec, "_to_components")
        and len(self._concrete.inputs)
        == (len(self._components(fixed)) + len(example_tensors) + len(self._concrete.captured_inputs))
    )

  @property
  def fixed(self) -> Any:
    """The first argument of every call; None once nothing else holds it."""
    return self._fixed()

  def __call__(self, *tensors: tf.Tensor) -> Any:
    """Returns `function(fixed, *tensors)`."""
    fixed = self._fixed()
    if fixed is None:
      raise ReferenceError(
          "FlatCall: its fixed argument (e.g. an iterator) was deleted; make a FlatCall for a live one."
      )
    if not self._flat:
      return self._function(fixed, *tensors)
    return self._concrete._call_flat(  # noqa: SLF001
        self._components(fixed) + list(tensors), self._concrete.captured_inputs
    )

  def _components(self, fixed: Any) -> list[Any]:
    return tf.nest.flatten(self._spec._to_components(fixed), expand_composites=True)  # noqa: SLF001
