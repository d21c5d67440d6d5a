"""Models of your own, as hpcgnn trains them: no hpcgnn import, plain PyTorch and PyG.

    PYTHONPATH=examples python -m hpcgnn model=custom model._target_=my_gnn.ResidualSAGE
    PYTHONPATH=examples python -m hpcgnn model=custom model._target_=my_gnn.JumpingGraphConv \\
        model.widths.in_channels=nfeat model.widths.out_channels=nclass '+model.kwargs.mode=max'
    PYTHONPATH=examples python -m hpcgnn dataset=synthetic_hetero model=custom model._target_=my_gnn.HeteroSAGE
    PYTHONPATH=examples python -m hpcgnn dataset=synthetic_hetero model=custom model._target_=my_gnn.ResidualSAGE
    PYTHONPATH=examples python -m hpcgnn dataset=files dataset.path=GRAPH model=custom model._target_=my_gnn.EdgeGINE
    PYTHONPATH=examples python -m hpcgnn dataset=files dataset.path=TYPED_GRAPH model=custom \
        model._target_=my_gnn.HeteroEdgeSAGE
    PYTHONPATH=examples python -m hpcgnn task=edge task.decoder=my_gnn.BilinearDecoder
    PYTHONPATH=examples python -m hpcgnn task=graph model=custom model._target_=my_gnn.PooledGINE

hpcgnn fills in the widths a class takes by name (in_channels, out_channels, hidden_channels, num_layers,
dropout, and edge_dim, the graph's edge features' width, where forward takes edge_attr: EdgeGINE; model.widths maps
them to other names) and hands forward the batch's nodes and edges; the rows
of the batch's seeds come first and are the ones scored. On a typed graph a class that takes ``metadata``
(HeteroSAGE) is built with the graph's node and edge types (and, taking ``edge_dims``, each relation's edge
feature width: HeteroEdgeSAGE); any other (ResidualSAGE, EdgeGINE) is made relational by PyG's to_hetero.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch_geometric.nn import (
    GINEConv,
    GraphConv,
    HeteroConv,
    JumpingKnowledge,
    Linear,
    MessagePassing,
    SAGEConv,
    global_add_pool,
)


class ResidualSAGE(torch.nn.Module):
    """GraphSAGE layers with a residual connection and layer norm between them. Dropout is a module, not
    F.dropout(x, p, self.training): PyG's to_hetero (a typed graph) traces the latter as always on."""

    def __init__(self, in_channels: int, hidden_channels: int, out_channels: int, num_layers: int = 2,
                 dropout: float = 0.0):
        super().__init__()
        self.inp = torch.nn.Linear(in_channels, hidden_channels)
        self.convs = torch.nn.ModuleList(SAGEConv(hidden_channels, hidden_channels) for _ in range(num_layers))
        self.norms = torch.nn.ModuleList(torch.nn.LayerNorm(hidden_channels) for _ in range(num_layers))
        self.out = torch.nn.Linear(hidden_channels, out_channels)
        self.dropout = torch.nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for conv, norm in zip(self.convs, self.norms, strict=True):
            h = h + self.dropout(F.relu(norm(conv(h, edge_index))))
        return self.out(h)


class EdgeGINE(torch.nn.Module):
    """GINEConv layers: each message is relu(x_j + W e_ij), its edge's features (edge_attr) added to the
    neighbour's. A forward that takes edge_attr gets each sampled edge's features; the graph must have some."""

    def __init__(self, in_channels: int, hidden_channels: int, out_channels: int, edge_dim: int, num_layers: int = 2):
        super().__init__()
        self.convs = torch.nn.ModuleList(
            GINEConv(torch.nn.Sequential(torch.nn.Linear(in_channels if i == 0 else hidden_channels, hidden_channels),
                                         torch.nn.ReLU(), torch.nn.Linear(hidden_channels, hidden_channels)),
                     edge_dim=edge_dim) for i in range(num_layers))
        self.out = torch.nn.Linear(hidden_channels, out_channels)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor, edge_attr: torch.Tensor) -> torch.Tensor:
        for conv in self.convs:
            x = F.relu(conv(x, edge_index, edge_attr))
        return self.out(x)


class PooledGINE(EdgeGINE):
    """A graph task's model (task=graph): EdgeGINE's layers over a batch of whole graphs, each graph's nodes summed
    (global_add_pool over ``batch``), a linear head: one row per graph. hpcgnn embeds categorical node and edge
    features first (in_channels, edge_dim: model.hidden_channels then)."""

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor, batch: torch.Tensor,
                edge_attr: torch.Tensor) -> torch.Tensor:
        for conv in self.convs:
            x = F.relu(conv(x, edge_index, edge_attr))
        return self.out(global_add_pool(x, batch))


class JumpingGraphConv(torch.nn.Module):
    """GraphConv layers whose outputs a jumping-knowledge layer combines; its own argument names (nfeat, nclass),
    mapped with model.widths, and an argument of its own (mode)."""

    def __init__(self, nfeat: int, nclass: int, hidden_channels: int = 64, num_layers: int = 2, mode: str = "cat"):
        super().__init__()
        self.convs = torch.nn.ModuleList(
            GraphConv(nfeat if i == 0 else hidden_channels, hidden_channels) for i in range(num_layers))
        self.jump = JumpingKnowledge(mode)
        self.out = torch.nn.Linear(hidden_channels * (num_layers if mode == "cat" else 1), nclass)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor, edge_weight: torch.Tensor | None = None):
        outs = []
        for conv in self.convs:
            x = F.relu(conv(x, edge_index, edge_weight))
            outs.append(x)
        return self.out(self.jump(outs))


class HeteroSAGE(torch.nn.Module):
    """For typed graphs: a SAGEConv per relation, summed per node type (HeteroConv), input widths sized lazily
    (-1) by the first forward; returns every type's rows (hpcgnn scores the labelled type's)."""

    def __init__(self, metadata, hidden_channels: int, out_channels: int, num_layers: int = 2, dropout: float = 0.0):
        super().__init__()
        _, edge_types = metadata
        self.convs = torch.nn.ModuleList(
            HeteroConv({rel: SAGEConv((-1, -1), hidden_channels) for rel in edge_types}, aggr="sum")
            for _ in range(num_layers))
        self.dropout = torch.nn.Dropout(dropout)
        self.out = torch.nn.Linear(hidden_channels, out_channels)

    def forward(self, x_dict: dict, edge_index_dict: dict) -> dict:
        for conv in self.convs:
            x_dict = {t: self.dropout(F.relu(h)) for t, h in conv(x_dict, edge_index_dict).items()}
        return {t: self.out(h) for t, h in x_dict.items()}


class EdgeSAGEConv(MessagePassing):
    """GraphSAGE with edge features: the mean over in-edges of W x_j (+ U e_ij where the relation has features of
    width ``edge_dim``), plus the target's own V x_i."""

    def __init__(self, out_channels: int, edge_dim: int = 0):
        super().__init__(aggr="mean")
        self.lin_src, self.lin_dst = Linear(-1, out_channels), Linear(-1, out_channels, bias=False)
        self.lin_edge = Linear(edge_dim, out_channels, bias=False) if edge_dim else None

    def forward(self, x, edge_index: torch.Tensor, edge_attr: torch.Tensor | None = None) -> torch.Tensor:
        src, dst = x if isinstance(x, tuple) else (x, x)
        return self.propagate(edge_index, x=(self.lin_src(src), dst), edge_attr=edge_attr) + self.lin_dst(dst)

    def message(self, x_j: torch.Tensor, edge_attr: torch.Tensor | None) -> torch.Tensor:
        return x_j if self.lin_edge is None else x_j + self.lin_edge(edge_attr)


class HeteroEdgeSAGE(torch.nn.Module):
    """For typed graphs whose relations may carry edge features: an EdgeSAGEConv per relation, summed per node type.
    hpcgnn builds it with ``metadata`` and ``edge_dims`` (relation -> its edge features' width, 0 for none) and hands
    forward each sampled edge's features per relation (``edge_attr_dict``)."""

    def __init__(self, metadata, edge_dims: dict, hidden_channels: int, out_channels: int, num_layers: int = 2):
        super().__init__()
        _, edge_types = metadata
        self.convs = torch.nn.ModuleList(
            HeteroConv({rel: EdgeSAGEConv(hidden_channels, edge_dims.get(rel, 0)) for rel in edge_types}, aggr="sum")
            for _ in range(num_layers))
        self.out = torch.nn.Linear(hidden_channels, out_channels)

    def forward(self, x_dict: dict, edge_index_dict: dict, edge_attr_dict: dict) -> dict:
        for conv in self.convs:
            x_dict = {t: F.relu(h) for t, h in conv(x_dict, edge_index_dict, edge_attr_dict=edge_attr_dict).items()}
        return {t: self.out(h) for t, h in x_dict.items()}


class BilinearDecoder(torch.nn.Module):
    """An edge task's decoder (``task.decoder=my_gnn.BilinearDecoder``): each output a bilinear form of the two
    ends' embeddings. hpcgnn builds it as ``BilinearDecoder(in_channels, out_channels)`` and calls it on the
    source's and the target's embeddings."""

    def __init__(self, in_channels: int, out_channels: int):
        super().__init__()
        self.bilinear = torch.nn.Bilinear(in_channels, in_channels, out_channels)

    def forward(self, source: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return self.bilinear(source, target)
