"""The TF-GNN example (configs/graphs.py) end to end from the CLI, and against TF-GNN's runner (`tensorflow_gnn.runner.run`).

TF-GNN needs `tf.keras` to be tf_keras for a whole process, so nothing here imports it: two `python -m runner` runs
of the example (one device, and mirrored over 2 logical CPUs), and one child process
(tests/testlib/gnn_runner_main.py) for every check inside TF-GNN's runner, on whose saved arrays the tests assert.
The three processes run at once (`processes`): the child, the longest, starts first.
"""

import importlib.util
import os
import re
import sys

import numpy as np
import pytest

from testlib import paths
from testlib import process_testlib

# Found, not imported: importing TF-GNN here would fix tf.keras for this process (the child imports it).
_MISSING = [name for name in ("tf_keras", "tensorflow_gnn") if importlib.util.find_spec(name) is None]
pytestmark = pytest.mark.skipif(
    bool(_MISSING),
    reason=(
        f"{' and '.join(_MISSING)} not installed, which the README's test command installs (pip install --no-deps "
        "tensorflow-gnn==1.0.3); if pip cannot install it for this TensorFlow, these tests cannot run here"
    ),
)

MAIN = os.path.join(paths.TESTLIB, "gnn_runner_main.py")
STEPS = 10
WINDOW = 5  # gnn_runner_main.WINDOW
EXAMPLE_STEPS = 400  # configs/graphs.py's train_steps.
STATED_ACCURACY = 0.9  # docs/keras2_and_gnn.md#the-tf-gnn-example
CLI_RUNS = {"one_device": [], "mirrored": ["--config.strategy.name=mirrored", "--config.strategy.virtual_cpus=2"]}


@pytest.fixture(scope="module")
def processes(tmp_path_factory):
  """Starts gnn_runner_main.py (writing `out`) and `python -m runner --config=configs/graphs.py` under each of CLI_RUNS.

  All at once: returns (out, {"gnn" or a name of CLI_RUNS: its Process}); kills those still running at the end.
  """
  out = tmp_path_factory.mktemp("gnn") / "runs.npz"
  started = {
      "gnn": process_testlib.Process(
          [sys.executable, MAIN, str(out), str(STEPS), str(EXAMPLE_STEPS)],
          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
          logs=str(out.parent / "logs"),
          name="gnn",
      )
  }
  env = {key: value for key, value in os.environ.items() if key not in ("TF_CPP_MIN_LOG_LEVEL", "TF_USE_LEGACY_KERAS")}
  env["PYTHONPATH"] = paths.REPO
  logs = tmp_path_factory.mktemp("example")
  for name, flags in CLI_RUNS.items():
    started[name] = process_testlib.Process(
        [sys.executable, "-m", "runner", "--config=configs/graphs.py", f"--workdir={logs / name}", *flags],
        env=env,
        logs=str(logs),
        name=name,
    )
  yield out, started
  for process in started.values():
    process.process.kill()


@pytest.fixture(scope="module")
def example_runs(processes):
  """The runs of `python -m runner --config=configs/graphs.py` under each of CLI_RUNS: {name: (status, stdout, stderr)}."""
  _, started = processes
  return {name: started[name].wait() for name in CLI_RUNS}


def _summary(stdout):
  """The CLI's closing lines as {'global step': '400', 'eval': {'accuracy': 0.93, ...}, ...}."""
  lines = dict(line.split(": ", 1) for line in stdout.splitlines() if ": " in line)
  lines["eval"] = {key: float(value) for key, value in (part.split("=") for part in lines["eval"].split())}
  return lines


@pytest.mark.parametrize("name", sorted(CLI_RUNS))
def test_the_example_reaches_its_stated_accuracy_from_the_cli_with_a_clean_stderr(example_runs, name):
  status, stdout, stderr = example_runs[name]
  assert status == 0, stderr[-3000:]
  summary = _summary(stdout)
  assert summary["global step"] == str(EXAMPLE_STEPS)
  assert summary["strategy"].startswith("one_device: 1 replica" if name == "one_device" else "mirrored: 2 replicas")
  assert summary["eval"]["num_examples"] == 256
  assert summary["eval"]["accuracy"] >= STATED_ACCURACY
  # Progress lines only: no warning (TF-GNN's own tf.nest warning is dropped), no error, no traceback.
  assert [line for line in stderr.splitlines() if not line.startswith("I")] == []


def test_the_whole_example_through_tfgnns_runner_follows_our_trainer(saved):
  # 400 steps, one step per loop, one loss per 50 (each the mean over its steps), both under op determinism.
  # Measured: the same to float32 rounding (the window means are summed in other precisions) and the same
  # evaluation. With 50 steps per loop our run parts from theirs after about 100 steps, by rounding (see
  # docs/keras2_and_gnn.md#against-the-tf-gnn-runner).
  np.testing.assert_allclose(saved["trainer_full/losses"], saved["full/losses"], rtol=1e-5)
  assert saved["trainer_full/eval_accuracy"] == saved["full/eval_accuracy"] >= STATED_ACCURACY
  assert saved["trainer_full/eval_loss"] == pytest.approx(saved["full/eval_loss"], rel=1e-5)


def test_the_cli_runs_end_where_tfgnns_runner_ends(example_runs, saved):
  # Without op determinism other kernels sum in another order: the runs part by float rounding over 400 Adam steps.
  for name in CLI_RUNS:
    ours = _summary(example_runs[name][1])["eval"]
    assert ours["accuracy"] == pytest.approx(saved["full/eval_accuracy"], abs=0.02)
    assert ours["loss"] == pytest.approx(saved["full/eval_loss"], rel=0.1)


@pytest.fixture(scope="module")
def saved(processes):
  out, started = processes
  status, stdout, stderr = started["gnn"].wait()
  assert status == 0 and "done" in stdout, stderr[-3000:]
  with np.load(out) as arrays:
    return dict(arrays)


def _weights(saved, prefix):
  return [saved[f"{prefix}/{i}"] for i in range(sum(k.startswith(f"{prefix}/") for k in saved))]


def test_the_labels_are_the_mean_degree_classes_in_a_fixed_order(saved):
  np.testing.assert_array_equal(saved["eval_labels"], saved["eval_rule_labels"])
  np.testing.assert_array_equal(saved["eval_labels"], saved["eval_labels_again"])
  np.testing.assert_array_equal(saved["train_labels"], saved["train_labels_again"])
  assert len(saved["train_labels"]) == 1024 and len(saved["eval_labels"]) == 256
  assert np.bincount(saved["train_labels"]).min() > 1024 // 4  # Every class about a third.
  # The training split is shuffled anew each epoch: its second pass has the same labels in another order.
  assert sorted(saved["train_epoch2_labels"]) == sorted(saved["train_labels"])
  assert not np.array_equal(saved["train_epoch2_labels"], saved["train_labels"])


def test_the_model_gives_logits_per_graph_and_starts_as_the_tfgnn_base_model(saved):
  assert list(saved["logits_shape"]) == [5, 3]
  ours, theirs = _weights(saved, "ours_initial"), _weights(saved, "tfgnn_initial")
  assert len(ours) == len(theirs) == 12
  for a, b in zip(ours, theirs):
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("kind", ["one_device", "mirrored"])
def test_our_wrapper_in_the_tfgnn_runner_trains_bit_for_bit_as_the_real_class(saved, kind):
  real, ours = _weights(saved, f"real_{kind}/weight"), _weights(saved, f"ours_{kind}/weight")
  assert len(real) == len(ours) == 12
  for a, b in zip(real, ours):
    np.testing.assert_array_equal(a, b)
  np.testing.assert_array_equal(saved[f"real_{kind}/losses"], saved[f"ours_{kind}/losses"])
  assert len(saved[f"ours_{kind}/losses"]) == STEPS
  assert saved[f"ours_{kind}/losses"][-3:].mean() < saved[f"ours_{kind}/losses"][:3].mean()  # It trained.
  initial = _weights(saved, "ours_initial")
  assert max(np.abs(a - b).max() for a, b in zip(initial, ours)) > 1e-3


def test_mirrored_follows_one_device_and_windows_are_means_of_steps(saved):
  # The loss is averaged over the global batch either way: 2 replicas follow 1 up to float rounding.
  np.testing.assert_allclose(saved["real_mirrored/losses"], saved["real_one_device/losses"], rtol=1e-5)
  per_step = saved["real_one_device/losses"]
  np.testing.assert_allclose(saved["windows/losses"], per_step.reshape(-1, WINDOW).mean(axis=1), rtol=1e-6)


@pytest.mark.parametrize("kind", ["one_device", "mirrored"])
def test_our_trainer_follows_the_tfgnn_runners_loss_curve(saved, kind):
  # The same graphs in the same order, the same initial weights, Adam and loss. Measured on the development VM:
  # equal bit for bit; the tolerance (docs/keras2_and_gnn.md) leaves room for another order of float sums.
  ours, theirs = saved[f"trainer_{kind}/losses"], saved[f"real_{kind}/losses"]
  assert len(ours) == len(theirs) == STEPS
  np.testing.assert_allclose(ours, theirs, rtol=1e-6)
  for a, b in zip(_weights(saved, f"trainer_{kind}/weight"), _weights(saved, f"real_{kind}/weight")):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_a_label_the_model_has_no_output_for_is_one_line_naming_it(saved):
  # The example number counts in a new pass over the data, which this training split reshuffles.
  assert re.fullmatch(
      r"The training data's batch of step 1 holds a label outside the task's range: example \d+ of the data "
      r"\(counting from 0\) has label 2, but labels must be integers in \[0, 2\) \(class ids of a model with 2 "
      r"outputs \(classes\)\)\.",
      str(saved["bad_label_message"]),
  )


def test_check_tpu_names_a_graph_tensor_as_a_tpus_problem(saved):
  assert re.fullmatch(
      r"the training data's features is a GraphTensor \(GraphTensorSpec\(.*\)\): a TPU takes only dense tensors "
      r"of static shape\.",
      str(saved["tpu_problem"]),
  )
