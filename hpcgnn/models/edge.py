"""An edge task's model (``task=edge``): an encoder (any node model, its output the node embedding) and a decoder
that turns the embeddings of an edge's two ends into the target's outputs (classes, labels or values).

Decoders (``task.decoder``):

- ``concat``: an MLP over ``[h_source, h_target]`` (the order matters: a directed edge) and, where the graph's
  edges have features, the target edge's own (zeros for a pair that is no edge of the graph);
- ``hadamard``: an MLP over ``h_source * h_target`` (symmetric; it reads no edge features);
- ``pkg.module.Class``: a module of the user's own, built as ``Class(in_channels, out_channels)`` and called as
  ``decoder(h_source, h_target)`` on ``[..., in_channels]`` embeddings, returning ``[..., out_channels]``; where its
  ``forward`` takes ``edge_attr`` and the graph's edges have features, built with ``edge_dim=D`` too and called with
  the target edges' features ``edge_attr`` [..., D].
"""

from __future__ import annotations

import torch
from torch import Tensor

from hpcgnn.checks import EDGE_DECODERS, locate
from hpcgnn.config import ModelConfig
from hpcgnn.errors import ConfigError
from hpcgnn.models.custom import forward_takes
from hpcgnn.models.gnn import build_model


class Concat(torch.nn.Module):
    """An MLP over both ends' embeddings, concatenated (source first), and the target edge's own features where
    there are some (``edge_dim``)."""

    def __init__(self, in_channels: int, out_channels: int, edge_dim: int = 0):
        super().__init__()
        self.mlp = torch.nn.Sequential(torch.nn.Linear(2 * in_channels + edge_dim, in_channels), torch.nn.ReLU(),
                                       torch.nn.Linear(in_channels, out_channels))

    def forward(self, a: Tensor, b: Tensor, edge_attr: Tensor | None = None) -> Tensor:
        return self.mlp(torch.cat([a, b] if edge_attr is None else [a, b, edge_attr.to(a.dtype)], -1))


class Hadamard(torch.nn.Module):
    """An MLP over the product of both ends' embeddings."""

    def __init__(self, in_channels: int, out_channels: int):
        super().__init__()
        self.mlp = torch.nn.Sequential(torch.nn.Linear(in_channels, in_channels), torch.nn.ReLU(),
                                       torch.nn.Linear(in_channels, out_channels))

    def forward(self, a: Tensor, b: Tensor) -> Tensor:
        return self.mlp(a * b)


def decoder_class(name: str) -> type:
    """The class ``task.decoder`` names; a module of the user's own refused, naming the fix, when it does not
    import or is no ``nn.Module``."""
    if name in EDGE_DECODERS:
        return {"concat": Concat, "hadamard": Hadamard}[name]
    cls, why = locate(name)
    if not (isinstance(cls, type) and issubclass(cls, torch.nn.Module)):
        raise ConfigError(f"task.decoder={name} does not name a torch.nn.Module class{why}. HINT: use "
                          f"{', '.join(EDGE_DECODERS)}, or a class importable where the job runs")
    return cls


def decoder_reads_edges(name: str) -> bool:
    """Whether the decoder ``task.decoder`` names reads the target edges' own features: ``concat``, and a module
    of the user's own whose ``forward`` takes ``edge_attr``."""
    return "edge_attr" in forward_takes(decoder_class(name))[0]


def edge_decoder(name: str, in_channels: int, out_channels: int, edge_dim: int = 0) -> torch.nn.Module:
    """The decoder ``task.decoder`` names (``edge_dim``: the width of the target edges' features it reads; 0:
    none); a module of the user's own refused, naming the fix, when it does not build from ``(in_channels,
    out_channels)`` (and ``edge_dim``)."""
    cls, extra = decoder_class(name), {"edge_dim": edge_dim} if edge_dim else {}
    try:
        return cls(in_channels, out_channels, **extra)
    except TypeError as exc:
        args = f"{in_channels}, {out_channels}" + (f", edge_dim={edge_dim}" if edge_dim else "")
        raise ConfigError(f"task.decoder={name}({args}) failed: {exc}. HINT: its __init__ takes (in_channels, "
                          f"out_channels{', edge_dim' if edge_dim else ''})") from None


class EdgeModel(torch.nn.Module):
    """Encoder and decoder: ``forward`` encodes the batch and decodes ``pairs`` (local ids of the batch's seeds) in
    one call, so that DDP sees every parameter used in forward; ``score`` decodes embeddings given."""

    def __init__(self, encoder: torch.nn.Module, decoder: torch.nn.Module, reads_pair_features: bool = False):
        super().__init__()
        self.encoder, self.decoder = encoder, decoder
        self.reads_pair_features = reads_pair_features  # the decoder reads the target edges' own features
        self.supports_trim = getattr(encoder, "supports_trim", True)

    def score(self, a: Tensor, b: Tensor, pair_attr: Tensor | None = None) -> Tensor:
        """The decoder's outputs for pairs of embeddings (``pair_attr``: the pairs' own edge features, which a
        decoder reading them is given)."""
        if self.reads_pair_features:
            return self.decoder(a, b, edge_attr=pair_attr)
        return self.decoder(a, b)

    def forward(self, x: Tensor, edge_index: Tensor, pairs: Tensor, pair_attr: Tensor | None = None,
                **kwargs) -> Tensor:
        h = self.encoder(x, edge_index, **kwargs)
        return self.score(h.index_select(0, pairs[0]), h.index_select(0, pairs[1]), pair_attr)


class TypedEdgeModel(EdgeModel):
    """An edge task's model on a typed graph, its targets ``relation``'s edges: the encoder returns the rows of the
    relation's two end types, by type; the decoder scores each pair (row 0 of ``pairs``: local ids of the source
    type's nodes, row 1: of the target type's)."""

    def __init__(self, encoder: torch.nn.Module, decoder: torch.nn.Module, relation: tuple[str, str, str],
                 reads_pair_features: bool = False):
        super().__init__(encoder, decoder, reads_pair_features)
        self.relation = tuple(relation)
        self.supports_trim = getattr(encoder, "supports_trim", False)
        self.unused_parameters = getattr(encoder, "unused_parameters", False)  # (DDP looks for them where it must)

    def forward(self, x_dict: dict, edge_index_dict: dict, pairs: Tensor, pair_attr: Tensor | None = None,
                **kwargs) -> Tensor:
        h = self.encoder(x_dict, edge_index_dict, **kwargs)
        return self.score(h[self.relation[0]].index_select(0, pairs[0]), h[self.relation[2]].index_select(0, pairs[1]),
                          pair_attr)


def build_edge_model(cfg: ModelConfig, decoder: str, in_channels: int, out_channels: int, num_layers: int,
                     edge_dim: int = 0, pair_edge_dim: int = 0) -> EdgeModel:
    """The encoder's last layer outputs ``model.hidden_channels`` (the embedding); the decoder ``out_channels``.
    ``edge_dim``: the width of the edge features the encoder reads; ``pair_edge_dim``: the decoder's (the target
    edges' own; 0: none)."""
    encoder = build_model(cfg, in_channels, cfg.hidden_channels, num_layers, edge_dim)
    return EdgeModel(encoder, edge_decoder(decoder, cfg.hidden_channels, out_channels, pair_edge_dim),
                     reads_pair_features=pair_edge_dim > 0)


def task_model(cfg: ModelConfig, decoder: str, shape, num_layers: int, relation=None) -> torch.nn.Module:
    """An edge task's model for a graph of ``shape`` (its outputs: the targets' width; a typed graph's targets are
    ``relation``'s edges): training's builder and a model file's (``TaskSpec.model``)."""
    s = shape
    if s.schema is not None:
        return build_typed_edge_model(cfg, decoder, s.schema, tuple(relation), s.num_features, s.num_classes,
                                      num_layers, s.pair_edge_dim)
    return build_edge_model(cfg, decoder, s.num_features, s.num_classes, num_layers, s.edge_dim, s.pair_edge_dim)


def build_typed_edge_model(cfg: ModelConfig, decoder: str, schema, relation: tuple[str, str, str], in_channels: int,
                           out_channels: int, num_layers: int, pair_edge_dim: int = 0) -> TypedEdgeModel:
    """A typed encoder returning the embeddings (``model.hidden_channels``) of ``relation``'s two end types, and the
    decoder (``out_channels``) over a pair of them (``pair_edge_dim``: and the target edge's own features)."""
    from hpcgnn.models.typed import build_typed_model

    ends = tuple(dict.fromkeys((relation[0], relation[2])))
    encoder = build_typed_model(cfg, schema.node_types, schema.relations, schema.target, in_channels,
                                cfg.hidden_channels, num_layers, schema.edge_dims, outputs=ends)
    return TypedEdgeModel(encoder, edge_decoder(decoder, cfg.hidden_channels, out_channels, pair_edge_dim), relation,
                          reads_pair_features=pair_edge_dim > 0)
