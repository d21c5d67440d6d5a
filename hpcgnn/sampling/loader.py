"""From seed ids to PyG mini-batches: the per-rank seed schedule and the node loader.

DDP needs every rank to run the same number of steps per epoch: a rank with
one batch more waits forever in its gradient all-reduce. The seed schedule
pads the shuffled seeds by wrapping around until they split evenly, so every
rank gets exactly ``ceil(num_seeds / world_size)`` seeds and the same step count.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
from torch import Tensor
from torch_geometric.data import Data

from hpcgnn.data.graph import Graph
from hpcgnn.sampling.neighbor import NeighborSampler


def rank_seeds(seeds: Tensor, world_size: int, rank: int, generator: torch.Generator | None = None) -> Tensor:
    """This rank's share of ``seeds``; every rank's share has the same length.

    With a generator (seeded identically on every rank) the seeds are shuffled
    first; padding repeats the first few shuffled seeds, as DistributedSampler does.
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} outside world of size {world_size}")
    if seeds.numel() == 0:
        raise ValueError("no seeds to split")
    order = seeds[torch.randperm(seeds.numel(), generator=generator)] if generator is not None else seeds
    per_rank = math.ceil(order.numel() / world_size)
    padded = order.repeat(math.ceil(per_rank * world_size / order.numel()))[: per_rank * world_size]
    return padded[rank::world_size]


def steps_per_epoch(num_seeds: int, world_size: int, batch_size: int) -> int:
    """Steps every rank runs per epoch for ``num_seeds`` seeds."""
    return math.ceil(math.ceil(num_seeds / world_size) / batch_size)


class NodeLoader:
    """Yields one PyG ``Data`` per batch of seeds: sampled subgraph, features and labels.

    ``Data`` fields: ``x``, ``edge_index``, ``y`` (all local nodes), ``n_id``,
    ``batch_size`` (seeds are the first nodes), ``num_sampled_nodes`` and
    ``num_sampled_edges`` (per hop, for ``trim_to_layer``).
    """

    def __init__(self, graph: Graph, sampler: NeighborSampler, seeds: Tensor, batch_size: int,
                 generator: torch.Generator | None = None, device: torch.device | None = None):
        self.graph, self.sampler, self.seeds = graph, sampler, seeds
        self.batch_size, self.generator, self.device = batch_size, generator, device

    def __len__(self) -> int:
        return math.ceil(self.seeds.numel() / self.batch_size)

    def __iter__(self) -> Iterator[Data]:
        for batch in self.seeds.split(self.batch_size):
            out = self.sampler.sample(batch, self.generator)
            data = Data(x=self.graph.x[out.n_id], edge_index=out.edge_index, y=self.graph.y[out.n_id],
                        n_id=out.n_id, batch_size=out.batch_size,
                        num_sampled_nodes=list(out.num_sampled_nodes),
                        num_sampled_edges=list(out.num_sampled_edges))
            if self.device is not None and self.device.type != "cpu":
                data = data.to(self.device, non_blocking=True)
            yield data
