"""The code every rank runs, whichever launcher started it.

submitit runs :data:`hpcgnn.submit.entry.run_task` (a light object the submitting process pickles),
which calls :func:`run_rank`; the local spawn launcher and srun/torchrun ranks call it directly.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import sys
import time
import traceback
from collections.abc import Mapping
from pathlib import Path

import submitit
import torch

from hpcgnn import dist
from hpcgnn.config import RunConfig
from hpcgnn.dist import pick_device, process_group
from hpcgnn.env import RankEnv, check_allocation
from hpcgnn.errors import EXIT_FAILED, EXIT_PREEMPTED, AnotherRankFailed, UserError, describe
from hpcgnn.io import write_json
from hpcgnn.rank.checkpoint import Preempted
from hpcgnn.rank.trainer import train
from hpcgnn.sampling.loader import keep_freed_memory


def run_rank(cfg: RunConfig, environ: Mapping[str, str]) -> dict:
    """Train as one rank. Any failure is recorded in ``run_dir/failures/`` (:func:`record_failure`) for the
    launcher's report before it leaves, and the exception says so (``exc.recorded``)."""
    env: RankEnv | None = None
    try:
        env = RankEnv.from_environ(environ, (cfg.dist.port_min, cfg.dist.port_max), cfg.dist.master_port)
        _setup_logging(env)
        if cfg.cluster is not None:  # without a cluster file, the layout is whatever started us
            c = cfg.cluster
            check_allocation(env, c.nodes, c.tasks_per_node, c.gpus_per_node,
                             torch.cuda.device_count() if torch.cuda.is_available() else 0)
        torch.set_num_threads(cfg.train.num_threads or env.default_threads(environ))
        if cfg.train.keep_freed_memory:
            keep_freed_memory()
        device = pick_device(env, cfg.train)
        if device.type == "cuda":
            torch.cuda.set_device(device)  # nccl's object collectives use the current device
        logging.getLogger(__name__).info("rank %d/%d (local %d/%d, node %d/%d) via %s on %s, %d threads",
                                         env.rank, env.world_size, env.local_rank, env.local_world_size,
                                         env.node_rank, env.num_nodes, env.source, device, torch.get_num_threads())
        with process_group(env, cfg.dist, device):
            try:
                return train(cfg, env, device)
            except Preempted as stop:
                raise _requeue(cfg, env, stop) from None
            except Exception as exc:
                # Recorded before the process group is torn down: the other ranks only
                # fail once this rank's connections close, so the cause is recorded first.
                record_failure(Path(cfg.run_dir), env, exc)
                raise
    except Exception as exc:
        if not getattr(exc, "recorded", False):  # failed before the process group was up
            record_failure(Path(cfg.run_dir), env, exc)
        raise


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
        outcome: BaseException = SystemExit(EXIT_PREEMPTED if handler is None else -1)
    else:
        log.info("%s; asking submitit to requeue the job", stop)
        try:
            handler(getattr(signal, f"SIG{cfg.checkpoint.signal}"), None)
            outcome = SystemExit(-1)
        except BaseException as exc:  # SystemExit after the requeue, or why it did not requeue
            outcome = exc
    dist.all_reduce_sum(torch.zeros(1))  # rank 0 has requeued (or given up) before anyone exits
    if env.is_main and handler is None:
        print(f"hpcgnn: {stop}; run the same command with hydra.run.dir={cfg.run_dir} to resume", flush=True)
    return outcome


def record_failure(run_dir: Path, env: RankEnv | None, exc: BaseException) -> None:
    """Write this rank's traceback to ``run_dir/failures/rank-<r>.json`` for the launcher's report, and mark
    ``exc.recorded`` when it is on disk (a rank whose environment could not be read is named by its pid).

    A user error (a corrupt partition, a checkpoint of another job, ...) is marked so, with
    the line that names the fix and its exit code: the launcher reports that line alone and
    leaves with that code (2; 4 for a diverged run).
    """
    user = isinstance(exc, UserError)
    record = {"rank": env.rank if env is not None else -1, "host": socket.gethostname(),
              "job_id": env.job_id if env is not None else "", "time": time.time(),
              "error": "".join(traceback.format_exception(exc)),
              "user_error": describe(exc) if user else None, "exit_code": exc.exit_code if user else EXIT_FAILED,
              "echo": isinstance(exc, AnotherRankFailed)}
    name = f"rank-{env.rank}.json" if env is not None else f"rank-unknown-{os.getpid()}.json"
    with contextlib.suppress(OSError):  # (a full or unwritable disk: the rank's own stderr keeps the traceback)
        write_json(run_dir / "failures" / name, record)
        exc.recorded = True


def read_failures(run_dir: Path) -> list[dict]:
    """The failure records of a run, earliest first; echoes of another rank's failure after every cause."""
    records = []
    for path in (run_dir / "failures").glob("rank-*.json"):
        with contextlib.suppress(OSError, ValueError):
            records.append(json.loads(path.read_text()))
    return sorted(records, key=lambda r: (r.get("echo", False), r["time"], r["rank"]))


def _setup_logging(env: RankEnv) -> None:
    """hpcgnn's loggers write to the task's stdout; rank 0 tells the story, the others warn only."""
    logger = logging.getLogger("hpcgnn")
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter(f"%(asctime)s [rank {env.rank}] %(message)s", datefmt="%H:%M:%S"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO if env.is_main else logging.WARNING)
    logger.propagate = False
