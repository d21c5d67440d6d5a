"""Where a rank is: one frozen RankEnv, read from exactly one table per launcher.

Sources, in the order they are tried:

- ``torchrun``: torchrun / torch.distributed.run, and hpcgnn's own local spawn;
- ``submitit_local``: submitit's LocalExecutor (``SUBMITIT_LOCAL_*``);
- ``slurm``: a task started by ``srun`` inside a SLURM allocation;
- ``single``: one plain process.

Nothing here writes ``os.environ``: every function takes the mapping it reads.
"""

from __future__ import annotations

import datetime
import itertools
import os
import re
import socket
import zlib
from collections.abc import Mapping
from dataclasses import dataclass

from hpcgnn.config import ConfigError

# role -> variable, one table per source. A role missing from a table is derived.
SOURCES: dict[str, dict[str, str]] = {
    "torchrun": {
        "rank": "RANK",
        "local_rank": "LOCAL_RANK",
        "world_size": "WORLD_SIZE",
        "local_world_size": "LOCAL_WORLD_SIZE",
        "node_rank": "GROUP_RANK",
        "master_addr": "MASTER_ADDR",
        "master_port": "MASTER_PORT",
        "job_id": "TORCHELASTIC_RUN_ID",
    },
    "submitit_local": {
        "rank": "SUBMITIT_LOCAL_GLOBALID",
        "local_rank": "SUBMITIT_LOCAL_LOCALID",
        "world_size": "SUBMITIT_LOCAL_NTASKS",
        "node_rank": "SUBMITIT_LOCAL_NODEID",
        "num_nodes": "SUBMITIT_LOCAL_JOB_NUM_NODES",
        "job_id": "SUBMITIT_LOCAL_JOB_ID",
    },
    "slurm": {
        "rank": "SLURM_PROCID",
        "local_rank": "SLURM_LOCALID",
        "world_size": "SLURM_NTASKS",
        "node_rank": "SLURM_NODEID",
        "num_nodes": "SLURM_JOB_NUM_NODES",
        "nodelist": "SLURM_JOB_NODELIST",
        "tasks_per_node": "SLURM_TASKS_PER_NODE",
        "job_id": "SLURM_JOB_ID",
        "step_tasks": "SLURM_STEP_NUM_TASKS",  # set by srun only
        "cpus_per_task": "SLURM_CPUS_PER_TASK",
    },
}
# The variables whose presence selects a source.
_MARKERS = {
    "torchrun": ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"),
    "submitit_local": ("SUBMITIT_LOCAL_JOB_ID", "SUBMITIT_LOCAL_GLOBALID"),
    "slurm": ("SLURM_JOB_ID", "SLURM_PROCID"),
}


class AllocationError(ConfigError):
    """What the launcher gave does not match what the config asked for."""


@dataclass(frozen=True)
class RankEnv:
    source: str  # torchrun | submitit_local | slurm | single
    rank: int  # global rank, 0..world_size-1
    local_rank: int  # rank on this node
    world_size: int  # ranks in the job
    local_world_size: int  # ranks on this node
    node_rank: int  # index of this node in the job
    num_nodes: int  # nodes in the job
    hostnames: tuple[str, ...]  # the job's nodes, in SLURM order (this host alone for local sources)
    master_addr: str  # host of rank 0's TCP store
    master_port: int  # port of rank 0's TCP store
    job_id: str  # the launcher's job id ("" when none)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @classmethod
    def from_environ(cls, environ: Mapping[str, str], port_range: tuple[int, int] = (20000, 32767),
                     master_port: int = 0) -> RankEnv:
        """Read the rank layout of this process from ``environ``.

        ``master_port`` > 0 overrides the derived port; ``port_range`` bounds the derivation.
        """
        source = detect_source(environ)
        if source == "single":
            port = master_port or derive_port(str(os.getpid()), *port_range)
            return cls("single", 0, 0, 1, 1, 0, 1, (socket.gethostname(),), "127.0.0.1", port, "")
        table = SOURCES[source]

        def get(role: str, default: str | None = None) -> str:
            var = table.get(role)
            value = environ.get(var) if var else None
            if value is None:
                if default is None:
                    raise AllocationError(f"{source} launch: variable {var} for {role} is not set")
                return default
            return value

        rank, world = int(get("rank")), int(get("world_size"))
        local_rank = int(get("local_rank", "0"))
        job_id = get("job_id", "")
        if source == "torchrun":
            local_world = int(get("local_world_size", str(world)))
            return cls(source, rank, local_rank, world, local_world, int(get("node_rank", "0")),
                       max(1, world // max(1, local_world)), (socket.gethostname(),),
                       get("master_addr"), master_port or int(get("master_port")), job_id)
        port = master_port or derive_port(job_id, *port_range)
        if source == "submitit_local":
            return cls(source, rank, local_rank, world, world, int(get("node_rank", "0")),
                       int(get("num_nodes", "1")), (socket.gethostname(),), "127.0.0.1", port, job_id)
        # slurm
        if "step_tasks" in table and environ.get(table["step_tasks"]) is None and world > 1:
            raise AllocationError(
                f"SLURM allocated {world} tasks but only this one is running: the training entry was started "
                "without srun, directly in the batch script. HINT: start it as\n"
                "    srun python -m hpcgnn ...\n"
                "or let hpcgnn submit the job with +cluster=NAME (it adds srun itself)")
        hostnames = tuple(expand_nodelist(get("nodelist")))
        num_nodes = int(get("num_nodes", str(len(hostnames))))
        node_rank = int(get("node_rank", "0"))
        per_node = expand_tasks_per_node(get("tasks_per_node", str(world)))
        local_world = per_node[node_rank] if node_rank < len(per_node) else per_node[-1]
        return cls(source, rank, local_rank, world, local_world, node_rank, num_nodes, hostnames,
                   hostnames[0], port, job_id)


def detect_source(environ: Mapping[str, str]) -> str:
    """The first source whose marker variables are all set, else ``single``."""
    for source, markers in _MARKERS.items():
        if all(m in environ for m in markers):
            return source
    return "single"


def started_as_rank(environ: Mapping[str, str]) -> bool:
    """True when torchrun or srun started this process as one rank of a job."""
    source = detect_source(environ)
    return source == "torchrun" or (source == "slurm" and SOURCES["slurm"]["step_tasks"] in environ)


def run_name(environ: Mapping[str, str], now: datetime.datetime | None = None) -> str:
    """The run folder's name, the same on every rank of an externally launched job.

    srun and torchrun start each rank as its own ``python -m hpcgnn``: a
    timestamp would give every rank its own folder.
    """
    source = detect_source(environ)
    if source == "slurm" and started_as_rank(environ):
        return f"slurm-{environ['SLURM_JOB_ID']}.{environ.get('SLURM_STEP_ID', 'batch')}"
    if source == "torchrun":
        run_id = environ.get("TORCHELASTIC_RUN_ID", "none")
        if run_id == "none":  # torchrun's default: fall back to what all ranks share
            run_id = f"{environ['MASTER_ADDR']}-{environ['MASTER_PORT']}"
        return f"torchrun-{run_id}"
    return (now or datetime.datetime.now()).strftime("%Y-%m-%d/%H-%M-%S-%f")


def derive_port(job_id: str, port_min: int = 20000, port_max: int = 32767) -> int:
    """A port in [port_min, port_max] that is a function of the job id alone.

    Every node of a job computes the same port without talking to the others, and
    jobs with consecutive ids (the common case for jobs sharing a node) get
    different ports. Non-numeric ids are hashed.
    """
    span = port_max - port_min + 1
    digits = re.sub(r"\D", "", job_id)
    n = int(digits) if digits else zlib.crc32(job_id.encode())
    return port_min + n % span


# ---------------------------------------------------------------- SLURM list syntaxes


def _split_top_level(text: str) -> list[str]:
    """Split on commas outside brackets: 'a[1-2],b' -> ['a[1-2]', 'b']."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced ']' in node list {text!r}")
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth != 0:
        raise ValueError(f"unbalanced '[' in node list {text!r}")
    parts.append(text[start:])
    return [p for p in parts if p]


def _expand_range_set(body: str, text: str) -> list[str]:
    """'001-003,010' -> ['001', '002', '003', '010'], keeping zero padding."""
    out = []
    for item in body.split(","):
        lo, sep, hi = item.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise ValueError(f"bad range {item!r} in node list {text!r}")
        if not sep:
            out.append(lo)
            continue
        width = len(lo)
        if int(hi) < int(lo):
            raise ValueError(f"descending range {item!r} in node list {text!r}")
        out.extend(str(i).zfill(width) for i in range(int(lo), int(hi) + 1))
    return out


def expand_nodelist(text: str) -> list[str]:
    """Expand a SLURM host list: 'gpu[001-003,010],cpu-a[1-2]' -> gpu001 ... cpu-a2.

    Several bracket groups in one name ('r[1-2]n[1-2]') expand as a product, in
    SLURM's order (the last group varies fastest).
    """
    hosts: list[str] = []
    for item in _split_top_level(text.strip()):
        pieces = re.split(r"(\[[^\]]*\])", item)
        choices = [_expand_range_set(p[1:-1], text) if p.startswith("[") else [p] for p in pieces if p]
        hosts.extend("".join(combo) for combo in itertools.product(*choices))
    if not hosts:
        raise ValueError(f"empty node list {text!r}")
    return hosts


def expand_tasks_per_node(text: str) -> list[int]:
    """Expand SLURM_TASKS_PER_NODE: '2(x3),1' -> [2, 2, 2, 1]."""
    out: list[int] = []
    for item in text.split(","):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", item.strip())
        if not m:
            raise ValueError(f"bad SLURM_TASKS_PER_NODE item {item!r} in {text!r}")
        out.extend([int(m.group(1))] * int(m.group(2) or 1))
    return out


# ---------------------------------------------------------------- allocation vs config


def check_allocation(env: RankEnv, nodes: int, tasks_per_node: int, gpus_per_node: int = 0,
                     cuda_devices: int = 0) -> None:
    """Compare what the launcher gave with what the config asked for, before any init.

    A mismatch would otherwise show up as a hang at rendezvous or as ranks that
    share a GPU; the error names the setting to change.
    """
    expected = nodes * tasks_per_node
    if env.world_size != expected:
        if env.num_nodes != nodes:
            hint = f"set cluster.nodes={env.num_nodes}"
        else:
            hint = f"set cluster.tasks_per_node={env.world_size // max(1, env.num_nodes)}"
        raise AllocationError(
            f"{env.source} started {env.world_size} tasks on {env.num_nodes} node(s), but the config asks for "
            f"cluster.nodes={nodes} x cluster.tasks_per_node={tasks_per_node} = {expected}. HINT: {hint}, "
            "or submit through hpcgnn so that sbatch gets the same numbers")
    if env.num_nodes != nodes:
        raise AllocationError(
            f"{env.source} gave {env.num_nodes} node(s) but the config asks for cluster.nodes={nodes}. "
            f"HINT: set cluster.nodes={env.num_nodes}")
    if gpus_per_node > 0:
        if cuda_devices == 0:
            raise AllocationError(
                f"cluster.gpus_per_node={gpus_per_node} but this task sees no CUDA device. HINT: request GPUs "
                "(the cluster file's gpus_per_node becomes --gpus-per-node) or set cluster.gpus_per_node=0")
        if env.local_world_size > cuda_devices and cuda_devices != 1:
            raise AllocationError(
                f"{env.local_world_size} ranks on this node but only {cuda_devices} visible GPUs. "
                f"HINT: set cluster.tasks_per_node={cuda_devices}")
