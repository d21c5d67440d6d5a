"""The code every rank runs, whichever launcher started it.

submitit runs :data:`hpcgnn.submit.entry.run_task` (a light object the submitting process pickles),
which calls :func:`run_rank`; the local spawn launcher and srun/torchrun ranks call it directly.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import signal
from collections.abc import Mapping
from pathlib import Path

import submitit
import torch

from hpcgnn import dist, process, trust
from hpcgnn.config import RunConfig
from hpcgnn.data.prepared import check_root
from hpcgnn.dist import pick_device, process_group
from hpcgnn.env import RankEnv
from hpcgnn.errors import EXIT_PREEMPTED, EXIT_REQUEUED, RunFolderBusy
from hpcgnn.failures import record_failure
from hpcgnn.logs import setup_logging
from hpcgnn.nodes import check_allocation
from hpcgnn.rank.checkpoint import Preempted
from hpcgnn.rank.trainer import train


def run_rank(cfg: RunConfig, environ: Mapping[str, str]) -> dict:
    """Train as one rank (or infer, for ``hpcgnn predict``). Any failure is recorded in ``run_dir/failures/`` (:func:`record_failure`) for the
    launcher's report before it leaves, and the exception says so (``exc.recorded``)."""
    env: RankEnv | None = None
    try:
        env = RankEnv.from_environ(environ, (cfg.dist.port_min, cfg.dist.port_max), cfg.dist.master_port)
        _setup_logging(env)
        trust.private_umask()
        trust.run_folder(cfg.run_dir)  # (its checkpoints and config are loaded: refused if another user may write it)
        check_root(cfg.dataset)  # (every level of the data root this run reads: refused if another user may write it)
        if cfg.cluster is not None:  # without a cluster file, the layout is whatever started us
            c = cfg.cluster
            check_allocation(env, c.nodes, c.tasks_per_node, c.gpus_per_node,
                             torch.cuda.device_count() if torch.cuda.is_available() else 0)
        threads, cfg = _thread_budget(cfg, env, environ)
        process.set_threads(threads)
        if cfg.train.keep_freed_memory:
            process.keep_freed_memory()
        device = pick_device(env, cfg.train)
        if device.type == "cuda":
            torch.cuda.set_device(device)  # nccl's object collectives use the current device
        logging.getLogger(__name__).info("rank %d/%d (local %d/%d, node %d/%d) via %s on %s, %d threads",
                                         env.rank, env.world_size, env.local_rank, env.local_world_size,
                                         env.node_rank, env.num_nodes, env.source, device, torch.get_num_threads())
        with process_group(env, cfg.dist, device):
            lock = _hold_run_folder(cfg, env, environ)
            try:
                if cfg.predict.model_file:  # hpcgnn predict RUN_DIR: a trained model's outputs, no training
                    from hpcgnn.rank.predict import predict

                    return predict(cfg, env, device)
                return train(cfg, env, device)
            except Preempted as stop:
                raise _requeue(cfg, env, stop) from None
            except Exception as exc:
                # Recorded before the process group is torn down: the other ranks only
                # fail once this rank's connections close, so the cause is recorded first.
                record_failure(Path(cfg.run_dir), env, exc)
                raise
            finally:
                if lock is not None:
                    lock.release()
    except RunFolderBusy:
        raise  # (not recorded: the folder's records are the running job's)
    except Exception as exc:
        if not getattr(exc, "recorded", False):  # failed before the process group was up
            record_failure(Path(cfg.run_dir), env, exc)
        raise


def _hold_run_folder(cfg: RunConfig, env: RankEnv, environ: Mapping[str, str]):
    """Collective, before training: rank 0 takes the run folder's lock (:mod:`hpcgnn.runlock`) unless the local
    launcher holds it, and sets an earlier attempt's failure records aside; where another job holds it, every
    rank raises :class:`~hpcgnn.errors.RunFolderBusy` naming it (none waits for the others)."""
    from hpcgnn import runlock
    from hpcgnn.env import read
    from hpcgnn.failures import set_aside_failures

    lock, busy = None, ""
    if env.is_main and read("run_locked", environ) != "1":
        try:
            lock = runlock.take(cfg.run_dir, f"rank 0 of {env.world_size}", env.job_id)
            set_aside_failures(Path(cfg.run_dir))
        except RunFolderBusy as exc:
            busy = str(exc)
    busy = dist.all_gather_object(busy)[0]
    if busy:
        raise RunFolderBusy(busy)
    return lock


def _thread_budget(cfg: RunConfig, env: RankEnv, environ: Mapping[str, str]) -> tuple[int, RunConfig]:
    """The rank's torch threads, and the config with each sampler process's (``train.sampler_threads``) resolved:
    together they take the cores the rank has (``train.num_threads``, else the task's CPUs), never more."""
    from hpcgnn.checks import split_threads

    t = cfg.train
    budget = t.num_threads or env.default_threads(environ)
    mine, each = split_threads(budget, t.sampler_procs, t.sampler_threads)
    if t.sampler_procs:
        logging.getLogger(__name__).info("rank %d: %d core(s): %d thread(s) for the rank, %d sampler process(es) of "
                                         "%d thread(s)", env.rank, budget, mine, t.sampler_procs, each)
        cfg = dataclasses.replace(cfg, train=dataclasses.replace(t, sampler_threads=each))
    return mine, cfg


def _requeue(cfg: RunConfig, env: RankEnv, stop: Preempted) -> BaseException:
    """After the preemption checkpoint: have the job requeued; returns what to leave with.

    Under submitit, rank 0 runs submitit's own handler for the signal (outside any signal
    context now): it counts time-outs against ``checkpoint.max_timeouts``, requeues with
    ``scontrol requeue`` and exits, or says why it will not requeue. The other ranks wait
    for that before exiting, so the job cannot end as completed before it is requeued.
    Elsewhere nobody can requeue: every rank exits with EXIT_PREEMPTED and the launcher
    says how to resume.
    """
    log = logging.getLogger(__name__)
    handler = None
    with contextlib.suppress(RuntimeError):
        submitit.JobEnvironment()  # raises outside a submitit job
        handler = signal.getsignal(getattr(signal, f"SIG{cfg.checkpoint.signal}"))
    if not callable(handler) or not env.is_main:
        outcome: BaseException = SystemExit(EXIT_PREEMPTED if handler is None else EXIT_REQUEUED)
    else:
        log.info("%s; asking submitit to requeue the job", stop)
        try:
            handler(getattr(signal, f"SIG{cfg.checkpoint.signal}"), None)
            outcome = SystemExit(EXIT_REQUEUED)
        except BaseException as exc:  # SystemExit after the requeue, or why it did not requeue
            outcome = exc
    dist.all_reduce_sum(torch.zeros(1))  # rank 0 has requeued (or given up) before anyone exits
    if env.is_main and handler is None:
        print(f"hpcgnn: {stop}; run the same command with hydra.run.dir={cfg.run_dir} to resume", flush=True)
    return outcome


def _setup_logging(env: RankEnv) -> None:
    setup_logging(f"rank {env.rank}", env.is_main)
