"""The built-in temporal encoder (``model=tgat``): attention over each node's sampled neighbours, each edge read with a
learnable encoding of its age (its seed's time minus the edge's time: ``data.edge_age``, :mod:`hpcgnn.sampling.temporal`),
TGAT's design (Xu et al., 2020) as TGN's attention embedding builds it: ``TransformerConv`` whose edge features are
``cos(w * age + b)``. A model of the user's own reads the ages the same way: its ``forward`` takes ``edge_age``.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from hpcgnn.config import ModelConfig


class TimeEncoder(torch.nn.Module):
    """``cos(w * t + b)`` of each age ``t``, ``dim`` wide; ``w`` starts at ``10^-k`` for ``k`` spread over 0..9 (TGN's
    initialisation), so that ages from seconds to years each move some of the columns."""

    def __init__(self, dim: int):
        super().__init__()
        self.lin = torch.nn.Linear(1, dim)
        with torch.no_grad():
            self.lin.weight.copy_((1.0 / 10 ** torch.linspace(0, 9, dim)).view(dim, 1))
            self.lin.bias.zero_()

    def forward(self, t: Tensor) -> Tensor:
        return torch.cos(self.lin(t.view(-1, 1).to(self.lin.weight.dtype)))


@functools.cache
def attention_class() -> type:
    """PyG's basic GNN over ``TransformerConv`` with edge features (imported when first built: the launcher imports
    no torch_geometric)."""
    from torch_geometric.nn import TransformerConv
    from torch_geometric.nn.models.basic_gnn import BasicGNN

    class TimeAttention(BasicGNN):
        supports_edge_weight = False
        supports_edge_attr = True

        def init_conv(self, in_channels: int, out_channels: int, **kwargs) -> torch.nn.Module:
            heads = kwargs.pop("heads", 1)
            concat = out_channels % heads == 0 and heads > 1
            return TransformerConv(in_channels, out_channels // heads if concat else out_channels,
                                   heads=heads if concat else 1, concat=concat, **kwargs)

    TimeAttention.__module__ = __name__
    return TimeAttention


class TGAT(torch.nn.Module):
    """Attention layers over sampled neighbours, each edge's age encoded (:class:`TimeEncoder`), one layer a hop."""

    supports_trim = True

    def __init__(self, in_channels: int, hidden: int, num_layers: int, out_channels: int, dropout: float, heads: int):
        super().__init__()
        self.time = TimeEncoder(hidden)
        self.gnn = attention_class()(in_channels, hidden, num_layers, out_channels, dropout=dropout, heads=heads,
                                     edge_dim=hidden)

    def forward(self, x: Tensor, edge_index: Tensor, edge_age: Tensor, num_sampled_nodes_per_hop=None,
                num_sampled_edges_per_hop=None) -> Tensor:
        trim = {} if num_sampled_nodes_per_hop is None else {
            "num_sampled_nodes_per_hop": num_sampled_nodes_per_hop,
            "num_sampled_edges_per_hop": num_sampled_edges_per_hop}
        return self.gnn(x, edge_index, edge_attr=self.time(edge_age), **trim)


def build_tgat(c: ModelConfig, i: int, o: int, n: int) -> torch.nn.Module:
    """TGAT: ``model.heads`` heads (where they divide ``model.hidden_channels``), ages encoded as wide as it."""
    return TGAT(i, c.hidden_channels, n, o, c.dropout, c.heads)
