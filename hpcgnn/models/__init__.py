"""Model registry over torch_geometric.nn: one GNN layer per sampling hop.

Each entry says how to build the model and what its batches need: ``gcn`` takes its
normalisation from the whole graph's degrees (``GCNNorm`` puts per-edge weights and
self-loops into every batch), so sampled GCN is the GCN of the paper; ``mlp`` reads no
edges, so its batches sample no neighbours.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from hpcgnn import checks
from hpcgnn.config import ModelConfig
from hpcgnn.models.custom import build_custom, build_custom_typed, takes


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


Builder = Callable[[ModelConfig, int, int, int], torch.nn.Module]


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
    return _with_aggregation(MODELS[cfg.name].build(cfg, in_channels, out_channels, num_layers), cfg)


def _with_aggregation(model: torch.nn.Module, cfg: ModelConfig) -> torch.nn.Module:
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


def _batch_kwargs(model: torch.nn.Module, data) -> dict:
    """What a sampled batch passes to the model besides x and edges: edge weights, per-hop counts.

    PyG's basic GNNs skip the outer hops layer by layer (``trim_to_layer``) when given the
    per-hop counts: the last layer computes the seeds only.
    """
    inner = getattr(model, "module", model)
    if isinstance(inner, LinkModel):
        inner = inner.encoder
    kwargs = {}
    if "edge_weight" in data and takes(inner, "edge_weight"):
        kwargs["edge_weight"] = data.edge_weight
    if getattr(inner, "supports_trim", True) and "num_sampled_nodes" in data and takes(inner, "num_sampled_nodes_per_hop"):
        kwargs.update(num_sampled_nodes_per_hop=data.num_sampled_nodes,
                      num_sampled_edges_per_hop=data.num_sampled_edges)
    return kwargs


def forward_batch(model: torch.nn.Module, data) -> Tensor:
    """Logits of the seed nodes of a sampled batch."""
    return model(data.x, data.edge_index, **_batch_kwargs(model, data))[: data.batch_size]


# ------------------------------------------------------------------------------ link prediction

DECODERS = checks.DECODERS


class LinkModel(torch.nn.Module):
    """An encoder (any model above, its output the node embedding) and a decoder scoring node pairs.

    ``forward`` encodes the batch and scores ``pairs`` (local ids of the batch's seeds) in one call,
    so DDP sees every parameter used in forward. Decoders: ``dot`` (the inner product of the two
    embeddings) or ``mlp`` (a two-layer MLP on their Hadamard product).
    """

    def __init__(self, encoder: torch.nn.Module, hidden: int, decoder: str):
        super().__init__()
        self.encoder = encoder
        self.supports_trim = getattr(encoder, "supports_trim", True)
        self.decoder = None
        if decoder == "mlp":
            self.decoder = torch.nn.Sequential(torch.nn.Linear(hidden, hidden), torch.nn.ReLU(),
                                               torch.nn.Linear(hidden, 1))

    def score(self, a: Tensor, b: Tensor) -> Tensor:
        """Scores (logits) of embedding pairs ``a[i]``, ``b[i]``; any leading shape."""
        if self.decoder is None:
            return (a * b).sum(-1)
        return self.decoder(a * b).squeeze(-1)

    def forward(self, x: Tensor, edge_index: Tensor, pairs: Tensor, **kwargs) -> Tensor:
        h = self.encoder(x, edge_index, **kwargs)
        return self.score(h.index_select(0, pairs[0]), h.index_select(0, pairs[1]))


def build_link_model(cfg: ModelConfig, decoder: str, in_channels: int, num_layers: int) -> LinkModel:
    """The encoder's last layer outputs ``hidden_channels``: the embedding the decoder scores."""
    encoder = build_model(cfg, in_channels, cfg.hidden_channels, num_layers)
    return LinkModel(encoder, cfg.hidden_channels, decoder)


def forward_pairs(model: torch.nn.Module, data, pairs: Tensor) -> Tensor:
    """Scores of ``pairs`` (local ids of the seeds) in a sampled link batch (outer hops trimmed)."""
    return model(data.x, data.edge_index, pairs, **_batch_kwargs(model, data))


# ------------------------------------------------------------------------------ typed graphs

TYPED_MODELS = checks.TYPED_MODELS


class RGCN(torch.nn.Module):
    """Relational GCN as in OGB's ogbn-mag neighbour-sampling baseline: per layer, each node type's root
    linear map plus, for every relation into it, a linear map of the mean of its in-neighbours along that
    relation (``HeteroConv`` over mean-aggregating ``SAGEConv`` without root weights, summed).

    Batches carry per-type and per-relation hop counts: PyG's heterogeneous ``trim_to_layer`` drops
    the outer hops layer by layer, so the last layer computes the target type's seeds only.
    """

    supports_trim = True
    aggregation = "csr"  # csr: on the CPU, each relation's mean as a sorted-CSR product (hpcgnn.models.aggregation)

    def __init__(self, node_types, relations, target: str, in_channels: int, hidden: int, out_channels: int,
                 num_layers: int, dropout: float):
        from torch_geometric.nn import HeteroConv, Linear, SAGEConv

        super().__init__()
        self.target, self.dropout, self.num_layers = target, dropout, num_layers
        dims = [in_channels] + [hidden] * (num_layers - 1) + [out_channels]
        # Layer i computes only the types that a later layer reads (the last: the target type), so that
        # every parameter takes part in every step (what DDP's all-reduce expects) and no work is wasted.
        needed = [{target}]
        for _ in range(num_layers - 1):
            needed.insert(0, needed[0] | {s for s, _, d in relations if d in needed[0]})
        self.convs = torch.nn.ModuleList()
        self.roots = torch.nn.ModuleList()
        for i in range(num_layers):
            rels = [r for r in relations if r[2] in needed[i]]
            with warnings.catch_warnings():  # "node types ... do not get updated": on purpose, see above
                warnings.simplefilter("ignore", UserWarning)
                self.convs.append(HeteroConv({rel: SAGEConv((dims[i], dims[i]), dims[i + 1], root_weight=False,
                                                            bias=False) for rel in rels}, aggr="sum"))
            self.roots.append(torch.nn.ModuleDict({t: Linear(dims[i], dims[i + 1]) for t in node_types
                                                   if t in needed[i]}))

    def relations_into(self, i: int, node_type: str):
        """(relation, its SAGEConv) of layer ``i`` for each relation into ``node_type``."""
        for key, conv in self.convs[i].convs.items():
            rel = key if isinstance(key, tuple) else tuple(key.split("__"))  # PyG's ModuleDict may key by string
            if rel[2] == node_type:
                yield rel, conv

    def forward(self, x_dict: dict, edge_index_dict: dict, num_sampled_nodes_dict: dict | None = None,
                num_sampled_edges_dict: dict | None = None) -> Tensor:
        from torch_geometric.utils import trim_to_layer

        from hpcgnn.models.aggregation import sorted_by_target

        if (self.aggregation == "csr" and num_sampled_nodes_dict is not None
                and x_dict[self.target].device.type == "cpu"
                and all(sorted_by_target(ei) for ei in edge_index_dict.values())):
            return self._forward_csr(x_dict, edge_index_dict, num_sampled_nodes_dict, num_sampled_edges_dict)
        for i in range(self.num_layers):
            if num_sampled_nodes_dict is not None:
                x_dict, edge_index_dict, _ = trim_to_layer(i, num_sampled_nodes_dict, num_sampled_edges_dict,
                                                           x_dict, edge_index_dict)
            out = self.convs[i](x_dict, edge_index_dict)
            x_dict = {t: self.roots[i][t](x) + out[t] if t in out else self.roots[i][t](x) for t, x in x_dict.items()
                      if t in self.roots[i]}
            if i < self.num_layers - 1:
                x_dict = {t: F.dropout(x.relu(), self.dropout, self.training) for t, x in x_dict.items()}
        return x_dict[self.target]

    def _forward_csr(self, x_dict: dict, edge_index_dict: dict, num_nodes: dict, num_edges: dict) -> Tensor:
        """Layer by layer, each type's nodes that a later layer reads (the last: the seeds), each relation's
        mean as one product with the CSR of its edges' prefix (edges come grouped by target)."""
        from hpcgnn.models.aggregation import csr, prefix_sums, target_rowptr

        layers = self.num_layers
        nodes = {t: prefix_sums(c) for t, c in num_nodes.items()}
        edges = {r: prefix_sums(c) for r, c in num_edges.items()}
        rowptr = {rel: target_rowptr(ei[1], nodes[rel[2]][layers]) for rel, ei in edge_index_dict.items()}
        x = x_dict
        for i in range(layers):
            out = {}
            for t in self.roots[i]:
                targets = nodes[t][layers - i]
                h = self.roots[i][t](x[t][:targets])
                for rel, conv in self.relations_into(i, t):
                    if rel not in edge_index_dict:
                        continue
                    reads, n = nodes[rel[0]][layers - i + 1], edges[rel][layers - i]
                    src = x[rel[0]][:reads]
                    adj = csr(rowptr[rel], edge_index_dict[rel][0][:n], src.new_ones(n), targets, reads)
                    h = h + conv((src, x[t][:targets]), adj)
                out[t] = h
            x = out if i == layers - 1 else {t: F.dropout(v.relu(), self.dropout, self.training) for t, v in out.items()}
        return x[self.target]

    @torch.no_grad()
    def inference_per_layer(self, i: int, node_type: str, x_dict: dict, graph, lo: int, hi: int) -> Tensor:
        """Layer ``i``'s output for ``node_type`` nodes ``lo..hi`` with all their in-neighbours along every
        relation (``graph``: a TypedGraph; ``x_dict``: layer ``i``'s input of every type it reads)."""
        out = self.roots[i][node_type](x_dict[node_type][lo:hi])
        for rel, conv in self.relations_into(i, node_type):
            rowptr, col = graph.rowptr[rel], graph.col[rel]
            nbr = col[rowptr[lo]:rowptr[hi]].to(out.device)
            dst = torch.repeat_interleave(torch.arange(hi - lo, device=out.device),
                                          (rowptr[lo + 1:hi + 1] - rowptr[lo:hi]).to(out.device))
            out = out + conv((x_dict[rel[0]], x_dict[node_type][lo:hi]), torch.stack([nbr, dst]))
        return out.relu() if i < self.num_layers - 1 else out

    def layer_types(self, i: int) -> list[str]:
        """The node types layer ``i`` computes (the last: the target type alone)."""
        return list(self.roots[i])


class TypedSAGE(torch.nn.Module):
    """PyG's GraphSAGE made relational by ``to_hetero`` (one SAGEConv per relation, summed per type).
    Its last layer computes every type, of which only the target's logits count: DDP must look for
    the parameters a step did not use."""

    supports_trim = False
    unused_parameters = True

    def __init__(self, node_types, relations, target: str, in_channels: int, hidden: int, out_channels: int,
                 num_layers: int, dropout: float):
        from torch_geometric.nn import GraphSAGE, to_hetero

        super().__init__()
        self.target = target
        base = GraphSAGE(in_channels, hidden, num_layers, out_channels, dropout=dropout)
        self.model = to_hetero(base, (list(node_types), list(relations)), aggr="sum")

    def forward(self, x_dict: dict, edge_index_dict: dict, **_: object) -> Tensor:
        return self.model(x_dict, edge_index_dict)[self.target]


def build_typed_model(cfg: ModelConfig, node_types, relations, target: str, in_channels: int, out_channels: int,
                      num_layers: int) -> torch.nn.Module:
    if checks.is_custom(cfg):  # a model of the user's own, relational (hpcgnn.models.custom)
        return build_custom_typed(cfg, node_types, relations, target, in_channels, out_channels, num_layers)
    if cfg.name == "mlp":  # the baseline on the target type's own features
        return TypedMLP(target, MLPBaseline(in_channels, cfg.hidden_channels, num_layers, out_channels, cfg.dropout))
    cls = {"rgcn": RGCN, "sage": TypedSAGE}[cfg.name]
    return _with_aggregation(cls(node_types, relations, target, in_channels, cfg.hidden_channels, out_channels,
                                 num_layers, cfg.dropout), cfg)


class TypedMLP(torch.nn.Module):
    supports_trim = False

    def __init__(self, target: str, mlp: torch.nn.Module):
        super().__init__()
        self.target, self.mlp = target, mlp

    def forward(self, x_dict: dict, edge_index_dict: dict, **_: object) -> Tensor:
        return self.mlp(x_dict[self.target])


def forward_typed_batch(model: torch.nn.Module, data) -> Tensor:
    """Logits of the target type's seeds in a typed batch (outer hops trimmed where the model can)."""
    inner = getattr(model, "module", model)
    target = inner.target
    kwargs = {}
    if getattr(inner, "supports_trim", False) and "num_sampled_nodes_dict" in data:
        kwargs = {"num_sampled_nodes_dict": data.num_sampled_nodes_dict,
                  "num_sampled_edges_dict": data.num_sampled_edges_dict}
    return model(data.x_dict, data.edge_index_dict, **kwargs)[: data[target].batch_size]


# ------------------------------------------------------------------------------ node classification, any graph


def build_node_model(cfg: ModelConfig, shape, num_layers: int) -> torch.nn.Module:
    """A node classifier for a graph of ``shape`` (a store's GraphShape): a typed model when the graph has a
    schema (its node types and relations), else a homogeneous one."""
    g = shape.schema
    if g is not None:
        return build_typed_model(cfg, g.node_types, g.relations, g.target, shape.num_features, shape.num_classes,
                                 num_layers)
    return build_model(cfg, shape.num_features, shape.num_classes, num_layers)


def node_logits_and_labels(model: torch.nn.Module, data) -> tuple[Tensor, Tensor]:
    """A node batch's seeds' logits and labels (a typed batch, ``HeteroData``: the target type's)."""
    n = data.batch_size
    if hasattr(data, "node_types"):
        return forward_typed_batch(model, data), data[getattr(model, "module", model).target].y[:n]
    return forward_batch(model, data), data.y[:n]
