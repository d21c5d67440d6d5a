"""A sampler server's batches of a partitioned graph: made by a sampler process of the trainer's, relayed.

A partitioned graph's batches fetch remote neighbours and rows with the other ranks' samplers. On a server, the
trainer's batches are made by a sampler process (:class:`~hpcgnn.sampling.procs.SamplerPool`) that joins the group
of every trainer's (on every server); the serve loop (:func:`hpcgnn.sampling.serving.serve`) forwards each batch's
bytes as they lie in that process's slot (:class:`~hpcgnn.sampling.shipping.Packed`): no second copy.
"""

from __future__ import annotations

import torch
from torch import Tensor

import hpcgnn.sampling.messages as m
from hpcgnn.sampling import shipping


class Relay:
    """A partitioned graph's batches, made by a sampler process of this trainer's
    (:class:`~hpcgnn.sampling.procs.SamplerPool`), which joins the group of every trainer's (on every server) to
    sample across parts; the serve loop relays them (:class:`hpcgnn.sampling.serving.Maker`)."""

    def __init__(self, hello: m.Hello, recipe: shipping.Deferred, threads: int, fail_batch: int):
        from hpcgnn.sampling.procs import SamplerPool

        # (what the process builds the trainer's sampler from, as the server would: its counts travel back with each
        # batch)
        self.pool = SamplerPool(shipping.dumps(recipe), 1, hello.depth, threads, torch.device("cpu"), rank=hello.rank,
                                group=hello.group, fail_batch=fail_batch)
        self.held = None
        self.pool.start()

    def epoch(self, msg: m.Epoch) -> None:  # its process starts on them at once
        self.pool.begin(msg.batch_seed, msg.jobs)

    def make(self, i: int, seeds: Tensor, batch_seed: int, alloc) -> tuple:
        packed, p, slot, delta = self.pool.receive(i, unpack=False)  # (its bytes go to the trainer as they lie)
        self.held = (p, slot)
        return packed, delta

    def done(self) -> None:
        self.pool.release(*self.held, None)

    def close(self) -> None:
        self.pool.close()
