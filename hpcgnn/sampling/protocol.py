"""What every sampler of hpcgnn is, whatever it samples: the loader, the sampler processes and the servers rely
on this and on nothing else (as PyG's ``BaseSampler`` and ``SamplerOutput`` say what a PyG sampler is).

- ``sample(items, generator) -> SampledSubgraph``: a step's batch from its items (seed nodes, positive edges
  by id, walk roots or cluster ids, evaluation pairs), drawn only with ``generator`` (so a step is the same
  whenever and wherever it is made: an exact resume, a sampler process, a server);
- ``device``: where its graph lives, and so where a batch's generator is made and its sampling runs.

Kinds: the neighbour samplers (``neighbor.CSRNeighborSampler``, across parts ``distributed``, LADIES), the
subgraph samplers (``subgraph``: GraphSAINT, Cluster-GCN), the typed graphs' (``typed``, a ``SampledSubgraph``
with per-type ids), the link samplers (``link``: training edges with their negatives, evaluation pairs), each
declaring both.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

import torch
from torch import Tensor

if TYPE_CHECKING:
    from hpcgnn.sampling.neighbor import SampledSubgraph


@runtime_checkable
class Sampler(Protocol):
    @property
    def device(self) -> torch.device: ...

    def sample(self, items: Tensor, generator: torch.Generator | None = None) -> SampledSubgraph: ...
