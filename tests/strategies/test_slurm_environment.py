"""strategies.slurm: the cluster of a SLURM step from environments written by hand, as SLURM 22.05 writes them.

The variables are those `srun` gave the tasks of the one-node test cluster
(tests/testlib/slurm_cluster.py) and, for several nodes and GPUs, what SLURM
documents. No TensorFlow, no SLURM: a fraction of a second.
"""

import pytest

from strategies import cluster as cluster_lib
from strategies import slurm
from strategies.errors import ConfigError


def _step(rank, *, tasks=2, nodes="localhost", per_node=None, job="324057", step="0", **extra):
  """The environment of task `rank` of an srun step, block layout; `extra` adds or overrides variables."""
  counts = slurm.expand_tasks_per_node(per_node or str(tasks))
  first = 0
  for node, count in enumerate(counts):
    if rank < first + count:
      break
    first += count
  environ = {
      "SLURM_JOB_ID": job,
      "SLURM_STEP_ID": step,
      "SLURM_PROCID": str(rank),
      "SLURM_LOCALID": str(rank - first),
      "SLURM_NODEID": str(node),
      "SLURM_STEP_NUM_TASKS": str(tasks),
      "SLURM_NTASKS": str(tasks),
      "SLURM_STEP_NODELIST": nodes,
      "SLURM_JOB_NODELIST": nodes,
      "SLURM_STEP_TASKS_PER_NODE": per_node or str(tasks),
      "SLURM_TASKS_PER_NODE": per_node or str(tasks),
  }
  environ.update(extra)
  return {name: value for name, value in environ.items() if value is not None}


def _cluster(environ, num_ps=None):
  """The cluster `config.strategy.cluster='slurm'` finds in `environ` (with `num_ps`: a parameter-server job's)."""
  return cluster_lib.find("slurm", environ=environ, parameter_server=num_ps is not None, num_ps=num_ps)


# Job 324057, step 0 without reserved ports: block (4 * 324057 + 0) % 1048 = 900, ports 16000 + 16 * 900 = 30400...
FIRST_PORT = 30400


def _ports(found):
  return [int(address.rpartition(":")[2]) for tasks in found.jobs.values() for address in tasks]


# Hostlists and tasks per node.


@pytest.mark.parametrize(
    ("text", "hosts"),
    [
        ("localhost", ["localhost"]),
        ("node[01-03,07],gpu-a1", ["node01", "node02", "node03", "node07", "gpu-a1"]),
        ("n[8-11]", ["n8", "n9", "n10", "n11"]),
        ("n[098-101]", ["n098", "n099", "n100", "n101"]),
        ("rack[1-2]-n[1,3]", ["rack1-n1", "rack1-n3", "rack2-n1", "rack2-n3"]),
        ("a,b[2],c", ["a", "b2", "c"]),
    ],
)
def test_hostlists_expand_in_order_with_their_zero_padding(text, hosts):
  assert slurm.expand_hostlist(text) == hosts


@pytest.mark.parametrize("text", ["", "node[01-03", "node01]", "node[[1]]", "node[a-c]", "node[5-3]", "n[1-2-3]"])
def test_a_bad_hostlist_is_one_config_error_naming_the_variable(text):
  with pytest.raises(
      ConfigError, match=r"SLURM_STEP_NODELIST=.* is not a SLURM hostlist: .* 'node\[01-03,07\],gpu-a1'"
  ):
    slurm.expand_hostlist(text, "SLURM_STEP_NODELIST")


def test_tasks_per_node_expand_slurms_repeat_counts():
  assert slurm.expand_tasks_per_node("2(x3),1") == [2, 2, 2, 1]
  assert slurm.expand_tasks_per_node("4") == [4]


@pytest.mark.parametrize("text", ["", "2(x0)", "0", "2x3", "two", "2(x3)1"])
def test_bad_tasks_per_node_are_one_config_error(text):
  with pytest.raises(ConfigError, match=r"is not SLURM's tasks per node: .* e\.g\. '2\(x3\),1'"):
    slurm.expand_tasks_per_node(text)


# Which process is a task of a step.


def test_only_a_task_of_a_step_of_several_tasks_is_a_multi_task_step():
  assert slurm.is_multi_task_step(_step(1))
  assert not slurm.is_multi_task_step(_step(0, tasks=1))
  assert not slurm.is_multi_task_step({})
  # A batch script's own process: the job's SLURM_NTASKS=2 and SLURM_PROCID=0, but no step (what sbatch sets).
  batch = _step(0, step=None, SLURM_STEP_NUM_TASKS=None, SLURM_STEP_NODELIST=None, SLURM_STEP_TASKS_PER_NODE=None)
  assert not slurm.is_multi_task_step(batch)
  with pytest.raises(ConfigError, match=r"not a task of a SLURM job step .* `srun python -m runner \.\.\.`"):
    _cluster(batch)
  # A half-set environment claims to be a task, so `find` reads it (and names what is missing).
  assert slurm.is_multi_task_step({"SLURM_PROCID": "1", "SLURM_NTASKS": "2"})
  assert slurm.is_multi_task_step({"SLURM_PROCID": "0", "SLURM_NTASKS": "2"})
  assert slurm.is_multi_task_step({"SLURM_PROCID": "0"})


# CPU nodes: the roles and addresses every task computes alike.


def test_on_one_cpu_node_every_task_is_a_worker_and_all_agree():
  clusters = [_cluster(_step(rank)) for rank in range(2)]
  block = [FIRST_PORT, FIRST_PORT + 1]
  expected_jobs = {"worker": (f"localhost:{block[0]}", f"localhost:{block[1]}")}
  for rank, found in enumerate(clusters):
    assert isinstance(found, cluster_lib.Cluster)
    assert (found.source, dict(found.jobs), found.task_type, found.task_id) == ("SLURM", expected_jobs, "worker", rank)
    assert found.gpu_index is None
  assert clusters[1].detail == f"job 324057, step 0, ports {block[0]}-{block[1]} from the job id"
  assert clusters[0].describe() == (
      f"cluster from SLURM (job 324057, step 0, ports {block[0]}-{block[1]} from the job id): 2 workers; "
      f"this task is worker:0 at localhost:{block[0]}"
  )


def test_several_nodes_hold_their_ranks_in_blocks():
  environ = {"nodes": "node[01-02],gpu-a1", "per_node": "2(x2),1", "tasks": 5}
  found = _cluster(_step(3, **environ))
  first = FIRST_PORT
  assert found.jobs["worker"] == (
      f"node01:{first}",
      f"node01:{first + 1}",
      f"node02:{first}",
      f"node02:{first + 1}",
      f"gpu-a1:{first}",
  )
  assert (found.task_type, found.task_id) == ("worker", 3)


def test_the_job_nodelist_and_ntasks_stand_in_for_the_steps():
  environ = _step(1, SLURM_STEP_NUM_TASKS=None, SLURM_STEP_NODELIST=None, SLURM_STEP_TASKS_PER_NODE=None)
  assert _cluster(environ).jobs == _cluster(_step(1)).jobs


def test_with_num_ps_rank_0_is_the_chief_then_the_ps_then_the_workers():
  roles = [_cluster(_step(rank, tasks=5), 2) for rank in range(5)]
  assert [(found.task_type, found.task_id) for found in roles] == [
      ("chief", 0),
      ("ps", 0),
      ("ps", 1),
      ("worker", 0),
      ("worker", 1),
  ]
  ports = range(FIRST_PORT, FIRST_PORT + 5)
  assert dict(roles[4].jobs) == {
      "chief": (f"localhost:{ports[0]}",),
      "ps": (f"localhost:{ports[1]}", f"localhost:{ports[2]}"),
      "worker": (f"localhost:{ports[3]}", f"localhost:{ports[4]}"),
  }


@pytest.mark.parametrize(("tasks", "num_ps"), [(2, 1), (3, 2)])
def test_too_few_tasks_for_the_ps_name_the_numbers(tasks, num_ps):
  with pytest.raises(ConfigError) as error:
    _cluster(_step(0, tasks=tasks), num_ps)
  assert str(error.value) == (
      f"config.strategy.num_ps={num_ps} needs at least {num_ps + 2} SLURM tasks (1 chief, {num_ps} ps, at least 1 "
      f"worker), but the step has {tasks}; start more tasks (srun -n {num_ps + 2}) or lower num_ps."
  )


@pytest.mark.parametrize("num_ps", [0, -1, 1.5, "2"])
def test_num_ps_must_be_a_positive_int(num_ps):
  with pytest.raises(ConfigError, match=r"config\.strategy\.num_ps must be a positive int"):
    _cluster(_step(0, tasks=3), num_ps)


# Ports.


def test_reserved_ports_are_taken_in_local_rank_order_on_every_node():
  environ = {"nodes": "n[1-2]", "per_node": "2(x2)", "tasks": 4, "SLURM_STEP_RESV_PORTS": "14809-14810,14900"}
  found = _cluster(_step(2, **environ))
  assert found.jobs["worker"] == ("n1:14809", "n1:14810", "n2:14809", "n2:14810")
  assert found.detail == "job 324057, step 0, ports reserved by SLURM (14809-14810,14900)"


def test_too_few_reserved_ports_say_how_many_to_reserve():
  with pytest.raises(ConfigError) as error:
    _cluster(_step(0, tasks=3, SLURM_STEP_RESV_PORTS="14809-14810"))
  assert str(error.value) == (
      "SLURM_STEP_RESV_PORTS='14809-14810' reserves 2 ports, but a node runs 3 tasks of this step; reserve one port "
      "per task of a node: srun --resv-ports=3."
  )


@pytest.mark.parametrize("ports", ["14809:14810", "1480a", "14809-", "-1"])
def test_bad_reserved_ports_are_one_config_error(ports):
  with pytest.raises(ConfigError, match=r"SLURM_STEP_RESV_PORTS=.* is not a list of ports such as '12000-12003'"):
    _cluster(_step(0, SLURM_STEP_RESV_PORTS=ports))


def test_derived_ports_of_jobs_less_than_jobs_apart_never_overlap():
  assert slurm.JOBS_APART == 262
  tasks = slurm.DERIVED_BLOCK_SIZE  # The whole block of every step.
  taken = {}
  for job in range(1_000_000, 1_000_000 + slurm.JOBS_APART):
    for step in range(slurm.STEP_SLOTS):
      for port in _ports(_cluster(_step(0, tasks=tasks, job=str(job), step=str(step)))):
        assert port not in taken, f"job {job} step {step} shares port {port} with {taken[port]}"
        assert slurm.DERIVED_PORTS_LOW <= port < slurm.DERIVED_PORTS_HIGH
        taken[port] = (job, step)
  assert len(taken) == slurm.JOBS_APART * slurm.STEP_SLOTS * tasks
  # The blocks wrap around after JOBS_APART jobs, and step ids after STEP_SLOTS steps.
  first = _cluster(_step(0, job="1000000", step="0")).jobs
  assert _cluster(_step(0, job=str(1_000_000 + slurm.JOBS_APART), step="0")).jobs == first
  assert _cluster(_step(0, job="1000000", step=str(slurm.STEP_SLOTS))).jobs == first


def test_more_tasks_on_a_node_than_a_derived_block_ask_for_reserved_ports():
  tasks = slurm.DERIVED_BLOCK_SIZE + 1
  with pytest.raises(ConfigError) as error:
    _cluster(_step(0, tasks=tasks))
  assert str(error.value) == (
      f"{tasks} tasks on one node, but without ports reserved by SLURM a step has 16 ports per node; reserve them: "
      f"srun --resv-ports={tasks} (slurm.conf needs MpiParams=ports=LOW-HIGH)."
  )


# GPU nodes.


@pytest.mark.parametrize(
    "gpus",
    [
        {"CUDA_VISIBLE_DEVICES": "0,1,2,3"},
        {"SLURM_STEP_GPUS": "4,5,6,7"},
        {"SLURM_JOB_GPUS": "0,1,2,3"},
        {"SLURM_GPUS_ON_NODE": "4"},
    ],
)
def test_on_a_gpu_node_each_task_uses_the_gpu_of_its_local_rank(gpus):
  environ = {"nodes": "gpu[1-2]", "per_node": "4(x2)", "tasks": 8, **gpus}
  assert [_cluster(_step(rank, **environ)).gpu_index for rank in range(8)] == [0, 1, 2, 3] * 2


@pytest.mark.parametrize(
    "environ",
    [
        {"CUDA_VISIBLE_DEVICES": "2", "SLURM_STEP_GPUS": "0,1,2,3"},  # SLURM bound one GPU per task.
        {"CUDA_VISIBLE_DEVICES": ""},
        {"CUDA_VISIBLE_DEVICES": "NoDevFiles"},
        {"SLURM_GPUS_ON_NODE": "0"},
        {},  # A CPU-only node: none of the GPU variables.
    ],
)
def test_a_task_that_sees_at_most_one_gpu_uses_what_it_sees(environ):
  assert _cluster(_step(1, tasks=4, **environ)).gpu_index is None


def test_one_task_on_a_node_uses_every_gpu_it_sees():
  environ = {"nodes": "gpu[1-2]", "per_node": "1(x2)", "tasks": 2, "CUDA_VISIBLE_DEVICES": "0,1,2,3"}
  assert _cluster(_step(1, **environ)).gpu_index is None


def test_more_tasks_than_gpus_on_a_node_is_one_config_error():
  with pytest.raises(ConfigError) as error:
    _cluster(_step(0, tasks=3, CUDA_VISIBLE_DEVICES="0,1"))
  assert str(error.value) == (
      "3 tasks of the step run on localhost, which has 2 GPUs (CUDA_VISIBLE_DEVICES='0,1'); run one task per GPU: "
      "srun --ntasks-per-node=2 (or --gpus-per-task=1)."
  )


# Bad environments.


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"SLURM_PROCID": "x"}, "SLURM_PROCID='x' is not a whole number >= 0."),
        ({"SLURM_PROCID": "2"}, "SLURM_PROCID=2 is outside the step's 2 tasks (valid: 0 to 1)."),
        ({"SLURM_STEP_NUM_TASKS": "0"}, "SLURM_STEP_NUM_TASKS='0' is not a whole number >= 1."),
        ({"SLURM_STEP_ID": None}, "not a task of a SLURM job step"),
        (
            {"SLURM_STEP_NODELIST": None, "SLURM_JOB_NODELIST": None},
            "SLURM_PROCID=1 is set but not SLURM_STEP_NODELIST/SLURM_JOB_NODELIST/SLURM_NODELIST; start "
            "every task with srun",
        ),
        (
            {"SLURM_STEP_TASKS_PER_NODE": "3"},
            "SLURM_STEP_TASKS_PER_NODE='3' (3 tasks on 1 nodes) does not match SLURM_STEP_NODELIST='localhost' "
            "(1 nodes) and 2 tasks.",
        ),
        (
            {"SLURM_STEP_NODELIST": "n[1-2]"},
            "SLURM_STEP_TASKS_PER_NODE='2' (2 tasks on 1 nodes) does not match SLURM_STEP_NODELIST='n[1-2]' (2 nodes)",
        ),
        ({"SLURM_LOCALID": "-1"}, "SLURM_LOCALID='-1' is not a whole number >= 0."),
        ({"SLURM_JOB_ID": "abc"}, "SLURM_JOB_ID='abc' is not a whole number >= 0."),
        ({"SLURM_GPUS_ON_NODE": "four"}, "SLURM_GPUS_ON_NODE='four' is not a whole number >= 0."),
    ],
)
def test_a_bad_environment_is_one_config_error_naming_the_variable(changes, message):
  with pytest.raises(ConfigError) as error:
    _cluster(_step(1, **changes))
  assert message in str(error.value)


def test_tasks_not_in_blocks_are_refused_with_the_distribution_to_use():
  # srun --distribution=cyclic on 2 nodes of 2 tasks: rank 1 is the first task of the second node.
  environ = _step(1, nodes="n[1-2]", per_node="2(x2)", tasks=4, SLURM_NODEID="1", SLURM_LOCALID="0")
  with pytest.raises(ConfigError) as error:
    _cluster(environ)
  assert str(error.value) == (
      "task 1 has SLURM_NODEID=1, but with the tasks in blocks (2 nodes, 2,2 tasks) it would be 0; start the step "
      "with the default distribution (srun --distribution=block)."
  )


def test_find_reads_a_slurm_step_under_auto_and_slurm():
  environ = _step(1)
  assert cluster_lib.find("auto", environ=environ) == _cluster(environ)
  assert cluster_lib.find("slurm", environ=environ).task_id == 1
