"""Process-group life cycle and the few collectives the trainer needs.

With one rank no process group is created and every helper is the identity, so
the same training code runs alone, under DDP on CPU (gloo) and on GPUs (nccl).
"""

from __future__ import annotations

import contextlib
import logging
import socket
from collections.abc import Iterator
from datetime import timedelta

import torch
import torch.distributed as dist

from hpcgnn.config import DistConfig, TrainConfig
from hpcgnn.env import RankEnv

log = logging.getLogger(__name__)

# Where collective inputs must live: the rank's GPU under nccl, the CPU under gloo.
_comm_device = torch.device("cpu")


def pick_device(env: RankEnv, train: TrainConfig) -> torch.device:
    """cuda:<local_rank> when CUDA is wanted and present (cuda:0 if the task sees one GPU), else cpu."""
    want_cuda = train.device == "cuda" or (train.device == "auto" and torch.cuda.is_available())
    if not want_cuda:
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise RuntimeError("train.device=cuda but torch sees no CUDA device: set train.device=auto or cpu")
    count = torch.cuda.device_count()
    return torch.device("cuda", env.local_rank if count > 1 else 0)


def pick_backend(cfg: DistConfig, device: torch.device) -> str:
    if cfg.backend != "auto":
        return cfg.backend
    return "nccl" if device.type == "cuda" else "gloo"


@contextlib.contextmanager
def process_group(env: RankEnv, cfg: DistConfig, device: torch.device) -> Iterator[None]:
    """Initialise the default process group for the job, and always tear it down.

    Init uses an explicit TCP rendezvous at env.master_addr:env.master_port with
    cfg.init_timeout_s; afterwards collectives time out after cfg.timeout_s, so a
    dead or stuck rank fails the job instead of hanging it.
    """
    if env.world_size == 1:
        yield
        return
    backend = pick_backend(cfg, device)
    where = f"{env.master_addr}:{env.master_port}"
    log.info("init process group: backend=%s store=%s rank=%d/%d host=%s init_timeout=%ss timeout=%ss",
             backend, where, env.rank, env.world_size, socket.gethostname(), cfg.init_timeout_s, cfg.timeout_s)
    try:
        # Our own store, so that the rendezvous has its own timeout: waiting for a
        # slow node to start is normal, a collective stuck that long is not.
        store = dist.TCPStore(env.master_addr, env.master_port, env.world_size, is_master=env.is_main,
                              timeout=timedelta(seconds=cfg.init_timeout_s), wait_for_workers=True)
    except Exception as exc:
        hint = ("the port is taken: set dist.master_port to a free port" if env.is_main
                else f"rank 0 did not open {where} in time: check that it started and that the port is reachable")
        raise RuntimeError(f"rank {env.rank}: rendezvous at {where} failed ({exc}). HINT: {hint}") from exc
    global _comm_device
    kwargs = {"device_id": device} if device.type == "cuda" else {}
    dist.init_process_group(backend, store=store, rank=env.rank, world_size=env.world_size,
                            timeout=timedelta(seconds=cfg.timeout_s), **kwargs)
    _comm_device = device if backend == "nccl" else torch.device("cpu")
    try:
        yield
    finally:
        # No barrier here: after an error on one rank, a barrier would wait for the dead.
        dist.destroy_process_group()
        _comm_device = torch.device("cpu")


def comm_device() -> torch.device:
    """Where collective buffers must live: the GPU under nccl, else the CPU."""
    return _comm_device


def new_group(cfg: DistConfig):
    """A second process group over all ranks (same backend, same timeout), or None alone.

    Collectives issued from the prefetch thread run on it, so they never interleave
    with the training thread's gradient all-reduces on the default group.
    """
    if not initialized():
        return None
    return dist.new_group(timeout=timedelta(seconds=cfg.timeout_s))


def initialized() -> bool:
    return dist.is_available() and dist.is_initialized()


def _all_reduce(t: torch.Tensor, op) -> torch.Tensor:
    if initialized():
        buf = t.to(_comm_device)  # nccl reduces GPU tensors only; a no-op copy under gloo
        dist.all_reduce(buf, op=op)
        if buf is not t:
            t.copy_(buf)
    return t


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    """Sum ``t`` over ranks in place and return it (any device)."""
    return _all_reduce(t, dist.ReduceOp.SUM)


def all_reduce_max(t: torch.Tensor) -> torch.Tensor:
    """Element-wise maximum of ``t`` over ranks, in place (any device)."""
    return _all_reduce(t, dist.ReduceOp.MAX)


def all_gather_object(obj: object) -> list:
    if not initialized():
        return [obj]
    out: list = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out
