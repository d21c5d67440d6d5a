"""Models of your own, as hpcgnn trains them: no hpcgnn import, plain PyTorch and PyG.

    PYTHONPATH=examples python -m hpcgnn model=custom model._target_=my_gnn.ResidualSAGE
    PYTHONPATH=examples python -m hpcgnn model=custom model._target_=my_gnn.JumpingGraphConv \\
        model.widths.in_channels=nfeat model.widths.out_channels=nclass '+model.kwargs.mode=max'

hpcgnn fills in the widths a class takes by name (in_channels, out_channels, hidden_channels, num_layers,
dropout; model.widths maps them to other names) and hands forward the batch's nodes and edges; the rows
of the batch's seeds come first and are the ones scored.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch_geometric.nn import GraphConv, JumpingKnowledge, SAGEConv


class ResidualSAGE(torch.nn.Module):
    """GraphSAGE layers with a residual connection and layer norm between them."""

    def __init__(self, in_channels: int, hidden_channels: int, out_channels: int, num_layers: int = 2,
                 dropout: float = 0.0):
        super().__init__()
        self.inp = torch.nn.Linear(in_channels, hidden_channels)
        self.convs = torch.nn.ModuleList(SAGEConv(hidden_channels, hidden_channels) for _ in range(num_layers))
        self.norms = torch.nn.ModuleList(torch.nn.LayerNorm(hidden_channels) for _ in range(num_layers))
        self.out = torch.nn.Linear(hidden_channels, out_channels)
        self.dropout = dropout

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for conv, norm in zip(self.convs, self.norms, strict=True):
            h = h + F.dropout(F.relu(norm(conv(h, edge_index))), self.dropout, self.training)
        return self.out(h)


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
