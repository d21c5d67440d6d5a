"""Sampler processes per rank (``train.sampler_procs=N``): batches made beside the training loop, on other cores.

Who owns what:

- The **rank** starts N processes (forked from a fresh fork server, never from the rank: libgomp is not
  fork-safe; :func:`hpcgnn.process.start_context`) once per run, and owns every buffer:
  N + ``train.prefetch`` - 1 shared-memory *slots*, handed to every process at start (pinned with
  ``cudaHostRegister`` when the rank trains on a GPU). The segments are unlinked as they are made
  (torch's file-descriptor sharing), so a killed job leaves nothing in ``/dev/shm``.
- **Sampler process k** maps the prepared graph itself (:mod:`hpcgnn.sampling.shipping`: no copy), and makes
  the batches i = k, k+N, k+2N, ... of each epoch, each with the generator ``rng.generator(batch_seed, i)``
  the in-process loader would use, into the slot the rank granted batch i. Only a small description of the
  batch crosses a pipe.
- The rank **consumes batches in index order** (batch i from process i mod N), viewing them in their slot.
  When it asks for the next batch it hands the slot back (on a GPU: once the copy out of it is done), and the
  slot goes to the next batch without one, in index order. The batches, and so training, are bitwise those
  of ``train.sampler_procs=0``.

A partitioned graph: each sampler process fetches remote neighbours and rows itself, over a gloo group of
its own made of sampler k of every rank (through rank 0's rendezvous store, under a prefix). Every rank walks
the same number of batches, so sampler k of every rank makes the same batch indices in the same order, and
their exchanges meet; the rank's own groups stay free for DDP, and nothing waits on the training loop.

Faults: a sampler process that raises reports its exception and exits; one that dies is noticed within a
second. Either fails its rank with :class:`~hpcgnn.errors.SamplerFailed`, naming the process. A sampler
process ignores the job's signals (the rank decides when to stop) and dies with its rank (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import collections
import contextlib
import functools
import logging
import os
import signal
import time
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing.connection import Connection

import torch
import torch.multiprocessing  # noqa: F401  (its reductions: a tensor in shared memory pickles as a handle)
from torch import Tensor

import hpcgnn.sampling.messages as m
import hpcgnn.sampling.serving as serving
import hpcgnn.sampling.shipping as shipping
from hpcgnn import process
from hpcgnn.checks import (
    SLOT_BYTES,  # a slot's first size; a batch that does not fit gets a larger slot (once or twice)
)
from hpcgnn.errors import SamplerFailed
from hpcgnn.sampling.loader import EpochPlan

log = logging.getLogger(__name__)

POLL_S = 0.5  # how often a waiting rank checks that its sampler process lives


@dataclass(frozen=True)
class SamplerSpec:
    """What a sampler process needs besides its recipe: who it is, its threads, and its group's rendezvous."""

    index: int  # k: makes batches k, k+N, ... (N processes)
    rank: int
    threads: int
    keep_freed_memory: bool
    group_size: int = 1  # >1: join the group of sampler k of every rank (a partitioned graph)
    master_addr: str = ""
    master_port: int = 0
    prefix: str = ""  # the group's keys in rank 0's store
    init_timeout_s: float = 1800.0
    timeout_s: float = 120.0
    fail_batch: int = -1  # debug.sampler_fail_*: raise making this batch (fault injection for tests)

    @property
    def name(self) -> str:
        return f"sampler process {self.index} of rank {self.rank}"


# ---------------------------------------------------------------------- inside a sampler process


def _join_group(spec: SamplerSpec) -> None:
    import torch.distributed as dist

    import hpcgnn.sampling.distributed as d

    store = dist.TCPStore(spec.master_addr, spec.master_port, is_master=False,
                          timeout=timedelta(seconds=spec.init_timeout_s))
    dist.init_process_group("gloo", store=dist.PrefixStore(spec.prefix, store), rank=spec.rank,
                            world_size=spec.group_size, timeout=timedelta(seconds=spec.init_timeout_s))
    d.use_group(dist.group.WORLD)  # this process's default group is the sampler group


class _PipeEnd:
    """A sampler process's end of its pipes (:class:`hpcgnn.sampling.serving.End`): batch i is written into the
    shared slot the rank granted it; a batch that does not fit asks the rank for a larger slot, which every process
    is handed."""

    def __init__(self, slots: list[Tensor], inbox: Connection, outbox: Connection):
        self.slots, self.inbox, self.outbox = slots, inbox, outbox
        self.grants: dict[int, int] = {}  # batch index -> the slot the rank gave it
        self.slot = -1  # the slot of the batch being made

    def recv(self, wait: bool):
        try:
            return self.inbox.recv() if self.inbox.poll(1.0 if wait else 0) else None
        except EOFError:  # the rank has ended (and this process with it: die_with_parent)
            raise serving.PeerGone from None

    def send(self, msg) -> None:
        try:
            self.outbox.send(msg)
        except OSError:
            raise serving.PeerGone from None

    def take(self, msg) -> None:
        if isinstance(msg, m.Grant):
            self.grants[msg.index] = msg.slot
        elif isinstance(msg, m.Slot):
            self.slots[msg.slot] = msg.tensor

    def room(self, i: int) -> bool:
        return i in self.grants

    def place(self, i: int) -> Tensor:
        self.slot = self.grants.pop(i)
        return self.slots[self.slot]

    def grow(self, i: int, needed: int, handle) -> Tensor:
        s = self.slot
        self.send(m.Grow(i, s, needed))
        while True:  # until the rank has handed slot s over grown (its other messages meanwhile as ever)
            msg = self.recv(wait=True)
            if msg is not None:
                handle(msg)
                if isinstance(msg, m.Slot) and msg.slot == s:
                    return self.slots[s]

    def deliver(self, i: int, meta, delta, nbytes: int, payload: memoryview | None = None) -> None:
        self.send(m.Batch(i, meta, delta, slot=self.slot))  # (a sampler process's batches are never relayed)


def serve(spec: SamplerSpec, recipe: bytes, slots: list[Tensor], inbox: Connection, outbox: Connection) -> None:
    """A sampler process's life: make the batches it is sent, into the slots granted them, until told to stop
    (:func:`hpcgnn.sampling.serving.serve`). ``inbox``: the rank's messages (read here), ``outbox``: this
    process's (written here)."""
    process.die_with_parent(signal.SIGKILL)
    process.ignore_signals(signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)  # the rank decides when
    process.set_threads(spec.threads)
    if spec.keep_freed_memory:
        process.keep_freed_memory()

    def start() -> serving.Sampling:
        if spec.group_size > 1:
            _join_group(spec)
        shorten = functools.partial(_shorten_timeout, spec.timeout_s) if spec.group_size > 1 else None
        return serving.Sampling(recipe, spec.fail_batch, shorten)

    try:
        stopped = serving.serve(_PipeEnd(slots, inbox, outbox), start)
    except BaseException:  # the rank has been told (Failed), and fails naming this process
        os._exit(1)
    if stopped and spec.group_size > 1:
        import torch.distributed as dist

        dist.destroy_process_group()
    outbox.close()
    process.end_quickly()


def _shorten_timeout(timeout_s: float) -> None:
    """The sampler group's collectives time out as the rank's do after its first step."""
    from torch.distributed.distributed_c10d import _set_pg_timeout

    _set_pg_timeout(timedelta(seconds=timeout_s), None)


# ---------------------------------------------------------------------- on the rank


def _shared(nbytes: int, pin: bool) -> Tensor:
    t = torch.empty(nbytes, dtype=torch.uint8).share_memory_()
    if pin:  # page-locked, so that a batch's copy to the GPU runs asynchronously from its slot
        err = torch.cuda.cudart().cudaHostRegister(t.data_ptr(), t.numel(), 0)
        if int(err) != 0:  # (e.g. a locked-memory limit): the copies still work, synchronously
            log.warning("a sampler slot of %.0f MB could not be pinned (cudaHostRegister: %s): its copies to the GPU "
                        "will not overlap", nbytes / 2**20, err)
    return t


def _unpin(t: Tensor) -> None:
    with contextlib.suppress(Exception):
        torch.cuda.cudart().cudaHostUnregister(t.data_ptr())


@dataclass
class _Proc:
    spec: SamplerSpec
    process: object
    inbox: Connection  # the rank's messages to it (epochs, slots granted to batches, grown slots, stop): written here
    outbox: Connection  # its messages to the rank (batches, growth requests, errors): read here


class SamplerPool:
    """A rank's sampler processes, started at the first epoch that needs them and stopped by :meth:`close`
    (or when an epoch is abandoned: the run is ending)."""

    def __init__(self, recipe: shipping.Recipe | bytes, procs: int, depth: int, threads: int, device: torch.device, *,
                 rank: int, keep_freed: bool = True, group: dict | None = None, fail_batch: int = -1):
        self.recipe, self.procs, self.threads = recipe, procs, threads
        self.device, self.rank, self.keep_freed, self.group = device, rank, keep_freed, group or {}
        self.pin, self.fail_batch = device.type == "cuda", fail_batch
        self.running: list[_Proc] = []
        # Slots shared by every process: one per process at work, plus the batches ahead the rank may hold
        # (train.prefetch - 1 besides the one it trains on); the rank grants each batch a slot in index order.
        self.total = procs + max(1, depth - 1)
        self.slots: list[Tensor] = []
        self.free: collections.deque = collections.deque()
        self.waiting: collections.deque = collections.deque()  # batch indices without a slot yet, in order
        # the rank's CommStats (or None): the processes' batches count there (a recipe already pickled: a sampler
        # server's, which hands each batch's counts on to its trainer)
        self.stats = None if isinstance(recipe, (bytes, shipping.Deferred)) else recipe.stats
        self.starts = 0  # the same on every rank: pools start and stop together

    def start(self) -> None:
        """Start the processes (a partitioned graph's: on every rank at once, their groups meet)."""
        if self.running:
            return
        ctx = process.start_context(__name__)  # (torch.multiprocessing's reductions: imported by this module)
        recipe = self.recipe if isinstance(self.recipe, bytes) else shipping.dumps(self.recipe)
        t0 = time.perf_counter()
        self.starts += 1
        self.slots = [_shared(SLOT_BYTES, self.pin) for _ in range(self.total)]
        self.free, self.waiting = collections.deque(range(self.total)), collections.deque()
        for k in range(self.procs):
            group = {**self.group, "prefix": f"hpcgnn/samplers/{self.starts}/{k}"} if self.group else {}
            spec = SamplerSpec(k, self.rank, self.threads, self.keep_freed, **group,
                               fail_batch=self.fail_batch)
            # Pipes, not multiprocessing's queues: a queue's named semaphores outlive a rank that a signal ends
            # (scancel, a time limit, Ctrl-C on a local run) until its resource tracker unlinks them, which warns
            # of "leaked semaphore objects" on every such stop. A pipe ends with the processes holding it.
            inbox_end, inbox = ctx.Pipe(duplex=False)
            outbox, outbox_end = ctx.Pipe(duplex=False)
            p = ctx.Process(target=serve, args=(spec, recipe, self.slots, inbox_end, outbox_end), daemon=True,
                            name=f"hpcgnn-sampler-{self.rank}.{k}")
            p.start()
            inbox_end.close()  # the process's ends: a pipe whose other end has gone reads EOF, writes fail
            outbox_end.close()
            self.running.append(_Proc(spec, p, inbox, outbox))
        for p in self.running:  # each has mapped the graph and built its sampler (and met its group)
            self._next(p, "start")
        log.info("%d sampler process(es) started, pids %s (%d thread(s) each, %d shared slots; recipe %.1f MB) in "
                 "%.1f s", self.procs, " ".join(map(str, self.pids())), self.threads, self.total, len(recipe) / 2**20,
                 time.perf_counter() - t0)

    def pids(self) -> list[int]:
        return [p.process.pid for p in self.running]

    def epoch(self, plan: EpochPlan) -> serving.ProducedLoader:
        """The plan's batches (its seeds, generators and order), made by these processes."""
        return serving.ProducedLoader(self, plan)

    # ---------------------------------------------------------------- one epoch

    def receive(self, i: int, unpack: bool = True):
        """Batch ``i``, viewed in its slot: (data, its process, slot, its exchange counts or None); ``unpack=False``:
        the batch as it lies there (:class:`~hpcgnn.sampling.shipping.Packed`)."""
        p = self.running[i % self.procs]
        batch = self._next(p, i)
        data = serving.arrived(batch, i, p.spec.name, self.stats, self.slots[batch.slot], unpack)
        return data, p, batch.slot, batch.delta

    def begin(self, batch_seed: int, jobs: list) -> None:
        """An epoch's batches to make, as (index, seeds as a numpy array) in index order, each to the process its
        index says; the first ones get their slots at once."""
        for p in self.running:
            self._send(p, m.Epoch(batch_seed, [(i, seeds) for i, seeds in jobs if i % self.procs == p.spec.index]))
        self.waiting.extend(i for i, _ in jobs)
        self._grant()

    def _grant(self) -> None:
        while self.free and self.waiting:
            i = self.waiting.popleft()
            self._send(self.running[i % self.procs], m.Grant(i, self.free.popleft()))

    def _next(self, p: _Proc, i: int | str):
        """``p``'s next message (a batch, or that it is ready), growing its slots as it asks; fails the rank
        when it raised or died."""
        while True:
            try:
                msg = p.outbox.recv() if p.outbox.poll(POLL_S) else None
            except EOFError:  # it has ended (its end of the pipe closed as it exited)
                p.process.join(POLL_S)
                msg = None
            if msg is None:
                if not p.process.is_alive():
                    raise self._died(p, i) from None
                continue
            if isinstance(msg, m.Grow):  # every process gets the grown slot (before any later grant of it)
                s = msg.slot
                old = self.slots[s]
                self.slots[s] = _shared(int(msg.needed * serving.GROWTH), self.pin)
                if self.pin:
                    _unpin(old)
                for q in self.running:
                    self._send(q, m.Slot(s, self.slots[s]))
                log.debug("%s: slot %d grown to %.1f MB", p.spec.name, s, self.slots[s].numel() / 2**20)
                continue
            if isinstance(msg, m.Failed):
                raise self._failed(p, msg)
            return msg

    def _send(self, p: _Proc, msg) -> None:
        """A message to ``p``; fails the rank when ``p`` has ended (with the error it sent, if it sent one)."""
        try:
            p.inbox.send(msg)
        except OSError:  # its end of the pipe has closed: it failed, or died
            error = None
            with contextlib.suppress(EOFError, OSError):
                while error is None and p.outbox.poll(0):
                    reply = p.outbox.recv()
                    error = reply if isinstance(reply, m.Failed) else None
            if error is not None:
                raise self._failed(p, error) from None
            p.process.join(5.0)
            raise self._died(p, msg.kind) from None

    def _failed(self, p: _Proc, msg: m.Failed) -> SamplerFailed:
        what = f"making batch {msg.index}" if msg.index >= 0 else "at its start"
        return SamplerFailed(f"{p.spec.name} (pid {p.process.pid}) failed {what}: {msg.line}\nits traceback:\n"
                             f"{msg.trace}")

    def _died(self, p: _Proc, i: int | str) -> SamplerFailed:
        """``p`` died while the rank waited for batch ``i``, for its start (``"start"``), or sent it a message
        (``i``: the message's kind)."""
        code = p.process.exitcode
        how = f"signal {signal.Signals(-code).name}" if code is not None and code < 0 else f"exit code {code}"
        when = (f"while the rank waited for batch {i}" if isinstance(i, int) else
                "while the rank waited for its start" if i == "start" else f"before the rank could send it {i!r}")
        return SamplerFailed(f"{p.spec.name} (pid {p.process.pid}) died ({how}) {when}. "
                             "HINT: SIGKILL is what the kernel's out-of-memory killer sends: check the node's memory "
                             "(cluster.mem_gb) or lower train.sampler_procs")

    def release(self, p: _Proc, s: int, done) -> None:
        """Hand slot ``s`` back to process ``p`` (once the copy out of it, ``done``, has finished)."""
        if done is not None:
            done.synchronize()
        self.free.append(s)
        self._grant()

    def close(self, done: bool = False) -> None:
        """Stop every process (a clean stop, else killed) and free the slots (``done``: as for RemotePool)."""
        for p in self.running:
            with contextlib.suppress(OSError):  # (one that has ended reads nothing)
                p.inbox.send(m.Stop())
        deadline = time.monotonic() + 5.0
        for p in self.running:
            p.process.join(timeout=max(0.0, deadline - time.monotonic()))
            if p.process.is_alive():
                p.process.kill()
                p.process.join()
            p.inbox.close()
            p.outbox.close()
        if self.pin:
            for t in self.slots:
                _unpin(t)
        self.running, self.slots = [], []
