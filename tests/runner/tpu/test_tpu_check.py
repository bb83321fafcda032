"""`runner.check_tpu` and `python -m runner --check_tpu`: what a TPU would reject, found on logical CPUs.

The checks run in this process on the 4 logical CPUs of conftest (with
batch sizes checked against a TPU's 8 replicas); the command line runs in
child processes, which split their CPU into 8 logical CPUs themselves.
"""

import os
import subprocess
import sys
import textwrap

import pytest

import runner
from testlib import paths

REPO = paths.REPO
DIGITS = os.path.join(REPO, "configs", "digits.py")
SUBPROCESS_TIMEOUT_SECONDS = 300
USER_ERROR_EXIT_CODE = 2

PLUGINS = textwrap.dedent("""
    import keras
    import numpy as np
    import tensorflow as tf

    from runner.data import providers as data

    EXAMPLES = 64


    def _numbers(dtype="float32"):
      rng = np.random.default_rng(0)
      return rng.random((EXAMPLES, 8)).astype(dtype), rng.integers(0, 10, EXAMPLES).astype("int32")


    def numbers(config, split):
      return data.InMemory(*_numbers())


    def float64_numbers(config, split):
      return data.InMemory(*_numbers("float64"))


    def named_numbers(config, split):
      features, labels = _numbers()
      names = np.array([f"digit {label}" for label in labels])
      return tf.data.Dataset.from_tensor_slices(({"pixels": features, "name": names}, labels))


    def ragged_numbers(config, split):
      features, labels = _numbers()
      tokens = tf.ragged.constant([list(range(1 + i % 5)) for i in range(EXAMPLES)])
      return tf.data.Dataset.from_tensor_slices((tokens, labels))


    class PyFunctionLayer(keras.layers.Layer):
      def call(self, x):
        doubled = tf.py_function(lambda t: t * 2.0, [x], tf.float32)
        return tf.ensure_shape(doubled, x.shape)


    class MaskedSum(keras.layers.Layer):
      def call(self, x):
        return x + tf.reduce_sum(tf.boolean_mask(x, x > 0.5))


    def py_function_model(config):
      return keras.Sequential([keras.Input((8,)), PyFunctionLayer(name="doubled_in_python"), keras.layers.Dense(10)])


    def boolean_mask_model(config):
      return keras.Sequential([keras.Input((8,)), keras.layers.Dense(8), MaskedSum(name="sum_of_large_values"),
                               keras.layers.Dense(10)])
    """)


@pytest.fixture(scope="module")
def plugins(tmp_path_factory):
  """Writes the models and datasets above as module `tpu_plugins`; returns its directory."""
  directory = tmp_path_factory.mktemp("plugins")
  (directory / "tpu_plugins.py").write_text(PLUGINS)
  sys.path.insert(0, str(directory))
  yield directory
  sys.path.remove(str(directory))
  sys.modules.pop("tpu_plugins", None)


def plugin_config(data="numbers", model="mlp", global_batch_size=32):
  return {
      "data": {"name": f"tpu_plugins:{data}", "global_batch_size": global_batch_size},
      "model": {"name": model if model == "mlp" else f"tpu_plugins:{model}"},
      "trainer": {"train_steps": 10},
  }


NOT_PROVABLE = (
    "Not provable on a CPU: that the model, optimizer state and batches fit in TPU memory (HBM), and that every "
    "op XLA compiled for the CPU has a TPU kernel."
)


def test_digits_tpu_variant_passes(cpu_devices):
  # configs/digits.py itself: test_the_command_line_passes_fails_in_one_line_and_writes_nothing.
  kept = []
  result = runner.check_tpu(runner.load_config(DIGITS + ":tpu"), kept=kept)
  assert [type(trainer).__name__ for trainer in kept] == ["Trainer"]  # The command line keeps it to the exit.
  assert result.passed and result.problem is None, result.problem
  assert (result.num_replicas, result.devices) == (8, tuple(cpu_devices(4)))  # TensorFlow's devices were made
  assert (result.steps_per_loop, result.train_steps, result.eval_examples) == (500, 2, 360)
  assert result.summary.startswith(
      "PASS: 2 training steps (steps_per_loop=500) and 360 evaluation examples in padded "
      "batches compiled with XLA and ran on 4 mirrored logical CPUs; both batch sizes split over 8 TPU replicas;"
  )
  assert result.summary.endswith(NOT_PROVABLE)
  assert "\n" not in result.summary


def test_a_py_function_layer_is_named(plugins):
  del plugins
  result = runner.check_tpu(plugin_config(model="py_function_model"))
  assert not result.passed and result.train_steps == 0
  assert result.problem == (
      "the train step runs op EagerPyFunc (tf.py_function) in layer 'doubled_in_python' (PyFunctionLayer) of the "
      "model: it calls Python, which a TPU program cannot. Write it with TensorFlow ops, or do the Python work in "
      "the input pipeline."
  )
  assert result.summary == f"FAIL: {result.problem}"


def test_a_data_dependent_shape_is_named_although_xla_on_a_cpu_compiles_it(plugins):
  del plugins
  result = runner.check_tpu(plugin_config(model="boolean_mask_model"))
  assert not result.passed
  assert result.problem.startswith(
      "the train step runs op Where (tf.boolean_mask, or tf.where with one argument) in layer "
      "'sum_of_large_values' (MaskedSum) of the model: its output shape (None, 1) depends on the data, and a TPU "
      "compiles each step for static shapes."
  )
  assert result.train_steps == 2  # XLA on the CPU compiled and ran it


@pytest.mark.parametrize(
    "data, problem",
    [
        (
            "named_numbers",
            "the training data's features['name'] is string: a TPU has no strings; map strings to numbers in the input "
            "pipeline (e.g. keras.layers.StringLookup or tf.strings.to_hash_bucket_fast in dataset.map). TPU dtypes: ",
        ),
        (
            "ragged_numbers",
            "the training data's features is a tf.RaggedTensor (RaggedTensorSpec(TensorShape([None]), tf.int32, 0, "
            "tf.int64)): a TPU takes only dense tensors of static shape. Pad or truncate it to a fixed length",
        ),
        (
            "float64_numbers",
            "the training data's features is float64: a TPU has no 64-bit floating point; cast to float32 (or bfloat16) "
            "in the input pipeline.",
        ),
    ],
)
def test_a_dataset_element_a_tpu_cannot_take_is_named(plugins, data, problem):
  del plugins
  result = runner.check_tpu(plugin_config(data=data))
  assert not result.passed and result.problem.startswith(problem), result.problem
  assert result.train_steps == 0


def test_a_batch_size_that_does_not_split_over_the_tpu_replicas(plugins):
  del plugins
  result = runner.check_tpu(plugin_config(global_batch_size=36))
  assert result.problem == (
      "config.data.global_batch_size=36 does not split over the 8 replicas of the TPU; use "
      "a multiple of 8, e.g. 32 or 40."
  )
  four = runner.check_tpu(plugin_config(data="float64_numbers", global_batch_size=36), num_replicas=4)  # a v4-8
  assert four.num_replicas == 4 and four.problem.startswith("the training data's features is float64")


def test_the_command_line_passes_fails_in_one_line_and_writes_nothing(plugins, tmp_path, subprocess_env):
  env = dict(subprocess_env, PYTHONPATH=os.pathsep.join([str(plugins), subprocess_env["PYTHONPATH"]]))
  cases = {
      "digits": [f"--config={DIGITS}"],
      "strings": [f"--config={DIGITS}", "--config.data.name=tpu_plugins:named_numbers"],
      "both_modes": [f"--config={DIGITS}", "--dry_run"],
  }
  processes = {
      case: subprocess.Popen(
          [sys.executable, "-m", "runner", f"--workdir={tmp_path / case}", "--check_tpu", *args],
          env=env,
          cwd=REPO,
          stdout=subprocess.PIPE,
          stderr=subprocess.PIPE,
          text=True,
      )
      for case, args in cases.items()
  }
  outputs = {case: (p.communicate(timeout=SUBPROCESS_TIMEOUT_SECONDS), p.returncode) for case, p in processes.items()}

  (stdout, stderr), returncode = outputs["digits"]
  assert returncode == 0, stderr[-3000:]
  assert stdout.splitlines()[-1].startswith(
      "PASS: 2 training steps (steps_per_loop=500) and 128 evaluation examples in padded batches compiled with XLA "
      "and ran on 8 mirrored logical CPUs; both batch sizes split over 8 TPU replicas;"
  )
  assert stdout.splitlines()[-1].endswith(NOT_PROVABLE)
  for case, message in (
      ("strings", "error: TPU check failed: the training data's features['name'] is string: a TPU has no strings;"),
      ("both_modes", "error: --dry_run prints the plan and --check_tpu runs steps to check them for a TPU; give one."),
  ):
    (_, stderr), returncode = outputs[case]
    assert returncode == USER_ERROR_EXIT_CODE, stderr[-3000:]
    assert "Traceback" not in stderr
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(message), stderr[-3000:]
  assert not any((tmp_path / case).exists() for case in cases)
