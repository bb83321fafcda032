"""The cluster of a SLURM job step: every task's role and address from SLURM's environment, on CPU or GPU nodes.

Every task of an `srun` step runs the same command; this module reads the
variables SLURM gives each task and returns the same cluster on all of them,
without TensorFlow, `scontrol` or `nvidia-smi`:

* Roles, from the task rank `SLURM_PROCID`: without parameter servers every
  task is a worker and rank r is 'worker:r' (worker 0 is the chief, as
  under `runner.launch --workers=N`). With `num_ps` parameter servers, rank 0
  is 'chief:0', ranks 1..num_ps are 'ps:0'.. and the rest 'worker:0'...
* Hosts: the step's node list (`SLURM_STEP_NODELIST`, a hostlist such as
  `node[01-03,07],gpu-a1`, expanded here in SLURM's order) and its tasks per
  node (`SLURM_STEP_TASKS_PER_NODE`, such as `2(x3),1`), the tasks laid out in
  blocks (SLURM's default): the first node holds the first ranks.
* Ports: the i-th task of a node listens on the i-th port of a block that
  every task of the step computes alike. Where SLURM reserved ports for the
  step (`SLURM_STEP_RESV_PORTS`: `srun --resv-ports`, or any step where
  slurm.conf has `MpiParams=ports=...`), the block is those ports, which no
  other step holds while this one runs. Otherwise the block is derived from
  the job and step ids: step s of job j takes the DERIVED_BLOCK_SIZE ports
  from DERIVED_PORTS_LOW + DERIVED_BLOCK_SIZE * ((STEP_SLOTS * j + s % STEP_SLOTS)
  % number of blocks), below Linux's ephemeral ports. Two steps whose job
  ids differ by less than `JOBS_APART` never share a port, unless they are
  steps of one job whose step ids are equal modulo STEP_SLOTS.
* GPUs: where the task sees more than one GPU (`CUDA_VISIBLE_DEVICES`, else
  the step's or job's GPUs, `SLURM_STEP_GPUS`, `SLURM_JOB_GPUS`,
  `SLURM_GPUS_ON_NODE`) and more than one task runs on its node, the task
  uses the one GPU of its local rank (`SLURM_LOCALID`): `Cluster.gpu_index`.
  A task that sees one GPU (SLURM bound one per task, e.g. `--gpus-per-task=1`)
  or runs alone on its node uses what it sees; a CPU-only node has no GPU.

TensorFlow's `SlurmClusterResolver(port_base=..., gpus_per_node=..., auto_set_gpu=False)` is not used: it
orders the nodes by name as strings (node10 before node9, so a task gets another node's address), fails on a
CPU-only node (`gpus_per_node=0`), reads only `os.environ`'s step variables and names no variable in its errors.
"""

from collections.abc import Mapping
import itertools
import re
from typing import Any

from strategies.errors import ConfigError

DERIVED_PORTS_LOW = 16000
DERIVED_PORTS_HIGH = 32768  # Linux's ephemeral ports (ip_local_port_range) start here.
DERIVED_BLOCK_SIZE = 16  # The most tasks on one node without reserved ports.
STEP_SLOTS = 4
NUM_BLOCKS = (DERIVED_PORTS_HIGH - DERIVED_PORTS_LOW) // DERIVED_BLOCK_SIZE
JOBS_APART = NUM_BLOCKS // STEP_SLOTS
_HOSTLIST_ITEM = r"(?:[^\[\],]|\[[\d,-]+\])+"  # A hostlist item: names, and numbers in brackets.
_NODE_LISTS = ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
_NUM_TASKS = ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS")
_TASKS_PER_NODE = ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE")
_SRUN = "start every task with srun, e.g. `srun python -m runner ...` (in an sbatch script too)"


def is_multi_task_step(environ: Mapping[str, str]) -> bool:
  """Whether this process claims to be one task of a SLURM job step (`srun`) of more than one task.

  It claims so with `SLURM_PROCID` and a rank above 0, or more than one task
  (`SLURM_STEP_NUM_TASKS` or `SLURM_NTASKS`) or no count, whether or not the
  rest of the step's variables are set (`read` checks them). A batch
  script's own process does not: it is rank 0 of the job, with the job's
  SLURM_NTASKS, id and node list, but no step (no SLURM_STEP_ID); its tasks
  are started by `srun` in it.
  """
  rank = environ.get("SLURM_PROCID")
  if rank is None:
    return False
  if "SLURM_STEP_ID" not in environ and rank == "0" and environ.get("SLURM_JOB_ID") and _first(environ, _NODE_LISTS)[0]:
    return False  # A batch script.
  tasks = _first(environ, _NUM_TASKS)[1]
  return rank != "0" or not tasks.isdigit() or int(tasks) > 1


def read(environ: Mapping[str, str], *, num_ps: int | None) -> tuple[Any, ...]:
  """Returns the cluster of the SLURM step this task belongs to; see the module docstring.

  `strategies.cluster.find` makes it a `Cluster` (source 'SLURM'), after
  checking `num_ps`.

  Args:
    environ: the task's environment, as SLURM set it.
    num_ps: how many tasks after the chief (rank 0) are parameter servers, a
      positive int; None for a job of workers only (multi_worker_mirrored).

  Returns:
    The `Cluster` fields after `source`: the same `jobs` on every task of the
    step, this task's `task_type` and `task_id`, the `detail` for its log line,
    and on a GPU node with several tasks the `gpu_index` this task uses.

  Raises:
    ConfigError: this process is not a task of a step, a variable is missing
      or not what SLURM writes, the node list, tasks per node and task count
      disagree, too few tasks for 1 chief + num_ps ps + 1 worker, too few
      ports or GPUs for the tasks of a node.
  """
  if "SLURM_PROCID" not in environ:
    raise ConfigError(
        f"config.strategy.cluster='slurm' but this process is not a task of a SLURM job step (SLURM_PROCID is not "
        f"set); {_SRUN}, or use cluster='auto'."
    )
  needed = [("SLURM_STEP_ID",), _NUM_TASKS, _NODE_LISTS, _TASKS_PER_NODE]
  needed += [] if environ.get("SLURM_STEP_RESV_PORTS") else [("SLURM_JOB_ID",)]  # For the ports, unless reserved.
  missing = ["/".join(group) for group in needed if not _first(environ, group)[0]]
  if missing:
    raise ConfigError(
        f"This process is not a task of a SLURM job step (a half-set SLURM environment): SLURM_PROCID="
        f"{environ['SLURM_PROCID']} is set but not {', '.join(missing)}; {_SRUN}, or unset SLURM_PROCID to train alone."
    )
  num_tasks, rank = _count(environ, _NUM_TASKS, minimum=1), _count(environ, ("SLURM_PROCID",), minimum=0)
  if rank >= num_tasks:
    raise ConfigError(f"SLURM_PROCID={rank} is outside the step's {num_tasks} tasks (valid: 0 to {num_tasks - 1}).")
  nodes_variable, nodes_text = _first(environ, _NODE_LISTS)
  per_node_variable, per_node_text = _first(environ, _TASKS_PER_NODE)
  hosts, per_node = expand_hostlist(nodes_text, nodes_variable), expand_tasks_per_node(per_node_text, per_node_variable)
  if len(per_node) != len(hosts) or sum(per_node) != num_tasks:
    raise ConfigError(
        f"{per_node_variable}={per_node_text!r} ({sum(per_node)} tasks on {len(per_node)} nodes) does not match "
        f"{nodes_variable}={nodes_text!r} ({len(hosts)} nodes) and {num_tasks} tasks."
    )
  # The tasks in blocks: node n holds ranks first[n] to first[n + 1] - 1.
  first = list(itertools.accumulate([0, *per_node]))
  node = next(n for n in range(len(per_node)) if rank < first[n + 1])
  for variable, expected in (("SLURM_NODEID", node), ("SLURM_LOCALID", rank - first[node])):
    if variable in environ and _count(environ, (variable,), minimum=0) != expected:
      raise ConfigError(
          f"task {rank} has {variable}={environ[variable]}, but with the tasks in blocks ({len(per_node)} nodes, "
          f"{','.join(map(str, per_node))} tasks) it would be {expected}; start the step with the default "
          f"distribution (srun --distribution=block)."
      )
  ports, ports_detail = _ports(environ, max(per_node))
  addresses = tuple(f"{host}:{ports[local]}" for host, count in zip(hosts, per_node) for local in range(count))
  jobs, task_type, task_id = {"worker": addresses}, "worker", rank
  if num_ps is not None:
    if len(addresses) < num_ps + 2:
      raise ConfigError(
          f"config.strategy.num_ps={num_ps} needs at least {num_ps + 2} SLURM tasks (1 chief, {num_ps} ps, at least "
          f"1 worker), but the step has {len(addresses)}; start more tasks (srun -n {num_ps + 2}) or lower num_ps."
      )
    jobs = {"chief": addresses[:1], "ps": addresses[1 : num_ps + 1], "worker": addresses[num_ps + 1 :]}
    task_type, task_id = ([("chief", 0)] + [("ps", i) for i in range(num_ps)] + [("worker", i) for i in range(rank)])[
        rank
    ]
  detail = f"job {environ.get('SLURM_JOB_ID', '?')}, step {environ['SLURM_STEP_ID']}, {ports_detail}"
  return jobs, task_type, task_id, detail, _gpu_index(environ, rank - first[node], per_node[node], hosts[node])


def expand_hostlist(text: str, variable: str = "SLURM_JOB_NODELIST") -> list[str]:
  """Returns the host names of a SLURM hostlist, in order: 'node[01-03,07],gpu-a1' -> node01..node03, node07, gpu-a1.

  A name may have several bracket groups ('r[1-2]n[1-2]': r1n1, r1n2, r2n1,
  r2n2); numbers keep the zero padding of the range's first number.

  Raises:
    ConfigError: naming `variable`, for an empty list, unbalanced brackets,
      or a range that is not 'a', 'a-b' with a <= b.
  """
  hosts = []
  try:
    for item in re.findall(_HOSTLIST_ITEM, text) if re.fullmatch(f"{_HOSTLIST_ITEM}(,{_HOSTLIST_ITEM})*", text) else ():
      parts = re.split(r"\[([^\]]*)\]", item)  # Literal text at even positions, bracket contents at odd ones.
      choices = [[part] if i % 2 == 0 else _numbers(part) for i, part in enumerate(parts)]
      hosts += ["".join(combination) for combination in itertools.product(*choices)]
  except ValueError:  # A range that is not 'a' or 'a-b' with a <= b.
    hosts = []
  if not hosts:
    raise ConfigError(
        f"{variable}={text!r} is not a SLURM hostlist: names with ranges of numbers in brackets, 'a' or 'a-b' "
        "with a <= b, such as 'node[01-03,07],gpu-a1'."
    )
  return hosts


def _numbers(ranges: str) -> list[str]:
  """The numbers of ranges such as '08-10,12', zero-padded as each range's first number.

  Raises:
    ValueError: a range is not 'a' or 'a-b' with a <= b.
  """
  numbers = []
  for item in ranges.split(","):
    low, dash, high = item.partition("-")
    first, last = int(low), int(high if dash else low)
    if last < first:
      raise ValueError(f"{item!r} ends before it starts")
    numbers += [str(n).zfill(len(low)) for n in range(first, last + 1)]
  return numbers


def expand_tasks_per_node(text: str, variable: str = "SLURM_TASKS_PER_NODE") -> list[int]:
  """Returns the tasks of each node from SLURM's compressed form: '2(x3),1' -> [2, 2, 2, 1].

  Raises:
    ConfigError: naming `variable`, for anything but comma-separated 'n' or 'n(xk)' with n, k >= 1.
  """
  counts = []
  for item in text.split(","):
    match = re.fullmatch(r"([1-9]\d*)(?:\(x([1-9]\d*)\))?", item.strip())
    if not match:
      raise ConfigError(
          f"{variable}={text!r} is not SLURM's tasks per node: counts, 'n(xk)' for k nodes, e.g. '2(x3),1'."
      )
    counts += [int(match[1])] * int(match[2] or 1)
  return counts


def _first(environ: Mapping[str, str], variables: tuple[str, ...]) -> tuple[str, str]:
  """The first of `variables` that is set (not empty), and its value; ('', '') when none is."""
  return next(((variable, environ[variable]) for variable in variables if environ.get(variable)), ("", ""))


def _count(environ: Mapping[str, str], variables: tuple[str, ...], *, minimum: int) -> int:
  variable, text = _first(environ, variables)
  if not text.isdigit() or int(text) < minimum:
    raise ConfigError(f"{variable}={text!r} is not a whole number >= {minimum}.")
  return int(text)


def _ports(environ: Mapping[str, str], tasks_on_a_node: int) -> tuple[list[int], str]:
  """The ports of a node's tasks (the i-th local task takes the i-th), and words on where they came from."""
  reserved = environ.get("SLURM_STEP_RESV_PORTS")
  if reserved:
    try:
      ports = [int(port) for port in _numbers(reserved)]
    except ValueError:
      raise ConfigError(f"SLURM_STEP_RESV_PORTS={reserved!r} is not a list of ports such as '12000-12003'.") from None
    if len(ports) < tasks_on_a_node:
      raise ConfigError(
          f"SLURM_STEP_RESV_PORTS={reserved!r} reserves {len(ports)} ports, but a node runs {tasks_on_a_node} tasks "
          f"of this step; reserve one port per task of a node: srun --resv-ports={tasks_on_a_node}."
      )
    return ports, f"ports reserved by SLURM ({reserved})"
  if tasks_on_a_node > DERIVED_BLOCK_SIZE:
    raise ConfigError(
        f"{tasks_on_a_node} tasks on one node, but without ports reserved by SLURM a step has "
        f"{DERIVED_BLOCK_SIZE} ports per node; reserve them: srun --resv-ports={tasks_on_a_node} (slurm.conf "
        f"needs MpiParams=ports=LOW-HIGH)."
    )
  job_id, step_id = (_count(environ, (variable,), minimum=0) for variable in ("SLURM_JOB_ID", "SLURM_STEP_ID"))
  first = DERIVED_PORTS_LOW + DERIVED_BLOCK_SIZE * ((STEP_SLOTS * job_id + step_id % STEP_SLOTS) % NUM_BLOCKS)
  return list(range(first, first + DERIVED_BLOCK_SIZE)), f"ports {first}-{first + tasks_on_a_node - 1} from the job id"


def _gpu_index(environ: Mapping[str, str], local_rank: int, tasks_on_node: int, host: str) -> int | None:
  """The one GPU this task uses among those it sees, or None: all it sees (none, one, or it is alone on its node)."""
  gpu_variables = ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS", "SLURM_GPUS_ON_NODE")
  variable = "CUDA_VISIBLE_DEVICES" if "CUDA_VISIBLE_DEVICES" in environ else _first(environ, gpu_variables)[0]
  text = environ.get(variable, "")
  if variable == "SLURM_GPUS_ON_NODE":
    gpus = _count(environ, (variable,), minimum=0)
  else:  # A list of GPUs; CUDA_VISIBLE_DEVICES may hide them all.
    gpus = 0 if text.strip() in ("", "-1", "NoDevFiles") else len(text.split(","))
  if gpus <= 1 or tasks_on_node == 1:
    return None
  if tasks_on_node > gpus:
    raise ConfigError(
        f"{tasks_on_node} tasks of the step run on {host}, which has {gpus} GPUs ({variable}={text!r}); run one task "
        f"per GPU: srun --ntasks-per-node={gpus} (or --gpus-per-task=1)."
    )
  return local_rank
