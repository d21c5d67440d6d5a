"""Neighbour sampling on typed graphs: hop by hop, relation by relation, into PyG ``HeteroData``.

At each hop, every relation whose target type has frontier nodes samples up to its fanout of
in-neighbours per frontier node (:func:`hpcgnn.sampling.neighbor.sample_neighbors` on that
relation's CSR: vectorised, the same uniform subsets as the homogeneous sampler). New nodes are
numbered per type in the order they are first reached, sorted within a hop: the target type's
seeds first, then each hop's new nodes. Edges are grouped by hop within each relation, and the
batch carries per-type node counts and per-relation edge counts per hop, so PyG's
heterogeneous ``trim_to_layer`` can drop the outer hops layer by layer.

Randomness: relations are walked in the graph's order with one generator per batch, so a batch
is the same for the same (seed, epoch, rank, step) however it is re-made.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from hpcgnn.data.typed import Relation, TypedGraph
from hpcgnn.sampling.neighbor import sample_neighbors


@dataclass(frozen=True)
class TypedSubgraph:
    """One sampled typed mini-batch, in per-type local ids."""

    n_id: dict[str, Tensor]  # node type -> type-local ids of the batch's nodes of that type; target seeds first
    edge_index: dict[Relation, Tensor]  # relation -> [2, E] (source, target) in the types' batch-local ids
    batch_size: int  # the first batch_size target-type nodes are the seeds
    num_sampled_nodes: dict[str, list[int]]  # node type -> nodes added per hop (hop 0: the seeds)
    num_sampled_edges: dict[Relation, list[int]]  # relation -> edges added per hop, hop 1 first


def relation_fanouts(relations: Sequence[Relation], fanouts: Sequence[int] | Mapping) -> dict[Relation, tuple]:
    """Per relation, the fanout of each hop: one list for every relation, or a mapping from relation
    (or its ``src__name__dst`` key) to its own list; every list has one entry per hop."""
    if not isinstance(fanouts, Mapping):
        return {r: tuple(int(f) for f in fanouts) for r in relations}
    out = {}
    for r in relations:
        value = fanouts.get(r, fanouts.get("__".join(r)))
        if value is None:
            raise ValueError(f"no fanouts for relation {'__'.join(r)}: give every relation its list")
        out[r] = tuple(int(f) for f in value)
    if len({len(v) for v in out.values()}) != 1:
        raise ValueError("every relation needs the same number of hops (one entry per GNN layer)")
    return out


class TypedNeighborSampler:
    """Samples ``fanouts[rel][h]`` in-neighbours per node along each relation at hop ``h``."""

    def __init__(self, graph: TypedGraph, fanouts: Sequence[int] | Mapping):
        self.graph = graph
        self.fanouts = relation_fanouts(graph.relations, fanouts)
        self.num_hops = len(next(iter(self.fanouts.values()))) if self.fanouts else 0
        device = graph.rowptr[graph.relations[0]].device
        # Type-local -> batch-local scratch maps, reset after every batch (one sampler per thread).
        self._local = {t: torch.full((n,), -1, dtype=torch.long, device=device) for t, n in graph.num_nodes.items()}

    def sample(self, seeds: Tensor, generator: torch.Generator | None = None) -> TypedSubgraph:
        g, local = self.graph, self._local
        if torch.unique(seeds).numel() != seeds.numel():
            raise ValueError("seeds must be distinct")
        device = local[g.target].device
        seeds = seeds.long().to(device)
        n_ids: dict[str, list[Tensor]] = {t: [] for t in g.node_types}
        counts = {t: [0] * (self.num_hops + 1) for t in g.node_types}
        total = dict.fromkeys(g.node_types, 0)
        edges: dict[Relation, list[Tensor]] = {r: [] for r in g.relations}
        num_edges = {r: [0] * self.num_hops for r in g.relations}
        local[g.target][seeds] = torch.arange(seeds.numel(), device=device)
        n_ids[g.target].append(seeds)
        counts[g.target][0] = total[g.target] = seeds.numel()
        frontier = {g.target: (seeds, torch.arange(seeds.numel(), device=device))}
        try:
            for hop in range(self.num_hops):
                drawn: list[tuple[Relation, Tensor, Tensor]] = []  # (relation, target batch-local ids, sources)
                for rel in g.relations:
                    if rel[2] not in frontier or self.fanouts[rel][hop] < 1:
                        continue
                    nodes, nodes_local = frontier[rel[2]]
                    row, nbr = sample_neighbors(g.rowptr[rel], g.col[rel], nodes, self.fanouts[rel][hop], generator)
                    drawn.append((rel, nodes_local.index_select(0, row), nbr))
                frontier = {}
                for t in g.node_types:  # number the new nodes of each type (sorted: a deterministic order)
                    found = [nbr for rel, _, nbr in drawn if rel[0] == t]
                    if not found:
                        continue
                    cand = torch.cat(found)
                    new = torch.unique(cand[local[t].index_select(0, cand) < 0])
                    new_local = torch.arange(total[t], total[t] + new.numel(), device=device)
                    local[t][new] = new_local
                    total[t] += new.numel()
                    counts[t][hop + 1] = new.numel()
                    n_ids[t].append(new)
                    if new.numel():
                        frontier[t] = (new, new_local)
                for rel, dst_local, nbr in drawn:
                    edges[rel].append(torch.stack([local[rel[0]].index_select(0, nbr), dst_local]))
                    num_edges[rel][hop] = nbr.numel()
            n_id = {t: torch.cat(v) if v else torch.empty(0, dtype=torch.long, device=device) for t, v in n_ids.items()}
        finally:
            for t, parts in n_ids.items():
                for ids in parts:
                    local[t][ids] = -1
        edge_index = {r: torch.cat(v, 1) if v else torch.empty(2, 0, dtype=torch.long, device=device)
                      for r, v in edges.items()}
        return TypedSubgraph(n_id, edge_index, seeds.numel(), counts, num_edges)


def to_hetero_data(graph: TypedGraph, out: TypedSubgraph):
    """The sampled subgraph as PyG's ``HeteroData``: per type ``x`` and ``n_id`` (target: ``y`` and
    ``batch_size``), per relation ``edge_index``; ``num_sampled_nodes_dict`` and
    ``num_sampled_edges_dict`` for PyG's heterogeneous ``trim_to_layer``."""
    from torch_geometric.data import HeteroData

    data = HeteroData()
    for t, ids in out.n_id.items():
        data[t].n_id = ids
        data[t].x = graph.x[t].index_select(0, ids.to(graph.x[t].device))
        data[t].num_nodes = ids.numel()
    target = data[graph.target]
    target.y = graph.y.index_select(0, out.n_id[graph.target].to(graph.y.device))
    target.batch_size = data.batch_size = out.batch_size  # the seeds' count, on the type and the batch
    for rel, ei in out.edge_index.items():
        data[rel].edge_index = ei
    data.num_sampled_nodes_dict = out.num_sampled_nodes
    data.num_sampled_edges_dict = out.num_sampled_edges
    return data
