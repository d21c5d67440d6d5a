"""Process-group life cycle and the few collectives the trainer needs.

With one rank no process group is created and every helper is the identity, so
the same training code runs alone, under DDP on CPU (gloo) and on GPUs (nccl).

Groups: the default group carries DDP's gradient all-reduce (nccl on GPUs); a second
group carries the partitioned sampler's exchanges from the prefetch thread
(:func:`new_group`); and under nccl a gloo *control* group carries the small host-side
collectives (the per-step checkpoint flags, object gathers), so that reading them never
waits for the GPU stream.

Timeouts: until the first training step has succeeded, collectives may wait
``dist.init_timeout_s`` (ranks start at different times; local rank 0 may prepare data);
after it, :func:`shorten_timeouts` sets ``dist.timeout_s`` on every group, so a rank
that hangs mid-run fails the job within that time (torchtitan does the same).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import socket
import tempfile
from collections.abc import Iterator
from datetime import timedelta

import torch
import torch.distributed as dist

from hpcgnn import paths
from hpcgnn.config import DistConfig, TrainConfig
from hpcgnn.env import RankEnv
from hpcgnn.errors import AllocationError, ConfigError

log = logging.getLogger(__name__)

# Where collective inputs must live: the rank's GPU under nccl, the CPU under gloo.
_comm_device = torch.device("cpu")
_groups: list = []  # every group made here besides the default one (their timeouts shorten with it)
_backend = "none"  # the default group's backend ("none": one rank, no group)
_control = None  # gloo group for host-side collectives under nccl (None: the default group is gloo already)


def pick_device(env: RankEnv, train: TrainConfig) -> torch.device:
    """cuda:<local_rank> when CUDA is wanted and present (cuda:0 if the task sees one GPU), else cpu."""
    want_cuda = train.device == "cuda" or (train.device == "auto" and torch.cuda.is_available())
    if not want_cuda:
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise AllocationError("train.device=cuda but torch sees no CUDA device here. HINT: ask the job for GPUs "
                              "(cluster.gpus_per_node), or set train.device=auto (or cpu)")
    return torch.device("cuda", env.local_rank % torch.cuda.device_count())


def gpu_identity(device: torch.device) -> str:
    """This rank's GPU as the node knows it: host and the device's UUID (the same physical GPU gives the same
    string in every process, whatever CUDA_VISIBLE_DEVICES renumbered); the CPU gives ''."""
    if device.type != "cuda":
        return ""
    props = torch.cuda.get_device_properties(device)
    return f"{socket.gethostname()}|{getattr(props, 'uuid', None) or device.index}"


def gpus_shared(store, env: RankEnv, identity: str) -> bool:
    """Whether any two ranks drive the same GPU, agreed by every rank through the rendezvous store.

    One visible GPU per task is ambiguous: SLURM may bind a GPU of its own to each task (each sees
    it as cuda:0), or the ranks may really share the node's one GPU; only the devices' UUIDs tell.
    Rank 0 reads every rank's identity and publishes the answer, so all ranks pick one backend.
    """
    if not identity:
        return False
    store.set(f"hpcgnn/gpu/{env.rank}", identity)
    if env.is_main:
        ids = [store.get(f"hpcgnn/gpu/{r}").decode() for r in range(env.world_size)]
        store.set("hpcgnn/gpu/shared", "1" if len(set(ids)) < len(ids) else "0")
    return store.get("hpcgnn/gpu/shared") == b"1"


def pick_backend(cfg: DistConfig, device: torch.device, shared: bool = False) -> str:
    """``dist.backend``; auto: nccl when every rank has a GPU of its own, else gloo (CPU, or ranks
    sharing a GPU: NCCL refuses two ranks on one device, gloo reduces CUDA tensors through the host)."""
    if cfg.backend == "nccl" and shared:
        raise ConfigError("dist.backend=nccl needs a GPU per rank, but some ranks share one. HINT: set "
                          "dist.backend=gloo (or auto), or start one rank per GPU (cluster.tasks_per_node = "
                          "cluster.gpus_per_node)")
    if cfg.backend != "auto":
        return cfg.backend
    if shared:
        log.warning("ranks share a GPU: gloo carries the gradients (NCCL needs a GPU per rank)")
        return "gloo"
    return "nccl" if device.type == "cuda" else "gloo"


@contextlib.contextmanager
def process_group(env: RankEnv, cfg: DistConfig, device: torch.device, always: bool = False) -> Iterator[None]:
    """Initialise the default process group for the job, and always tear it down.

    Init uses an explicit TCP rendezvous at env.master_addr:env.master_port with
    cfg.init_timeout_s, the timeout of every collective too until :func:`shorten_timeouts`;
    so a dead or stuck rank fails the job instead of hanging it. One rank makes no group
    unless ``always`` (the tests walk the backends' init paths with one rank).
    """
    if env.world_size == 1 and not always:
        yield
        return
    where = f"{env.master_addr}:{env.master_port}"
    try:
        # Our own store, so that the rendezvous has its own timeout: waiting for a
        # slow node to start is normal, a collective stuck that long is not.
        local = is_loopback(env.master_addr)
        if local:  # every rank is on this machine: nothing listens beyond it (the store here, gloo's pairs)
            from hpcgnn.env import gloo_on_loopback

            gloo_on_loopback()
        store = dist.TCPStore(env.master_addr, env.master_port, env.world_size, is_master=env.is_main,
                              timeout=timedelta(seconds=cfg.init_timeout_s), wait_for_workers=True,
                              master_listen_fd=_listen_on_loopback(env.master_port) if local and env.is_main else None)
    except Exception as exc:
        hint = ("the port is taken: set dist.master_port to a free port" if env.is_main
                else f"rank 0 did not open {where} in time: check that it started and that the port is reachable")
        raise RuntimeError(f"rank {env.rank}: rendezvous at {where} failed ({exc}). HINT: {hint}") from exc
    backend = pick_backend(cfg, device, gpus_shared(store, env, gpu_identity(device)))
    log.info("init process group: backend=%s store=%s rank=%d/%d host=%s timeouts: %ss until the first step, "
             "then %ss", backend, where, env.rank, env.world_size, socket.gethostname(), cfg.init_timeout_s,
             cfg.timeout_s)
    global _comm_device, _control, _backend
    _backend = backend
    kwargs = {"device_id": device} if backend == "nccl" else {}
    dist.init_process_group(backend, store=store, rank=env.rank, world_size=env.world_size,
                            timeout=timedelta(seconds=cfg.init_timeout_s), **kwargs)
    _comm_device = device if backend == "nccl" else torch.device("cpu")
    if backend == "nccl":
        _control = dist.new_group(backend="gloo", timeout=timedelta(seconds=cfg.init_timeout_s))
        _groups.append(_control)
    try:
        yield
    finally:
        # No barrier here: after an error on one rank, a barrier would wait for the dead.
        dist.destroy_process_group()
        _comm_device, _control, _backend = torch.device("cpu"), None, "none"
        _groups.clear()


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine's loopback interface (a local run's MASTER_ADDR)."""
    return host in ("localhost", "::1") or host.startswith("127.")


def _listen_on_loopback(port: int) -> int | None:
    """A socket listening on 127.0.0.1:``port`` for the rendezvous store to take over (its file descriptor):
    torch's store, left to itself, listens on every interface. None where the port is held already (torchrun's
    agent keeps a store of its own there, which the ranks share): torch's store then does as it does."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        sock.listen(1024)
    except OSError:
        sock.close()
        return None
    return sock.detach()


def backend() -> str:
    """The default group's backend: nccl, gloo, or none (one rank)."""
    return _backend


def comm_device() -> torch.device:
    """Where collective buffers must live: the GPU under nccl, else the CPU."""
    return _comm_device


def new_group(cfg: DistConfig):
    """A second process group over all ranks (same backend), or None alone.

    Collectives issued from the prefetch thread run on it, so they never interleave
    with the training thread's gradient all-reduces on the default group.
    """
    if not initialized():
        return None
    group = dist.new_group(timeout=timedelta(seconds=cfg.init_timeout_s))
    _groups.append(group)
    return group


def shorten_timeouts(seconds: float) -> None:
    """After the first step succeeded: every group's collectives time out after ``seconds``."""
    if not initialized():
        return
    from torch.distributed.distributed_c10d import _set_pg_timeout

    for group in [None, *_groups]:
        _set_pg_timeout(timedelta(seconds=seconds), group)
    log.info("collective timeout now %ss (dist.timeout_s)", seconds)


def initialized() -> bool:
    return dist.is_available() and dist.is_initialized()


def _all_reduce(t: torch.Tensor, op) -> torch.Tensor:
    if initialized():
        if _control is not None and t.device.type == "cpu":  # host values: the gloo control group
            dist.all_reduce(t, op=op, group=_control)
            return t
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
    """Every rank's ``obj`` (small, JSON: numbers, strings, lists, dicts; a tuple comes back a list), in rank
    order; through the control group under nccl. Nothing is unpickled: gloo's connections are not
    authenticated (docs/security.md), and JSON runs no code whoever wrote the bytes."""
    if not initialized():
        return [obj]
    return gather_json(obj, _control)


def gather_json(obj: object, group=None) -> list:
    """``obj`` of every member of ``group`` (default: the default group), in rank order, as JSON over two tensor
    all-gathers (the lengths, then the bytes padded to the longest) on the CPU (gloo groups)."""
    data = torch.frombuffer(bytearray(json.dumps(obj).encode()), dtype=torch.uint8)
    size = dist.get_world_size(group)
    n = torch.tensor([data.numel()], dtype=torch.long)
    lengths = [torch.zeros_like(n) for _ in range(size)]
    dist.all_gather(lengths, n, group=group)
    most = max(int(x) for x in lengths)
    mine = torch.zeros(most, dtype=torch.uint8)
    mine[: data.numel()] = data
    parts = [torch.empty(most, dtype=torch.uint8) for _ in range(size)]
    dist.all_gather(parts, mine, group=group)
    return [json.loads(bytes(p[: int(k)].numpy())) for p, k in zip(parts, lengths, strict=True)]


def node_table(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor | None:
    """An uninitialised host tensor that every rank maps: one copy on the node, each rank writing its rows and
    reading everyone's, with nothing sent (every rank of the job on this node; collective). None where it cannot
    be made (``/dev/shm`` too full, or absent): the caller all-gathers instead.

    Rank 0 makes a file of its own in ``/dev/shm`` (mode 0600: no other user can open it) and reserves its
    pages (a tmpfs that fills later would kill a rank with SIGBUS at a write); each rank maps it once it has
    checked that it is a plain file of its user's (:func:`hpcgnn.paths.open_nofollow`), and rank 0 removes the name
    once all have: nothing is left in ``/dev/shm``, however the job ends after that."""

    numel = math.prod(shape)
    name = ""
    if dist.get_rank() == 0 and numel:
        try:
            fd, name = tempfile.mkstemp(prefix="hpcgnn-table-", dir="/dev/shm")
            try:
                os.posix_fallocate(fd, 0, numel * dtype.itemsize)
            finally:
                os.close(fd)
        except OSError as exc:
            log.warning("a node-shared table of %.0f MB could not be made in /dev/shm (%s): the ranks all-gather it",
                        numel * dtype.itemsize / 2**20, exc.strerror)
            if name:
                os.unlink(name)
            name = ""
    name = all_gather_object(name)[0]
    if not name:
        return None
    try:
        os.close(paths.open_nofollow(name, os.O_RDWR, what="a node-shared table", private=True))
        table = torch.from_file(name, shared=True, size=numel, dtype=dtype)
    finally:
        all_reduce_max(torch.zeros(1))  # (every rank has mapped it)
        if dist.get_rank() == 0:
            os.unlink(name)
    return table.view(shape)


class NodeTables:
    """Node-shared tables (:func:`node_table`) kept to be used again: ``take`` hands out a table given back
    before where one fits (nothing made, its pages in every rank's mapping already: making and faulting in a
    table of 128 MB costs 30-60 ms here), else makes one; ``give`` hands one back once no rank reads it (any
    other tensor: ignored). The ranks take and give the same tables in the same order, so each decides alike;
    taking one given back is no collective. A table given back keeps its memory until the pool's end, as one
    rank's heap keeps its freed blocks (``train.keep_freed_memory``)."""

    def __init__(self) -> None:
        self._free: list[torch.Tensor] = []  # the bytes of tables given back (uint8, flat)
        self._lent: dict[int, torch.Tensor] = {}  # data pointer of a table handed out -> its bytes
        self.made = 0  # tables made (the rest of those taken were given back before)

    def take(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor | None:
        """An uninitialised table (None where none can be made: the caller all-gathers). A table given back
        serves a request of at least half its bytes (a small one does not hold a large one: the smallest
        that fits)."""
        need = math.prod(shape) * dtype.itemsize
        if need == 0:
            return torch.empty(shape, dtype=dtype)
        fits = [k for k, b in enumerate(self._free) if need <= b.numel() <= 2 * need]
        if fits:
            flat = self._free.pop(min(fits, key=lambda k: self._free[k].numel()))
        else:
            flat = node_table((need,), torch.uint8)
            if flat is None:
                return None
            self.made += 1
        self._lent[flat.data_ptr()] = flat
        return flat[:need].view(dtype).view(shape)

    def give(self, *tables: torch.Tensor | None) -> None:
        for t in tables:
            flat = None if t is None else self._lent.pop(t.data_ptr(), None)
            if flat is not None:
                self._free.append(flat)


def all_gather_rows(mine: torch.Tensor, counts: list[int]) -> torch.Tensor:
    """Concatenate every rank's rows in rank order (rank r holds ``counts[r]`` rows of the same width).

    A tensor collective (no pickling): rows are padded to the largest count and gathered into
    one preallocated buffer on the collective device. ``mine`` may come padded already (its first
    ``counts[rank]`` rows count): then it is sent as it is. Where every rank but the last with rows
    holds the most (a range split in order), the result is a prefix of that buffer, not a copy.
    """
    if not initialized() or len(counts) == 1:
        return mine[: counts[0]] if len(counts) == 1 else mine
    most, rank = max(counts), dist.get_rank()
    if mine.size(0) == most and mine.device == _comm_device and mine.is_contiguous():
        buf = mine
    else:
        buf = mine.new_zeros((most, *mine.shape[1:]), device=_comm_device)
        buf[: counts[rank]] = mine[: counts[rank]].to(_comm_device)
    out = buf.new_empty((len(counts) * most, *mine.shape[1:]))
    dist.all_gather(list(out.split(most)), buf)
    filled = sum(counts)
    if all(c == most for c in counts[: filled // most]) and not any(counts[filled // most + 1:]):
        return out[:filled].to(mine.device)
    return torch.cat([out[r * most: r * most + c] for r, c in enumerate(counts)]).to(mine.device)
