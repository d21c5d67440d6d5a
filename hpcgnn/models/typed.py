"""Typed graphs' models: relational GCN (OGB's ogbn-mag baseline), GraphSAGE per relation, and the MLP baseline."""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from torch import Tensor

from hpcgnn import checks
from hpcgnn.config import ModelConfig
from hpcgnn.models.custom import build_custom_typed
from hpcgnn.models.gnn import MLPBaseline, with_aggregation
from hpcgnn.specs import load, models


class RGCN(torch.nn.Module):
    """Relational GCN as in OGB's ogbn-mag neighbour-sampling baseline: per layer, each node type's root
    linear map plus, for every relation into it, a linear map of the mean of its in-neighbours along that
    relation (``HeteroConv`` over mean-aggregating ``SAGEConv`` without root weights, summed).

    Batches carry per-type and per-relation hop counts: PyG's heterogeneous ``trim_to_layer`` drops
    the outer hops layer by layer, so the last layer computes the target type's seeds only (``outputs``: those
    types' instead, whose rows ``forward`` returns by type: an edge task's two ends).
    """

    supports_trim = True
    aggregation = "csr"  # csr: on the CPU, each relation's mean as a sorted-CSR product (hpcgnn.models.aggregation)

    def __init__(self, node_types, relations, target: str, in_channels: int, hidden: int, out_channels: int,
                 num_layers: int, dropout: float, outputs: tuple[str, ...] | None = None):
        from torch_geometric.nn import HeteroConv, Linear, SAGEConv

        super().__init__()
        self.target, self.dropout, self.num_layers, self.outputs = target, dropout, num_layers, outputs
        dims = [in_channels] + [hidden] * (num_layers - 1) + [out_channels]
        # Layer i computes only the types that a later layer reads (the last: the target type), so that
        # every parameter takes part in every step (what DDP's all-reduce expects) and no work is wasted.
        needed = [set(outputs or (target,))]
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
        return typed_outputs(self, x_dict)

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
        return typed_outputs(self, x)

    def maps_first(self, i: int, device: torch.device) -> dict:
        """The relations of layer ``i`` whose linear map exact inference applies to their source rows before the
        mean, where that narrows the rows through the edges (the mean is linear and the map has no bias): relation
        -> its map. On the CPU's CSR path only."""
        if device.type != "cpu" or self.aggregation != "csr":
            return {}
        return {rel: conv.lin_l for t in self.layer_types(i) for rel, conv in self.relations_into(i, t)
                if conv.lin_l.out_channels < conv.lin_l.in_channels and conv.lin_l.bias is None}

    @torch.no_grad()
    def inference_per_layer(self, i: int, node_type: str, x_dict: dict, graph, lo: int, hi: int,
                            mapped: dict | None = None) -> Tensor:
        """Layer ``i``'s output for ``node_type`` nodes ``lo..hi`` with all their in-neighbours along every
        relation (``graph``: a TypedGraph; ``x_dict``: layer ``i``'s input of every type it reads). On the CPU
        each relation's mean comes straight from its CSR (the C kernels: no message per edge,
        :mod:`hpcgnn.models.layerwise`), of ``mapped[relation]`` where given (its source rows' linear map, from
        :meth:`maps_first`), else by PyG's message passing."""
        out = self.roots[i][node_type](x_dict[node_type][lo:hi])
        if out.device.type == "cpu" and self.aggregation == "csr":
            from hpcgnn.kernels.ops import aggregate_rows

            for rel, conv in self.relations_into(i, node_type):
                if mapped is not None and rel in mapped:
                    out = out + aggregate_rows(graph.rowptr[rel], graph.col[rel], mapped[rel], lo, hi, mean=True)
                    continue
                src = x_dict[rel[0]]
                out = out + conv.lin_l(aggregate_rows(graph.rowptr[rel], graph.col[rel], src.contiguous(), lo, hi,
                                                      mean=True))
            return out.relu() if i < self.num_layers - 1 else out
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
                 num_layers: int, dropout: float, outputs: tuple[str, ...] | None = None):
        from torch_geometric.nn import GraphSAGE, to_hetero

        super().__init__()
        self.target, self.outputs = target, outputs
        base = GraphSAGE(in_channels, hidden, num_layers, out_channels, dropout=dropout)
        self.model = to_hetero(base, (list(node_types), list(relations)), aggr="sum")

    def forward(self, x_dict: dict, edge_index_dict: dict, **_: object) -> Tensor:
        return typed_outputs(self, self.model(x_dict, edge_index_dict))


def typed_outputs(model: torch.nn.Module, x_dict: dict):
    """What a typed model returns from its last layer's rows by type: the target type's (a node task), or a dict of
    the types ``model.outputs`` names (an edge task's two ends)."""
    return {t: x_dict[t] for t in model.outputs} if model.outputs else x_dict[model.target]


def build_typed_model(cfg: ModelConfig, node_types, relations, target: str, in_channels: int, out_channels: int,
                      num_layers: int, edge_dims: dict[str, int] | None = None,
                      outputs: tuple[str, ...] | None = None) -> torch.nn.Module:
    """``edge_dims``: relation key -> the width of its edges' features (a model of the user's own may read them);
    ``outputs``: the node types whose rows the model returns, by type (an edge task's ends; None: the target's)."""
    if checks.is_custom(cfg):  # a model of the user's own, relational (hpcgnn.models.custom)
        return build_custom_typed(cfg, node_types, relations, target, in_channels, out_channels, num_layers, edge_dims,
                                  outputs)
    build = load(models.SPECS[cfg.name].typed_build)
    return with_aggregation(build(cfg, node_types, relations, target, in_channels, out_channels, num_layers, outputs),
                            cfg)


def build_rgcn(cfg: ModelConfig, node_types, relations, target: str, i: int, o: int, n: int, outputs=None):
    return RGCN(node_types, relations, target, i, cfg.hidden_channels, o, n, cfg.dropout, outputs)


def build_sage(cfg: ModelConfig, node_types, relations, target: str, i: int, o: int, n: int, outputs=None):
    return TypedSAGE(node_types, relations, target, i, cfg.hidden_channels, o, n, cfg.dropout, outputs)


def build_mlp(cfg: ModelConfig, node_types, relations, target: str, i: int, o: int, n: int, outputs=None):
    """The baseline on the target type's own features."""
    return TypedMLP(target, MLPBaseline(i, cfg.hidden_channels, n, o, cfg.dropout))


class TypedMLP(torch.nn.Module):
    supports_trim = False

    def __init__(self, target: str, mlp: torch.nn.Module):
        super().__init__()
        self.target, self.mlp = target, mlp

    def forward(self, x_dict: dict, edge_index_dict: dict, **_: object) -> Tensor:
        return self.mlp(x_dict[self.target])


def typed_batch_kwargs(encoder: torch.nn.Module, data) -> dict:
    """What a typed batch passes to a typed model besides features and edges: per-hop counts where it trims the
    outer hops, the relations' edge features (``edge_attr_dict``) where it reads them."""
    kwargs = {}
    if getattr(encoder, "supports_trim", False) and "num_sampled_nodes_dict" in data:
        kwargs = {"num_sampled_nodes_dict": data.num_sampled_nodes_dict,
                  "num_sampled_edges_dict": data.num_sampled_edges_dict}
    if getattr(encoder, "edge_keyword", None) is not None:
        kwargs["edge_attr_dict"] = data.collect("edge_attr", allow_empty=True)
    return kwargs


def forward_typed_batch(model: torch.nn.Module, data) -> Tensor:
    """Logits of the target type's seeds in a typed batch (outer hops trimmed where the model can; the relations'
    edge features, ``edge_attr_dict``, where the batch carries them: the model reads them)."""
    inner = getattr(model, "module", model)
    kwargs = typed_batch_kwargs(inner, data)
    return model(data.x_dict, data.edge_index_dict, **kwargs)[: data[inner.target].batch_size]

