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

A :class:`BatchSource`: the trainer asks it for an epoch's batches, whichever of the three producers it is.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

import torch
from torch import Tensor

if TYPE_CHECKING:
    from collections.abc import Iterable

    from torch_geometric.data import Data

    from hpcgnn.sampling.loader import BatchLoader
    from hpcgnn.sampling.neighbor import SampledSubgraph


@runtime_checkable
class Sampler(Protocol):
    @property
    def device(self) -> torch.device: ...

    def sample(self, items: Tensor, generator: torch.Generator | None = None) -> SampledSubgraph: ...


@runtime_checkable
class BatchSource(Protocol):
    """Where a rank's training batches come from, chosen once by the store (``Store.batch_source``): the rank
    itself (``loader.InRank``: its loader, with a prefetch thread), its sampler processes (``procs.SamplerPool``)
    or its sampler servers (``server.RemotePool``). Whichever it is, an epoch's batches are the same, bitwise.

    - ``start()``: before the first epoch (processes started, servers connected: before the clock runs);
    - ``epoch(loader)``: ``loader``'s batches (its seeds, generators, order and ``start``), on the device, as an
      iterable with ``len`` and ``sizes``;
    - ``close(done)``: at the end (``done``: the run has finished, and servers may leave).
    """

    def start(self) -> None: ...

    def epoch(self, loader: BatchLoader) -> Iterable[Data]: ...

    def close(self, done: bool = False) -> None: ...
