"""Link prediction's model: an encoder (any node model) and a decoder scoring node pairs."""

from __future__ import annotations

import torch
from torch import Tensor

from hpcgnn.config import ModelConfig
from hpcgnn.models.gnn import batch_kwargs, build_model
from hpcgnn.specs import choices, tasks

DECODERS = choices(tasks.LinkTaskConfig, "decoder")


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


def task_model(cfg: ModelConfig, decoder: str, shape, num_layers: int, relation=None) -> torch.nn.Module:
    """A link task's model (an encoder to ``hidden_channels`` and ``decoder``) for a graph of ``shape``: training's
    builder and a model file's (``TaskSpec.model``)."""
    return build_link_model(cfg, decoder, shape.num_features, num_layers, shape.edge_dim)


def build_link_model(cfg: ModelConfig, decoder: str, in_channels: int, num_layers: int,
                     edge_dim: int = 0) -> LinkModel:
    """The encoder's last layer outputs ``hidden_channels``: the embedding the decoder scores (``edge_dim``: the
    width of the edge features it reads, 0: none)."""
    encoder = build_model(cfg, in_channels, cfg.hidden_channels, num_layers, edge_dim)
    return LinkModel(encoder, cfg.hidden_channels, decoder)


def forward_pairs(model: torch.nn.Module, data, pairs: Tensor) -> Tensor:
    """Scores of ``pairs`` (local ids of the seeds) in a sampled link batch (outer hops trimmed); a typed batch's (an
    edge task on a typed graph: ``HeteroData``) through its typed model."""
    if hasattr(data, "node_types"):
        from hpcgnn.models.typed import typed_batch_kwargs

        kwargs = typed_batch_kwargs(getattr(model, "module", model).encoder, data)
        if "edge_label_attr" in data:  # its decoder reads its target edges' own features
            kwargs["pair_attr"] = data.edge_label_attr
        return model(data.x_dict, data.edge_index_dict, pairs, **kwargs)
    kwargs = batch_kwargs(getattr(model, "module", model).encoder, data)
    if "edge_label_attr" in data:  # an edge task's batch whose decoder reads its target edges' own features
        kwargs["pair_attr"] = data.edge_label_attr
    return model(data.x, data.edge_index, pairs, **kwargs)

