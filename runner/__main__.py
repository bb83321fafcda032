"""The command line: `python -m runner --config=FILE[:ARG] --workdir=DIR [--config.a.b=v ...]`.

Flags:
  --config=FILE.py[:ARG]  the config file (its get_config() or get_config(ARG)); required.
  --config.a.b=VALUE      overrides config.a.b (repeatable; parsed by ml-collections
                          config_flags; 'None' sets an optional field to None).
  --workdir=DIR           checkpoints, summaries, metrics.jsonl, config.json, export
                          (a leading ~ expanded); default: a new temporary directory,
                          or under Vertex AI the directories of AIP_CHECKPOINT_DIR,
                          AIP_TENSORBOARD_LOG_DIR and AIP_MODEL_DIR (`runner.cluster.vertex`).
  --mode=MODE             overrides config.mode (train, eval, train_and_eval, export,
                          continuous_eval, predict); with another --config.mode, an error.
  --dry_run               prints the resolved config, the strategy, the replicas, the
                          per-replica batch sizes, whether the workdir holds a run and
                          the step it would resume from, and the step plan from there;
                          refuses what the run would refuse of the workdir's checkpoint;
                          writes nothing.
  --verbose               an error line (exit 2, 3, 170 or 171) prints its traceback
                          (with the exception it came from, e.g. the one a config
                          file raised) before its `error:` line.
  --check_tpu             compiles and runs the config's train and eval steps the way
                          a TPU would, on logical CPUs, and prints one line `PASS: ...`
                          or exits 2 naming what a TPU would reject (`runner.tpu.check`);
                          trains nothing lasting, writes nothing.

On a worker or ps task of a parameter-server cluster (TF_CONFIG task type
'worker' or 'ps', config.strategy.name 'parameter_server') the same command
serves instead of training, until the coordinator (the chief) is done; see
`runner.cluster.task_server`.

Exit status: 0 done; 2 a user error (bad config, override, name, batch size,
workdir, no TPU, a checkpoint that does not match or cannot be written, what
--check_tpu finds a TPU would reject, data that does not fit the model or
the task, cannot be read or holds NaN or inf), as one line `error: ...` on
stderr (with --verbose, after its traceback); 3 training diverged: a step's
loss or gradients were not finite while its batch was, as one `error:` line;
170 a peer of a multi-worker job (or the tf.data service's dispatcher) could
not be reached, never came or stopped answering (one `error:` line naming it;
transient: a restart of the job resumes it); 171 the workdir's file system could not be reached (no
network; one `error:` line naming it and the reason; transient: a later run
may reach it); 143 after SIGTERM and 130 after Ctrl-C (a checkpoint saved at the end of the current loop; a
second Ctrl-C aborts; during start-up one line `Stopped by SIGTERM during
start-up; nothing was written.`, see `stop_signals.handle_outside_training`);
1 any other error, a bug, with its traceback. 1-127 are permanent, 128-255
transient (`runner.exit_codes`; docs/clusters.md#exit-statuses).
TensorFlow's C++ start-up chatter is hidden, and lines below a TF_CPP_MIN_LOG_LEVEL
the user set (from 1 on) too; 0 shows everything (see `tensorflow_logs`).

TensorFlow is imported only once the config is loaded and checked: --help,
a bad flag and a config error answer without loading it.
"""

from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple, NoReturn

from runner.cluster import stop_signals

stop_signals.handle_outside_training()  # First: SIGTERM at start-up ends the process with one line, writing nothing.

from runner.outputs import tensorflow_logs

tensorflow_logs.quiet_start()  # Before anything imports TensorFlow, the runner or a user's module.

import contextlib
import re
import sys
import traceback

from absl import app
from absl import flags
from absl import logging as absl_logging

from runner import exit_codes
from runner.cluster import process_exit
from runner.config import run_config as config_lib
from runner.workdir import remote
import strategies
from strategies.errors import ClusterError
from strategies.errors import ConfigError
from strategies.errors import print_error_line

_OVERRIDE = re.compile(r"^--?(no)?config\.(.+)$")

_CONFIG = flags.DEFINE_string(
    "config",
    None,
    "The config file, FILE.py or FILE.py:ARG for get_config(ARG), e.g. configs/digits.py:tpu. "
    "Override any field with --config.SECTION.FIELD=VALUE, e.g. --config.strategy.name=mirrored.",
)
_WORKDIR = flags.DEFINE_string(
    "workdir",
    None,
    "Where checkpoints, summaries, metrics.jsonl, config.json and the export go (local or gs://). "
    "A workdir with checkpoints resumes. Default: a new temporary directory, or Vertex AI's AIP_CHECKPOINT_DIR "
    "(summaries to AIP_TENSORBOARD_LOG_DIR, the final export to AIP_MODEL_DIR).",
)
_MODE = flags.DEFINE_enum("mode", None, config_lib.MODES, "Overrides config.mode.")
_DRY_RUN = flags.DEFINE_bool("dry_run", False, "Print what the run would do, and from which step; write nothing.")
_CHECK_TPU = flags.DEFINE_bool(
    "check_tpu", False, "Run the config's steps as a TPU would (XLA, static shapes) on CPUs; name what it rejects."
)
_VERBOSE = flags.DEFINE_bool("verbose", False, "Print an error line's traceback (exit 2, 3, 170 or 171) before it.")
# The exceptions that end the command line with one `error:` line, and their exit statuses (`runner.exit_codes`).
_ERROR_LINES = {
    ConfigError: exit_codes.USER_ERROR,
    FloatingPointError: exit_codes.NON_FINITE,
    ClusterError: exit_codes.CLUSTER,
    remote.UnreachableError: exit_codes.UNREACHABLE,
}
# What `--check_tpu` made that holds tf.data iterators: never deleted (`run_main` exits without teardown).
_KEPT_UNTIL_EXIT: list[Any] = []


class CommandLine(NamedTuple):
  """The parsed command line: absl's leftover arguments and the config overrides."""

  arguments: list[str]
  overrides: list[str]


def parse_flags(argv: list[str]) -> CommandLine:
  """Parses the absl flags and collects the `--config.*` overrides (absl's `flags_parser`).

  The overrides are parsed later, against the loaded config, by
  `runner.load_config`. A bad flag prints one line and exits 2; `--help`
  prints the usage and exits 0.

  Returns:
    A `CommandLine`.
  """
  try:
    argv = flags.FLAGS.read_flags_from_files(argv, force_gnu=False)
  except flags.CantOpenFlagFileError as e:
    exit_with_user_error(f"{str(e).removeprefix('ERROR:: ')}; --flagfile names a file of flags, one per line.")
  overrides, rest = [], [argv[0]]
  for argument in argv[1:]:
    match = _OVERRIDE.match(argument)
    if match is None:
      rest.append(argument)
    else:
      negated, override = match.groups()
      overrides.append(f"{override}=false" if negated else override)
  arguments = strategies.flags.parse_flags(rest)  # --help exits 0, a bad flag 2.
  if _CONFIG.value is None:
    exit_with_user_error("--config is required, e.g. --config=configs/digits.py")
  return CommandLine(arguments=arguments, overrides=overrides)


def exit_with_user_error(error: BaseException | str, status: int = exit_codes.USER_ERROR) -> NoReturn:
  """Prints `error` as one line `error: ...` on stderr (after its traceback with --verbose) and exits with `status`."""
  if isinstance(error, BaseException) and flags.FLAGS.is_parsed() and _VERBOSE.value:
    traceback.print_exception(type(error), error, error.__traceback__)
  print_error_line(error)
  sys.exit(status)


def format_metrics(metrics: Mapping[str, float]) -> str:
  """Returns 'name=value ...' sorted by name, floats with 4 decimals, ints (counts) as they are."""
  return " ".join(
      f"{name}={value}" if isinstance(value, int) else f"{name}={value:.4f}" for name, value in sorted(metrics.items())
  )


def main(command_line: CommandLine) -> None:
  """Runs the command line; a ConfigError, non-finite step, ClusterError or unreachable workdir is an `error:` line.

  A run (`runner.run`) prints what it did: the workdir, strategy, global step, metrics, export and predictions.
  """
  with _exit_statuses():
    workdir = remote.user_path(_WORKDIR.value)
    config = _config(command_line)
    # The config holds; what follows needs TensorFlow's devices.
    if _CHECK_TPU.value:  # Before any TensorFlow device work: it splits the CPU into logical CPUs.
      _check_tpu(config)
      return
    if _served(config):  # A worker or ps task of a parameter-server cluster only serves.
      return
    if _DRY_RUN.value:
      _dry_run(config, workdir)
      return
    from runner import from_config

    result = from_config.run(config, workdir)
  print(f"workdir: {result.workdir}")
  print(f"strategy: {strategies.describe(result.strategy)}")
  print(f"global step: {result.global_step}")
  if result.train_metrics:
    print(f"train: {format_metrics(result.train_metrics)}")
  if result.eval_metrics:
    print(f"eval: {format_metrics(result.eval_metrics)}")
  if result.export_path:
    print(f"export: {result.export_path}")
  if result.predictions_path:
    print(f"predictions: {result.predictions_path}")


@contextlib.contextmanager
def _exit_statuses() -> Iterator[None]:
  """Inside, a ConfigError, a FloatingPointError or a ClusterError exits with its status (`exit_codes`) and one line."""
  try:
    yield
  except BaseException as e:
    stopped = stop_signals.raised_stop()
    if stopped is not None and e is not stopped:  # What a library made of a stop signal (see `raised_stop`).
      raise stopped from None
    for error, status in _ERROR_LINES.items():
      if isinstance(e, error):
        exit_with_user_error(e, status)
    raise


def _config(command_line: CommandLine) -> Any:
  """The run config of the command line: the config file with its overrides and `--mode`, validated."""
  if command_line.arguments[1:]:
    raise ConfigError(
        f"Unexpected arguments {command_line.arguments[1:]}; give overrides as --config.SECTION.FIELD=VALUE."
    )
  if _DRY_RUN.value and _CHECK_TPU.value:
    raise ConfigError("--dry_run prints the plan and --check_tpu runs steps to check them for a TPU; give one.")
  for override in command_line.overrides:
    field, _, mode = override.partition("=")
    if _MODE.value and field == "mode" and mode != _MODE.value:
      raise ConfigError(f"--mode={_MODE.value} and --config.mode={mode} disagree; give one of them.")
  overrides = command_line.overrides + ([f"mode={_MODE.value}"] if _MODE.value else [])
  assert _CONFIG.value is not None  # The command line was parsed: it names a config file.
  return config_lib.load_config(_CONFIG.value, overrides)


def _check_tpu(config: Any) -> None:
  from runner.tpu import check as tpu_check

  verdict = tpu_check.check_tpu(config, kept=_KEPT_UNTIL_EXIT)
  if not verdict.passed:
    raise ConfigError(f"TPU check failed: {verdict.problem}")
  print(verdict.summary)


def _served(config: Any) -> bool:
  """Serves when this process is a worker or ps task of a parameter-server cluster; returns whether it was one."""
  from runner.cluster import roles

  role, found = roles.role(config)
  if role != roles.SERVE:
    return False
  from runner.cluster import task_server  # Imports TensorFlow: only once the cluster is known to be good.

  if _DRY_RUN.value:
    print(found.describe())
    print(f"plan: {task_server.describe(found)}")
    print("dry run: nothing served.")
  else:
    absl_logging.info("%s.", found.describe())
    task_server.serve(found, config.strategy.timeout_seconds)
  return True


def _dry_run(config: Any, workdir: str | None) -> None:
  """Prints what the run would do; refuses what it would refuse (`from_config.check_resumable`)."""
  from runner import from_config
  from runner.cluster import roles
  from runner.cluster import vertex
  from runner.outputs import checkpoints

  print(roles.cluster_of(config).describe())
  config = from_config.for_this_task(config)
  strategy = from_config.create_strategy(config)
  batch_sizes = from_config.per_replica_batch_sizes(config, strategy.num_replicas_in_sync)
  outputs = vertex.output_dirs(workdir)
  workdir = from_config.reachable_workdir(outputs.workdir)
  step = checkpoints.latest_step(workdir)
  if workdir is not None and step is not None and config.mode != "continuous_eval":  # As `runner.run` checks it.
    from_config.check_resumable(config, workdir)
  print(f"config:\n{config}")
  print(f"strategy: {strategies.describe(strategy)}")
  print(f"replicas: {strategy.num_replicas_in_sync}")
  print(f"per-replica batch size: train {batch_sizes['train']}, eval {batch_sizes['eval']}")
  print(f"workdir: {from_config.describe_workdir(workdir, step)}")
  for line in outputs.describe():
    print(f"vertex: {line}")
  print(f"plan: {from_config.step_plan(config, strategy, step)}")
  print("dry run: nothing trained or written.")


def run_main() -> None:
  """The `tf-runner` console script and `python -m runner`: every way out ends the process at once.

  Logs and output are flushed, then the process exits with
  `process_exit.exit_now` (`os._exit` once AutoGraph's files are deleted),
  skipping interpreter teardown, where TensorFlow's tf.data can deadlock
  deleting a live iterator (a finished or failed run would then never end,
  and on a cluster would block every restart). Files are already complete:
  checkpoints are written synchronously and the reports are flushed by the
  Trainer.
  """
  status = 1
  script = sys.modules["__main__"]
  if script is not sys.modules[__name__]:  # The console script: absl's --help shows __main__'s docstring and flags.
    script.__doc__ = __doc__
    for flag in flags.FLAGS.get_key_flags_for_module(__name__):
      flags.FLAGS.register_key_flag_for_module(sys.argv[0], flag)
  try:
    with stop_signals.raising_stops():
      app.run(main, flags_parser=parse_flags)
    status = 0
  except SystemExit as e:
    status = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
  except stop_signals.Stopped as e:  # SIGTERM or Ctrl-C outside a training loop.
    print(e.line, file=sys.stderr)
    status = e.exit_code
  except BaseException:  # noqa: BLE001
    traceback.print_exc()  # A bug: keep its traceback.
  finally:
    absl_logging.flush()
    process_exit.exit_now(status)


if __name__ == "__main__":
  run_main()
