"""The TF-GNN checks of tests/runner/test_gnn_example.py, in one process (run as a process, not by pytest).

Usage: gnn_runner_main.py OUT.npz STEPS FULL_STEPS

A process of its own: TF-GNN needs `tf.keras` to be tf_keras (TF_USE_LEGACY_KERAS=1, set by the modules it
imports before TensorFlow), which a test process whose other tests touched `tf.keras` as Keras 3 no longer
can be. Splits the CPU into 2 logical devices; enables TensorFlow's op determinism (TF-GNN's runner maps its
batches with `deterministic=False`, which let one run's batches come in another order); loads configs/graphs.py; then saves to OUT.npz:

- `train_labels`, `train_labels_again`, `eval_labels`, `eval_labels_again`: the labels of the data function's
  splits in the order it gives them, each read twice from a new dataset; `eval_rule_labels`: the eval labels
  recomputed from each eval GraphTensor's own node and edge counts by the mean-degree rule; `train_epoch2_labels`:
  the second pass over the first train dataset;
- `logits_shape`: the shape of configs.graphs.gnn's output on a batch of 5 eval graphs;
- `ours_initial/i`, `tfgnn_initial/i`: the initial weights of configs.graphs.gnn and of the TF-GNN runner's base
  model (`tfgnn_runner_side.base_model`), each made after the same seeding;
- for each run R in RUNS, `R/losses` and `R/weight/i`: `tfgnn_runner_side.train` for STEPS steps, one loss per
  step (`windows` one loss per 5 steps) under the strategy R names;
- `trainer_mirrored/losses` and `trainer_mirrored/weight/i`: the same for our `runner.Trainer` on the same model,
  data and optimizer, under MirroredStrategy;
- `full/losses`, `full/eval_loss`, `full/eval_accuracy`: the example's whole run (FULL_STEPS steps, one device)
  through `tensorflow_gnn.runner.run`, one loss per FULL_WINDOW steps, its model then scored on the evaluation
  split; `trainer_full/...`: the same with our Trainer (one step per loop), whose first STEPS steps give
  `trainer_one_device/losses` (one loss per step) and `trainer_one_device/weight/i` (the weights after them): a
  run of STEPS steps of its own would train the same steps;
- `bad_label_message`: the DataError of training a model of 2 classes on the 3 classes' labels;
- `tpu_problem`: what `--check_tpu` says of the training data (runner.tpu.rules.element_problem).
"""

import copy
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/, for `testlib`

from testlib import paths

sys.path.insert(0, paths.REPO)

import numpy as np
import tensorflow as tf
import tf_keras

from benchmarks import tfgnn_runner_side
from configs import graphs
import runner
from runner.cluster import process_exit
from runner.tpu import rules as tpu_rules
import strategies

WINDOW = 5
FULL_WINDOW = 50
CPUS = ("/cpu:0", "/cpu:1")
# name -> (strategy maker, steps per loss).
RUNS = {
    "real_one_device": (lambda: tf.distribute.OneDeviceStrategy(CPUS[0]), 1),
    "ours_one_device": (lambda: strategies.OneDeviceStrategy(device=CPUS[0]), 1),
    "real_mirrored": (lambda: tf.distribute.MirroredStrategy(list(CPUS)), 1),
    "ours_mirrored": (lambda: strategies.MirroredStrategy(devices=list(CPUS)), 1),
    "windows": (lambda: tf.distribute.OneDeviceStrategy(CPUS[0]), WINDOW),
}


class _StepLosses(runner.actions.Action):
  """Records the loss of every loop (one step each), and the weights of `model_of()` after step `weights_step`."""

  def __init__(self, weights_step):
    self.losses = []
    self.weights_step = weights_step
    self.model_of = None
    self.weights = None

  def __call__(self, loop):
    self.losses.append(loop.train_results["loss"])
    if loop.step == self.weights_step:
      self.weights = self.model_of().get_weights()


def _trainer_run(config, strategy, steps, log_every=1, weights_step=None):
  """Trains configs.graphs' model on its data with our Trainer, one step per loop.

  Returns:
    (the mean loss of each window of `log_every` steps, the final weights, the model, the loss of each step, the
    weights after step `weights_step`).
  """
  recorder = _StepLosses(weights_step)
  trainer = runner.Trainer(
      strategy,
      model_fn=lambda: graphs.gnn(config.model),
      optimizer_fn=lambda: tf_keras.optimizers.Adam(config.optimizer.learning_rate),
      task=graphs.graph_classification(config.task),
      seed=config.trainer.seed,
      actions=[recorder],
      quiet=True,
  )
  recorder.model_of = lambda: trainer.model
  trainer.train(
      graphs.random_graph_density(config.data, "train"), global_batch_size=config.data.global_batch_size, steps=steps
  )
  losses = np.reshape(recorder.losses, [-1, log_every]).mean(axis=1)
  return losses, trainer.model.get_weights(), trainer.model, np.array(recorder.losses), recorder.weights


def _bad_label_message(config):
  """The error of training the example's model with 2 outputs (its labels go to 2): the data check's one line."""
  two_classes = copy.deepcopy(config.model)
  two_classes.num_classes = 2
  trainer = runner.Trainer(
      strategies.OneDeviceStrategy(device=CPUS[0]),
      model_fn=lambda: graphs.gnn(two_classes),
      optimizer_fn=lambda: tf_keras.optimizers.Adam(config.optimizer.learning_rate),
      task=graphs.graph_classification(config.task),
      seed=config.trainer.seed,
      quiet=True,
  )
  try:
    trainer.train(graphs.random_graph_density(config.data, "train"), global_batch_size=32, steps=2)
  except runner.data.DataError as error:
    return str(error)
  return "no error"


def _scored(logits_of, evaluation):
  """The mean loss and the accuracy of `logits_of(batch of graphs)` over every graph of `evaluation`."""
  losses, hits = [], []
  for graph, labels in evaluation.batch(64):
    logits = logits_of(graph)
    losses.append(tf_keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True).numpy())
    hits.append(np.argmax(logits, axis=1) == labels.numpy())
  return np.concatenate(losses).mean(), np.concatenate(hits).mean()


def _labels(dataset):
  labels = dataset.map(lambda graph, label: label)
  return next(iter(labels.batch(int(dataset.cardinality())))).numpy()


def _rule_labels(dataset):
  """The labels by the mean-degree rule, from each graph's own sizes (edges are stored in both directions)."""

  def mean_degree(graph, label):
    del label  # Recomputed.
    return graph.edge_sets[graphs.EDGE_SET].total_size / graph.node_sets[graphs.NODE_SET].total_size

  return np.digitize(
      _labels(dataset.map(lambda graph, label: (graph, mean_degree(graph, label)))), graphs.MEAN_DEGREE_BOUNDS
  )


def main(out, steps, full_steps):
  strategies.virtual_cpus(len(CPUS))
  tf.config.experimental.enable_op_determinism()  # TF-GNN's runner maps batches with deterministic=False.
  config = runner.load_config(os.path.join(paths.REPO, "configs", "graphs.py"))
  arrays = {}
  train = graphs.random_graph_density(config.data, "train")
  arrays["train_labels"] = _labels(train)
  arrays["train_epoch2_labels"] = _labels(train)
  arrays["train_labels_again"] = _labels(graphs.random_graph_density(config.data, "train"))
  evaluation = graphs.random_graph_density(config.data, "eval")
  arrays["eval_labels"] = _labels(evaluation)
  arrays["eval_labels_again"] = _labels(graphs.random_graph_density(config.data, "eval"))
  arrays["eval_rule_labels"] = _rule_labels(evaluation)

  random.seed(config.trainer.seed)
  np.random.seed(config.trainer.seed)
  ours = graphs.gnn(config.model)
  batch, _ = next(iter(evaluation.batch(5)))
  arrays["logits_shape"] = np.array(ours(batch.merge_batch_to_components()).shape)
  merged_spec = batch.merge_batch_to_components().spec.relax(num_components=True, num_nodes=True, num_edges=True)
  theirs = tfgnn_runner_side.base_model(config, merged_spec)
  for name, model in (("ours_initial", ours), ("tfgnn_initial", theirs)):
    for i, weight in enumerate(model.weights):
      arrays[f"{name}/{i}"] = weight.numpy()

  for name, (make_strategy, log_every) in RUNS.items():
    run = tfgnn_runner_side.train(
        config, make_strategy(), model_dir=os.path.join(os.path.dirname(out), name), steps=steps, log_every=log_every
    )
    arrays[f"{name}/losses"] = np.array(run.losses)
    for i, weight in enumerate(run.weights):
      arrays[f"{name}/weight/{i}"] = weight
  losses, weights, _, _, _ = _trainer_run(config, strategies.MirroredStrategy(devices=list(CPUS)), steps)
  arrays["trainer_mirrored/losses"] = np.array(losses)
  for i, weight in enumerate(weights):
    arrays[f"trainer_mirrored/weight/{i}"] = weight
  full = tfgnn_runner_side.train(
      config,
      RUNS["real_one_device"][0](),
      model_dir=os.path.join(os.path.dirname(out), "full"),
      steps=full_steps,
      log_every=FULL_WINDOW,
  )
  arrays["full/losses"] = np.array(full.losses)
  arrays["full/eval_loss"], arrays["full/eval_accuracy"] = _scored(
      lambda graph: full.model(graph.merge_batch_to_components()), evaluation
  )
  losses, _, model, step_losses, weights = _trainer_run(
      config, strategies.OneDeviceStrategy(device=CPUS[0]), full_steps, FULL_WINDOW, weights_step=steps
  )
  arrays["trainer_full/losses"] = np.array(losses)
  arrays["trainer_one_device/losses"] = step_losses[:steps]
  for i, weight in enumerate(weights):
    arrays[f"trainer_one_device/weight/{i}"] = weight
  arrays["trainer_full/eval_loss"], arrays["trainer_full/eval_accuracy"] = _scored(
      lambda graph: model(graph.merge_batch_to_components()), evaluation
  )
  arrays["bad_label_message"] = np.array(_bad_label_message(config))
  arrays["tpu_problem"] = np.array(tpu_rules.element_problem(train.element_spec, "the training data"))
  np.savez(out, **arrays)
  print("done", flush=True)


if __name__ == "__main__":
  main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
  process_exit.exit_now(0)  # See runner.__main__.run_main: no tf.data teardown.
