"""SLURM's node lists, the ports a job derives from its id, and the allocation's check: pure functions of
strings and numbers (the environment itself is read in :mod:`hpcgnn.env`, SLURM's commands in :mod:`hpcgnn.slurm`).
"""

from __future__ import annotations

import itertools
import re
import zlib

from hpcgnn.errors import AllocationError

PORTS = (20000, 32767)


def derive_port(job_id: str, port_min: int = PORTS[0], port_max: int = PORTS[1]) -> int:
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


def check_allocation(env, nodes: int, tasks_per_node: int, gpus_per_node: int = 0,
                     cuda_devices: int = 0) -> None:
    """Compare what the launcher gave (``env``: a :class:`~hpcgnn.env.RankEnv`) with what the config asked for, before
    any init.

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


# ---------------------------------------------------------------- sampler servers


def server_port(job_id: str, local_index: int, port_min: int = PORTS[0], port_max: int = PORTS[1]) -> int:
    """The port of a job's sampler server ``local_index`` on its node: derived from the job id, away from the
    job's master port (the other half of the range), so that both sides compute it without talking."""
    span = port_max - port_min + 1
    base = derive_port(job_id, port_min, port_max) - port_min
    return port_min + (base + span // 2 + local_index) % span
