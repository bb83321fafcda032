"""evaluate counts every example exactly once and matches numpy on the same model."""

import numpy as np
import pytest
import tensorflow as tf

import runner
from runner.outputs import checkpoints
import strategies
from testlib import trainer_testlib


def _numpy_loss_and_accuracy(trainer, features, labels, weights=None):
  kernel, bias = trainer.model.get_weights()
  logits = features @ kernel + bias
  log_probs = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
  per_example = -log_probs[np.arange(len(labels)), labels]
  weights = np.ones(len(labels)) if weights is None else weights
  correct = logits.argmax(axis=1) == labels
  return (per_example * weights).sum() / len(labels), (correct * weights).sum() / weights.sum()


def _trained(strategy, **options):
  trainer = trainer_testlib.make_trainer(strategy, **options)
  trainer.train(trainer_testlib.classification_data(128), global_batch_size=16, steps=3)
  return trainer


@pytest.mark.parametrize("jit_compile", [False, True], ids=["graph", "xla"])
def test_1001_examples_on_4_replicas_count_once_and_match_numpy(jit_compile, cpu_devices):
  trainer = _trained(strategies.MirroredStrategy(cpu_devices(4)), jit_compile=jit_compile)
  features, labels = trainer_testlib.classification_arrays(1001, seed=3)
  results = trainer.evaluate(tf.data.Dataset.from_tensor_slices((features, labels)), global_batch_size=64)
  assert set(results) == {"loss", "accuracy", "num_examples"}
  assert results["num_examples"] == 1001
  loss, accuracy = _numpy_loss_and_accuracy(trainer, features, labels)
  assert results["accuracy"] == pytest.approx(accuracy, abs=1e-6)
  assert results["loss"] == pytest.approx(loss, rel=1e-5)


def test_fewer_examples_than_replicas(cpu_devices):
  trainer = _trained(strategies.MirroredStrategy(cpu_devices(4)))
  features, labels = trainer_testlib.classification_arrays(3, seed=4)
  results = trainer.evaluate(tf.data.Dataset.from_tensor_slices((features, labels)), global_batch_size=8)
  assert results["num_examples"] == 3
  assert results["accuracy"] == pytest.approx(_numpy_loss_and_accuracy(trainer, features, labels)[1], abs=1e-6)


def test_sample_weights_are_honoured_and_a_weight_0_example_still_counts(cpu_devices):
  trainer = _trained(strategies.MirroredStrategy(cpu_devices(2)))
  features, labels = trainer_testlib.classification_arrays(50, seed=5)
  weights = np.random.default_rng(6).uniform(0.0, 3.0, 50).astype(np.float32)
  weights[7] = 0.0
  results = trainer.evaluate(tf.data.Dataset.from_tensor_slices((features, labels, weights)), global_batch_size=8)
  loss, accuracy = _numpy_loss_and_accuracy(trainer, features, labels, weights)
  assert results["num_examples"] == 50
  assert results["loss"] == pytest.approx(loss, rel=1e-5)
  assert results["accuracy"] == pytest.approx(accuracy, abs=1e-6)


def test_steps_limits_the_batches_and_allows_infinite_data():
  trainer = _trained(tf.distribute.OneDeviceStrategy("/cpu:0"))
  results = trainer.evaluate(trainer_testlib.classification_data(30).repeat(), global_batch_size=8, steps=5)
  assert results["num_examples"] == 40


class EveryThirdExample(runner.data.DatasetProvider):
  """A provider that shards by itself and keeps only every third example."""

  def __init__(self, dataset):
    self.dataset = dataset
    self.contexts = []

  def get_dataset(self, input_context):
    self.contexts.append(input_context)
    return self.dataset.shard(input_context.num_input_pipelines, input_context.input_pipeline_id).shard(3, 0)


def test_a_dataset_provider_gets_the_input_context(cpu_devices):
  trainer = _trained(strategies.MirroredStrategy(cpu_devices(2)))
  provider = EveryThirdExample(trainer_testlib.classification_data(100))
  assert trainer.evaluate(provider, global_batch_size=8)["num_examples"] == 34
  # First a default context, for the element spec the data is checked by; then the strategy's.
  assert [(c.num_input_pipelines, c.num_replicas_in_sync) for c in provider.contexts] == [(1, 1), (1, 2)]


def test_evaluations_inside_train_use_their_own_batch_size_and_steps(cpu_devices):
  trainer = trainer_testlib.make_trainer(strategies.MirroredStrategy(cpu_devices(2)), steps_per_loop=2)
  assert trainer.last_eval_metrics is None
  eval_data = trainer_testlib.classification_data(100, seed=1)
  trainer.train(
      trainer_testlib.classification_data(128),
      global_batch_size=16,
      steps=4,
      eval_data=eval_data,
      eval_every=2,
      eval_global_batch_size=8,
      eval_steps=3,
  )
  assert trainer.last_eval_metrics["num_examples"] == 3 * 8
  assert trainer.evaluate(eval_data, global_batch_size=8, steps=3) == trainer.last_eval_metrics
  assert trainer.evaluate(eval_data, global_batch_size=20)["num_examples"] == 100
  assert trainer.last_eval_metrics["num_examples"] == 100


class CappedLoss(runner.tasks.Classification):
  """A loss with Python control flow on a tensor, which only AutoGraph turns into graph ops."""

  def loss(self, labels, outputs):
    per_example = super().loss(labels, outputs)
    if tf.reduce_max(per_example) > 0.0:
      per_example = tf.zeros_like(per_example) + 1.0
    return per_example


def test_the_tasks_loss_is_converted_by_autograph_as_in_training():
  trainer = trainer_testlib.make_trainer(tf.distribute.OneDeviceStrategy("/cpu:0"), task=CappedLoss())
  results = trainer.evaluate(trainer_testlib.classification_data(30), global_batch_size=8)
  assert results["loss"] == pytest.approx(1.0) and results["num_examples"] == 30


class _CheckpointsSeen(runner.data.DatasetProvider):
  """Evaluation data that notes the newest checkpoint on disk each time an evaluation makes its input."""

  def __init__(self, model_dir):
    self.model_dir = model_dir
    self.seen = []

  def get_dataset(self, input_context):
    self.seen.append(checkpoints.latest(self.model_dir))
    return trainer_testlib.classification_data(16, seed=1)


@pytest.mark.parametrize("eval_every", [None, 2], ids=["after_the_loops", "in_the_last_loop"])
def test_the_final_evaluation_starts_after_the_checkpoint_of_the_last_step(tmp_path, eval_every):
  trainer = trainer_testlib.make_trainer(
      tf.distribute.OneDeviceStrategy("/cpu:0"),
      model_dir=str(tmp_path),
      steps_per_loop=2,
      checkpoint_every=2 if eval_every else None,
  )
  eval_data = _CheckpointsSeen(str(tmp_path))
  trainer.train(
      trainer_testlib.classification_data(64), global_batch_size=8, steps=4, eval_data=eval_data, eval_every=eval_every
  )
  assert eval_data.seen[-1] == str(tmp_path / "checkpoints" / "ckpt-4")
  assert checkpoints.latest_step(str(tmp_path)) == 4
  with open(tmp_path / "checkpoints" / "checkpoint", encoding="utf-8") as f:  # Once: not again by checkpoint_every.
    assert f.read().count('all_model_checkpoint_paths: "ckpt-4"') == 1
