"""The cluster of a SLURM job step: every task's role and address from SLURM's environment, on CPU or GPU nodes.

Every task of an `srun` step runs the same command; this module reads the
variables SLURM gives each task and returns the same cluster on all of them,
without TensorFlow, `scontrol` or `nvidia-smi`:

* Roles, from the task rank `SLURM_PROCID`: without parameter servers every
  task is a worker and rank r is 'worker:r' (worker 0 is the chief, as
  under `runner.launch --workers=N`). With `num_ps` parameter servers, rank 0
  is 'chief:0', ranks 1..num_ps are 'ps:0'.. and the rest 'worker:0'...
* Hosts: the step's node list (`SLURM_STEP_NODELIST`, a hostlist such as
  `node[01-03,07],gpu-a1`, expanded here) and its tasks per node
  (`SLURM_STEP_TASKS_PER_NODE`, such as `2(x3),1`), the tasks laid out in
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
"""

from collections.abc import Iterator, Mapping
import itertools
import re

from strategies import checks
from strategies import cluster_view
from strategies.errors import ConfigError

DERIVED_PORTS_LOW = 16000
DERIVED_PORTS_HIGH = 32768  # Linux's ephemeral ports (ip_local_port_range) start here.
DERIVED_BLOCK_SIZE = 16  # The most tasks on one node without reserved ports.
STEP_SLOTS = 4
NUM_BLOCKS = (DERIVED_PORTS_HIGH - DERIVED_PORTS_LOW) // DERIVED_BLOCK_SIZE
JOBS_APART = NUM_BLOCKS // STEP_SLOTS
_NO_GPU = ("", "-1", "NoDevFiles")  # CUDA_VISIBLE_DEVICES values that hide every GPU.
_NUMBERS = re.compile(r"\d+(-\d+)?$")
_NODE_LISTS = ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
# What every task of a step needs, each one of a group: the step, its task count, node list and tasks per node.
_STEP_VARIABLES = (
    ("SLURM_STEP_ID",),
    ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"),
    _NODE_LISTS,
    ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"),
)


def is_multi_task_step(environ: Mapping[str, str]) -> bool:
  """Whether this process claims to be one task of a SLURM job step (`srun`) of more than one task.

  It claims so with `SLURM_PROCID` and a rank above 0, or more than one task
  (`SLURM_STEP_NUM_TASKS` or `SLURM_NTASKS`) or no count, whether or not the
  rest of the step's variables are set (`cluster` checks them). A batch
  script's own process does not: it is rank 0 of the job, with the job's
  SLURM_NTASKS, id and node list, but no step (no SLURM_STEP_ID); its tasks
  are started by `srun` in it.
  """
  rank = environ.get("SLURM_PROCID")
  if rank is None:
    return False
  if "SLURM_STEP_ID" not in environ and rank == "0" and environ.get("SLURM_JOB_ID") and _set(environ, _NODE_LISTS):
    return False  # A batch script.
  tasks = environ.get("SLURM_STEP_NUM_TASKS") or environ.get("SLURM_NTASKS") or ""
  return rank != "0" or not tasks.isdigit() or int(tasks) > 1


def cluster(environ: Mapping[str, str], *, num_ps: int | None) -> cluster_view.Cluster:
  """Returns the cluster of the SLURM step this task belongs to; see the module docstring.

  Args:
    environ: the task's environment, as SLURM set it.
    num_ps: how many tasks after the chief (rank 0) are parameter servers;
      None for a job of workers only (multi_worker_mirrored).

  Returns:
    The same jobs on every task of the step, this task's role, and on a GPU
    node with several tasks the local GPU this task uses.

  Raises:
    ConfigError: this process is not a task of a step, a variable is missing
      or not what SLURM writes, the node list, tasks per node and task count
      disagree, too few tasks for 1 chief + num_ps ps + 1 worker, too few
      ports or GPUs for the tasks of a node.
  """
  checks.positive_int(num_ps, "config.strategy.num_ps", optional=True)
  if "SLURM_PROCID" not in environ:
    raise ConfigError(
        "config.strategy.cluster='slurm' but this process is not a task of a SLURM job step (SLURM_PROCID is not "
        "set); start every task with srun, e.g. `srun python -m runner ...` (in an sbatch script too), or use "
        "cluster='auto'."
    )
  job_id = () if environ.get("SLURM_STEP_RESV_PORTS") else (("SLURM_JOB_ID",),)  # For the ports, unless reserved.
  missing = [
      group[0] + (f" (or {' or '.join(group[1:])})" if group[1:] else "")
      for group in (*_STEP_VARIABLES, *job_id)
      if not _set(environ, group)
  ]
  if missing:
    listed = ", ".join(missing[:-1]) + (" and " if missing[:-1] else "") + missing[-1]
    raise ConfigError(
        f"This process is not a task of a SLURM job step (a half-set SLURM environment): SLURM_PROCID="
        f"{environ['SLURM_PROCID']} is set but {listed} {'is' if len(missing) == 1 else 'are'} not; start every task "
        f"with srun, e.g. `srun python -m runner ...` (in an sbatch script too), or unset SLURM_PROCID to train alone."
    )
  num_tasks = _count(environ, ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"), minimum=1)
  rank = _count(environ, ("SLURM_PROCID",), minimum=0)
  if rank >= num_tasks:
    raise ConfigError(f"SLURM_PROCID={rank} is outside the step's {num_tasks} tasks (valid: 0 to {num_tasks - 1}).")
  nodes_variable, nodes_text = _first(environ, _NODE_LISTS)
  hosts = expand_hostlist(nodes_text, nodes_variable)
  per_node_variable, per_node_text = _first(environ, ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"))
  tasks_per_node = expand_tasks_per_node(per_node_text, per_node_variable)
  if len(tasks_per_node) != len(hosts) or sum(tasks_per_node) != num_tasks:
    raise ConfigError(
        f"{per_node_variable}={per_node_text!r} ({sum(tasks_per_node)} tasks on {len(tasks_per_node)} nodes) does "
        f"not match {nodes_variable}={nodes_text!r} ({len(hosts)} nodes) and {num_tasks} tasks."
    )
  node, local_rank = _place(environ, rank, tasks_per_node)
  ports, ports_detail = _ports(environ, max(tasks_per_node))
  addresses = tuple(f"{host}:{ports[local]}" for host, count in zip(hosts, tasks_per_node) for local in range(count))
  jobs, task_type, task_id = _roles(addresses, rank, num_ps)
  return cluster_view.Cluster(
      source="SLURM",
      jobs=jobs,
      task_type=task_type,
      task_id=task_id,
      detail=f"job {environ.get('SLURM_JOB_ID', '?')}, step {environ['SLURM_STEP_ID']}, {ports_detail}",
      gpu_index=_gpu_index(environ, local_rank, tasks_per_node[node], hosts[node]),
  )


def expand_hostlist(text: str, variable: str = "SLURM_JOB_NODELIST") -> list[str]:
  """Returns the host names of a SLURM hostlist, in order: 'node[01-03,07],gpu-a1' -> node01..node03, node07, gpu-a1.

  A name may have several bracket groups ('r[1-2]n[1-2]': r1n1, r1n2, r2n1,
  r2n2); numbers keep the zero padding of the range's first number.

  Raises:
    ConfigError: naming `variable`, for an empty list, unbalanced brackets,
      or a range that is not 'a', 'a-b' with a <= b.
  """
  hosts = [host for item in _top_level_items(text, variable) for host in _expand_item(item, text, variable)]
  if not hosts:
    raise ConfigError(f"{variable}={text!r} names no node; SLURM writes a hostlist such as 'node[01-03],gpu1'.")
  return hosts


def expand_tasks_per_node(text: str, variable: str = "SLURM_TASKS_PER_NODE") -> list[int]:
  """Returns the tasks of each node from SLURM's compressed form: '2(x3),1' -> [2, 2, 2, 1].

  Raises:
    ConfigError: naming `variable`, for anything but comma-separated 'n' or 'n(xk)' with n, k >= 1.
  """
  counts = []
  for item in text.split(","):
    match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", item.strip())
    if not match or int(match[1]) < 1 or (match[2] is not None and int(match[2]) < 1):
      raise ConfigError(
          f"{variable}={text!r} is not SLURM's tasks per node: comma-separated counts, 'n(xk)' for k nodes of n "
          f"tasks, e.g. '2(x3),1'."
      )
    counts += [int(match[1])] * int(match[2] or 1)
  return counts


def _top_level_items(text: str, variable: str) -> Iterator[str]:
  """Yields the comma-separated items of a hostlist, the commas inside brackets left in their item."""
  depth, start = 0, 0
  for i, char in enumerate(text + ","):
    depth += {"[": 1, "]": -1}.get(char, 0)
    if depth not in (0, 1):
      raise ConfigError(f"{variable}={text!r} has unbalanced brackets; SLURM writes e.g. 'node[01-03,07]'.")
    if char == "," and depth == 0:
      if text[start:i].strip():
        yield text[start:i].strip()
      start = i + 1
  if depth:
    raise ConfigError(f"{variable}={text!r} has unbalanced brackets; SLURM writes e.g. 'node[01-03,07]'.")


def _expand_item(item: str, text: str, variable: str) -> list[str]:
  """The host names of one hostlist item such as 'node[01-03,07]' (every combination of its bracket groups)."""
  parts = re.split(r"\[([^\]]*)\]", item)  # Literal text at even positions, bracket contents at odd ones.
  choices = [[part] if i % 2 == 0 else _expand_ranges(part, text, variable) for i, part in enumerate(parts)]
  return ["".join(combination) for combination in itertools.product(*choices)]


def _expand_ranges(ranges: str, text: str, variable: str) -> list[str]:
  numbers = []
  for item in ranges.split(","):
    if not _NUMBERS.match(item):
      raise ConfigError(f"{variable}={text!r} has a range {item!r} that is not 'n' or 'a-b'.")
    first, _, last = item.partition("-")
    last = last or first
    if int(last) < int(first):
      raise ConfigError(f"{variable}={text!r} has a range {item!r} that ends before it starts.")
    numbers += [str(n).zfill(len(first)) for n in range(int(first), int(last) + 1)]
  return numbers


def _set(environ: Mapping[str, str], variables: tuple[str, ...]) -> bool:
  """Whether any of `variables` is set to a non-empty value."""
  return any(environ.get(variable) for variable in variables)


def _first(environ: Mapping[str, str], variables: tuple[str, ...]) -> tuple[str, str]:
  """The first of `variables` that is set, and its value."""
  for variable in variables:
    if environ.get(variable):
      return variable, environ[variable]
  raise ConfigError(f"SLURM did not set {' or '.join(variables)}; is this a task started by srun?")


def _count(environ: Mapping[str, str], variables: tuple[str, ...], *, minimum: int) -> int:
  variable, text = _first(environ, variables)
  if not text.isdigit() or int(text) < minimum:
    raise ConfigError(f"{variable}={text!r} is not a whole number >= {minimum}.")
  return int(text)


def _place(environ: Mapping[str, str], rank: int, tasks_per_node: list[int]) -> tuple[int, int]:
  """(node index, local rank) of task `rank` in the block layout; checked against SLURM_NODEID and SLURM_LOCALID."""
  first_ranks = list(itertools.accumulate([0, *tasks_per_node]))
  node = next(n for n in range(len(tasks_per_node)) if rank < first_ranks[n + 1])
  local_rank = rank - first_ranks[node]
  for variable, expected in (("SLURM_NODEID", node), ("SLURM_LOCALID", local_rank)):
    if variable in environ:
      given = _count(environ, (variable,), minimum=0)
      if given != expected:
        raise ConfigError(
            f"task {rank} has {variable}={given}, but with the tasks in blocks ({len(tasks_per_node)} nodes, "
            f"{','.join(map(str, tasks_per_node))} tasks) it would be {expected}; start the step with the default "
            f"distribution (srun --distribution=block)."
        )
  return node, local_rank


def _ports(environ: Mapping[str, str], tasks_on_a_node: int) -> tuple[list[int], str]:
  """The ports of a node's tasks (the i-th local task takes the i-th), and words on where they came from."""
  reserved = environ.get("SLURM_STEP_RESV_PORTS")
  if reserved:
    ports: list[int] = []
    for item in reserved.split(","):
      if not _NUMBERS.match(item):
        raise ConfigError(f"SLURM_STEP_RESV_PORTS={reserved!r} is not a list of ports such as '12000-12003'.")
      low, _, high = item.partition("-")
      ports += range(int(low), int(high or low) + 1)
    if len(ports) < tasks_on_a_node:
      raise ConfigError(
          f"SLURM_STEP_RESV_PORTS={reserved!r} reserves {len(ports)} ports, but a node runs {tasks_on_a_node} tasks "
          f"of this step; reserve one port per task of a node: srun --resv-ports={tasks_on_a_node}."
      )
    return ports, f"ports reserved by SLURM ({reserved})"
  job_id = _count(environ, ("SLURM_JOB_ID",), minimum=0)
  step_id = _count(environ, ("SLURM_STEP_ID",), minimum=0)
  if tasks_on_a_node > DERIVED_BLOCK_SIZE:
    raise ConfigError(
        f"{tasks_on_a_node} tasks on one node, but without ports reserved by SLURM a step has "
        f"{DERIVED_BLOCK_SIZE} ports per node; reserve them: srun --resv-ports={tasks_on_a_node} (slurm.conf "
        f"needs MpiParams=ports=LOW-HIGH)."
    )
  block = (STEP_SLOTS * job_id + step_id % STEP_SLOTS) % NUM_BLOCKS
  first = DERIVED_PORTS_LOW + DERIVED_BLOCK_SIZE * block
  return list(range(first, first + DERIVED_BLOCK_SIZE)), f"ports {first}-{first + tasks_on_a_node - 1} from the job id"


def _roles(addresses: tuple[str, ...], rank: int, num_ps: int | None) -> tuple[dict[str, tuple[str, ...]], str, int]:
  """The jobs of the step's task addresses (in rank order), and task `rank`'s type and index."""
  if num_ps is None:
    return {"worker": addresses}, "worker", rank
  if len(addresses) < num_ps + 2:
    raise ConfigError(
        f"config.strategy.num_ps={num_ps} needs at least {num_ps + 2} SLURM tasks (1 chief, {num_ps} ps, at least "
        f"1 worker), but the step has {len(addresses)}; start more tasks (srun -n {num_ps + 2}) or lower num_ps."
    )
  jobs = {"chief": addresses[:1], "ps": addresses[1 : num_ps + 1], "worker": addresses[num_ps + 1 :]}
  if rank == 0:
    return jobs, "chief", 0
  if rank <= num_ps:
    return jobs, "ps", rank - 1
  return jobs, "worker", rank - num_ps - 1


def _gpu_index(environ: Mapping[str, str], local_rank: int, tasks_on_node: int, host: str) -> int | None:
  """The one GPU this task uses among those it sees, or None: all it sees (none, one, or it is alone on its node)."""
  visible = environ.get("CUDA_VISIBLE_DEVICES")
  if visible is not None:
    gpus = 0 if visible.strip() in _NO_GPU else len(visible.split(","))
    seen_from = f"CUDA_VISIBLE_DEVICES={visible!r}"
  elif environ.get("SLURM_STEP_GPUS") or environ.get("SLURM_JOB_GPUS"):
    variable, text = _first(environ, ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS"))
    gpus, seen_from = len(text.split(",")), f"{variable}={text!r}"
  elif environ.get("SLURM_GPUS_ON_NODE"):
    gpus, seen_from = _count(environ, ("SLURM_GPUS_ON_NODE",), minimum=0), "SLURM_GPUS_ON_NODE"
  else:
    return None
  if gpus <= 1 or tasks_on_node == 1:
    return None
  if tasks_on_node > gpus:
    raise ConfigError(
        f"{tasks_on_node} tasks of the step run on {host}, which has {gpus} GPUs ({seen_from}); run one task per "
        f"GPU: srun --ntasks-per-node={gpus} (or --gpus-per-task=1)."
    )
  return local_rank
