"""Per-batch transforms a model asks for, applied on the host where the batch is made.

GCN's symmetric normalisation weighs edge ``u -> v`` by ``1 / sqrt((deg u + 1)(deg v + 1))``
and adds a self-loop of weight ``1 / (deg v + 1)``, with the degrees of the *whole* graph.
Computed on a sampled batch (what ``GCNConv(normalize=True)`` does), the outer hop's nodes
have only their sampled edges and the normalisation sees the wrong degrees: sampled GCN
is then not the GCN of the paper. :class:`GCNNorm` carries the global degrees into the
batch instead: per-edge weights from every node's in-degree in the graph, and self-loops
for every node that a layer computes, placed in the hop group of the edges into that node (at
the end of its row: the edges stay grouped by target), so that PyG's ``trim_to_layer`` keeps
them exactly as long as the node is a target. With
fanouts above every degree, the seeds' logits equal the full-batch GCN's (tested).

A link step whose target edges carry no messages (``task.target_edges=drop``) stands for the graph
without those edges, as evaluation's graph is without the held-out ones: their endpoints' degrees
leave them out too (``absent_in_degree``). Normalised by the full degrees instead, an endpoint of a
positive pair would aggregate fewer neighbours than its weights assume (half its embedding, for a
node whose one edge is the target), which no endpoint at evaluation does.

A self-loop already in the graph counts in the in-degree, and the batch gets one more;
PyG's ``add_remaining_self_loops`` would keep only the existing one. Graphs are expected
without self-loops (the synthetic, OGB and files loaders keep whatever the source has).
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import Tensor

from hpcgnn.sampling.neighbor import SampledSubgraph


class GCNNorm:
    """Self-loops and global-degree GCN weights (``edge_weight``) for every sampled batch.

    ``degree``: in-degree of every node of the graph, by global id (a memory-mapped array
    is fine: only the batch's nodes are read).
    """

    def __init__(self, degree: Tensor):
        self.degree = degree

    def __call__(self, out: SampledSubgraph) -> SampledSubgraph:
        n_id, edge_index = out.n_id, out.edge_index
        degree = self.degree.index_select(0, n_id.cpu()).to(n_id.device, torch.float64)
        if out.absent_in_degree is not None:  # edges the batch leaves out of the graph leave its degrees too
            degree = degree - out.absent_in_degree.to(degree)
        dinv = (degree + 1.0).rsqrt()
        if out.num_sampled_nodes is None:  # a subgraph without hops: every node is a target
            loops = torch.arange(n_id.numel(), device=n_id.device)
            edge_index = torch.cat([edge_index, torch.stack([loops, loops])], 1)
            num_edges = None
        else:
            # Hop h's edges point into the nodes of hop h - 1: their self-loops join that group.
            node_start = torch.tensor([0, *out.num_sampled_nodes]).cumsum(0).tolist()
            edge_start = torch.tensor([0, *out.num_sampled_edges]).cumsum(0).tolist()
            groups, num_edges = [], []
            for h in range(len(out.num_sampled_edges)):
                groups.append(with_row_loops(edge_index[:, edge_start[h]:edge_start[h + 1]], node_start[h],
                                             node_start[h + 1]))
                num_edges.append(groups[-1].size(1))
            edge_index = torch.cat(groups, 1) if groups else edge_index
            num_edges = tuple(num_edges)
        weight = (dinv.index_select(0, edge_index[0]) * dinv.index_select(0, edge_index[1])).float()
        return replace(out, edge_index=edge_index, num_sampled_edges=num_edges, edge_weight=weight)


def with_row_loops(edge_index: Tensor, lo: int, hi: int) -> Tensor:
    """A hop's edges (grouped by target, targets ``lo .. hi - 1`` in order) with a self-loop for every target
    at the end of its row: still grouped by target, so the batch stays a CSR (:mod:`hpcgnn.models.aggregation`)."""
    dst = edge_index[1]
    rows = hi - lo
    ends = torch.cumsum(torch.bincount(dst - lo, minlength=rows), 0)  # each row's end among the edges
    out = edge_index.new_empty((2, dst.numel() + rows))
    out[:, torch.arange(dst.numel(), device=dst.device) + (dst - lo)] = edge_index  # after the loops of earlier rows
    loops = torch.arange(lo, hi, device=dst.device)
    out[:, ends + torch.arange(rows, device=dst.device)] = torch.stack([loops, loops])
    return out
