"""configs/graphs.py's data and model, and our strategy wrappers inside TF-GNN's runner (`tensorflow_gnn.runner.run`).

One child process (tests/testlib/gnn_runner_main.py) runs every check that needs TF-GNN, which needs `tf.keras`
to be tf_keras for the whole process; the tests here assert on what it saved.
"""

import importlib.util
import os
import sys

import numpy as np
import pytest

from testlib import paths
from testlib import process_testlib

# Found, not imported: importing TF-GNN here would fix tf.keras for this process (the child imports it).
_MISSING = [name for name in ("tf_keras", "tensorflow_gnn") if importlib.util.find_spec(name) is None]
pytestmark = pytest.mark.skipif(
    bool(_MISSING),
    reason=f"{' and '.join(_MISSING)} not installed: pip install tf-keras && pip install --no-deps tensorflow-gnn",
)

MAIN = os.path.join(paths.TESTLIB, "gnn_runner_main.py")
STEPS = 10
WINDOW = 5  # gnn_runner_main.WINDOW


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
  out = tmp_path_factory.mktemp("gnn") / "runs.npz"
  status, stdout, stderr = process_testlib.Process(
      [sys.executable, MAIN, str(out), str(STEPS)],
      env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
      logs=str(out.parent / "logs"),
      name="gnn",
  ).wait()
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
