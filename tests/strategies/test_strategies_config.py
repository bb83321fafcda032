"""strategies.create / default_config / names / describe / flags, and every bad-input message."""

import json
import logging
import os
import subprocess
import sys

from absl import flags
import ml_collections
import pytest
import tensorflow as tf

import strategies
from testlib import paths

TIMEOUT_SECONDS = 120
FIELDS = [
    "name",
    "device",
    "devices",
    "virtual_cpus",
    "cross_device_ops",
    "num_packs",
    "communication",
    "timeout_seconds",
    "cluster",
    "num_ps",
    "worker_hosts",
    "task_index",
    "min_shard_bytes",
    "tpu",
    "zone",
    "project",
    "computation_shape",
    "num_replicas",
    "spmd_xla_partitioning",
]


def test_default_config_has_exactly_the_design_fields_at_their_defaults():
  config = strategies.default_config()
  assert isinstance(config, ml_collections.ConfigDict)
  assert sorted(config.keys()) == sorted(FIELDS)
  assert config.to_dict() == {
      "name": "auto",
      "device": None,
      "devices": None,
      "virtual_cpus": None,
      "cross_device_ops": "auto",
      "num_packs": 1,
      "communication": "auto",
      "timeout_seconds": 300.0,
      "cluster": "auto",
      "num_ps": None,
      "worker_hosts": None,
      "task_index": None,
      "min_shard_bytes": None,
      "tpu": "",
      "zone": None,
      "project": None,
      "computation_shape": None,
      "num_replicas": None,
      "spmd_xla_partitioning": False,
  }


def test_default_config_fields_accept_values_of_their_type():
  config = strategies.default_config()
  config.devices = ["/cpu:0", "/cpu:1"]
  config.task_index = 1
  config.timeout_seconds = 30
  assert (config.devices, config.task_index, config.timeout_seconds) == (("/cpu:0", "/cpu:1"), 1, 30.0)
  with pytest.raises(TypeError):
    config.task_index = "one"


def test_names():
  assert strategies.names() == [
      "auto",
      "default",
      "one_device",
      "mirrored",
      "multi_worker_mirrored",
      "parameter_server",
      "tpu",
  ]


def test_create_from_config_dict(cpu_devices):
  config = strategies.default_config()
  config.name = "mirrored"
  config.devices = cpu_devices(2)
  config.cross_device_ops = "reduce_to_one"
  strategy = strategies.create(config)
  assert isinstance(strategy, strategies.MirroredStrategy)
  assert strategies.describe(strategy) == "mirrored: 2 replicas on CPU:0, CPU:1"


def test_create_from_frozen_config_dict():
  config = strategies.default_config()
  config.name = "one_device"
  config.device = "/cpu:2"
  strategy = strategies.create(ml_collections.FrozenConfigDict(config))
  assert strategies.describe(strategy) == "one_device: 1 replica on CPU:2"


@pytest.mark.parametrize(
    "config, wrapper, description",
    [
        ({"name": "one_device"}, strategies.OneDeviceStrategy, "one_device: 1 replica on CPU:0"),
        ({"name": "mirrored"}, strategies.MirroredStrategy, "mirrored: 4 replicas on CPU:0, CPU:1, CPU:2, CPU:3"),
        (
            {"name": "mirrored", "devices": ("cpu:3", "/device:CPU:1")},
            strategies.MirroredStrategy,
            "mirrored: 2 replicas on CPU:3, CPU:1",
        ),
        (
            {"name": "mirrored", "virtual_cpus": 4},
            strategies.MirroredStrategy,
            "mirrored: 4 replicas on CPU:0, CPU:1, CPU:2, CPU:3",
        ),
        ({"name": "default"}, strategies.DefaultStrategy, "default: 1 replica on the current device (no distribution)"),
    ],
)
def test_create_from_plain_dict(config, wrapper, description):
  strategy = strategies.create(config)
  assert isinstance(strategy, wrapper)
  assert strategies.describe(strategy) == description


def test_auto_on_a_cpu_host_with_logical_cpus_is_mirrored_over_them_and_logs_one_line(caplog, monkeypatch):
  for variable in strategies.tpu.TPU_ENVIRONMENT_VARIABLES:
    monkeypatch.delenv(variable, raising=False)
  caplog.set_level(logging.INFO, logger="absl")
  strategy = strategies.create(None)
  assert strategies.describe(strategy) == "mirrored: 4 replicas on CPU:0, CPU:1, CPU:2, CPU:3"
  decisions = [r.getMessage() for r in caplog.records if "auto chose" in r.getMessage()]
  assert decisions == ["Strategy auto chose mirrored: no TPU or GPU, 4 logical CPUs."]


def test_describe_names_a_plain_tensorflow_strategy():
  assert strategies.describe(tf.distribute.OneDeviceStrategy("/cpu:1")) == "one_device: 1 replica on CPU:1"


@pytest.mark.parametrize(
    "config, message",
    [
        (
            {"name": "mirored"},
            r"config.strategy.name='mirored' is not valid. Did you mean 'mirrored'\? "
            r"Valid: auto, default, one_device, mirrored, multi_worker_mirrored, parameter_server, tpu.",
        ),
        (
            {"name": "mirrored", "device": "/cpu:0"},
            r"config.strategy.device='/cpu:0' is not used by strategy 'mirrored', which reads devices, virtual_cpus, "
            r"cross_device_ops, num_packs. Remove it, or choose a strategy that uses it: one_device.",
        ),
        (
            {"name": "mirrored", "tpu": "local"},
            r"config.strategy.tpu='local' is not used by strategy 'mirrored'.*: tpu.",
        ),
        (
            {"name": "default", "virtual_cpus": 4},
            r"virtual_cpus=4 is not used by strategy 'default', which reads no other field.*auto, one_device, mirrored.",
        ),
        ({"name": "tpu", "num_packs": 2}, r"num_packs=2 is not used by strategy 'tpu'"),
        (
            {"name": "one_device", "worker_hosts": ["a:1"]},
            r"worker_hosts=\['a:1'\] is not used.*multi_worker_mirrored.",
        ),
        ({"nmae": "mirrored"}, r"config.strategy has no field 'nmae'. Did you mean 'name'\? Fields: name, device, "),
        (
            {"name": "one_device", "device": "/gpu:0"},
            r"device='/gpu:0' does not exist in this process. Devices TensorFlow sees: /device:CPU:0, /device:CPU:1, "
            r"/device:CPU:2, /device:CPU:3.",
        ),
        ({"name": "one_device", "device": "not a device"}, r"device='not a device' does not exist"),
        ({"name": "mirrored", "devices": ["/cpu:0", "/cpu:9"]}, r"devices\[\]='/cpu:9' does not exist.*/device:CPU:3"),
        ({"name": "mirrored", "devices": "/cpu:0"}, r"devices must be a non-empty list of strings"),
        ({"name": "mirrored", "devices": ["/cpu:1", "cpu:1"]}, r"devices lists /device:CPU:1 more than once"),
        (
            {"name": "mirrored", "cross_device_ops": "ncl"},
            r"cross_device_ops='ncl' is not valid. Did you mean 'nccl'\? Valid: auto, nccl, hierarchical_copy, reduce_to_one.",
        ),
        ({"name": "mirrored", "cross_device_ops": "nccl"}, r"'nccl' all-reduces across GPUs, but /device:CPU:0"),
        (
            {"name": "mirrored", "num_packs": 2},
            r"num_packs=2 is used only by cross_device_ops 'nccl' or 'hierarchical_copy', not 'auto'",
        ),
        (
            {"name": "mirrored", "cross_device_ops": "hierarchical_copy", "num_packs": 0},
            r"num_packs must be a positive int, got 0.",
        ),
        (
            {"name": "mirrored", "virtual_cpus": 2},
            r"virtual_cpus=2: virtual_cpus\(2\) came too late: TensorFlow already "
            r"initialized its devices with 4 logical CPU",
        ),
        ({"name": "mirrored", "virtual_cpus": 0}, r"virtual_cpus=0: virtual_cpus needs a positive int"),
        (
            {"name": "multi_worker_mirrored", "worker_hosts": ["localhost:1", "localhost:2"], "task_index": 2},
            r"task_index=2 is outside worker_hosts \(localhost:1, localhost:2\); valid: 0 to 1.",
        ),
        (
            {"name": "multi_worker_mirrored", "worker_hosts": ["localhost:1"], "task_index": -1},
            r"task_index=-1 is outside worker_hosts",
        ),
        (
            {"name": "multi_worker_mirrored", "worker_hosts": ["localhost:1", "localhost:2"]},
            r"worker_hosts needs task_index, this worker's position in it: 0 to 1.",
        ),
        ({"name": "multi_worker_mirrored", "task_index": 0}, r"task_index=0 needs worker_hosts"),
        (
            {"name": "multi_worker_mirrored", "worker_hosts": ["localhost"], "task_index": 0},
            r"worker_hosts entry 'localhost' is not 'host:port'",
        ),
        (
            {"name": "multi_worker_mirrored", "communication": "rings"},
            r"communication='rings' is not valid. Did you mean 'ring'\? Valid: auto, ring, nccl.",
        ),
        ({"name": "multi_worker_mirrored", "communication": "nccl"}, r"communication='nccl' needs GPUs"),
        (
            {"name": "multi_worker_mirrored", "timeout_seconds": -5.0},
            r"timeout_seconds must be None or a positive number, got -5\.0\.",
        ),
        ({"name": "parameter_server", "min_shard_bytes": 0}, r"min_shard_bytes must be a positive int, got 0."),
    ],
)
def test_bad_config_message(config, message):
  with pytest.raises(strategies.ConfigError, match=message):
    strategies.create(config)


def test_config_must_be_a_mapping():
  with pytest.raises(strategies.ConfigError, match=r"must be a ConfigDict or a mapping, got str"):
    strategies.create("mirrored")


def test_parameter_server_without_a_ps_job(monkeypatch):
  monkeypatch.setenv(
      "TF_CONFIG",
      json.dumps(
          {"cluster": {"chief": ["localhost:1"], "worker": ["localhost:2"]}, "task": {"type": "chief", "index": 0}}
      ),
  )
  with pytest.raises(
      strategies.ConfigError,
      match=r"parameter_server needs a 'ps' job in the cluster \(cluster from TF_CONFIG: 1 chief, 1 worker; this task is chief:0 at .*\), which has chief, worker. "
      r"Example TF_CONFIG: ",
  ):
    strategies.create({"name": "parameter_server"})


def test_parameter_server_on_a_worker_task(monkeypatch):
  monkeypatch.setenv(
      "TF_CONFIG",
      json.dumps(
          {
              "cluster": {"chief": ["localhost:1"], "worker": ["localhost:2"], "ps": ["localhost:3"]},
              "task": {"type": "worker", "index": 0},
          }
      ),
  )
  with pytest.raises(
      strategies.ConfigError, match=r"This process is task worker:0 of a parameter-server cluster; only the coordinator"
  ):
    strategies.create({"name": "parameter_server"})


def test_parameter_server_without_tf_config(monkeypatch):
  monkeypatch.delenv("TF_CONFIG", raising=False)
  with pytest.raises(
      strategies.ConfigError,
      match=r"needs a 'ps' job in the cluster \(cluster: none \(no TF_CONFIG, CLUSTER_SPEC or SLURM step of more than one task\): this process alone\), which has no jobs",
  ):
    strategies.create({"name": "parameter_server"})


def test_malformed_tf_config(monkeypatch):
  monkeypatch.setenv("TF_CONFIG", "{cluster: worker}")
  with pytest.raises(strategies.ConfigError, match=r"TF_CONFIG='\{cluster: worker\}' is not valid; it must be JSON"):
    strategies.create({"name": "parameter_server"})


def test_multi_worker_with_both_tf_config_and_worker_hosts(monkeypatch):
  monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": {"worker": ["localhost:1"]}}))
  with pytest.raises(strategies.ConfigError, match=r"Both TF_CONFIG and worker_hosts define the cluster"):
    strategies.create({"name": "multi_worker_mirrored", "worker_hosts": ["localhost:1"], "task_index": 0})


def test_default_strategy_inside_another_scope(cpu_devices):
  with strategies.MirroredStrategy(cpu_devices(2)).scope():
    with pytest.raises(strategies.ConfigError, match=r"inside the scope of MirroredStrategy; create it outside"):
      strategies.DefaultStrategy()


def parse_flags(*argv):
  flag_values = flags.FlagValues()
  strategies.flags.define_flags(flag_values)
  strategies.flags.define_flags(flag_values)  # A second call is a no-op.
  flag_values(["script", *argv])
  return flag_values


def test_flag_defaults_are_the_config_defaults():
  assert strategies.flags.config_from_flags(parse_flags()) == strategies.default_config().to_dict()


def test_flags_build_the_strategy(cpu_devices):
  flag_values = parse_flags(
      "--strategy=mirrored",
      f"--devices={','.join(cpu_devices(2))}",
      "--cross_device_ops=hierarchical_copy",
      "--num_packs=2",
  )
  strategy = strategies.flags.create_from_flags(flag_values)
  assert strategies.describe(strategy) == "mirrored: 2 replicas on CPU:0, CPU:1"


def test_flags_give_tpu_fields_their_types():
  config = strategies.flags.config_from_flags(
      parse_flags(
          "--strategy=tpu", "--tpu=local", "--computation_shape=1,1,1,2", "--num_replicas=4", "--spmd_xla_partitioning"
      )
  )
  assert (config["computation_shape"], config["num_replicas"], config["spmd_xla_partitioning"]) == (
      [1, 1, 1, 2],
      4,
      True,
  )


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["--strategy=mirrord"],
            r"flag --strategy=mirrord: --strategy='mirrord' is not valid. Did you mean 'mirrored'\?",
        ),
        (
            ["--strategy=mirrored", "--tpu=local"],
            r"--tpu='local' is not used by strategy 'mirrored', which reads devices, .*: tpu.",
        ),
        (
            ["--worker_hosts=localhost:1,localhost:2"],
            r"--worker_hosts=\['localhost:1', 'localhost:2'\] is not used by strategy 'auto'",
        ),
        (["--strategy=tpu", "--computation_shape=1,x"], r"--computation_shape=1,x must be comma-separated ints"),
    ],
)
def test_bad_flags_fail_when_parsed(argv, message):
  with pytest.raises(flags.IllegalFlagValueError, match=message):
    parse_flags(*argv)


def run_python(args, env):
  result = subprocess.run(
      [sys.executable, *args], env=env, capture_output=True, text=True, timeout=TIMEOUT_SECONDS, check=False
  )
  assert result.returncode == 0, result.stderr[-3000:]
  return result.stdout


def test_user_script_with_flags_runs_mirrored_on_two_virtual_cpus(subprocess_env):
  script = os.path.join(paths.TESTLIB, "flags_script.py")
  report = json.loads(run_python([script, "--strategy=mirrored", "--virtual_cpus=2"], subprocess_env).splitlines()[-1])
  assert report == {
      "replicas": 2,
      "all_reduce_sum": 3.0,
      "variable": 3.0,
      "strategy": "mirrored: 2 replicas on CPU:0, CPU:1",
  }


def test_python_m_strategies_prints_devices_and_auto_choice(subprocess_env):
  for variable in strategies.tpu.TPU_ENVIRONMENT_VARIABLES:
    subprocess_env.pop(variable, None)
  output = run_python(
      ["-m", "strategies", "--virtual_cpus=3", "--strategy=one_device", "--device=/cpu:2"], subprocess_env
  )
  assert "/physical_device:CPU:0" in output
  assert "Logical devices:\n  /device:CPU:0\n  /device:CPU:1\n  /device:CPU:2\n" in output
  assert "auto would choose: mirrored (no TPU or GPU, 3 logical CPUs)\n" in output
  assert output.endswith("--strategy=one_device: one_device: 1 replica on CPU:2\n")


def test_python_m_strategies_prints_a_config_error_in_one_line(subprocess_env):
  result = subprocess.run(
      [sys.executable, "-m", "strategies", "--strategy=one_device", "--device=/gpu:3"],
      env=subprocess_env,
      capture_output=True,
      text=True,
      timeout=TIMEOUT_SECONDS,
      check=False,
  )
  assert result.returncode == 2
  assert (
      "error: device='/gpu:3' does not exist in this process. Devices TensorFlow sees: /device:CPU:0." in result.stderr
  )
  assert "Traceback" not in result.stderr


def test_python_m_strategies_exits_2_for_bad_input_and_0_for_help(subprocess_env):
  processes = {
      args[-1]: subprocess.Popen(
          [sys.executable, "-m", "strategies", *args],
          env=subprocess_env,
          stdout=subprocess.PIPE,
          stderr=subprocess.PIPE,
          text=True,
      )
      for args in (["--strategy=mirorred"], ["--help"], ["--virtual_cpus=2", "mirrored"])
  }
  outputs = {}
  for flag, process in processes.items():
    stdout, stderr = process.communicate(timeout=TIMEOUT_SECONDS)
    outputs[flag] = (process.returncode, stdout, stderr)
  status, _, stderr = outputs["--strategy=mirorred"]
  assert status == 2
  assert [line for line in stderr.splitlines() if line.startswith("error:")] == [
      "error: flag --strategy=mirorred: --strategy='mirorred' is not valid. Did you mean 'mirrored'? Valid: auto, "
      "default, one_device, mirrored, multi_worker_mirrored, parameter_server, tpu."
  ]
  assert "Traceback" not in stderr and "FATAL" not in stderr
  status, _, stderr = outputs["mirrored"]
  assert status == 2 and "Traceback" not in stderr
  assert [line for line in stderr.splitlines() if line.startswith("error:")] == [
      "error: Unexpected arguments ['mirrored']; give flags as --NAME=VALUE."
  ]
  status, stdout, stderr = outputs["--help"]
  assert status == 0, stderr
  assert "--strategy" in stdout and "--virtual_cpus" in stdout
