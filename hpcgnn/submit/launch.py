"""From a RunConfig to running ranks: local processes, submitit's local executor, or sbatch.

How (``launch.mode``, default ``auto``: see :func:`launch_mode`):

- ``rank``: srun or torchrun started this process as one rank: it trains in place;
- ``local``: ``launch.procs`` processes on this machine (forked from a fork server: :func:`hpcgnn.process.start_context`);
- ``submit``: to the cluster of ``+cluster=NAME``: submitit's LocalExecutor
  (``cluster.executor=local``, tasks on this machine with job folders) or its SlurmExecutor,
  which writes and submits the sbatch script.

The sbatch script is rendered by submitit's own code path for dry runs too, so
``launch.dry_run=true`` prints exactly the script that a real submission writes.

This module decides and starts; the rest of the way is in ``executor.py`` (submitit and sbatch),
``partition_job.py`` (parts made first), ``local.py`` (local processes) and ``follow.py`` (waiting,
following, the failure report).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from hpcgnn import checks, env, runlock, trust
from hpcgnn.config import RunConfig
from hpcgnn.failures import set_aside_failures
from hpcgnn.submit.compose import record_config
from hpcgnn.submit.executor import (
    check_partition_capacity,
    dry_run_text,
    job_folder,
    make_executor,
    submitting,
)
from hpcgnn.submit.follow import wait_for
from hpcgnn.submit.local import run_this_rank, spawn_local
from hpcgnn.submit.partition_job import ensure_partitioned
from hpcgnn.trust import run_secret


def launch(cfg: RunConfig, overrides: tuple[str, ...] | list[str] = ()) -> int:
    """Run or submit ``cfg``; returns the process exit code (see :mod:`hpcgnn.errors`)."""
    if cfg.launch.dry_run:
        print(dry_run_text(cfg))
        return 0
    mode, why = launch_mode(cfg)
    if why:
        print(f"hpcgnn: {why}", flush=True)
    if mode == "rank":
        return run_this_rank(cfg)
    if mode == "local":
        cfg = dataclasses.replace(cfg, cluster=None)  # the ranks are these processes, whatever the cluster file says
    with new_attempt(cfg, mode):
        return _start(cfg, mode, overrides)


@contextlib.contextmanager
def new_attempt(cfg: RunConfig, mode: str) -> Iterator[None]:
    """Around starting a run in its folder: one job at a time there (:mod:`hpcgnn.runlock`: a local run's launcher
    holds the folder's lock until the run ends; before a submission, no running job may hold it), and an earlier
    attempt's failure records set aside, so that this attempt's report is its own."""
    lock = runlock.take(cfg.run_dir, "a local run's launcher") if mode == "local" else None
    try:
        if lock is None:
            runlock.check_free(cfg.run_dir)
        aside = set_aside_failures(Path(cfg.run_dir))
        if aside is not None:
            print(f"hpcgnn: an earlier attempt's failure records were moved to {aside}", flush=True)
        yield
    finally:
        if lock is not None:
            lock.release()


def _start(cfg: RunConfig, mode: str, overrides) -> int:
    trust.run_folder(cfg.run_dir)  # (a folder another user owns or may write: refused before anything is read)
    record_config(cfg, overrides)
    run_secret(cfg.run_dir)  # made here, by the user who starts the run (hpcgnn.trust); refused if others can read it
    check_data_on_disk(cfg)
    check_model(cfg)
    from hpcgnn.checks import check_thread_budget

    check_thread_budget(cfg, len(os.sched_getaffinity(0)))
    if mode == "submit":
        check_partition_capacity(cfg.cluster)
        c = cfg.cluster
        checks.check_slots(cfg, c.tasks_per_node, None, None if c.mem_gb is None else int(c.mem_gb * 2**30),
                           f"a node of {c.name} (cluster.mem_gb={c.mem_gb})")
    else:
        checks.check_slots(cfg, cfg.launch.procs, checks.shm_free(), env.available_memory(), "this machine")
    after = None
    if cfg.graph.mode == "partitioned":
        after = ensure_partitioned(cfg, mode)
    if mode == "local":
        return spawn_local(cfg)
    ex = make_executor(cfg)
    if after is not None:  # SLURM starts training only once partitioning succeeded, and drops it otherwise
        ex.update_parameters(additional_parameters={**cfg.cluster.sbatch_extra, "dependency": f"afterok:{after.job_id}",
                                                    "kill_on_invalid_dep": "yes"})
    from hpcgnn.submit.entry import run_task

    servers = None
    if cfg.cluster.samplers.nodes:  # what the sampler servers start from
        from hpcgnn.submit.het import submit_servers, write_servers_config

        write_servers_config(cfg, job_folder(cfg))
        if not cfg.cluster.samplers.het:  # a job of their own, started first; the trainers' waits for it
            with submitting():
                servers = submit_servers(cfg, job_folder(cfg), sys.executable)
            extra = dict(ex.parameters.get("additional_parameters", {}))
            extra["dependency"] = ",".join(filter(None, [extra.get("dependency"), f"after:{servers}"]))
            ex.update_parameters(additional_parameters=extra)
            print(f"submitted the sampler servers' job {servers}", flush=True)
    with submitting():
        job = ex.submit(run_task, cfg)
    print(f"submitted job {job.job_id} to {cfg.cluster.name} ({cfg.world_size} tasks)"
          f"{f', after partitioning job {after.job_id}' if after is not None else ''}; output folder: {cfg.run_dir}",
          flush=True)
    if cfg.launch.wait is False:
        return 0
    try:
        return wait_for(job, cfg, after)
    finally:
        if servers is not None:  # done with the trainers: the servers' job ends too
            subprocess.run(["scancel", servers], capture_output=True)


def check_data_on_disk(cfg: RunConfig) -> None:
    """Before submitting: the files and OGB sources a job reads must be there (synthetic graphs are made where
    they are prepared), and a node task's kind must fit the labels where they can be read here. The data module's
    check imports torch: only datasets read from disk pay for it."""
    dataset = cfg.dataset
    if dataset.name in (*checks.ON_DISK, *checks.PYG_DATASETS):  # (pyg: its class or function must import)
        from hpcgnn.data import check_available
        from hpcgnn.specs import load, tasks

        check_available(dataset)
        check = tasks.SPECS[cfg.task.name].target_check
        if check is not None:
            load(check)(dataset, cfg.task)


def check_model(cfg: RunConfig) -> None:
    """Before submitting: a model of the user's own imports, takes its arguments and returns one row per node on a
    tiny graph (on the CPU, here; torch is imported for it alone); on a typed graph, one of its node types and
    relations (where they are known before the graph is prepared; else the rank checks it as it builds the model).
    A model that reads edge features (``model.edge_dim``, or one of the user's own) is checked against the
    width of the graph's where that is known before the graph is prepared (:func:`hpcgnn.data.edge_width`)."""
    d, m = cfg.dataset, cfg.model
    if checks.is_graph_set(d):  # (a graph task's model: checked on two tiny graphs, whatever its widths)
        if checks.is_custom(m):
            from hpcgnn.models.graph import probe_custom

            probe_custom(cfg)
        return
    if checks.is_custom(m) and checks.is_typed(d):
        from hpcgnn.data import typed_shape
        from hpcgnn.models.custom import check_custom

        shape = typed_shape(d)
        if shape is not None:
            check_custom(cfg, shape[1], shape[2], schema=shape[0])
        return
    if not (checks.is_custom(m) or m.edge_dim) or checks.is_typed(d):
        return
    from hpcgnn.data import edge_width
    from hpcgnn.models import edge_features_read

    width = edge_width(d)
    edge_features_read(m, width, d.name)
    if checks.is_custom(m):
        from hpcgnn.models.custom import check_custom

        check_custom(cfg, d.num_features if d.name == "synthetic" else 16,
                     d.num_classes if d.name == "synthetic" else 3, edge_dim=width)


def launch_mode(cfg: RunConfig, environ=None) -> tuple[str, str]:
    """How this process runs ``cfg``, and why when the guess is not the obvious one.

    ``launch.mode`` other than ``auto`` decides. Otherwise:

    - ``rank``: torchrun, or srun with several tasks in the step, started this process as one
      rank: it trains in place. So does a one-task srun step that is not a shell a user types
      in (a batch script's ``srun python -m hpcgnn``). A batch script with several tasks but
      no srun lands here too, and fails with the srun line to use.
    - ``submit``: with ``+cluster=NAME``, hand the job to the cluster's executor, also from a
      shell inside an allocation (``srun --pty bash``, ``salloc``) or from a batch job.
    - ``local``: start ``launch.procs`` processes on this machine.
    """
    if cfg.launch.mode != "auto":
        return cfg.launch.mode, ""
    if env.started_as_rank(environ):
        return "rank", ""
    interactive = env.interactive_reason(environ)
    tasks = env.srun_step_tasks(environ)
    if tasks is not None:  # a one-task interactive step, or started_as_rank would have said so
        where = f"a one-task interactive SLURM step ({interactive})"
        what = f"submitting to {cfg.cluster.name}" if cfg.cluster is not None else \
            f"starting {cfg.launch.procs} local processes"
        return ("submit" if cfg.cluster is not None else "local",
                f"{where}: {what}; launch.mode=rank trains in this process instead")
    if cfg.cluster is not None:
        return "submit", ""
    job_tasks = env.read_int("job_tasks", environ) or 1
    if env.detect_source(environ) == "slurm" and job_tasks > 1 \
            and interactive is None:
        return "rank", ""  # a batch step that forgot srun: RankEnv says so, with the line to use
    return "local", ""

