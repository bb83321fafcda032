"""Options: precision (with gradient accumulation under loss scaling), jit_compile, clipnorm and seed."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import strategies
from testlib import trainer_testlib

GLOBAL_BATCH = 16


@pytest.mark.parametrize("precision, compute_dtype", [("mixed_bfloat16", "bfloat16"), ("mixed_float16", "float16")])
def test_mixed_precision_trains_with_float32_weights_and_leaves_the_global_policy_alone(
    precision, compute_dtype, cpu_devices
):
  before = keras.mixed_precision.global_policy().name
  trainer = trainer_testlib.make_trainer(strategies.MirroredStrategy(cpu_devices(2)), precision=precision)
  assert keras.mixed_precision.global_policy().name == before
  dense = trainer.model.layers[-1]
  assert (dense.compute_dtype, dense.kernel.dtype) == (compute_dtype, "float32")
  initial = trainer.model.get_weights()
  results = trainer.train(trainer_testlib.classification_data(64), global_batch_size=GLOBAL_BATCH, steps=3)
  assert keras.mixed_precision.global_policy().name == before
  assert np.isfinite(results["loss"])
  assert not np.allclose(trainer.model.get_weights()[0], initial[0])
  # mixed_float16 scales the loss; the optimizer that does it is the one checkpointed.
  optimizer = trainer._parts.optimizer  # noqa: SLF001
  assert isinstance(optimizer, keras.optimizers.LossScaleOptimizer) == (precision == "mixed_float16")
  assert trainer.evaluate(trainer_testlib.classification_data(20), global_batch_size=GLOBAL_BATCH)["num_examples"] == 20
  if (
      precision == "mixed_float16"
  ):  # 2 micro-batches a step: each one's loss scaled, their summed gradient unscaled once.
    accumulated = trainer_testlib.make_trainer(
        strategies.MirroredStrategy(cpu_devices(2)), precision=precision, gradient_accumulation_steps=2
    )
    accumulated.train(trainer_testlib.classification_data(64), global_batch_size=GLOBAL_BATCH, steps=3)
    for got, want in zip(accumulated.model.get_weights(), trainer.model.get_weights(), strict=True):
      np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-4)


def test_jit_compile_trains_like_graph_mode(cpu_devices):
  weights = []
  for jit_compile in (False, True):
    trainer = trainer_testlib.make_trainer(
        strategies.MirroredStrategy(cpu_devices(2)), jit_compile=jit_compile, steps_per_loop=2
    )
    trainer.train(trainer_testlib.classification_data(64), global_batch_size=GLOBAL_BATCH, steps=3)
    weights.append(trainer.model.get_weights())
  for got, want in zip(*weights):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_clipnorm_bounds_the_global_norm_of_the_summed_gradient(cpu_devices):
  # Plain SGD with learning rate 1: one step moves the weights by exactly the clipped gradient.
  updates = []
  for strategy in (tf.distribute.OneDeviceStrategy("/cpu:0"), strategies.MirroredStrategy(cpu_devices(4))):
    trainer = trainer_testlib.make_trainer(strategy, clipnorm=0.01, optimizer_fn=lambda: keras.optimizers.SGD(1.0))
    before = trainer.model.get_weights()
    trainer.train(trainer_testlib.classification_data(64), global_batch_size=GLOBAL_BATCH, steps=1)
    updates.append([after - start for after, start in zip(trainer.model.get_weights(), before)])
  for update in updates:
    assert np.sqrt(sum(np.sum(u**2) for u in update)) == pytest.approx(0.01, rel=1e-4)
  for one_device, mirrored in zip(*updates):
    np.testing.assert_allclose(mirrored, one_device, rtol=1e-4, atol=1e-8)


def test_seed_fixes_the_initial_weights_without_changing_global_random_state():
  def initial(seed):
    return trainer_testlib.make_trainer(tf.distribute.OneDeviceStrategy("/cpu:0"), seed=seed).model.get_weights()[0]

  state = np.random.get_state()
  np.testing.assert_array_equal(initial(3), initial(3))
  assert not np.array_equal(initial(3), initial(4))
  assert np.random.get_state()[1].tolist() == state[1].tolist()


def test_under_loss_scaling_a_gradient_overflow_on_one_replica_skips_the_step_on_all(cpu_devices):
  features, labels = trainer_testlib.classification_arrays(GLOBAL_BATCH)
  features[GLOBAL_BATCH // 2 :] *= 300.0  # Only the second replica's float16 gradients overflow.
  trainer = trainer_testlib.make_trainer(strategies.MirroredStrategy(cpu_devices(2)), precision="mixed_float16")
  before = trainer.model.get_weights()
  results = trainer.train(
      tf.data.Dataset.from_tensor_slices((features, labels)), global_batch_size=GLOBAL_BATCH, steps=1
  )
  assert np.isfinite(results["loss"])
  for got, want in zip(trainer.model.get_weights(), before):
    np.testing.assert_array_equal(got, want)
  assert float(trainer._parts.optimizer.dynamic_scale.numpy()) == 2.0**14  # noqa: SLF001
