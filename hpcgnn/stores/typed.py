"""A typed graph every rank of a node maps whole; seeds are the target type's training nodes (or the task's items: an
edge task's targets, a relation's edges, around both ends), batches HeteroData."""

from __future__ import annotations

import dataclasses
import logging
import time

import torch

from hpcgnn.checks import check_timed_config
from hpcgnn.config import RunConfig
from hpcgnn.data import open_typed, prepare
from hpcgnn.data.times import typed_as_of
from hpcgnn.env import RankEnv
from hpcgnn.sampling import steps_per_epoch
from hpcgnn.sampling.producers import GraphSide
from hpcgnn.sampling.shipping import SamplerState
from hpcgnn.stores.base import (
    GraphViews,
    WholeGraphStore,
    on_local_rank0,
    require_training_items,
    say_times,
    typed_fanouts,
)
from hpcgnn.stores.exact import Exact, WholeTypedPieces, exact_outputs
from hpcgnn.stores.replicated import graph_on

log = logging.getLogger(__name__)


def typed_views(g, typed_rows=None, whole: bool = True, **more) -> GraphViews:
    """What a task's items read of a typed graph ``g`` (a TypedGraph; ``typed_rows``: where a type's ids are not
    its rows)."""
    return GraphViews(g.num_features, g.num_classes, sum(g.num_nodes.values()), g.labels, g.schema,
                      max(g.schema.edge_dims.values(), default=0), whole=whole, typed=g,
                      typed_rows=typed_rows or (lambda node_type, ids: ids), **more)


def typed_samplers(cfg: RunConfig, features, state: SamplerState, wrap=None, graph=None,
                   strict: bool = False) -> tuple:
    """Evaluation's neighbour sampler over a typed graph (``features``: the graph, or its copy on the GPU; ``graph``:
    the graph on the host, where it differs) and training's, from what the rank decided (``state``: whether batches
    carry their edges' ids): the neighbour sampler, or (``wrap(node_sampler)``) the task's items' sampler around their
    seeds; the one builder of the rank and its sampler servers. A timed graph's samples as of each seed's time
    (``strict``: strictly before it, the task's items say)."""
    from hpcgnn.sampling.typed import TypedNeighborSampler

    g = graph if graph is not None else features
    edge_ids = bool(state.values.get("edge_ids"))
    if g.timelines is not None and cfg.time.respect:  # (as of each seed's time: hpcgnn.sampling.temporal)
        from hpcgnn.sampling.temporal import TypedTemporalSampler

        t = cfg.time
        sampler = TypedTemporalSampler(features, typed_fanouts(cfg, g), t.strategy, t.window, strict, edge_ids)
    else:
        sampler = TypedNeighborSampler(features, typed_fanouts(cfg, g), edge_ids=edge_ids)
    return sampler, (sampler if wrap is None else wrap(sampler))


class TypedStore(WholeGraphStore):
    """A typed graph, whole on every rank (one mapped copy per node); seeds are the target type's
    training nodes (in its own ids), or the task's items, split across ranks as a replicated graph's are."""

    def __init__(self, cfg: RunConfig, env: RankEnv, device: torch.device | None = None, items=None):
        super().__init__(cfg, env, device or torch.device("cpu"))
        on_local_rank0(env, f"prepare {cfg.dataset.name}", lambda: prepare(cfg.dataset))
        self.graph = self.features = g = open_typed(cfg.dataset)
        check_timed_config(cfg, g.timelines is not None, g.seed_time is not None)  # (a PyG graph's: known here)
        if cfg.predict.at is not None and g.timelines is not None:  # (predict at=T: exact over the edges before T)
            total = g.num_edges()
            self.graph = self.features = g = typed_as_of(g, cfg.predict.at)
            log.info("the graph as of %g: its %d edges before it (of %d)", cfg.predict.at, g.num_edges(), total)
        say_times(cfg, next(iter(g.timelines.values())) if g.timelines else None, env.rank == 0)
        # (edge features: the widest relation's width; the model reads each relation's own, schema.edge_dims)
        self.open_items(items, typed_views(g))
        items = self.items
        self.graph_on = graph_on(cfg, env, self.device, self.resident_bytes()) if items.own_sampler else "host"
        if self.graph_on == "device":  # sampled and gathered where the model runs
            t0 = time.perf_counter()
            self.features = g.to(self.device)
            log.info("typed graph copied to %s in %.1f s: sampling and gathering there (%.0f MB)", self.device,
                     time.perf_counter() - t0, self.resident_bytes() / 2**20)
        self.state = SamplerState("typed", env.rank, env.world_size, {"edge_ids": self.shape.edge_dim > 0})
        self.sampler, self.train_sampler = typed_samplers(
            cfg, self.features, self.state, None if items.own_sampler else items.train_sampler, g, items.strict_times)
        if not items.own_sampler:  # the task's items: a step's seeds are its ids (a relation's target edges)
            ids = items.train_ids()
            require_training_items(cfg, ids.numel(), items.noun)
            self.draws, self.items_per_step = ids, cfg.train.batch_size
            self.steps = steps_per_epoch(ids.numel(), env.world_size, cfg.train.batch_size)
            log.info("typed graph: %s nodes; %s edges; %s", g.num_nodes,
                     {"__".join(r): g.num_edges(r) for r in g.relations}, items.describe(self.shape))
            return
        require_training_items(cfg, g.train_idx.numel(), f"{g.target} nodes")
        self.draws, self.items_per_step = g.train_idx, cfg.train.batch_size
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
    def server_side(cfg: RunConfig, state: SamplerState, g, items) -> tuple[GraphSide, None]:
        """A rank's training sampler built on a sampler server as the rank built it (:func:`typed_samplers`, over
        ``g``, the typed graph the server opened; ``items``: the task's items' unit); a typed graph's batches need no
        degrees."""
        wrap = None if items.own_sampler else (lambda s: items.server_sampler(cfg, typed_views(g), s))
        return GraphSide(g, typed_samplers(cfg, g, state, wrap, strict=items.strict_times)[1]), None

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
