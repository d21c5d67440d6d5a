"""What every sampler of hpcgnn is, whatever it samples, and what every source of a rank's batches is.

A :class:`Sampler`: the loader, the sampler processes and the servers rely on this and on nothing else (as PyG's
``BaseSampler`` and ``SamplerOutput`` say what a PyG sampler is).

- ``sample(items, generator) -> SampledSubgraph``: a step's batch from its items (seed nodes, positive edges
  by id, walk roots or cluster ids, evaluation pairs), drawn only with ``generator`` (so a step is the same
  whenever and wherever it is made: an exact resume, a sampler process, a server);
- ``device``: where its graph lives, and so where a batch's generator is made and its sampling runs.

Kinds: the neighbour samplers (``neighbor.CSRNeighborSampler``, across parts ``distributed``, LADIES), the
subgraph samplers (``subgraph``: GraphSAINT, Cluster-GCN), the typed graphs' (``typed``, a ``SampledSubgraph``
with per-type ids), the link samplers (``link``: training edges with their negatives, evaluation pairs), each
declaring both.

A :class:`BatchSource`: the trainer asks it for an epoch's batches, whichever of the three producers it is; a
:class:`Pool`: the two producers outside the rank, as the rank's walk over their batches drives them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

import torch
from torch import Tensor

if TYPE_CHECKING:
    from collections.abc import Iterable

    from torch_geometric.data import Data

    from hpcgnn.sampling.loader import EpochPlan
    from hpcgnn.sampling.neighbor import SampledSubgraph


@runtime_checkable
class Sampler(Protocol):
    @property
    def device(self) -> torch.device: ...

    def sample(self, items: Tensor, generator: torch.Generator | None = None) -> SampledSubgraph: ...


@runtime_checkable
class BatchSource(Protocol):
    """Where a rank's training batches come from, chosen once (:func:`hpcgnn.sampling.producers.choose`): the rank
    itself (``loader.InRank``: a loader, with a prefetch thread), its sampler processes (``procs.SamplerPool``) or
    its sampler servers (``client.RemotePool``). Whichever it is, an epoch's batches are the same, bitwise. Its
    owner (the trainer) starts it once and closes it once.

    - ``start()``: before the first epoch (processes started, servers connected: before the clock runs);
    - ``epoch(plan)``: the :class:`~hpcgnn.sampling.loader.EpochPlan`'s batches (its seeds, generators, order and
      ``start``), on the device, as an iterable with ``len`` and ``sizes``;
    - ``close(done)``: at the end (``done``: the run has finished, and servers may leave).
    """

    def start(self) -> None: ...

    def epoch(self, plan: EpochPlan) -> Iterable[Data]: ...

    def close(self, done: bool = False) -> None: ...


@runtime_checkable
class Pool(Protocol):
    """A producer outside the rank (sampler processes, sampler servers), as the rank's walk over its batches
    (:class:`~hpcgnn.sampling.serving.ProducedLoader`) drives it: a :class:`BatchSource` that also takes an epoch's
    jobs and hands batches over in slots.

    - ``device``: where the rank trains (its slots are pinned for a GPU);
    - ``begin(batch_seed, jobs)``: an epoch's (index, seeds) to make, in index order;
    - ``receive(i) -> (data, where, slot, exchange counts)``: batch ``i``, viewed in its slot;
    - ``release(where, slot, done)``: the slot is free again (``done``: an event to wait for first, or None).
    """

    device: torch.device

    def start(self) -> None: ...

    def epoch(self, plan: EpochPlan) -> Iterable[Data]: ...

    def begin(self, batch_seed: int, jobs: list) -> None: ...

    def receive(self, i: int) -> tuple: ...

    def release(self, where, slot: int, done) -> None: ...

    def close(self, done: bool = False) -> None: ...
