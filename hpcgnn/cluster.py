"""``python -m hpcgnn.cluster init NAME [--partition P]``: a cluster file from what SLURM reports.

Asks ``sinfo`` for the partition's nodes, CPUs, memory, GPUs (gres) and time limit, and
writes ``NAME.yaml`` to the user's cluster folder (``$HPCGNN_CONFIG_DIR/cluster``, default
``~/.config/hpcgnn/cluster``), where ``+cluster=NAME`` finds it. One rank per GPU, or one
rank per node without GPUs; every value can be edited afterwards.
"""

from __future__ import annotations

import argparse
import re
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from hpcgnn import user_config_dir

SINFO_FORMAT = "%P|%D|%c|%m|%G|%l|%N"


@dataclass(frozen=True)
class PartitionInfo:
    name: str
    default: bool
    nodes: int
    cpus: int  # per node (the smallest node group)
    mem_mb: int  # per node (the smallest node group)
    gpus: int  # per node, from gres
    time_min: int | None  # partition limit; None = infinite
    nodelist: str


def parse_gpus(gres: str) -> int:
    """GPUs per node from a gres string: ``gpu:4``, ``gpu:a100:8(S:0-1)``, ``gpu:a100:4,shard:8``."""
    total = 0
    for item in gres.split(","):
        parts = re.sub(r"\(.*?\)", "", item).split(":")
        if parts[0] == "gpu" and parts[-1].isdigit():
            total += int(parts[-1])
    return total


def parse_time_min(limit: str) -> int | None:
    """Minutes of a SLURM time limit: ``infinite``, ``MM``, ``HH:MM:SS``, ``D-HH:MM:SS``."""
    if limit in ("infinite", "UNLIMITED", "n/a", ""):
        return None
    days, _, rest = limit.rpartition("-")
    fields = [int(x) for x in rest.split(":")]
    if len(fields) == 1:  # minutes
        h, m, s = 0, fields[0], 0
    elif len(fields) == 2:  # MM:SS
        h, m, s = 0, fields[0], fields[1]
    else:
        h, m, s = fields[-3:]
    return (int(days) if days else 0) * 1440 + h * 60 + m + (1 if s else 0)


def parse_sinfo(text: str) -> list[PartitionInfo]:
    """Partitions from ``sinfo -h -o SINFO_FORMAT`` (one line per node group)."""
    groups: dict[str, list[list[str]]] = {}
    for line in text.splitlines():
        fields = line.strip().split("|")
        if len(fields) == 7:
            groups.setdefault(fields[0], []).append(fields)
    out = []
    for raw, rows in groups.items():
        out.append(PartitionInfo(
            name=raw.rstrip("*"), default=raw.endswith("*"), nodes=sum(int(r[1]) for r in rows),
            cpus=min(int(r[2].rstrip("+")) for r in rows), mem_mb=min(int(r[3].rstrip("+")) for r in rows),
            gpus=min(parse_gpus(r[4]) for r in rows), time_min=parse_time_min(rows[0][5]),
            nodelist=",".join(r[6] for r in rows)))
    return out


def cluster_yaml(name: str, p: PartitionInfo, host: str) -> str:
    tasks = p.gpus or 1
    mem_gb = int(p.mem_mb * 0.9 // 1024) if p.mem_mb > 1 else None  # leave the OS its share
    time_min = min(p.time_min, 24 * 60) if p.time_min else 60
    lines = [
        f"# Written by `python -m hpcgnn.cluster init {name}` from sinfo on {host}, {time.strftime('%Y-%m-%d %H:%M')}.",
        f"# Partition {p.name}: {p.nodes} nodes ({p.nodelist}), {p.cpus} CPUs, {p.mem_mb} MB, {p.gpus} GPUs per node,",
        f"# time limit {'infinite' if p.time_min is None else f'{p.time_min} min'}. Edit freely.",
        "defaults:",
        "  - base_cluster",
        f"name: {name}",
        "executor: slurm",
        f"partition: {p.name}",
        f"nodes: {min(p.nodes, 2)}  # of {p.nodes}",
        f"tasks_per_node: {tasks}  # one rank per GPU" if p.gpus else "tasks_per_node: 1  # no GPUs: one rank per node",
        f"gpus_per_node: {p.gpus}",
        f"cpus_per_task: {max(p.cpus // tasks, 1)}",
        f"mem_gb: {mem_gb if mem_gb else 'null'}",
        f"time_min: {time_min}",
        f"job_name: hpcgnn-{name}",
    ]
    return "\n".join(lines) + "\n"


def init(name: str, partition: str | None, folder: Path, sinfo: str | None = None, force: bool = False) -> Path:
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        raise ValueError(f"cluster name {name!r}: use letters, digits, '_', '-' or '.'")
    if sinfo is None:
        res = subprocess.run(["sinfo", "-h", "-o", SINFO_FORMAT], capture_output=True, text=True, timeout=60)
        if res.returncode != 0:
            raise RuntimeError(f"sinfo failed: {res.stderr.strip()}")
        sinfo = res.stdout
    parts = parse_sinfo(sinfo)
    if not parts:
        raise RuntimeError("sinfo reported no partitions")
    if partition is None:
        chosen = next((p for p in parts if p.default), parts[0])
    else:
        chosen = next((p for p in parts if p.name == partition), None)
        if chosen is None:
            raise ValueError(f"no partition {partition!r}; sinfo lists: {', '.join(p.name for p in parts)}")
    path = folder / f"{name}.yaml"
    if path.exists() and not force:
        raise FileExistsError(f"{path} exists: pass --force to overwrite it")
    folder.mkdir(parents=True, exist_ok=True)
    path.write_text(cluster_yaml(name, chosen, socket.gethostname()))
    return path


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m hpcgnn.cluster", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("init", help="write NAME.yaml from sinfo")
    p.add_argument("name")
    p.add_argument("--partition", help="default: the cluster's default partition")
    p.add_argument("--force", action="store_true", help="overwrite an existing file")
    args = ap.parse_args(argv)
    try:
        path = init(args.name, args.partition, user_config_dir() / "cluster", force=args.force)
    except (ValueError, RuntimeError, FileExistsError, OSError, subprocess.TimeoutExpired) as exc:
        print(f"hpcgnn: {exc}", file=sys.stderr)
        return 2
    print(path.read_text(), end="")
    print(f"written: {path}\nuse it with: python -m hpcgnn +cluster={args.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
