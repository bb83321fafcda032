"""configs/graphs.py without TF-GNN: its config, its label rule, its errors (the rest: test_gnn_example.py)."""

import importlib
import os
import sys

import ml_collections
import numpy as np
import pytest

import runner
from strategies import ConfigError
from testlib import paths

GRAPHS = os.path.join(paths.REPO, "configs", "graphs.py")


@pytest.fixture(autouse=True)
def no_legacy_keras_left_behind(monkeypatch):
  """configs/graphs.py sets TF_USE_LEGACY_KERAS when it loads: removed after each test, for later tests' children."""
  monkeypatch.setenv("TF_USE_LEGACY_KERAS", "")  # Recorded as it was, so that undoing both restores that.
  monkeypatch.delenv("TF_USE_LEGACY_KERAS")


@pytest.fixture(name="graphs")
def fixture_graphs():
  """configs/graphs.py as a module, imported inside a test (not at collection, which would set the variable for good)."""
  return importlib.import_module("configs.graphs")


def test_the_config_names_its_own_data_and_model_with_their_fields():
  config = runner.load_config(GRAPHS)
  assert config.data.name == "configs.graphs:random_graph_density" and config.model.name == "configs.graphs:gnn"
  assert (config.data.num_train_examples, config.data.num_eval_examples, config.data.global_batch_size) == (
      1024,
      256,
      32,
  )
  assert (config.model.num_classes, config.model.message_passing_rounds) == (3, 2)
  assert (config.mode, config.task.name, config.optimizer.name, config.trainer.seed) == (
      "train_and_eval",
      "configs.graphs:graph_classification",
      "adam",
      0,
  )
  assert os.environ["TF_USE_LEGACY_KERAS"] in ("1", "true", "True")


@pytest.mark.parametrize("missing", ["tf_keras", "tensorflow_gnn"])
def test_a_missing_package_is_a_config_error_naming_the_install(monkeypatch, missing):
  monkeypatch.setitem(sys.modules, missing, None)  # What importlib reports for a package that is not installed.
  with pytest.raises(
      ConfigError,
      match=rf"needs {missing}, not installed\. Install with: pip install \"tf-runner\[gnn\]\" && pip install --no-deps",
  ):
    runner.load_config(GRAPHS)


def test_labels_are_the_mean_degree_class_and_fixed_by_the_seed(graphs):
  made = graphs.random_graphs(300, seed=[0, 0])
  again = graphs.random_graphs(300, seed=[0, 0])
  other = graphs.random_graphs(300, seed=[0, 1])
  np.testing.assert_array_equal(made["labels"], again["labels"])
  assert not np.array_equal(made["labels"], other["labels"])
  for features, sources, targets, label in zip(made["node_features"], made["sources"], made["targets"], made["labels"]):
    num_nodes = len(features)
    assert 8 <= num_nodes <= 16 and features.shape == (num_nodes, 4)
    np.testing.assert_array_equal(np.sort(sources * num_nodes + targets), np.sort(targets * num_nodes + sources))
    assert (sources != targets).all() and sources.max(initial=0) < num_nodes
    mean_degree = len(sources) / num_nodes  # Each undirected edge is stored in both directions.
    assert label == (0 if mean_degree < 2.5 else 1 if mean_degree < 4 else 2)
  assert sorted(set(made["labels"])) == [0, 1, 2]


@pytest.mark.parametrize(
    "fields, split, message",
    [
        ({}, "test", "random_graph_density: split must be 'train' or 'eval', got 'test'."),
        (
            {"min_nodes": 9, "max_nodes": 8},
            "train",
            "random_graph_density needs 1 <= config.data.min_nodes <= config.data.max_nodes, got 9 and 8.",
        ),
    ],
)
def test_bad_data_arguments_are_config_errors(graphs, fields, split, message):
  config = ml_collections.ConfigDict(
      {
          "num_train_examples": 8,
          "num_eval_examples": 8,
          "min_nodes": 8,
          "max_nodes": 16,
          "num_node_features": 4,
          "seed": 0,
          **fields,
      }
  )
  with pytest.raises(ConfigError) as raised:
    graphs.random_graph_density(config, split)
  assert str(raised.value) == message
