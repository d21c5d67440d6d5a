"""Where batches are born: samplers over CSR (replicated or across parts) and the per-rank loaders."""

from hpcgnn.sampling.loader import BatchLoader, PrefetchLoader, rank_seeds, steps_per_epoch
from hpcgnn.sampling.neighbor import CSRNeighborSampler, SampledSubgraph, sample_neighbors
from hpcgnn.sampling.transforms import GCNNorm

__all__ = ["BatchLoader", "CSRNeighborSampler", "GCNNorm", "PrefetchLoader", "SampledSubgraph", "rank_seeds",
           "sample_neighbors", "steps_per_epoch"]
