"""export: a SavedModel that serves the model's predictions in a process without this package."""

import json
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf

import strategies
from testlib import trainer_testlib

LOAD_AND_PREDICT = textwrap.dedent("""
    import json, sys
    import tensorflow as tf
    serve = tf.saved_model.load(sys.argv[1]).signatures["serving_default"]
    outputs = serve(features=tf.constant(json.loads(sys.argv[2]), tf.float32))
    assert not {"runner", "strategies"} & set(sys.modules), "the package was imported"
    print(json.dumps({name: tensor.numpy().tolist() for name, tensor in outputs.items()}))
""")


def test_exported_model_serves_its_predictions_without_the_package(tmp_path, cpu_devices, subprocess_env):
  trainer = trainer_testlib.make_trainer(strategies.MirroredStrategy(cpu_devices(2)))
  trainer.train(trainer_testlib.classification_data(64), global_batch_size=16, steps=2)
  path = trainer.export(str(tmp_path / "saved_model"))
  features, _ = trainer_testlib.classification_arrays(5, seed=8)
  env = dict(subprocess_env)
  env.pop("PYTHONPATH")  # Not even importable there.
  completed = subprocess.run(
      [sys.executable, "-c", LOAD_AND_PREDICT, path, json.dumps(features.tolist())],
      env=env,
      capture_output=True,
      text=True,
      timeout=120,
      check=False,
  )
  assert completed.returncode == 0, completed.stderr[-3000:]
  served = json.loads(completed.stdout.strip().splitlines()[-1])
  assert set(served) == {"outputs"}
  kernel, bias = trainer.model.get_weights()
  np.testing.assert_allclose(np.array(served["outputs"]), features @ kernel + bias, rtol=1e-5, atol=1e-6)


def test_export_of_a_lazily_built_model_before_any_data_says_what_to_do(tmp_path):
  trainer = trainer_testlib.make_trainer(
      tf.distribute.OneDeviceStrategy("/cpu:0"), model_fn=lambda: keras.Sequential([keras.layers.Dense(4)])
  )
  with pytest.raises(strategies.ConfigError, match=r"export needs the model's input shape.*keras\.Input"):
    trainer.export(str(tmp_path / "saved_model"))


def test_export_of_a_lazily_built_model_with_data_builds_it_and_serves(tmp_path):
  trainer = trainer_testlib.make_trainer(
      tf.distribute.OneDeviceStrategy("/cpu:0"), model_fn=lambda: keras.Sequential([keras.layers.Dense(4)])
  )
  path = trainer.export(str(tmp_path / "saved_model"), data=trainer_testlib.classification_data(8))
  features, _ = trainer_testlib.classification_arrays(5)
  served = tf.saved_model.load(path).signatures["serving_default"]
  (outputs,) = served(tf.constant(features)).values()
  np.testing.assert_allclose(outputs.numpy(), trainer.model(features).numpy(), rtol=1e-6)
  assert trainer.model.layers[0].kernel.shape == (trainer_testlib.NUM_FEATURES, 4)
