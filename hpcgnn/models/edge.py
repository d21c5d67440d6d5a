"""An edge task's model (``task=edge``): an encoder (any node model, its output the node embedding) and a decoder
that turns the embeddings of an edge's two ends into the target's outputs (classes, labels or values).

Decoders (``task.decoder``):

- ``concat``: an MLP over ``[h_source, h_target]`` (the order matters: a directed edge);
- ``hadamard``: an MLP over ``h_source * h_target`` (symmetric);
- ``pkg.module.Class``: a module of the user's own, built as ``Class(in_channels, out_channels)`` and called as
  ``decoder(h_source, h_target)`` on ``[..., in_channels]`` embeddings, returning ``[..., out_channels]``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from hpcgnn.checks import EDGE_DECODERS, locate
from hpcgnn.config import ModelConfig
from hpcgnn.errors import ConfigError
from hpcgnn.models.gnn import build_model


class Concat(torch.nn.Module):
    """An MLP over both ends' embeddings, concatenated (source first)."""

    def __init__(self, in_channels: int, out_channels: int):
        super().__init__()
        self.mlp = torch.nn.Sequential(torch.nn.Linear(2 * in_channels, in_channels), torch.nn.ReLU(),
                                       torch.nn.Linear(in_channels, out_channels))

    def forward(self, a: Tensor, b: Tensor) -> Tensor:
        return self.mlp(torch.cat([a, b], -1))


class Hadamard(torch.nn.Module):
    """An MLP over the product of both ends' embeddings."""

    def __init__(self, in_channels: int, out_channels: int):
        super().__init__()
        self.mlp = torch.nn.Sequential(torch.nn.Linear(in_channels, in_channels), torch.nn.ReLU(),
                                       torch.nn.Linear(in_channels, out_channels))

    def forward(self, a: Tensor, b: Tensor) -> Tensor:
        return self.mlp(a * b)


def edge_decoder(name: str, in_channels: int, out_channels: int) -> torch.nn.Module:
    """The decoder ``task.decoder`` names; a module of the user's own refused, naming the fix, when it does not
    import, is no ``nn.Module``, or does not build from ``(in_channels, out_channels)``."""
    if name in EDGE_DECODERS:
        return {"concat": Concat, "hadamard": Hadamard}[name](in_channels, out_channels)
    cls, why = locate(name)
    if not (isinstance(cls, type) and issubclass(cls, torch.nn.Module)):
        raise ConfigError(f"task.decoder={name} does not name a torch.nn.Module class{why}. HINT: use "
                          f"{', '.join(EDGE_DECODERS)}, or a class importable where the job runs")
    try:
        return cls(in_channels, out_channels)
    except TypeError as exc:
        raise ConfigError(f"task.decoder={name}({in_channels}, {out_channels}) failed: {exc}. HINT: its __init__ "
                          "takes (in_channels, out_channels)") from None


class EdgeModel(torch.nn.Module):
    """Encoder and decoder: ``forward`` encodes the batch and decodes ``pairs`` (local ids of the batch's seeds) in
    one call, so that DDP sees every parameter used in forward; ``score`` decodes embeddings given."""

    def __init__(self, encoder: torch.nn.Module, decoder: torch.nn.Module):
        super().__init__()
        self.encoder, self.decoder = encoder, decoder
        self.supports_trim = getattr(encoder, "supports_trim", True)

    def score(self, a: Tensor, b: Tensor) -> Tensor:
        return self.decoder(a, b)

    def forward(self, x: Tensor, edge_index: Tensor, pairs: Tensor, **kwargs) -> Tensor:
        h = self.encoder(x, edge_index, **kwargs)
        return self.score(h.index_select(0, pairs[0]), h.index_select(0, pairs[1]))


def build_edge_model(cfg: ModelConfig, decoder: str, in_channels: int, out_channels: int, num_layers: int,
                     edge_dim: int = 0) -> EdgeModel:
    """The encoder's last layer outputs ``model.hidden_channels`` (the embedding); the decoder ``out_channels``."""
    encoder = build_model(cfg, in_channels, cfg.hidden_channels, num_layers, edge_dim)
    return EdgeModel(encoder, edge_decoder(decoder, cfg.hidden_channels, out_channels))
