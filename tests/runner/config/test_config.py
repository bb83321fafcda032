"""The run config: schema, loading with overrides, validation messages, names, optimizers."""

import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import runner
from runner import tasks
from runner.config import registry
from runner.config import run_config as config_lib
import strategies
from strategies import ConfigError
from testlib import paths

REPO = paths.REPO
DIGITS = os.path.join(REPO, "configs", "digits.py")
SYNTHETIC = os.path.join(REPO, "configs", "synthetic.py")


@pytest.fixture
def user_module(tmp_path, monkeypatch):
  """Writes `usermod.py` (a model, a dataset and a task function) on sys.path."""
  (tmp_path / "usermod.py").write_text(textwrap.dedent("""
      import keras
      import numpy as np
      import tensorflow as tf
      import runner

      def tiny_model(config):
        return keras.Sequential([keras.layers.Dense(config.units)])

      def ramp(config, split):
        x = np.arange(config.size, dtype=np.float32)[:, None]
        return tf.data.Dataset.from_tensor_slices((x, 2.0 * x))

      def squared_error(config):
        return runner.tasks.Regression()

      NOT_A_FUNCTION = 3
      """))
  (tmp_path / "fieldsmod.py").write_text(textwrap.dedent("""
      from ml_collections import config_dict
      import runner

      @runner.config_fields(train_files="", num_classes=5, shuffle_buffer=0, vocab=config_dict.placeholder(str))
      def files(config, split):
        return config.train_files, split

      @runner.config_fields(global_batch_size=8)
      def batching(config, split):
        return config.global_batch_size, split
      """))
  (tmp_path / "brokenmod.py").write_text("import no_such_dependency_xyz\n")
  monkeypatch.syspath_prepend(str(tmp_path))
  yield
  for name in ("usermod", "fieldsmod", "brokenmod"):
    sys.modules.pop(name, None)


def test_default_config_has_every_field_of_the_design_with_a_default():
  config = config_lib.default_config()
  assert set(config) == {"mode", "strategy", "data", "model", "task", "optimizer", "trainer", "predict"}
  assert {"name", "global_batch_size", "eval_global_batch_size", "predict_split"} <= set(config.data)
  assert (config.data.predict_split, config.predict.checkpoint) == (None, "latest")
  assert set(config.optimizer) == {
      "name",
      "learning_rate",
      "schedule",
      "warmup_steps",
      "weight_decay",
      "clipnorm",
      "gradient_accumulation_steps",
      "ema_momentum",
      "end_learning_rate",
      "decay_rate",
      "decay_steps",
      "boundaries",
      "rates",
  }
  assert set(config.trainer) == {
      "train_steps",
      "steps_per_loop",
      "eval_every",
      "eval_steps",
      "checkpoint_every",
      "max_to_keep",
      "async_checkpoints",
      "jit_compile",
      "precision",
      "seed",
      "profile_steps",
      "best_metric",
      "best_mode",
      "export_every",
      "report_metric",
      "eval_timeout_seconds",
  }
  assert config.mode == "train_and_eval"
  assert (config.data.name, config.model.name, config.task.name) == ("synthetic", "mlp", "classification")
  assert config.data.num_classes == config.model.num_outputs == 10  # the default config is coherent
  assert set(config.strategy) == set(strategies.default_config())


def test_load_config_completes_overrides_and_locks():
  config = runner.load_config(
      DIGITS,
      [
          "trainer.train_steps=300",
          "strategy.name=mirrored",
          "strategy.devices=/cpu:0",
          "strategy.devices=/cpu:1",
          "model.hidden_units=(32, 16)",
          "trainer.jit_compile",
          "trainer.eval_every=None",
          "optimizer.learning_rate=1",
      ],
  )
  assert config.trainer.train_steps == 300
  assert config.strategy.devices == ("/cpu:0", "/cpu:1")  # a repeated tuple override collects
  assert config.model.hidden_units == (32, 16)
  assert config.trainer.jit_compile is True and config.trainer.eval_every is None
  assert config.optimizer.learning_rate == 1.0 and isinstance(config.optimizer.learning_rate, float)
  assert config.data.eval_global_batch_size == config.data.global_batch_size == 64  # resolved
  assert config.optimizer.weight_decay == 0.0  # a field the file did not set takes its default
  with pytest.raises(AttributeError):
    config.new_field = 1
  assert runner.load_config(DIGITS, {"trainer.seed": 7}).trainer.seed == 7
  assert runner.load_config(DIGITS, ["trainer.seed=None"]).trainer.seed is None  # Documented: random weights.


def test_config_file_variants():
  tpu = runner.load_config(DIGITS + ":tpu")
  assert tpu.strategy.name == "tpu" and tpu.trainer.precision == "mixed_bfloat16"
  assert tpu.trainer.steps_per_loop is None and tpu.data.global_batch_size % 32 == 0  # None: auto.
  regression = runner.load_config(SYNTHETIC + ":regression")
  assert (regression.task.name, regression.model.num_outputs, regression.data.regression) == ("regression", 1, True)
  with pytest.raises(ConfigError, match=r"no variant 'gpu'; variants: '' \(default\), 'tpu'"):
    runner.load_config(DIGITS + ":gpu")


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["trainer.train_step=5"], r"config.trainer has no field 'train_step'. Did you mean 'train_steps'\?"),
        (["optimiser.name=sgd"], r"config has no field 'optimiser'. Did you mean 'optimizer'\?"),
        (["data.num_examples=5"], r"config.data has no field 'num_examples'. Fields of config.data: .*test_fraction"),
        (["trainer.train_steps=abc"], r"config.trainer.train_steps must be an int, got 'abc'"),
        (["trainer.jit_compile=maybe"], r"config.trainer.jit_compile must be a bool, got 'maybe'"),
        ({"trainer.async_checkpoints": 1}, r"config.trainer.async_checkpoints must be a bool, got 1"),
        ({"optimizer.learning_rate": "fast"}, r"config.optimizer.learning_rate must be a float, got 'fast'"),
        (["trainer.train_steps"], r"'trainer.train_steps' has no value; write trainer.train_steps=VALUE"),
        (["trainer"], r"config.trainer is a section; override its fields one by one"),
        (["trainer.train_steps=None"], r"config.trainer.train_steps must be an int, got None"),
        (["trainer.train_steps=0"], r"config.trainer.train_steps must be a positive int, got 0"),
        (["trainer.train_steps=-5"], r"config.trainer.train_steps must be a positive int, got -5"),
        (
            ["trainer.steps_per_loop=100", "trainer.eval_every=150"],
            r"config.trainer.eval_every=150 is not a multiple of config.trainer.steps_per_loop=100.* such as 200",
        ),
        (
            ["trainer.steps_per_loop=100", "trainer.checkpoint_every=50"],
            r"config.trainer.checkpoint_every=50 is not a multiple of config.trainer.steps_per_loop=100.* such as 100",
        ),
        (
            ["trainer.profile_steps=(5, 2)"],
            r"config.trainer.profile_steps must be None or a pair of steps \(first, "
            r"last\) with 1 <= first <= last, e.g. \(5, 10\), got \(5, 2\)\.",
        ),
        (["trainer.profile_steps=(0, 2)"], r"config.trainer.profile_steps must be None or a pair .* got \(0, 2\)\."),
        (
            ["trainer.profile_steps=(1, 2, 3)"],
            r"config.trainer.profile_steps must be None or a pair .* got \(1, 2, 3\)",
        ),
        (
            ["trainer.profile_steps=(990, 1010)"],
            r"config.trainer.profile_steps=\(990, 1010\) goes past "
            r"config.trainer.train_steps=1000; choose steps the run trains\.",
        ),
        (["mode=trian"], r"config.mode='trian' is not valid. Did you mean 'train'\?"),
        (["strategy.name=mirored"], r"config.strategy.name='mirored' is not valid. Did you mean 'mirrored'\?"),
        (
            ["model.name=mpl"],
            r"Unknown model 'mpl'. Did you mean 'mlp'\? Built-in models: linear, mlp; or give an "
            r"import path 'package.module:function'",
        ),
        (["data.name=digitz"], r"Unknown dataset 'digitz'. Did you mean 'digits'\?"),
        (["task.name=clasification"], r"Unknown task 'clasification'. Did you mean 'classification'\?"),
        (
            ["model.name=no_such_package_xyz.models:mlp"],
            r"The model 'no_such_package_xyz.models:mlp' does not import: ModuleNotFoundError",
        ),
        (["model.name=runner.models:mpl"], r"module 'runner.models' has no attribute 'mpl'. Did you mean 'mlp'\?"),
        (["model.name=runner.models:BUILTINS"], r"The model 'runner.models:BUILTINS' is a dict, not a function"),
        (["data.global_batch_size=0"], r"config.data.global_batch_size must be a positive int, got 0"),
        (["optimizer.schedule=cosin"], r"config.optimizer.schedule='cosin' is not valid. Did you mean 'cosine'\?"),
        (
            ["optimizer.schedule=warmup_cosine", "optimizer.warmup_steps=1000"],
            r"needs 1 <= config.optimizer.warmup_steps < config.trainer.train_steps=1000, got warmup_steps=1000",
        ),
        (["optimizer.clipnorm=0"], r"config.optimizer.clipnorm must be None or a positive number, got 0.0"),
        (["trainer.precision=bfloat16"], r"config.trainer.precision='bfloat16' is not valid.*mixed_bfloat16"),
        (["model.hidden_units=(64, 0)"], r"hidden_units=\(64, 0\) must be a positive int, got 0"),
        (["model.dropout=1.0"], r"config.model.dropout must be in \[0, 1\), got 1.0"),
        (["model.activation=relux"], r"config.model.activation='relux' is not a Keras activation"),
        (["data.test_fraction=1.5"], r"config.data.test_fraction must be in \(0, 1\), got 1.5"),
        (["strategy.devices=/cpu:0"], r"config.strategy.devices=\('/cpu:0',\) is not used by strategy 'auto'"),
    ],
)
def test_bad_input_is_a_config_error_naming_what_is_valid(overrides, message):
  with pytest.raises(ConfigError, match=message):
    runner.load_config(DIGITS, overrides)


def test_a_missing_config_file_one_without_get_config_and_one_not_of_python(tmp_path):
  with pytest.raises(ConfigError, match=r"Config file '.*nothere.py' does not exist"):
    runner.load_config(str(tmp_path / "nothere.py:tpu"))
  (tmp_path / "empty.py").write_text("X = 1\n")
  with pytest.raises(ConfigError, match=r"has no function get_config\(\)"):
    runner.load_config(str(tmp_path / "empty.py"))
  (tmp_path / "config.yaml").write_text("model: mlp\n")
  with pytest.raises(ConfigError, match=r"Config file '.*config\.yaml' is not a Python file; give FILE\.py \(from "):
    runner.load_config(str(tmp_path / "config.yaml"))


@pytest.mark.parametrize(
    "source, message, cause",
    [
        (
            "import ml_collections\ndef get_config(:\n  pass\n",
            "{file}', line 2: SyntaxError: invalid syntax",
            SyntaxError,
        ),
        (
            "def get_config():\n  config = {}\n  raise ValueError('no variant here')\n",
            "{file}', line 3, in get_config(): ValueError: no variant here",
            ValueError,
        ),
        (
            "X = 1\nimport no_such_module_here\ndef get_config():\n  pass\n",
            "{file}', line 2: ModuleNotFoundError: No module named 'no_such_module_here'",
            ModuleNotFoundError,
        ),
        (
            "import sys\nsys.exit('bye')\n",
            "{file}', line 2: the config file tried to end the process with "
            "SystemExit('bye'); a config file must return its config (raise an exception to report a problem).",
            SystemExit,
        ),
        (
            "import sys\ndef get_config():\n  sys.exit(3)\n",
            "{file}', line 3, in get_config(): the config file tried to "
            "end the process with SystemExit(3); a config file must return its config (raise an exception to report a "
            "problem).",
            SystemExit,
        ),
        (
            "def get_config():\n  return 42\n",
            "{file}': get_config() returned 42 (int); it must return an ml_collections.ConfigDict.",
            type(None),
        ),
    ],
)
def test_a_config_file_that_fails_is_one_config_error_naming_the_file_and_line(tmp_path, source, message, cause):
  config_file = tmp_path / "broken.py"
  config_file.write_text(source)
  with pytest.raises(ConfigError) as raised:
    runner.load_config(str(config_file))
  assert str(raised.value) == "Config file '" + message.format(file=config_file)
  assert isinstance(raised.value.__cause__, cause)  # The config file's own traceback stays chained.


def test_switching_a_builtin_drops_the_old_defaults_and_rejects_set_fields():
  switched = runner.load_config(DIGITS, ["data.name=synthetic", "data.num_examples=100"])
  assert switched.data.num_examples == 100 and switched.data.num_features == 16
  assert "test_fraction" not in switched.data  # digits' field, at its default, is dropped
  with pytest.raises(
      ConfigError,
      match=r"config.model.hidden_units is not a field of model 'linear' \(a field of "
      r"another model, set to \(256, 128\)\)",
  ):
    runner.load_config(DIGITS, ["model.name=linear"])
  with pytest.raises(
      ConfigError, match=r"config.model.hidden_unit is not a field of model 'mlp'. Did you mean 'hidden_units'\?"
  ):
    config_lib.validate({"model": {"name": "mlp", "hidden_unit": (8,)}})


def test_validate_checks_types_of_a_config_built_in_python():
  with pytest.raises(ConfigError, match=r"config.trainer.steps_per_loop must be an int, got '10' \(str\)"):
    config_lib.validate({"trainer": {"steps_per_loop": "10"}})
  with pytest.raises(ConfigError, match=r"config.trainer must be a section"):
    config_lib.validate({"trainer": 3})
  validated = config_lib.validate({"data": {"name": "synthetic", "num_classes": 3}, "model": {"num_outputs": 3}})
  assert validated.data.num_examples == 2048 and validated.model.hidden_units == (128,)
  assert config_lib.validate(validated).to_dict() == validated.to_dict()  # idempotent


def test_import_paths_resolve_and_keep_their_own_fields(user_module):
  config = config_lib.validate(
      {
          "data": {"name": "usermod:ramp", "size": 8},
          "model": {"name": "usermod:tiny_model", "units": 1},
          "task": {"name": "usermod:squared_error"},
      }
  )
  assert config.data.size == 8 and config.model.units == 1
  undeclared = runner.load_config(SYNTHETIC, ["data.name=usermod:ramp"])  # declares no fields: keeps the file's
  assert undeclared.data.num_examples == 2048 and "size" not in undeclared.data
  with pytest.raises(ConfigError, match=r"config.data has no field 'size'"):
    runner.load_config(SYNTHETIC, ["data.name=usermod:ramp", "data.size=8"])
  assert registry.resolve("model", config.model.name)(config.model).layers[0].units == 1
  assert isinstance(registry.resolve("task", config.task.name)(config.task), tasks.Regression)
  with pytest.raises(
      ConfigError,
      match=r"The dataset 'brokenmod:ramp' does not import: ModuleNotFoundError: "
      r"No module named 'no_such_dependency_xyz'",
  ):
    registry.resolve("dataset", "brokenmod:ramp")
  with pytest.raises(ConfigError, match=r"The task 'usermod:NOT_A_FUNCTION' is a int, not a function"):
    registry.resolve("task", "usermod:NOT_A_FUNCTION")


def test_declared_fields_of_an_import_path_behave_like_a_builtins(user_module, tmp_path):
  config = runner.load_config(
      SYNTHETIC, ["data.name=fieldsmod:files", "data.train_files=/data/train-*.rec", "data.vocab=vocab.txt"]
  )
  assert (config.data.train_files, config.data.shuffle_buffer, config.data.vocab) == (
      "/data/train-*.rec",
      0,
      "vocab.txt",
  )
  assert config.data.num_classes == 5  # its default, not synthetic's 10 that the config file set
  assert set(config.data) == {
      "name",
      "global_batch_size",
      "eval_global_batch_size",
      "sharding",
      "predict_split",
      "service",
      "service_mode",
      "train_files",
      "num_classes",
      "shuffle_buffer",
      "vocab",
  }  # synthetic's fields dropped
  assert runner.load_config(SYNTHETIC, {"data.name": "fieldsmod:files", "data.shuffle_buffer": 9}).data.vocab is None
  with pytest.raises(
      ConfigError,
      match=r"config.data has no field 'train_file'. Did you mean 'train_files'\? "
      r"Fields of config.data: eval_global_batch_size, global_batch_size, name, "
      r"num_classes, predict_split, service, service_mode, sharding, shuffle_buffer, train_files, vocab.$",
  ):
    runner.load_config(SYNTHETIC, ["data.name=fieldsmod:files", "data.train_file=x"])
  with pytest.raises(ConfigError, match=r"config.data.shuffle_buffer must be an int, got 'big'"):
    runner.load_config(SYNTHETIC, ["data.name=fieldsmod:files", "data.shuffle_buffer=big"])
  with pytest.raises(
      ConfigError,
      match=r"config.data.train_file is not a field of dataset 'fieldsmod:files'. Did you mean 'train_files'\?",
  ):
    config_lib.validate({"data": {"name": "fieldsmod:files", "train_file": "x"}})
  (tmp_path / "own.py").write_text("def get_config():\n  return {'data': {'name': 'fieldsmod:files'}}\n")
  back = runner.load_config(str(tmp_path / "own.py"), ["data.name=synthetic"])  # its defaults give way
  assert back.data.num_classes == 10 and "train_files" not in back.data
  (tmp_path / "own_set.py").write_text(
      "def get_config():\n  return {'data': {'name': 'fieldsmod:files', 'train_files': 'a'}}\n"
  )
  with pytest.raises(
      ConfigError,
      match=r"config.data.train_files is not a field of dataset 'synthetic' \(a field "
      r"of another dataset, set to 'a'\)",
  ):
    runner.load_config(str(tmp_path / "own_set.py"), ["data.name=synthetic"])
  (tmp_path / "set.py").write_text("def get_config():\n  return {'data': {'name': 'synthetic', 'num_examples': 100}}\n")
  with pytest.raises(
      ConfigError,
      match=r"config.data.num_examples is not a field of dataset 'fieldsmod:files' "
      r"\(a field of another dataset, set to 100\)",
  ):
    runner.load_config(str(tmp_path / "set.py"), ["data.name=fieldsmod:files"])


@pytest.mark.parametrize(
    "fields, message",
    [
        (
            {"vocab": None},
            r"the default of 'vocab' is None \(NoneType\); a default is a bool, int, float, str or tuple, or "
            r"ml_collections.config_dict.placeholder\(TYPE\) \(TYPE one of those\) for an optional field",
        ),
        (
            {"files": ["a"]},
            r"the default of 'files' is \['a'\] \(list\); a default is a bool, int, float, str or tuple",
        ),
        ({"name": "x"}, r"'name' is the field that names the function"),
    ],
)
def test_a_declaration_that_cannot_work_is_a_config_error(fields, message):
  where = f"@runner.config_fields on {__name__}:test_a_declaration_that_cannot_work_is_a_config_error.<locals>.fn: "
  with pytest.raises(ConfigError, match=re.escape(where) + message):

    @runner.config_fields(**fields)
    def fn(config, split):
      del config, split


def test_a_module_declares_its_fields_before_it_imports_tensorflow():
  code = "import sys, runner; runner.config_fields(a=1)(lambda config: config); print('tensorflow' in sys.modules)"
  done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=False)
  assert (done.returncode, done.stdout) == (0, "False\n"), done.stderr


def test_a_declared_field_that_the_section_has_for_every_dataset_is_a_config_error(user_module):
  with pytest.raises(
      ConfigError,
      match=r"The dataset 'fieldsmod:batching' declares the field\(s\) "
      r"global_batch_size, which config.data has for every dataset",
  ):
    config_lib.validate({"data": {"name": "fieldsmod:batching"}})


def test_builtin_names_and_models():
  assert registry.names("model") == ["linear", "mlp"]
  assert registry.names("dataset") == ["digits", "synthetic", "tfds:NAME"]
  assert registry.names("task") == ["classification", "regression"]
  config = config_lib.default_config()
  with config.model.unlocked():
    config.model.hidden_units = (5, 4)
  model = registry.resolve("model", "mlp")(config.model)
  assert model(np.zeros((2, 3, 3), np.float32)).shape == (2, 10)
  assert [w.shape for w in model.weights[::2]] == [(9, 5), (5, 4), (4, 10)]


def test_digits_without_scikit_learn_says_how_to_install_it(monkeypatch):
  monkeypatch.setitem(sys.modules, "sklearn", None)  # makes `import sklearn` raise ImportError
  with pytest.raises(ConfigError, match=r"Dataset 'digits' needs scikit-learn.*pip install 'tf-runner\[examples\]'"):
    runner.load_config(DIGITS)
