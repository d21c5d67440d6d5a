"""A typed graph every rank of a node maps whole; seeds are the target type's training nodes (an edge task's: its
targets, a relation's edges, around both ends), batches HeteroData."""

from __future__ import annotations

import dataclasses
import logging
import time

import torch

from hpcgnn.config import RunConfig
from hpcgnn.data import open_typed, prepare
from hpcgnn.env import RankEnv
from hpcgnn.sampling import steps_per_epoch
from hpcgnn.sampling.producers import GraphSide
from hpcgnn.sampling.shipping import SamplerState
from hpcgnn.stores.base import (
    WholeGraphStore,
    edge_targets,
    graph_shape,
    on_local_rank0,
    pair_features_read,
    require_training_items,
    typed_fanouts,
)
from hpcgnn.stores.exact import Exact, WholeTypedPieces, exact_outputs
from hpcgnn.stores.replicated import graph_on

log = logging.getLogger(__name__)


def typed_edge_target_sampler(cfg: RunConfig, sampler, g, targets, pair_features: bool = False, row_of=None):
    """An edge task's sampler over target ids on a typed graph (training's and evaluation's alike): around both ends
    of each target, a relation's edge; ``pair_features``: with each target's own edge features (its decoder reads
    them), read from ``g`` (a TypedGraph, or a rank's TypedParts: then ``row_of(target nodes)`` gives their rows
    in its CSRs: a rank's targets are those whose target node it holds)."""
    from hpcgnn.data.edges import reverse_relation
    from hpcgnn.sampling.loader import gather_rows
    from hpcgnn.sampling.typed import TypedEdgeTargetSampler

    rel = targets.relation

    def own_features(items: torch.Tensor) -> torch.Tensor:  # (their edges' rows: the target node's row start + place)
        own = targets.own_features(items)  # (kept apart: parallel edges, one in the graph)
        if own is not None:
            return own
        ids = targets.edge_ids(items, lambda nodes: g.rowptr[rel].index_select(0, nodes if row_of is None else
                                                                                 row_of(nodes)))
        rows = gather_rows(g.edge_attr[rel], ids.clamp(min=0), dtype=torch.float32)
        return rows.masked_fill_((ids < 0).unsqueeze(1), 0.0)

    return TypedEdgeTargetSampler(sampler, targets, reverse_relation(g, rel), drop_targets=cfg.task.target_edges == "drop",
                                  pair_features=own_features if pair_features else None)


def typed_samplers(cfg: RunConfig, features, state: SamplerState, targets=None, graph=None) -> tuple:
    """Evaluation's neighbour sampler over a typed graph (``features``: the graph, or its copy on the GPU; ``graph``:
    the graph on the host, where it differs) and training's, from what the rank decided (``state``: whether batches
    carry their edges' ids), with an edge task's targets (a relation's edges, around both ends, each with its own
    features where the decoder reads them): the one builder of the rank and its sampler servers."""
    from hpcgnn.sampling.typed import TypedNeighborSampler

    g = graph if graph is not None else features
    sampler = TypedNeighborSampler(features, typed_fanouts(cfg, g), edge_ids=bool(state.values.get("edge_ids")))
    if targets is None:
        return sampler, sampler
    reads = pair_features_read(cfg, g.schema.edge_dim(targets.relation)) > 0
    return sampler, typed_edge_target_sampler(cfg, sampler, g, targets, reads)


class TypedStore(WholeGraphStore):
    """A typed graph, whole on every rank (one mapped copy per node); seeds are the target type's
    training nodes (in its own ids), split across ranks as a replicated graph's are."""

    def __init__(self, cfg: RunConfig, env: RankEnv, device: torch.device | None = None):
        super().__init__(cfg, env, device or torch.device("cpu"))
        on_local_rank0(env, f"prepare {cfg.dataset.name}", lambda: prepare(cfg.dataset))
        self.graph = self.features = g = open_typed(cfg.dataset)
        if cfg.task.name == "edge":  # its targets beside the graph (a relation's edges), their labels the outputs
            self.targets = edge_targets(cfg, env)
        # (edge features: the widest relation's width; the model reads each relation's own, schema.edge_dims)
        self.shape = graph_shape(cfg, g.num_features, g.num_classes, sum(g.num_nodes.values()),
                                 self.targets.labels if self.targets is not None else g.labels, g.schema,
                                 edge_dim=max(g.schema.edge_dims.values(), default=0),
                                 target_edge_dim=g.schema.edge_dim(self.targets.relation) if self.targets else None)
        self.graph_on = graph_on(cfg, env, self.device, self.resident_bytes())
        if self.graph_on == "device":  # sampled and gathered where the model runs
            t0 = time.perf_counter()
            self.features = g.to(self.device)
            log.info("typed graph copied to %s in %.1f s: sampling and gathering there (%.0f MB)", self.device,
                     time.perf_counter() - t0, self.resident_bytes() / 2**20)
        self.state = SamplerState("typed", env.rank, env.world_size, {"edge_ids": self.shape.edge_dim > 0})
        self.sampler, self.train_sampler = typed_samplers(cfg, self.features, self.state, self.targets, graph=g)
        if self.targets is not None:  # an edge task: a step's seeds are training targets (a relation's edges)
            train = self.targets.split("train")
            require_training_items(cfg, train.numel(), "target edges")
            self.eval_pairs = self.train_sampler
            self.items, self.items_per_step = train, cfg.train.batch_size
            self.steps = steps_per_epoch(train.numel(), env.world_size, cfg.train.batch_size)
            log.info("typed graph: %s nodes; %s edges; %d/%d/%d train/val/test target edges of %s (%s), target edges "
                     "%s in their batches", g.num_nodes, {"__".join(r): g.num_edges(r) for r in g.relations},
                     train.numel(), self.targets.split("val").numel(), self.targets.split("test").numel(),
                     "__".join(self.targets.relation), self.shape.target.outputs(),
                     "left out" if cfg.task.target_edges == "drop" else "kept")
            return
        require_training_items(cfg, g.train_idx.numel(), f"{g.target} nodes")
        self.items, self.items_per_step = g.train_idx, cfg.train.batch_size
        self.steps = steps_per_epoch(g.train_idx.numel(), env.world_size, cfg.train.batch_size)
        log.info("typed graph: %s nodes; %s edges; target %s: %d features, %d classes, %d/%d/%d train/val/test; "
                 "features of %s", g.num_nodes, {"__".join(r): g.num_edges(r) for r in g.relations}, g.target,
                 g.num_features, g.num_classes, g.train_idx.numel(), g.val_idx.numel(), g.test_idx.numel(),
                 {t: rule for t, rule in g.feature_rule.items() if rule != "given"})

    def sampler_state(self) -> SamplerState:
        """The rank's place and whether batches carry their edges' ids: what :func:`typed_samplers` built the rank's
        samplers from."""
        return self.state

    @staticmethod
    def server_side(cfg: RunConfig, state: SamplerState, g) -> tuple[GraphSide, None]:
        """A rank's training sampler built on a sampler server as the rank built it (:func:`typed_samplers`, over
        ``g``, the typed graph the server opened); a typed graph's batches need no degrees."""
        targets = None
        if cfg.task.name == "edge":
            from hpcgnn.data.edges import open_targets

            targets = open_targets(cfg.dataset)
        return GraphSide(g, typed_samplers(cfg, g, state, targets)[1]), None

    def pair_features(self, items: torch.Tensor) -> torch.Tensor:
        """An edge task's targets' own edge features (its relation's), for a decoder that reads them."""
        return self.eval_pairs.pair_features(items)

    def exact(self, model: torch.nn.Module, gcn_norm: bool = False, layers: int | None = None,
              on_layer=None) -> Exact:
        t, env = self.cfg.train, self.env
        out = exact_outputs(model, WholeTypedPieces(self.graph, self.device, t.eval_chunk, env.rank, env.world_size,
                                                    self.node_tables()), layers, on_layer)
        if isinstance(out, dict):  # an edge task's encoder: its two end types' rows, read by type
            exact = self._exact(out[self.graph.target])
            return dataclasses.replace(exact, typed_rows=lambda node_type, ids: out[node_type].index_select(0, ids))
        return self._exact(out)

    def resident_bytes(self) -> int:
        g = self.graph
        tensors = [*g.rowptr.values(), *g.col.values(), *g.x.values(), g.y, *(g.edge_attr or {}).values()]
        return sum(t.numel() * t.element_size() for t in tensors)
