"""Model registry over torch_geometric.nn: one GNN layer per sampling hop."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor
from torch_geometric.nn import GAT, GCN, GIN, MLP, GraphSAGE

from hpcgnn.config import ModelConfig


class MLPBaseline(torch.nn.Module):
    """Ignores the edges: the baseline a GNN has to beat on the same features."""

    supports_trim = False

    def __init__(self, in_channels: int, hidden: int, num_layers: int, out_channels: int, dropout: float):
        super().__init__()
        self.mlp = MLP(in_channels=in_channels, hidden_channels=hidden, out_channels=out_channels,
                       num_layers=num_layers, dropout=dropout, norm=None)

    def forward(self, x: Tensor, edge_index: Tensor, **_: object) -> Tensor:
        return self.mlp(x)


Builder = Callable[[ModelConfig, int, int, int], torch.nn.Module]

# name -> builder(cfg, in_channels, out_channels, num_layers)
MODELS: dict[str, Builder] = {
    "sage": lambda c, i, o, n: GraphSAGE(i, c.hidden_channels, n, o, dropout=c.dropout),
    "gcn": lambda c, i, o, n: GCN(i, c.hidden_channels, n, o, dropout=c.dropout),
    "gat": lambda c, i, o, n: GAT(i, c.hidden_channels, n, o, dropout=c.dropout, heads=c.heads),
    "gin": lambda c, i, o, n: GIN(i, c.hidden_channels, n, o, dropout=c.dropout),
    "mlp": lambda c, i, o, n: MLPBaseline(i, c.hidden_channels, n, o, c.dropout),
}


def build_model(cfg: ModelConfig, in_channels: int, out_channels: int, num_layers: int) -> torch.nn.Module:
    return MODELS[cfg.name](cfg, in_channels, out_channels, num_layers)


def forward_batch(model: torch.nn.Module, data) -> Tensor:
    """Logits of the seed nodes of a sampled batch.

    PyG's basic GNNs skip the outer hops layer by layer (``trim_to_layer``) when
    given the per-hop counts: the last layer computes the seeds only.
    """
    inner = getattr(model, "module", model)
    if getattr(inner, "supports_trim", True) and "num_sampled_nodes" in data:
        out = model(data.x, data.edge_index, num_sampled_nodes_per_hop=data.num_sampled_nodes,
                    num_sampled_edges_per_hop=data.num_sampled_edges)
    else:
        out = model(data.x, data.edge_index)
    return out[: data.batch_size]
