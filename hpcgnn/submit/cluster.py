"""``python -m hpcgnn cluster init NAME [--partition P]``: a cluster file from what SLURM reports.

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
from pathlib import Path

from hpcgnn.env import user_config_dir
from hpcgnn.errors import EXIT_USER_ERROR
from hpcgnn.slurm import (
    SINFO_FORMAT,
    PartitionInfo,
    parse_gpus,
    parse_sinfo,
    parse_time_min,
    pick_partition,
)

__all__ = ["PartitionInfo", "cluster_yaml", "init", "main", "parse_gpus", "parse_sinfo", "parse_time_min"]

def cluster_yaml(name: str, p: PartitionInfo, host: str) -> str:
    tasks = p.gpus or 1
    mem_gb = int(p.mem_mb * 0.9 // 1024) if p.mem_mb > 1 else None  # leave the OS its share
    time_min = min(p.time_min, 24 * 60) if p.time_min else 60
    lines = [
        f"# Written by `python -m hpcgnn cluster init {name}` from sinfo on {host}, {time.strftime('%Y-%m-%d %H:%M')}.",
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
        "# account: my-project  # --account: your project, where the site bills jobs to one",
        "# qos: normal          # --qos",
        "# setup: shell lines the batch script runs before the ranks start: load what the job needs, e.g.",
        "#   - module load gcc cuda",
        "#   - source /path/to/your/venv/bin/activate   # the environment must be at the same path on every node",
        "setup: []",
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
    chosen = pick_partition(parts, partition)
    if chosen is None:
        raise ValueError(f"no partition {partition!r}; sinfo lists: {', '.join(p.name for p in parts)}")
    path = folder / f"{name}.yaml"
    if path.exists() and not force:
        raise FileExistsError(f"{path} exists: pass --force to overwrite it")
    folder.mkdir(parents=True, exist_ok=True)
    path.write_text(cluster_yaml(name, chosen, socket.gethostname()))
    return path


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m hpcgnn cluster", description=__doc__.splitlines()[0])
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
        return EXIT_USER_ERROR
    print(path.read_text(), end="")
    print(f"written: {path}\nuse it with: python -m hpcgnn +cluster={args.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
