"""A node classifier on any graph: the homogeneous models (:mod:`hpcgnn.models.gnn`) or the typed ones
(:mod:`hpcgnn.models.typed`), chosen by the graph's shape; its logits and labels for a batch."""

from __future__ import annotations

import torch
from torch import Tensor

from hpcgnn.config import ModelConfig
from hpcgnn.models.gnn import build_model, forward_batch
from hpcgnn.models.typed import build_typed_model, forward_typed_batch


def task_model(cfg: ModelConfig, decoder, shape, num_layers: int, relation=None) -> torch.nn.Module:
    """A node task's model for a graph of ``shape`` (its outputs: the target's): training's builder and a model
    file's (``TaskSpec.model``)."""
    return build_node_model(cfg, shape, num_layers)


def build_node_model(cfg: ModelConfig, shape, num_layers: int) -> torch.nn.Module:
    """A node classifier for a graph of ``shape`` (a store's GraphShape): a typed model when the graph has a
    schema (its node types and relations), else a homogeneous one."""
    g = shape.schema
    if g is not None:
        return build_typed_model(cfg, g.node_types, g.relations, g.target, shape.num_features, shape.num_classes,
                                 num_layers, g.edge_dims)
    return build_model(cfg, shape.num_features, shape.num_classes, num_layers, shape.edge_dim)


def node_logits_and_labels(model: torch.nn.Module, data) -> tuple[Tensor, Tensor]:
    """A node batch's seeds' logits and labels (a typed batch, ``HeteroData``: the target type's)."""
    n = data.batch_size
    if hasattr(data, "node_types"):
        return forward_typed_batch(model, data), data[getattr(model, "module", model).target].y[:n]
    return forward_batch(model, data), data.y[:n]

