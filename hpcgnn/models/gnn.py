"""The homogeneous models by name over torch_geometric.nn, one GNN layer per sampling hop, and what each model's
batches need: ``gcn`` takes its normalisation from the whole graph's degrees (``GCNNorm`` puts per-edge weights and
self-loops into every batch), so sampled GCN is the GCN of the paper; ``mlp`` reads no edges, so its batches sample
no neighbours.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from hpcgnn import checks
from hpcgnn.config import ModelConfig
from hpcgnn.models.custom import build_custom, takes

Builder = Callable[[ModelConfig, int, int, int], torch.nn.Module]


class MLPBaseline(torch.nn.Module):
    """Ignores the edges: the baseline a GNN has to beat on the same features."""

    supports_trim = False

    def __init__(self, in_channels: int, hidden: int, num_layers: int, out_channels: int, dropout: float):
        from torch_geometric.nn import MLP

        super().__init__()
        self.mlp = MLP(in_channels=in_channels, hidden_channels=hidden, out_channels=out_channels,
                       num_layers=num_layers, dropout=dropout, norm=None)

    def forward(self, x: Tensor, edge_index: Tensor | None = None, **_: object) -> Tensor:
        return self.mlp(x)


@dataclass(frozen=True)
class ModelSpec:
    build: Builder  # (cfg, in_channels, out_channels, num_layers) -> module
    global_gcn_norm: bool = False  # batches carry GCN weights from the graph's degrees, and self-loops
    uses_edges: bool = True  # False: batches need no sampled neighbours


def _csr(name: str):
    """PyG's ``name`` model whose forward aggregates sampled batches as sorted-CSR products
    (:mod:`hpcgnn.models.aggregation`; the same parameters and state dict)."""
    from hpcgnn.models.aggregation import csr_model

    return csr_model(name)


MODELS: dict[str, ModelSpec] = {
    "sage": ModelSpec(lambda c, i, o, n: _csr("GraphSAGE")(i, c.hidden_channels, n, o, dropout=c.dropout)),
    # normalize=False: the weights and self-loops come with the batch (GCNNorm), from global degrees.
    "gcn": ModelSpec(lambda c, i, o, n: _csr("GCN")(i, c.hidden_channels, n, o, dropout=c.dropout, normalize=False),
                     global_gcn_norm=True),
    "gat": ModelSpec(lambda c, i, o, n: _csr("GAT")(i, c.hidden_channels, n, o, dropout=c.dropout, heads=c.heads)),
    "gin": ModelSpec(lambda c, i, o, n: _csr("GIN")(i, c.hidden_channels, n, o, dropout=c.dropout)),
    "mlp": ModelSpec(lambda c, i, o, n: MLPBaseline(i, c.hidden_channels, n, o, c.dropout), uses_edges=False),
}


def build_model(cfg: ModelConfig, in_channels: int, out_channels: int, num_layers: int) -> torch.nn.Module:
    if checks.is_custom(cfg):  # a model of the user's own (hpcgnn.models.custom)
        return build_custom(cfg, in_channels, out_channels, num_layers)
    return with_aggregation(MODELS[cfg.name].build(cfg, in_channels, out_channels, num_layers), cfg)


def with_aggregation(model: torch.nn.Module, cfg: ModelConfig) -> torch.nn.Module:
    """``model.aggregation`` (csr|pyg) on the models that have the choice (sage, gcn, gin, gat, rgcn)."""
    if hasattr(model, "aggregation"):
        model.aggregation = cfg.aggregation
    return model


def uses_edges(cfg: ModelConfig) -> bool:
    return checks.is_custom(cfg) or MODELS[cfg.name].uses_edges


def batch_transform(cfg: ModelConfig, degree: Tensor):
    """What every batch of this model needs done where it is made (None: nothing)."""
    if (cfg.name in MODELS and MODELS[cfg.name].global_gcn_norm) or (checks.is_custom(cfg) and cfg.gcn_norm):
        from hpcgnn.sampling.transforms import GCNNorm

        return GCNNorm(degree)
    return None


def batch_kwargs(model: torch.nn.Module, data) -> dict:
    """What a sampled batch passes to the model besides x and edges: edge weights, per-hop counts.

    PyG's basic GNNs skip the outer hops layer by layer (``trim_to_layer``) when given the
    per-hop counts: the last layer computes the seeds only.
    """
    inner = getattr(model, "module", model)  # (under DDP)
    kwargs = {}
    if "edge_weight" in data and takes(inner, "edge_weight"):
        kwargs["edge_weight"] = data.edge_weight
    if getattr(inner, "supports_trim", True) and "num_sampled_nodes" in data and takes(inner, "num_sampled_nodes_per_hop"):
        kwargs.update(num_sampled_nodes_per_hop=data.num_sampled_nodes,
                      num_sampled_edges_per_hop=data.num_sampled_edges)
    return kwargs


def forward_batch(model: torch.nn.Module, data) -> Tensor:
    """Logits of the seed nodes of a sampled batch."""
    return model(data.x, data.edge_index, **batch_kwargs(model, data))[: data.batch_size]


