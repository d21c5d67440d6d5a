"""The homogeneous models by name over torch_geometric.nn, one GNN layer per sampling hop, and what each model's
batches need: ``gcn`` takes its normalisation from the whole graph's degrees (``GCNNorm`` puts per-edge weights and
self-loops into every batch), so sampled GCN is the GCN of the paper; ``mlp`` reads no edges, so its batches sample
no neighbours.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from hpcgnn import checks
from hpcgnn.config import ModelConfig
from hpcgnn.errors import ConfigError, DatasetError
from hpcgnn.models.custom import build_custom, declared_edge_dim, forward_takes, takes, takes_edge_dim
from hpcgnn.specs import load, models


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


def _csr(name: str):
    """PyG's ``name`` model whose forward aggregates sampled batches as sorted-CSR products
    (:mod:`hpcgnn.models.aggregation`; the same parameters and state dict)."""
    from hpcgnn.models.aggregation import csr_model

    return csr_model(name)


def build_gin(c: ModelConfig, i: int, o: int, n: int) -> torch.nn.Module:
    """GIN, or GIN over edge features (``model.edge_dim``): :class:`GINE`."""
    if c.edge_dim:
        return gine_class()(i, c.hidden_channels, n, o, dropout=c.dropout, edge_dim=c.edge_dim)
    return _csr("GIN")(i, c.hidden_channels, n, o, dropout=c.dropout)


def build_gat(c: ModelConfig, i: int, o: int, n: int) -> torch.nn.Module:
    """GAT; with ``model.edge_dim``, its attention reads each edge's features too (GATConv(edge_dim))."""
    extra = {"edge_dim": c.edge_dim} if c.edge_dim else {}
    return _csr("GAT")(i, c.hidden_channels, n, o, dropout=c.dropout, heads=c.heads, **extra)


@functools.cache
def gine_class() -> type:
    """PyG's basic GNN with GINEConv (``nn(x_i (1 + eps) + sum_j relu(x_j + lin(e_ij)))``), as PyG's GIN is with
    GINConv: a two-layer MLP per layer, whose hidden width is the wider of its input and output (PyG's GIN narrows
    the last layer to the classes before its ReLU, where two units often die: a model stuck at chance). Imported
    when first built: the launcher imports no torch_geometric."""
    from torch_geometric.nn import GINEConv
    from torch_geometric.nn.models import MLP
    from torch_geometric.nn.models.basic_gnn import BasicGNN

    class GINE(BasicGNN):
        supports_edge_weight = False
        supports_edge_attr = True

        def init_conv(self, in_channels: int, out_channels: int, **kwargs) -> torch.nn.Module:
            mlp = MLP([in_channels, max(in_channels, out_channels), out_channels], act=self.act,
                      act_first=self.act_first, norm=self.norm, norm_kwargs=self.norm_kwargs)
            return GINEConv(mlp, **kwargs)

    GINE.__module__ = __name__
    GINE.__qualname__ = "GINE"
    return GINE


def build_sage(c: ModelConfig, i: int, o: int, n: int) -> torch.nn.Module:
    return _csr("GraphSAGE")(i, c.hidden_channels, n, o, dropout=c.dropout)


def build_gcn(c: ModelConfig, i: int, o: int, n: int) -> torch.nn.Module:
    """normalize=False: the weights and self-loops come with the batch (GCNNorm), from global degrees."""
    return _csr("GCN")(i, c.hidden_channels, n, o, dropout=c.dropout, normalize=False)


def build_mlp(c: ModelConfig, i: int, o: int, n: int) -> torch.nn.Module:
    return MLPBaseline(i, c.hidden_channels, n, o, c.dropout)


def build_model(cfg: ModelConfig, in_channels: int, out_channels: int, num_layers: int,
                edge_dim: int = 0) -> torch.nn.Module:
    """The model ``cfg`` names; ``edge_dim``: the width of the edges' features it reads (its own must match)."""
    if checks.is_custom(cfg):  # a model of the user's own (hpcgnn.models.custom)
        return build_custom(cfg, in_channels, out_channels, num_layers, edge_dim)
    return with_aggregation(load(models.SPECS[cfg.name].build)(cfg, in_channels, out_channels, num_layers), cfg)


def reads_edge_features(cfg: ModelConfig) -> bool:
    """Whether the model reads the edges' features (its batches then carry them, ``edge_attr``): hpcgnn's gat and
    gin with ``model.edge_dim``; a model of the user's own whose forward takes ``edge_attr`` (a PyG basic GNN:
    whose convolutions do, given an ``edge_dim`` in ``model.kwargs``)."""
    if not checks.is_custom(cfg):
        return cfg.edge_dim > 0
    from hpcgnn.models.custom import model_class, reads_edge_attr

    return reads_edge_attr(model_class(cfg), dict(cfg.kwargs))


def edge_features_read(cfg: ModelConfig, edge_dim: int | None, dataset: str, typed: bool = False) -> int:
    """The width of the edge features the model reads (0: it reads none) on a graph whose edges have ``edge_dim``
    (None: not known yet, at submit before the graph is prepared: what can be told without it); refused, naming
    the fix, where the model cannot be handed them, the graph has none, or the width the model is given differs
    from the graph's (``model.edge_dim``; a model of the user's own: its ``edge_dim`` in ``model.kwargs``, on a
    homogeneous graph: a ``typed`` graph's relations each have their own)."""
    if not reads_edge_features(cfg):
        return 0
    what = checks.edge_reader(cfg)
    if cfg.gcn_norm:
        raise ConfigError(f"{what} reads edge features, but model.gcn_norm=true adds self-loops that carry none. HINT: "
                          "model.gcn_norm=false, or a model that reads none")
    if edge_dim is None:
        return 0
    if not edge_dim:
        raise DatasetError(f"{what} reads edge features, but the edges of dataset={dataset} have none. HINT: give "
                           "them (files: edge_attr.npy, a row per edge; PyG: data.edge_attr), or a model that reads "
                           "none")
    if cfg.edge_dim and cfg.edge_dim != edge_dim:
        raise ConfigError(f"model.edge_dim={cfg.edge_dim}, but the edges of dataset={dataset} have {edge_dim} "
                          f"features. HINT: model.edge_dim={edge_dim}")
    key, given = declared_edge_dim(cfg)
    if not typed and given is not None and given != edge_dim:
        fix = f"leave {key} out of model.kwargs: hpcgnn fills in the graph's" if takes_edge_dim(cfg) else \
            f"model.kwargs.{key}={edge_dim}"
        raise ConfigError(f"model.kwargs.{key}={given}, but the edges of dataset={dataset} have {edge_dim} features. "
                          f"HINT: {fix}")
    return edge_dim


def with_aggregation(model: torch.nn.Module, cfg: ModelConfig) -> torch.nn.Module:
    """``model.aggregation`` (csr|pyg) on the models that have the choice (sage, gcn, gin, gat, rgcn)."""
    if hasattr(model, "aggregation"):
        model.aggregation = cfg.aggregation
    return model


def uses_edges(cfg: ModelConfig) -> bool:
    return checks.is_custom(cfg) or models.SPECS[cfg.name].uses_edges


def gcn_norm(cfg: ModelConfig) -> bool:
    """Whether the model is normalised as GCN by the whole graph's degrees (hpcgnn's gcn; a model of the user's own
    with ``model.gcn_norm``): its batches carry the weights and self-loops, its exact inference the degrees."""
    spec = models.SPECS.get(cfg.name)
    return (spec is not None and spec.global_gcn_norm) or (checks.is_custom(cfg) and cfg.gcn_norm)


def batch_transform(cfg: ModelConfig, degree: Tensor):
    """What every batch of this model needs done where it is made (None: nothing)."""
    if gcn_norm(cfg):
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
    if "edge_attr" in data and takes(inner, "edge_attr"):  # (batches carry them for a model that reads them)
        kwargs["edge_attr"] = data.edge_attr
    if "edge_age" in data and "edge_age" in forward_takes(type(inner))[0]:  # (named: a model that reads ages)
        kwargs["edge_age"] = data.edge_age
    if getattr(inner, "supports_trim", True) and "num_sampled_nodes" in data and takes(inner, "num_sampled_nodes_per_hop"):
        kwargs.update(num_sampled_nodes_per_hop=data.num_sampled_nodes,
                      num_sampled_edges_per_hop=data.num_sampled_edges)
    return kwargs


def forward_batch(model: torch.nn.Module, data) -> Tensor:
    """Logits of the seed nodes of a sampled batch."""
    return model(data.x, data.edge_index, **batch_kwargs(model, data))[: data.batch_size]


