"""Where batches are born: neighbour sampling and the per-rank loader."""

from hpcgnn.sampling.loader import NodeLoader, PrefetchLoader, rank_seeds, steps_per_epoch
from hpcgnn.sampling.neighbor import NeighborSampler, SamplerOutput, sample_neighbors

__all__ = ["NeighborSampler", "NodeLoader", "PrefetchLoader", "SamplerOutput", "rank_seeds", "sample_neighbors", "steps_per_epoch"]
