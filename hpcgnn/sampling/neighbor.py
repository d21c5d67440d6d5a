"""Uniform neighbour sampling over CSR, hop by hop, vectorised with torch ops.

Per hop, every frontier node keeps all of its neighbours when it has at most
``fanout`` of them, and a uniform sample of ``fanout`` distinct ones otherwise.
Nodes are numbered locally in the order they are first reached: the seeds
first, then the nodes new at hop 1, then at hop 2, ... Edges are grouped by
hop, so PyG's ``trim_to_layer`` can drop the outer hops layer by layer.

:class:`CSRNeighborSampler` is also a PyG sampler (``BaseSampler.sample_from_nodes``
returning PyG's ``SamplerOutput``), so it plugs into ``torch_geometric.loader.NodeLoader``;
hpcgnn's own loader calls :meth:`CSRNeighborSampler.sample` and gets a :class:`SampledSubgraph`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor
from torch_geometric.sampler import BaseSampler, NodeSamplerInput, SamplerOutput


@dataclass(frozen=True)
class SampledSubgraph:
    """One sampled mini-batch subgraph, in local ids."""

    n_id: Tensor  # int64 [num_nodes], global id of each local node; seeds first
    edge_index: Tensor  # int64 [2, num_edges], (source, target) in local ids, grouped by hop
    batch_size: int  # the first batch_size nodes of n_id are the seeds (the loss targets)
    num_sampled_nodes: tuple[int, ...] | None = None  # nodes added per hop, seeds as hop 0 (None: not layered)
    num_sampled_edges: tuple[int, ...] | None = None  # edges added per hop, hop 1 first
    node_weight: Tensor | None = None  # float [batch_size]: loss weight of each seed (None: a plain mean)
    edge_weight: Tensor | None = None  # float [num_edges]: per-edge weights a model asked for (GCN's normalisation)
    targets: dict | None = None  # what a task scores besides the seeds (link prediction: the pairs and labels)


class CSRNeighborSampler(BaseSampler):
    """Samples ``fanouts[h]`` neighbours per node at hop ``h``; holds only references to the CSR.

    ``rowptr``/``col``: in-edges (``col[rowptr[v]:rowptr[v + 1]]`` are ``v``'s in-neighbours).
    """

    def __init__(self, rowptr: Tensor, col: Tensor, fanouts: tuple[int, ...] | list[int],
                 num_nodes: int | None = None):
        if rowptr.dtype != torch.long or col.dtype != torch.long:
            raise TypeError("rowptr and col must be int64")
        self.rowptr, self.col, self.fanouts = rowptr, col, tuple(int(f) for f in fanouts)
        # Global -> local id scratch map, reset after every batch (not thread-safe: one sampler per thread).
        # ``num_nodes``: ids col may hold, when rowptr covers only some of them (a rank's parts).
        size = rowptr.numel() - 1 if num_nodes is None else num_nodes
        self._local = torch.full((size,), -1, dtype=torch.long, device=rowptr.device)

    def sample(self, seeds: Tensor, generator: torch.Generator | None = None) -> SampledSubgraph:
        """Sample the subgraph around ``seeds``; the generator must live on the graph's device."""
        dev = self.rowptr.device
        seeds = seeds.long().to(dev)
        local = self._local
        if torch.unique(seeds).numel() != seeds.numel():
            raise ValueError("seeds must be distinct")
        self.begin_batch()
        n_ids = [seeds]
        local[seeds] = torch.arange(seeds.numel(), device=dev)
        num_nodes, edges, num_edges = [seeds.numel()], [], []
        frontier, frontier_local, total = seeds, torch.arange(seeds.numel(), device=dev), seeds.numel()
        try:
            for fanout in self.fanouts:
                row, nbr = self.hop(frontier, fanout, generator)
                nbr_local = local.index_select(0, nbr)
                new_mask = nbr_local < 0
                new_nodes = torch.unique(nbr[new_mask])  # sorted: deterministic local order
                local[new_nodes] = torch.arange(total, total + new_nodes.numel(), device=dev)
                total += new_nodes.numel()
                nbr_local = local.index_select(0, nbr)
                edges.append(torch.stack([nbr_local, frontier_local.index_select(0, row)]))
                num_edges.append(nbr.numel())
                num_nodes.append(new_nodes.numel())
                n_ids.append(new_nodes)
                frontier = new_nodes
                frontier_local = local[new_nodes]
            n_id = torch.cat(n_ids)
        finally:
            for ids in n_ids:
                local[ids] = -1
        edge_index = torch.cat(edges, dim=1) if edges else torch.empty(2, 0, dtype=torch.long, device=dev)
        return SampledSubgraph(n_id, edge_index, seeds.numel(), tuple(num_nodes), tuple(num_edges))

    # -------------------------------------------------------------------- PyG's sampler protocol

    def sample_from_nodes(self, index: NodeSamplerInput, **kwargs) -> SamplerOutput:
        """PyG's entry: the same walk, as PyG's ``SamplerOutput`` (row = source, col = target)."""
        out = self.sample(index.node)
        return SamplerOutput(node=out.n_id, row=out.edge_index[0], col=out.edge_index[1], edge=None,
                             num_sampled_nodes=list(out.num_sampled_nodes),
                             num_sampled_edges=list(out.num_sampled_edges), metadata=(index.input_id, index.time))

    def sample_from_edges(self, index, neg_sampling=None) -> SamplerOutput:
        raise NotImplementedError("CSRNeighborSampler samples from seed nodes; use PyG's loaders with node seeds")

    def begin_batch(self) -> None:
        """Called before the first hop of every batch (the distributed sampler resets its counters)."""

    def hop(self, frontier: Tensor, fanout: int, generator: torch.Generator | None) -> tuple[Tensor, Tensor]:
        """``(row, nbr)`` for one hop: see :func:`sample_neighbors`. Subclasses sample elsewhere."""
        return sample_neighbors(self.rowptr, self.col, frontier, fanout, generator)


def sample_neighbors(rowptr: Tensor, col: Tensor, nodes: Tensor, fanout: int,
                     generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
    """Up to ``fanout`` distinct uniform neighbours of each node.

    Returns ``(row, nbr)``: ``row[i]`` indexes ``nodes`` and ``nbr[i]`` is a global
    neighbour id of ``nodes[row[i]]``. Rows come out in order. Nodes with at most
    ``fanout`` neighbours keep them all; the others draw ``fanout`` distinct offsets
    with Floyd's algorithm, vectorised over rows: ``fanout`` small steps whatever the
    degree, so hubs cost no more than ordinary nodes.
    """
    device = rowptr.device
    start = rowptr[nodes]
    deg = rowptr[nodes + 1] - start
    take = deg.clamp(max=fanout)
    row = torch.repeat_interleave(torch.arange(nodes.numel(), device=device), take)
    # Offset of each output slot inside its row's neighbour list: 0, 1, ... per row.
    slot = torch.arange(row.numel(), device=device) - torch.repeat_interleave(torch.cumsum(take, 0) - take, take)
    big = deg > fanout
    if bool(big.any()):
        offsets = floyd_sample(deg[big], fanout, generator)  # [rows with deg > fanout, fanout]
        slot[big[row]] = offsets.reshape(-1)  # big rows own exactly `fanout` consecutive slots each
    return row, col.index_select(0, start.index_select(0, row) + slot)


def floyd_sample(n: Tensor, k: int, generator: torch.Generator | None = None) -> Tensor:
    """For each row i, ``k`` distinct integers drawn uniformly from ``[0, n[i])`` (needs n >= k).

    Floyd's algorithm: at step j, draw t from [0, n - k + j]; if t was drawn before,
    take n - k + j itself. Every k-subset comes out with equal probability.
    """
    m = n.numel()
    out = torch.empty(m, k, dtype=torch.long, device=n.device)
    for j in range(k):
        top = n - k + j  # inclusive upper bound of this step
        u = torch.rand(m, generator=generator, dtype=torch.float64, device=n.device)
        t = (u * (top + 1).to(torch.float64)).long().clamp(max=top)
        if j:
            seen = (out[:, :j] == t.unsqueeze(1)).any(1)
            t = torch.where(seen, top, t)
        out[:, j] = t
    return out
