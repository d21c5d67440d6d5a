"""Partitioning before training: where the parts are missing, a job of its own (on the cluster: its own SLURM job,
sized for METIS) or in place.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

from hpcgnn.config import RunConfig
from hpcgnn.submit.executor import make_executor, submitting
from hpcgnn.submit.follow import stopped_or_failed


def ensure_partitioned(cfg: RunConfig, mode: str):
    """Parts for a partitioned run: made here before local ranks start, or by a SLURM job the
    training job depends on (``afterok``), so no training node idles while one node partitions.
    Returns that job, or None when nothing was submitted."""
    from hpcgnn.partition import parts_ready, run_partition

    num_parts = cfg.graph.parts_for(cfg.world_size)
    if parts_ready(cfg.dataset, cfg.graph, num_parts):
        return None
    if mode == "local" or cfg.cluster.executor == "local":
        run_partition(cfg.dataset, cfg.graph, num_parts)
        return None
    _check_partition_job_memory(cfg)
    return submit_partition(cfg)


def _check_partition_job_memory(cfg: RunConfig) -> None:
    """Before submitting: when the graph is prepared and the job's memory is known, will METIS fit?"""
    from hpcgnn.data import cache, cache_folder
    from hpcgnn.partition import check_partition_memory

    folder = cache_folder(cfg.dataset)
    limit = cfg.graph.partition_mem_gb or cfg.cluster.mem_gb
    if limit is None or not cache.is_complete(folder):
        return
    meta = cache.GraphMeta.read(folder)
    check_partition_memory(cfg.graph.method, meta.num_nodes, meta.num_edges, int(limit * 2**30))


def partition_job_config(cfg: RunConfig) -> RunConfig:
    """The cluster settings of the partitioning job: no GPU, the job's memory; one task on one node, or
    for ``graph.method=lp`` one task on each of ``cluster.nodes`` nodes (they share the work)."""
    c = cfg.cluster
    nodes = c.nodes if cfg.graph.method == "lp" else 1
    one = dataclasses.replace(c, nodes=nodes, tasks_per_node=1, gpus_per_node=0, job_name=f"{c.job_name}-partition")
    return dataclasses.replace(cfg, cluster=one, run_dir=str(Path(cfg.run_dir) / "partition"))


def submit_partition(cfg: RunConfig):
    from hpcgnn.partition import run_partition_task

    pcfg = partition_job_config(cfg)
    with submitting():
        job = make_executor(pcfg).submit(run_partition_task, cfg)
    print(f"submitted partitioning job {job.job_id} to {cfg.cluster.name}; output folder: {pcfg.run_dir}", flush=True)
    return job


def wait_partition(job, cfg: RunConfig) -> int:
    from submitit.core.utils import FailedJobError, UncompletedJobError

    try:
        job.results()  # every task's (lp shares the work among several)
    except (KeyboardInterrupt, FailedJobError, UncompletedJobError) as exc:
        return stopped_or_failed(job, "partitioning job", "", exc)
    for i in range(job.num_tasks):  # task 0 prints the report; every task its peak memory
        text = job.task(i).stdout() if job.num_tasks > 1 else job.stdout()
        sys.stdout.write(text if i == 0 else "".join(line + "\n" for line in (text or "").splitlines()
                                                         if line.startswith("task ")))
    return 0

