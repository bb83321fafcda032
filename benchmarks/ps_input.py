"""Parameter-server input: the examples each worker reads, with 1, 2 and 4 workers.

`python -m benchmarks.ps_input [--workers=1,2,4] [--before=REV] [--steps_per_worker=100]`
runs, for each worker count N, a localhost cluster of real processes: a ps
task and N workers serving (`python -m runner` with their TF_CONFIG) and a
chief (`benchmarks/ps_input_chief.py`) whose Trainer trains
`steps_per_worker * N` steps (global batch 32) on `TFRecordFiles` sharded by
file (8 files, 2,048 records). The parse function prints each record's
number on the stderr of the worker that parses it (a counting map inside the
input pipeline), so the driver counts the records every worker read, and
which of them another worker read too. With `--before=REV` the same clusters
also run from that commit's tree (a temporary git worktree), in the same run.
It prints the machine and a Markdown table: per tree and N, the examples
trained per worker (steps x batch / N), the examples read per worker (min to
max), all workers' reads over the examples trained, and the records read by
more than one worker. Reads include what the pipelines read ahead (prefetch).
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf

from benchmarks import commits
from benchmarks import ps_input_chief
from benchmarks import throughput
from runner import launch as launcher
from strategies import peers

CHIEF_SCRIPT = os.path.abspath(ps_input_chief.__file__)
REPO_ROOT = throughput.REPO_ROOT
THIS_TREE = "this tree"
NUM_FILES = 8
RECORDS_PER_FILE = 256
GLOBAL_BATCH = ps_input_chief.GLOBAL_BATCH
READ_LINE = re.compile(rf"{ps_input_chief.READ_MARK} \[?([\d ]+)\]?")


def write_records(directory):
  """Writes NUM_FILES TFRecord files; record `k` of file `f` has the number `f * RECORDS_PER_FILE + k`."""
  rng = np.random.default_rng(0)
  for f in range(NUM_FILES):
    with tf.io.TFRecordWriter(os.path.join(directory, f"part-{f}.tfrecord")) as writer:
      for k in range(RECORDS_PER_FILE):
        feature = {
            "x": tf.train.Feature(
                float_list=tf.train.FloatList(value=rng.standard_normal(ps_input_chief.NUM_FEATURES))
            ),
            "y": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(rng.integers(0, 10))])),
            "n": tf.train.Feature(int64_list=tf.train.Int64List(value=[f * RECORDS_PER_FILE + k])),
        }
        writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
  return os.path.join(directory, "part-*.tfrecord")


def run_cluster(tree, workers, args, records, logs):
  """Runs one cluster of `tree` with `workers` workers; returns {"global_step", "reads": [numbers per worker]}."""
  cluster = launcher.cluster_spec(workers=workers, ps=1)
  env = dict(os.environ, PYTHONPATH=tree)
  serve = [sys.executable, "-m", "runner", f"--config={os.path.join(tree, 'configs', 'synthetic.py')}"]
  serve += ["--config.strategy.name=parameter_server", f"--workdir={os.path.join(logs, 'unused')}"]
  processes = {}

  def start(job, index, command):
    name = f"{job}{index}"
    task_env = dict(env, TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": job, "index": index}}))
    with open(os.path.join(logs, f"{name}.out"), "w") as out, open(os.path.join(logs, f"{name}.err"), "w") as err:
      processes[name] = subprocess.Popen(command, cwd=tree, env=task_env, stdout=out, stderr=err)

  try:
    for job in ("ps", "worker"):
      for index in range(len(cluster[job])):
        start(job, index, serve)
    deadline = time.monotonic() + args.timeout
    while not all(peers.listening(address) for job in ("ps", "worker") for address in cluster[job]):
      if time.monotonic() > deadline:
        raise RuntimeError(f"{tree}: the servers of {cluster} did not start in {args.timeout} s (logs in {logs})")
      time.sleep(0.5)
    steps = args.steps_per_worker * workers
    start("chief", 0, [sys.executable, CHIEF_SCRIPT, f"--records={records}", f"--steps={steps}"])
    for name, process in processes.items():
      if process.wait(timeout=args.timeout) != 0:
        raise RuntimeError(f"{tree}: {name} exited with {process.returncode}; see {logs}/{name}.err")
  finally:
    for process in processes.values():
      if process.poll() is None:
        process.kill()
        process.wait()
  with open(os.path.join(logs, "chief0.out")) as f:
    global_step = json.loads(f.read().strip().splitlines()[-1])["global_step"]
  reads = []
  for index in range(workers):
    with open(os.path.join(logs, f"worker{index}.err")) as f:
      reads.append([int(n) for match in READ_LINE.finditer(f.read()) for n in match.group(1).split()])
  return {"global_step": global_step, "reads": reads}


def row(tree, workers, result):
  """A Markdown row: tree, workers, steps, examples read per worker, all reads over examples trained, records shared."""
  counts = [len(numbers) for numbers in result["reads"]]
  owners = {}
  for worker, numbers in enumerate(result["reads"]):
    for n in set(numbers):
      owners.setdefault(n, set()).add(worker)
  shared = sum(1 for workers_of_n in owners.values() if len(workers_of_n) > 1)
  read = f"{min(counts):,}" if min(counts) == max(counts) else f"{min(counts):,} to {max(counts):,}"
  trained = result["global_step"] * GLOBAL_BATCH
  return (
      f"| {tree} | {workers} | {result['global_step']} | {trained / workers:,.0f} | {read} | "
      f"{sum(counts) / trained:.2f} | {shared:,} of {len(owners):,} |"
  )


def main(argv=None):
  """Runs the benchmark with the command-line arguments `argv` (default: `sys.argv[1:]`)."""
  parser = argparse.ArgumentParser(prog="python -m benchmarks.ps_input", description=__doc__.splitlines()[0])
  parser.add_argument("--workers", default="1,2,4", help="comma-separated worker counts")
  parser.add_argument("--before", help="also run the clusters from this commit (any git revision)")
  parser.add_argument("--steps_per_worker", type=int, default=100, help="steps trained = this x workers")
  parser.add_argument("--timeout", type=int, default=300, help="seconds allowed per cluster")
  args = parser.parse_args(argv)
  worker_counts = [int(n) for n in args.workers.split(",")]
  if min(worker_counts) < 1 or args.steps_per_worker < 1:
    parser.error(f"--workers and --steps_per_worker must be >= 1, got {args.workers} and {args.steps_per_worker}.")
  machine = throughput.machine_lines()
  start = time.perf_counter()
  rows = []
  with tempfile.TemporaryDirectory() as work, tempfile.TemporaryDirectory() as before_dir:
    records = write_records(work)
    trees = {THIS_TREE: REPO_ROOT}
    try:
      if args.before:
        trees[f"before ({commits.worktree(args.before, before_dir)})"] = before_dir
      for workers in worker_counts:
        for name, tree in trees.items():
          logs = tempfile.mkdtemp(dir=work)
          result = run_cluster(tree, workers, args, records, logs)
          rows.append(row(name, workers, result))
          print(rows[-1], file=sys.stderr, flush=True)
    finally:
      if args.before:
        subprocess.run(
            ["git", "-C", REPO_ROOT, "worktree", "remove", "--force", before_dir], check=False, capture_output=True
        )
  minutes = (time.perf_counter() - start) / 60
  throughput.print_machine(machine)
  print(f"\n## Parameter-server input ({minutes:.1f} min; TFRecordFiles by file, {NUM_FILES} files, global batch 32)\n")
  print(
      "| tree | workers | steps | examples trained per worker (mean) | examples read per worker | "
      "examples read / trained (all workers) | records read by 2+ workers |"
  )
  print("|---|---|---|---|---|---|---|")
  print("\n".join(rows))


if __name__ == "__main__":
  main()
