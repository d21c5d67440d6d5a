"""Exact layers straight from the CSR: how exact inference (every in-neighbour of every node, layer by layer:
:mod:`hpcgnn.stores.exact`) computes a layer of GraphSAGE, GCN, GIN and GAT without a message per edge.

PyG's ``inference_per_layer`` runs a chunk of targets as a subgraph: it writes every edge's source row
(``[E_chunk, width]`` floats) and scatters them, and GCN's linear map runs again on every node a chunk reads.
Here a layer is split where its arithmetic allows:

- ``before``: a linear map applied to every row of the layer's input once, before aggregating, where it narrows
  the rows (mean and sum are linear: DGL's SAGEConv does the same, ``lin_before_mp``): GraphSAGE's neighbour
  weight when the layer's output is narrower than its input, GCN's weight always (as PyG's GCNConv does);
- the aggregation: the sum or mean of the in-neighbours' rows, each read once per edge into an accumulator, rows
  stored as bfloat16 or float16 widened on the way (:func:`hpcgnn.kernels.ops.aggregate_rows`, C);
  GCN's weights from the nodes' global degrees and its self-loops, as :class:`~hpcgnn.sampling.transforms.GCNNorm`
  puts them into a sampled batch;
- ``after``: the rest, on the chunk's targets: the root weight and bias (GraphSAGE), the bias (GCN), GIN's
  ``(1 + eps) x`` and its MLP, GAT's heads joined (or averaged) and its bias, then the activation between layers.

GAT's attention: each node's source and target scores per head are a table computed once per layer (from the
rows its linear map made); a chunk's edge weights (the softmax over each row's in-edges and self-loop) are
``heads`` floats per edge, and the weighted sum runs in the same kernel, a weight per head over its slice.

The outputs equal PyG's path up to float rounding (the same sums, in another order where a linear map moves before
them: tests/test_exact_layers.py). GATv2, edge features, models with norms, jumping knowledge or a final linear
map, PyG's own aggregation (``model.aggregation=pyg``) and models on a GPU keep PyG's path (:func:`plan` says why).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CSRLayer:
    """Layer ``i`` of a model, computed from the CSR (see the module)."""

    before: Callable[[Tensor], Tensor] | None  # rows of the layer's input -> the rows aggregated (None: the input)
    mean: bool  # the mean of the in-neighbours (else their sum)
    gcn: bool  # GCN's degree weights and self-loops
    after: Callable[[Tensor, Tensor], Tensor]  # (the targets' input rows, their aggregate) -> the layer's output
    says: str  # for the log: what runs
    scores: Callable[[Tensor], Tensor] | None = None  # GAT: rows aggregated -> each node's [source | target] scores
    attention: Callable | None = None  # GAT: (rowptr, col, scores, lo, hi) -> (edge weights, self-loop weights)


def _convs_kind(model) -> str | None:
    """``GraphSAGE``, ``GCN`` or ``GIN`` where every layer is that plain kind; else None."""
    from torch_geometric.nn.conv import GATConv, GCNConv, GINConv, SAGEConv

    kind = type(model).__name__
    conv = {"GraphSAGE": SAGEConv, "GCN": GCNConv, "GIN": GINConv, "GAT": GATConv}.get(kind)
    if conv is None or not all(type(c) is conv for c in model.convs):
        return None
    if kind == "GraphSAGE" and not all(c.aggr == "mean" and not c.normalize and c.root_weight and not c.project
                                       for c in model.convs):
        return None
    if kind == "GCN" and not all(not c.normalize and c.aggr == "add" for c in model.convs):  # (self-loops: GCNNorm)
        return None
    if kind == "GAT" and not all(c.lin is not None and c.add_self_loops and c.edge_dim is None for c in model.convs):
        return None
    return kind


def plan(model, device: torch.device, gcn_norm: bool) -> tuple[str | None, str]:
    """Whether exact inference takes the CSR path for ``model``: (its kind, or None, and the reason for the log).
    ``gcn_norm``: the store gives GCN's global-degree weights (hpcgnn's gcn always has them)."""
    from hpcgnn.models.aggregation import CSRForward

    name = type(model).__name__
    if device.type != "cpu":
        return None, f"{name} on {device}: PyG's inference_per_layer (the CSR path runs on the host)"
    if not isinstance(model, CSRForward) or model.aggregation != "csr":
        return None, (f"{name}: PyG's inference_per_layer (the CSR path takes hpcgnn's sage, gcn, gin and gat, "
                      "and PyG's GraphSAGE, GIN and GAT, with model.aggregation=csr)")
    if not model.supports_csr() or model.jk_mode is not None:
        return None, f"{name} with norms, jumping knowledge or a final linear map: PyG's inference_per_layer"
    kind = _convs_kind(model)
    if kind is None:
        return None, f"{name}: PyG's inference_per_layer (its layers' aggregation is not a plain sum or mean)"
    if kind == "GCN" and not gcn_norm:
        return None, f"{name} without the graph's degree weights: PyG's inference_per_layer"
    return kind, f"{name}: aggregated straight from the CSR"


def layer(model, kind: str, i: int, last: bool) -> CSRLayer:
    """Layer ``i`` of a model :func:`plan` accepted, as a :class:`CSRLayer`."""
    conv = model.convs[i]

    def finish(x: Tensor) -> Tensor:
        return x if last else model.act(x)  # (dropout: evaluation's identity)

    if kind == "GraphSAGE":
        lin_l, lin_r = conv.lin_l, conv.lin_r
        first = lin_l.out_channels < lin_l.in_channels  # the narrower rows move through the edges
        return CSRLayer(
            before=(lambda x: F.linear(x, lin_l.weight)) if first else None, mean=True, gcn=False,
            after=lambda xt, agg: finish((agg + lin_l.bias if lin_l.bias is not None else agg) + lin_r(xt)
                                         if first else lin_l(agg) + lin_r(xt)),
            says=f"mean of {'linear map first ' if first else ''}{lin_l.in_channels} -> {lin_l.out_channels}")
    if kind == "GCN":
        return CSRLayer(before=conv.lin, mean=False, gcn=True,
                        after=lambda xt, agg: finish(agg + conv.bias if conv.bias is not None else agg),
                        says=f"weighted sum, linear map first {conv.in_channels} -> {conv.out_channels}")
    if kind == "GAT":
        heads, per = conv.heads, conv.out_channels
        att = torch.cat([conv.att_src.view(heads, per), conv.att_dst.view(heads, per)])  # [2 heads, per]

        def scores(h: Tensor) -> Tensor:  # each node's score as a source and as a target, per head
            h = h.float().view(-1, 1, heads, per)
            return (h * att.view(2, heads, per)).sum(-1).view(-1, 2 * heads)

        def after(xt: Tensor, agg: Tensor) -> Tensor:
            out = agg.view(-1, heads * per) if conv.concat else agg.view(-1, heads, per).mean(1)
            if conv.res is not None:
                out = out + conv.res(xt)
            return finish(out + conv.bias if conv.bias is not None else out)

        return CSRLayer(before=conv.lin, mean=False, gcn=False, after=after, scores=scores,
                        attention=lambda rowptr, col, sc, lo, hi: attention(rowptr, col, sc, lo, hi, heads,
                                                                            conv.negative_slope),
                        says=f"attention over the CSR, {heads} head(s), linear map first "
                             f"{conv.in_channels} -> {heads * per}")
    return CSRLayer(before=None, mean=False, gcn=False,
                    after=lambda xt, agg: finish(conv.nn(agg + (1 + conv.eps) * xt)),
                    says=f"sum, then the MLP {conv.nn.channel_list}")


def attention(rowptr: Tensor, col: Tensor, scores: Tensor, lo: int, hi: int, heads: int,
              slope: float) -> tuple[Tensor, Tensor]:
    """GAT's attention weights of target rows ``lo .. hi``, per head: for each edge ``s -> r`` and each row's
    self-loop, the softmax over the row's in-edges and its self-loop of ``leaky_relu(src[s] + dst[r])`` (``scores``:
    ``[src | dst]`` per node); an edge from a row to itself weighs 0 (PyG removes such edges and adds one self-loop).
    Per-edge temporaries of ``heads`` floats: the chunk's edges, never a message per edge."""
    e0, e1 = int(rowptr[lo]), int(rowptr[hi])
    src = col[e0:e1].long()
    row = torch.repeat_interleave(torch.arange(hi - lo), (rowptr[lo + 1:hi + 1] - rowptr[lo:hi]).long())
    a_src, a_dst = scores[:, :heads], scores[:, heads:]
    s = F.leaky_relu(a_src.index_select(0, src) + a_dst[lo:hi].index_select(0, row), slope)
    s.masked_fill_((src == row + lo).unsqueeze(1), float("-inf"))
    own = F.leaky_relu(a_src[lo:hi] + a_dst[lo:hi], slope)  # the self-loops'
    top = own.clone().scatter_reduce_(0, row.unsqueeze(1).expand_as(s), s, "amax")
    ex, ex_own = (s - top.index_select(0, row)).exp(), (own - top).exp()
    total = ex_own.clone().index_add_(0, row, ex).add_(1e-16)
    return ex.div_(total.index_select(0, row)), ex_own.div_(total)


_said: set[str] = set()


def say(message: str) -> None:
    """The choice, in the log once per process (evaluation runs every epoch)."""
    if message not in _said:
        _said.add(message)
        log.info("exact inference: %s", message)
