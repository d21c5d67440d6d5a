"""The one serve loop of a batch producer, over either transport, and the rank's walk over what it receives.

A producer is a sampler process of a rank's own (:mod:`hpcgnn.sampling.procs`: a pipe, batches written into the
rank's shared slots) or a sampler server's thread for one trainer (:mod:`hpcgnn.sampling.server`: a socket,
each batch's bytes after its message). Both run :func:`serve`, which owns what they share:

- the order: the batches an :class:`~hpcgnn.sampling.messages.Epoch` lists, made one after another as they come;
- the room: a batch is made only once the rank has room for it (the transport says: a slot granted to it, or
  a credit left);
- growth: a batch that does not fit its place is packed again into a larger one the transport finds;
- fault injection and errors: a producer that raises sends :class:`~hpcgnn.sampling.messages.Failed` (its
  batch, or -1: at its start) before it goes.

What differs is the transport (an :class:`End`) and what makes a batch (a :class:`Maker`: the sampler here,
or, on a server for a partitioned graph, a sampler process this thread relays).
"""

from __future__ import annotations

import collections
import contextlib
import time
import traceback
from collections.abc import Callable, Iterator
from typing import Protocol

import torch
from torch import Tensor

import hpcgnn.sampling.messages as m
import hpcgnn.sampling.shipping as shipping
from hpcgnn import rng
from hpcgnn.sampling.loader import BatchLoader, DeviceCopy, EpochPlan

GROWTH = 1.25  # a grown slot or buffer holds the batch that did not fit, plus this margin


class PeerGone(Exception):
    """The transport's other end has gone (the rank ended, the trainer left)."""


class _Stopped(Exception):
    """The rank said :class:`~hpcgnn.sampling.messages.Stop` (raised where a wait for a grown slot reads it)."""


class End(Protocol):
    """A producer's end of its transport."""

    def recv(self, wait: bool) -> object | None:
        """The rank's next message; None when there is none (``wait``: after waiting a while). Raises
        :class:`PeerGone`."""

    def send(self, msg) -> None:
        """A message to the rank. Raises :class:`PeerGone`."""

    def take(self, msg) -> None:
        """A message of the transport's own (a slot granted or grown; a credit)."""

    def room(self, i: int) -> bool:
        """Whether batch ``i`` may be made now."""

    def place(self, i: int) -> Tensor:
        """The bytes batch ``i`` is written into."""

    def grow(self, i: int, needed: int, handle: Callable) -> Tensor:
        """A place of ``needed`` bytes or more for batch ``i`` (``handle``: for the rank's messages meanwhile)."""

    def deliver(self, i: int, meta, delta, nbytes: int, payload: memoryview | None = None) -> None:
        """Batch ``i`` is in its place (``nbytes`` of it), or in ``payload`` (a relayed batch's bytes as they
        lie): tell the rank (and hand the bytes over)."""


class Maker(Protocol):
    """What makes a batch: ``make(i, seeds, batch_seed, alloc) -> (data, the exchange counts it added)``, data
    a batch to pack or one packed already (:class:`~hpcgnn.sampling.shipping.Packed`: passed on as it lies);
    ``epoch(msg)`` sees each epoch's list first; ``done()`` once a batch is delivered; ``close()`` at the end."""

    def epoch(self, msg: m.Epoch) -> None: ...

    def make(self, i: int, seeds: Tensor, batch_seed: int, alloc) -> tuple: ...

    def done(self) -> None: ...

    def close(self) -> None: ...


class Sampling:
    """Batches made here, by the recipe's sampler, each with the generator the rank's own loader would use.
    ``fail_batch``: raise making that batch (debug.sampler_fail_*). ``after_first``: called once the first batch
    is made."""

    def __init__(self, recipe: shipping.Recipe | bytes, fail_batch: int = -1, after_first: Callable | None = None):
        r = shipping.loads(recipe) if isinstance(recipe, bytes) else recipe  # (bytes: over a pipe)
        if isinstance(r, shipping.Deferred):  # (built here, as the server would have built it)
            r = r()
        self.stats, self.fail_batch, self.after_first = r.stats, fail_batch, after_first
        self.loader = BatchLoader(r.features, r.sampler, [], transform=r.transform)

    def epoch(self, msg: m.Epoch) -> None:
        pass

    def make(self, i: int, seeds: Tensor, batch_seed: int, alloc) -> tuple:
        if i == self.fail_batch:
            raise RuntimeError(f"injected failure making batch {i} (debug.sampler_fail_rank)")
        before = self.stats.snapshot() if self.stats is not None else None
        data = self.loader.sample(seeds, rng.generator(batch_seed, i), alloc=alloc)
        return data, (self.stats - before if self.stats is not None else None)

    def done(self) -> None:
        if self.after_first is not None:
            self.after_first()
            self.after_first = None

    def close(self) -> None:
        pass


class Counters(Protocol):
    def waited(self, seconds: float) -> None: ...

    def made(self, seconds: float, nbytes: int) -> None: ...


def serve(end: End, start: Callable[[], Maker], counters: Counters | None = None) -> bool:
    """Make the batches the rank asks for until it says stop (True) or goes (False). ``start()``: the maker,
    built here so that a failure to build it reaches the rank as one at the start (batch -1)."""
    pending: collections.deque = collections.deque()  # (i, seeds, batch_seed), in order
    maker, i = None, -1

    def handle(msg) -> None:
        if isinstance(msg, m.Stop):
            raise _Stopped
        if isinstance(msg, m.Epoch):
            pending.extend((i, torch.from_numpy(seeds), msg.batch_seed) for i, seeds in msg.jobs)
            maker.epoch(msg)
        else:
            end.take(msg)

    try:
        maker = start()
        end.send(m.Ready())
        while True:
            ready = bool(pending) and end.room(pending[0][0])
            t0 = time.perf_counter()
            msg = end.recv(wait=not ready)  # what the rank says comes first
            if counters is not None:
                counters.waited(time.perf_counter() - t0)
            if msg is not None:
                handle(msg)
                continue
            if not ready:
                continue
            i, seeds, batch_seed = pending.popleft()
            t0 = time.perf_counter()
            writer = shipping.SlotWriter(end.place(i))
            data, delta = maker.make(i, seeds, batch_seed, writer.alloc)
            payload = None
            if isinstance(data, shipping.Packed):  # (relayed: its bytes go on as they lie, no second copy)
                meta, nbytes, payload = data.meta, data.nbytes, data.view()
            else:
                meta, nbytes = shipping.pack(data, writer)
                if meta is None:  # a larger place, and the batch packed again
                    writer = shipping.SlotWriter(end.grow(i, nbytes, handle))
                    meta, nbytes = shipping.pack(data, writer)
            del data
            if counters is not None:
                counters.made(time.perf_counter() - t0, nbytes)
            end.deliver(i, meta, delta, nbytes, payload)
            maker.done()
    except _Stopped:
        return True
    except PeerGone:
        return False
    except BaseException as exc:  # reported to the rank, which fails naming this producer
        with contextlib.suppress(PeerGone):
            end.send(m.Failed(i, f"{type(exc).__name__}: {exc}", traceback.format_exc()))
        raise
    finally:
        if maker is not None:
            maker.close()


# ---------------------------------------------------------------------- on the rank


def arrived(batch: m.Batch, i: int, producer: str, stats, slot: Tensor, unpack: bool = True):
    """Batch ``i`` as it arrived in ``slot``, viewed in place (``unpack=False``: as it lies,
    :class:`~hpcgnn.sampling.shipping.Packed`); its exchange counts added to the rank's ``stats`` (None: none
    kept)."""
    if batch.index != i:
        raise RuntimeError(f"{producer} sent batch {batch.index}, expected {i}")
    if batch.delta is not None and stats is not None:
        stats.add(batch.delta)
    return shipping.unpack(batch.meta, slot) if unpack else shipping.Packed(batch.meta, slot)


class ProducedLoader:
    """One epoch's batches from a producer pool (:class:`~hpcgnn.sampling.protocol.Pool`: sampler processes or
    servers), in index order, on the device (``BatchLoader``'s interface: ``sizes``, ``len``, iteration). A batch is
    viewed in its slot; the slot goes back when the next batch is asked for (on a GPU: once the copy out of it is
    done). The pool was started by its source's owner (the trainer)."""

    def __init__(self, pool, plan: EpochPlan):
        self.pool, self.plan, self.sizes = pool, plan, plan.sizes

    def __len__(self) -> int:
        return len(self.plan)

    def __iter__(self) -> Iterator:
        pool, plan, copies = self.pool, self.plan, DeviceCopy(self.pool.device)
        pool.begin(plan.batch_seed, plan.jobs())  # (padding batches: empty)
        held, finished = None, False
        try:
            for i in range(plan.start, plan.num_batches):
                if held is not None:  # the step on the previous batch is over: its slot is free again
                    pool.release(*held)
                    held = None
                data, p, s, _ = pool.receive(i)
                data, ready = copies.copy(data)  # (on the side stream, as the rank's own batches: DeviceCopy)
                held = (p, s, ready)  # (its slot is free again once the copy out of it is done)
                yield copies.hand_over(data, ready)
            finished = True
        finally:
            copies.close()
            if finished and held is not None:
                pool.release(*held)
            # (abandoned mid-epoch, an error or a preemption: the run is ending, and the source's owner closes it)
