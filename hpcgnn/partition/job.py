"""Partitioning as a job of its own: the processes of one partition (their communicator), their peak memory, and the
task a SLURM job or the launcher runs.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import torch

from hpcgnn import env, process
from hpcgnn.config import DatasetConfig, GraphConfig
from hpcgnn.io import stop_cleanly_on_sigterm
from hpcgnn.partition.cache import ensure_parts
from hpcgnn.partition.multilevel import LOCAL, Comm
from hpcgnn.partition.report import format_report


def run_partition(dataset: DatasetConfig, graph_cfg: GraphConfig, num_parts: int, comm: Comm = LOCAL) -> dict:
    """Partition (or reuse) and print the report; the body of `python -m hpcgnn.partition` and its job."""
    t0 = time.perf_counter()
    folder, meta, reused = ensure_parts(dataset, graph_cfg, num_parts, comm=comm)
    took = time.perf_counter() - t0
    peak = peak_rss()
    if comm.rank == 0:
        print(format_report(meta), flush=True)
        how = (f"reused in {took:.3f} s" if reused else
               f"partitioned in {meta['partition_s']:.1f} s by {comm.size} task(s), written in {took:.1f} s")
        print(f"parts: {folder} ({how})", flush=True)
    print(f"task {comm.rank}/{comm.size}: {torch.get_num_threads()} threads, peak RSS {peak / 2**20:.0f} MB", flush=True)
    return {**meta, "folder": str(folder), "reused": reused, "seconds": took, "peak_rss": peak}


def peak_rss() -> int:
    """This process's peak resident memory in bytes (VmHWM), 0 where /proc is missing."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def run_partition_task(cfg) -> dict:
    """Entry of the partitioning job that submitit runs; importable by reference. Several tasks (lp on
    ``cluster.nodes`` nodes): a gloo process group from SLURM's variables, and the work shared."""
    from hpcgnn.dist import process_group

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    environ = env.current()
    rank_env = env.RankEnv.from_environ(environ, (cfg.dist.port_min, cfg.dist.port_max), cfg.dist.master_port)
    # the CPUs the job asked for (torch would take every core it sees: where SLURM does not bind tasks to
    # their cores, tasks sharing a node would each run a thread per core)
    process.set_threads(rank_env.default_threads(environ))
    with stop_cleanly_on_sigterm("partition task"), process_group(rank_env, cfg.dist, torch.device("cpu")):
        comm = Comm(rank_env.rank, rank_env.world_size) if rank_env.world_size > 1 else LOCAL
        return run_partition(cfg.dataset, cfg.graph, cfg.graph.parts_for(cfg.world_size), comm)

