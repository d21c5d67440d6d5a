"""RankEnv from every launcher's table, SLURM list syntaxes, ports, allocation checks."""

from __future__ import annotations

import os
import socket

import pytest

from hpcgnn.env import RankEnv, detect_source
from hpcgnn.errors import AllocationError
from hpcgnn.nodes import check_allocation, derive_port, expand_nodelist, expand_tasks_per_node

SLURM_TASK = {
    "SLURM_JOB_ID": "123456",
    "SLURM_PROCID": "3",
    "SLURM_LOCALID": "1",
    "SLURM_NTASKS": "4",
    "SLURM_NODEID": "1",
    "SLURM_JOB_NUM_NODES": "2",
    "SLURM_JOB_NODELIST": "gpu[007-008]",
    "SLURM_TASKS_PER_NODE": "2(x2)",
    "SLURM_STEP_NUM_TASKS": "4",
}


def test_slurm_table():
    env = RankEnv.from_environ(SLURM_TASK)
    assert env == RankEnv(source="slurm", rank=3, local_rank=1, world_size=4, local_world_size=2, node_rank=1,
                          num_nodes=2, hostnames=("gpu007", "gpu008"), master_addr="gpu007",
                          master_port=derive_port("123456"), job_id="123456")


def test_slurm_uneven_tasks_per_node():
    env = RankEnv.from_environ({**SLURM_TASK, "SLURM_NTASKS": "5", "SLURM_STEP_NUM_TASKS": "5",
                                "SLURM_TASKS_PER_NODE": "3,2", "SLURM_NODEID": "1", "SLURM_PROCID": "4"})
    assert (env.local_world_size, env.world_size, env.rank) == (2, 5, 4)


def test_slurm_without_srun_is_detected():
    batch_step = {k: v for k, v in SLURM_TASK.items() if k != "SLURM_STEP_NUM_TASKS"}
    with pytest.raises(AllocationError, match=r"without srun.*\n    srun python -m hpcgnn"):
        RankEnv.from_environ(batch_step)


def test_slurm_batch_step_with_one_task_is_fine():
    one = {**SLURM_TASK, "SLURM_NTASKS": "1", "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0",
           "SLURM_JOB_NUM_NODES": "1", "SLURM_JOB_NODELIST": "cpu01", "SLURM_TASKS_PER_NODE": "1"}
    del one["SLURM_STEP_NUM_TASKS"]
    env = RankEnv.from_environ(one)
    assert (env.world_size, env.master_addr) == (1, "cpu01")


def test_torchrun_table():
    env = RankEnv.from_environ({"RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4",
                                "GROUP_RANK": "1", "MASTER_ADDR": "node0", "MASTER_PORT": "29400",
                                "TORCHELASTIC_RUN_ID": "abc"})
    assert env == RankEnv(source="torchrun", rank=5, local_rank=1, world_size=8, local_world_size=4, node_rank=1,
                          num_nodes=2, hostnames=(socket.gethostname(),), master_addr="node0", master_port=29400,
                          job_id="abc")


def test_submitit_local_table():
    env = RankEnv.from_environ({"SUBMITIT_LOCAL_JOB_ID": "4242", "SUBMITIT_LOCAL_GLOBALID": "1",
                                "SUBMITIT_LOCAL_LOCALID": "1", "SUBMITIT_LOCAL_NTASKS": "3",
                                "SUBMITIT_LOCAL_NODEID": "0", "SUBMITIT_LOCAL_JOB_NUM_NODES": "1"})
    assert env == RankEnv(source="submitit_local", rank=1, local_rank=1, world_size=3, local_world_size=3, node_rank=0,
                          num_nodes=1, hostnames=(socket.gethostname(),), master_addr="127.0.0.1",
                          master_port=derive_port("4242"), job_id="4242")


def test_single_process():
    env = RankEnv.from_environ({"HOME": "/root"})
    assert (env.source, env.rank, env.world_size, env.local_world_size) == ("single", 0, 1, 1)


def test_threads_are_the_cpus_slurm_gave_the_task_else_a_share_of_the_cores():
    import os

    slurm = {**SLURM_TASK, "SLURM_CPUS_PER_TASK": "3"}
    assert RankEnv.from_environ(slurm).default_threads(slurm) == 3
    cores = len(os.sched_getaffinity(0))
    assert RankEnv.from_environ(SLURM_TASK).default_threads(SLURM_TASK) == max(1, cores // 2)  # 2 tasks a node
    local = {"SUBMITIT_LOCAL_JOB_ID": "1", "SUBMITIT_LOCAL_GLOBALID": "0", "SUBMITIT_LOCAL_LOCALID": "0",
             "SUBMITIT_LOCAL_NTASKS": "1", "SUBMITIT_LOCAL_NODEID": "0", "SUBMITIT_LOCAL_JOB_NUM_NODES": "1",
             "SLURM_CPUS_PER_TASK": "64"}  # (a local job started inside an allocation: not its CPUs)
    assert RankEnv.from_environ(local).default_threads(local) == cores


def test_source_priority_torchrun_inside_slurm():
    environ = {**SLURM_TASK, "RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "x", "MASTER_PORT": "20001"}
    assert detect_source(environ) == "torchrun"
    assert detect_source({**SLURM_TASK, "SUBMITIT_LOCAL_JOB_ID": "1", "SUBMITIT_LOCAL_GLOBALID": "0"}) == "submitit_local"


def test_explicit_master_port_wins():
    assert RankEnv.from_environ(SLURM_TASK, master_port=24000).master_port == 24000


@pytest.mark.parametrize("text, hosts", [
    ("n1", ["n1"]),
    ("a,b", ["a", "b"]),
    ("gpu[001-003,010],cpu-a[1-2]", ["gpu001", "gpu002", "gpu003", "gpu010", "cpu-a1", "cpu-a2"]),
    ("node-[9-11]", ["node-9", "node-10", "node-11"]),
    ("r[1-2]n[01-02]", ["r1n01", "r1n02", "r2n01", "r2n02"]),
    ("x[08-10]y", ["x08y", "x09y", "x10y"]),
    ("login1,gpu[1,3]", ["login1", "gpu1", "gpu3"]),
])
def test_expand_nodelist(text, hosts):
    assert expand_nodelist(text) == hosts


@pytest.mark.parametrize("text, message", [
    ("gpu[1-", "unbalanced"),
    ("gpu1-2]", "unbalanced"),
    ("gpu[3-1]", "descending"),
    ("gpu[a-b]", "bad range"),
    ("", "empty"),
])
def test_expand_nodelist_errors(text, message):
    with pytest.raises(ValueError, match=message):
        expand_nodelist(text)


@pytest.mark.parametrize("text, counts", [("4", [4]), ("2(x3),1", [2, 2, 2, 1]), ("1,3(x2)", [1, 3, 3])])
def test_expand_tasks_per_node(text, counts):
    assert expand_tasks_per_node(text) == counts


def test_port_range_and_spread():
    ports = [derive_port(str(job)) for job in range(1_000_000, 1_010_000)]
    assert all(20000 <= p <= 32767 for p in ports)  # below Linux's ephemeral range 32768-60999
    assert len(set(ports)) == len(ports)  # consecutive job ids never share a port
    assert derive_port("987654") == derive_port("987654")
    assert 20000 <= derive_port("run-abc") <= 32767
    assert derive_port("5", 40000, 40009) == 40005


def test_allocation_mismatch_tasks():
    env = RankEnv.from_environ(SLURM_TASK)  # 2 nodes x 2 tasks
    with pytest.raises(AllocationError, match=r"started 4 tasks on 2 node\(s\).*cluster.nodes=2 x "
                                              r"cluster.tasks_per_node=4 = 8\. HINT: set cluster.tasks_per_node=2"):
        check_allocation(env, nodes=2, tasks_per_node=4)


def test_allocation_mismatch_nodes():
    env = RankEnv.from_environ(SLURM_TASK)
    with pytest.raises(AllocationError, match=r"HINT: set cluster.nodes=2"):
        check_allocation(env, nodes=1, tasks_per_node=2)
    check_allocation(env, nodes=2, tasks_per_node=2)  # matches: no error


def test_allocation_gpus():
    env = RankEnv.from_environ(SLURM_TASK)  # 2 ranks per node
    with pytest.raises(AllocationError, match=r"sees no CUDA device.*cluster.gpus_per_node=0"):
        check_allocation(env, nodes=2, tasks_per_node=2, gpus_per_node=2, cuda_devices=0)
    four = RankEnv.from_environ({**SLURM_TASK, "SLURM_NTASKS": "8", "SLURM_STEP_NUM_TASKS": "8",
                                 "SLURM_TASKS_PER_NODE": "4(x2)"})
    with pytest.raises(AllocationError, match=r"4 ranks on this node but only 2 visible GPUs\. "
                                              r"HINT: set cluster.tasks_per_node=2"):
        check_allocation(four, nodes=2, tasks_per_node=4, gpus_per_node=4, cuda_devices=2)
    # Both layouts are valid: every task sees all GPUs of its node, or SLURM binds one GPU per task.
    check_allocation(env, nodes=2, tasks_per_node=2, gpus_per_node=2, cuda_devices=2)
    check_allocation(env, nodes=2, tasks_per_node=2, gpus_per_node=2, cuda_devices=1)


def test_started_as_rank_and_run_name():
    from hpcgnn.env import run_name, started_as_rank

    assert started_as_rank(SLURM_TASK)
    batch = {k: v for k, v in SLURM_TASK.items() if k != "SLURM_STEP_NUM_TASKS"}
    assert not started_as_rank(batch)
    assert run_name({**SLURM_TASK, "SLURM_STEP_ID": "0"}) == "slurm-123456.0"
    torchrun = {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "29500"}
    assert run_name({**torchrun, "TORCHELASTIC_RUN_ID": "job7"}) == "torchrun-job7"
    assert run_name({**torchrun, "TORCHELASTIC_RUN_ID": "none"}) == "torchrun-h-29500"
    import datetime

    assert run_name({}, datetime.datetime(2026, 1, 2, 3, 4, 5, 6)) == "2026-01-02/03-04-05-000006"


def test_ranks_agree_whether_they_share_a_gpu():
    """Each rank publishes its GPU's identity in the rendezvous store; rank 0 decides for all (one visible
    GPU per task is either SLURM's binding, each its own, or the node's one GPU shared)."""
    import socket
    import threading
    from datetime import timedelta

    import torch.distributed as tdist

    from hpcgnn.dist import gpus_shared

    def agree(identities: list[str]) -> list[bool]:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        out: list = [None] * len(identities)
        stores: list = []  # alive until every rank has read the answer (in a job the store lives on in the group)

        def rank(r: int) -> None:
            store = tdist.TCPStore("127.0.0.1", port, len(identities), is_master=r == 0,
                                   timeout=timedelta(seconds=30), wait_for_workers=False)
            stores.append(store)
            env = RankEnv.from_environ({"RANK": str(r), "WORLD_SIZE": str(len(identities)), "LOCAL_RANK": str(r),
                                        "LOCAL_WORLD_SIZE": str(len(identities)), "MASTER_ADDR": "127.0.0.1",
                                        "MASTER_PORT": str(port)})
            out[r] = gpus_shared(store, env, identities[r])

        threads = [threading.Thread(target=rank, args=(r,)) for r in range(len(identities))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        return out

    assert agree(["n1|GPU-a", "n1|GPU-b", "n2|GPU-a"]) == [False] * 3  # a GPU each (UUIDs differ per node too)
    assert agree(["n1|GPU-a", "n1|GPU-a"]) == [True, True]  # both ranks drive the one GPU
    assert agree(["", ""]) == [False, False]  # CPU ranks share nothing


def test_backend_choice():
    import torch

    from hpcgnn.config import DistConfig
    from hpcgnn.dist import pick_backend
    from hpcgnn.errors import ConfigError

    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")
    assert pick_backend(DistConfig(), cpu) == "gloo"
    assert pick_backend(DistConfig(), cuda) == "nccl"
    assert pick_backend(DistConfig(), cuda, shared=True) == "gloo"
    assert pick_backend(DistConfig(backend="gloo"), cuda) == "gloo"
    with pytest.raises(ConfigError, match=r"dist.backend=nccl needs a GPU per rank, but some ranks share one\. "
                                          r"HINT: set dist.backend=gloo"):
        pick_backend(DistConfig(backend="nccl"), cuda, shared=True)


@pytest.mark.slow
def test_openmp_threads_wait_passively_in_hpcgnn_processes_unless_the_user_says_otherwise():
    """libgomp reads OMP_WAIT_POLICY once, when torch loads it: importing hpcgnn first sets PASSIVE (spinning
    teams slowed the loaders 2.6x with one core taken), and a user's own value stays."""
    import subprocess
    import sys

    code = "import hpcgnn, torch; torch.ones(10**6).sum()"
    base = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    for given, expected in ((None, "PASSIVE"), ("active", "ACTIVE")):
        extra = {"OMP_WAIT_POLICY": given} if given else {}
        res = subprocess.run([sys.executable, "-c", code], env={**base, **extra, "OMP_DISPLAY_ENV": "true"},
                             capture_output=True, text=True, check=True)
        assert f"OMP_WAIT_POLICY = '{expected}'" in res.stderr


def test_processes_start_from_a_fork_server_only_where_its_socket_is_private(monkeypatch):
    """Ranks, servers and sampler processes fork from a fork server that imported torch once; before Python
    3.10.9 its socket was in Linux's abstract namespace, open to every user of the machine (CVE-2022-42919):
    spawn there."""
    import sys

    from hpcgnn import process

    assert process.start_context("json").get_start_method() == "forkserver"
    monkeypatch.setattr(sys, "version_info", (3, 10, 8, "final", 0))
    assert process.start_context("json").get_start_method() == "spawn"
