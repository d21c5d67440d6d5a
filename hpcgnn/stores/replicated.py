"""A graph every rank of a node maps whole: one copy per node in the page cache (or on a rank's GPU)."""

from __future__ import annotations

import logging
import time

import torch
from torch import Tensor

from hpcgnn.checks import check_timed_config
from hpcgnn.config import RunConfig
from hpcgnn.data import Graph, open_graph, prepare
from hpcgnn.data.graph import csr_has_edge
from hpcgnn.data.times import as_of
from hpcgnn.env import RankEnv
from hpcgnn.sampling import CSRNeighborSampler, steps_per_epoch
from hpcgnn.sampling.loader import LocalFeatures
from hpcgnn.sampling.producers import GraphSide
from hpcgnn.sampling.shipping import SamplerState
from hpcgnn.sampling.temporal import TemporalSampler
from hpcgnn.specs.samplers import SPECS as SAMPLER_SPECS
from hpcgnn.stores.base import (
    GraphViews,
    WholeGraphStore,
    fanouts,
    on_local_rank0,
    require_training_items,
    say_times,
)
from hpcgnn.stores.exact import Exact, WholeGraphPieces, exact_outputs
from hpcgnn.stores.samplers import build as build_sampler
from hpcgnn.stores.samplers import prepare as prepare_sampler

log = logging.getLogger(__name__)


def open_shared_graph(cfg: RunConfig, env: RankEnv) -> Graph:
    """One graph copy per node: local rank 0 prepares the cache if needed, then every rank maps it.

    The mapped pages live once in the node's page cache, however many ranks map them.
    """
    # prepare() never downloads: that is `python -m hpcgnn.data prepare`'s job
    on_local_rank0(env, f"prepare {cfg.dataset.name}", lambda: prepare(cfg.dataset))
    return open_graph(cfg.dataset)


def graph_on(cfg: RunConfig, env: RankEnv, device: torch.device, graph_bytes: int) -> str:
    """Where a replicated rank samples and gathers: ``train.graph_on``, with ``auto`` resolved.

    ``auto`` picks the GPU when the rank trains on one, makes its own batches (no sampler processes or
    servers: they sample the graph on the host), the sampler runs there (``sampler=neighbor``; the task's items are
    the graph's nodes: ``graph_on`` is asked only then) and the ranks sharing that GPU
    together hold at most ``train.graph_on_fraction`` of its memory; the host otherwise.
    """
    from hpcgnn.checks import sampler_servers

    t = cfg.train
    if t.graph_on != "auto":
        return t.graph_on
    if device.type != "cuda" or t.sampler != "neighbor" or t.sampler_procs or sampler_servers(cfg):
        return "host"
    sharing = env.local_world_size if torch.cuda.device_count() < env.local_world_size else 1
    total = torch.cuda.get_device_properties(device).total_memory
    fits = graph_bytes * sharing <= t.graph_on_fraction * total
    log.info("train.graph_on=auto: the graph takes %.1f GB x %d rank(s) of the GPU's %.1f GB: sampling on the %s",
             graph_bytes / 1e9, sharing, total / 1e9, "device" if fits else "host")
    return "device" if fits else "host"


def whole_views(g: Graph) -> GraphViews:
    """What a task's items read of a whole graph ``g``."""
    return GraphViews(g.num_features, g.num_classes, g.num_nodes, g.labels, None, g.edge_dim, whole=True,
                      has_edge=lambda: csr_has_edge(g.rowptr, g.col),
                      row_starts=lambda nodes: g.rowptr.index_select(0, nodes), edge_rows=LocalFeatures(g),
                      time_dtype=g.timeline.time.dtype if g.timeline is not None else None)


def whole_samplers(cfg: RunConfig, g: Graph, state: SamplerState, wrap=None, strict: bool = False) -> tuple:
    """Evaluation's neighbour sampler over the whole graph ``g`` and training's, from what the rank decided
    (``state``: whether batches carry their edges' ids, the arrays its sampler's ``prepare`` decided): ``train.sampler``
    over the graph's nodes, or (``wrap(node_sampler)``) the task's items' sampler around their seeds; the one builder
    of the rank, its sampler processes and its sampler servers. ``strict``: a timed graph's seeds sampled strictly
    before their times (the task's items say: a link's own edge is at its time)."""
    sampler = node_sampler(cfg, g, bool(state.values.get("edge_ids")), strict)
    if wrap is not None:
        return sampler, wrap(sampler)
    return sampler, build_sampler(cfg, g, sampler, state.arrays)


def node_sampler(cfg: RunConfig, g: Graph, edge_ids: bool, strict: bool = False):
    """The neighbour sampler of a whole graph: as of each seed's time where its edges have times (``time.respect``;
    :mod:`hpcgnn.sampling.temporal`; ``strict``: strictly before it), else over every edge."""
    if g.timeline is not None and cfg.time.respect:
        return TemporalSampler(g.rowptr, g.timeline, fanouts(cfg), cfg.time.strategy, cfg.time.window,
                               strict=strict, edge_ids=edge_ids)
    return CSRNeighborSampler(g.rowptr, g.col, fanouts(cfg), edge_ids=edge_ids)


class ReplicatedStore(WholeGraphStore):
    """Every rank maps the whole prepared graph; the task's items (``items``: their unit, :mod:`hpcgnn.tasks.items`;
    nodes, edges, targets) are split across ranks."""

    def __init__(self, cfg: RunConfig, env: RankEnv, device: torch.device | None = None, items=None):
        super().__init__(cfg, env, device or torch.device("cpu"))
        self.graph = g = open_shared_graph(cfg, env)
        timeline = g.timeline  # (a PyG graph's times: known once prepared)
        check_timed_config(cfg, timeline is not None, timeline is not None and timeline.seed_time is not None)
        if cfg.predict.at is not None and timeline is not None:  # (predict at=T: exact over the edges before T)
            total = g.num_edges
            self.graph = g = as_of(g, cfg.predict.at)
            log.info("the graph as of %g: its %d edges before it (of %d)", cfg.predict.at, g.num_edges, total)
        say_times(cfg, g.timeline, env.rank == 0)
        self.features = g
        self.degree = g.degree()
        self.open_items(items, whole_views(g))
        # batches say which edges they hold where the model reads their features (gathered with the nodes')
        self.state = SamplerState("whole", env.rank, env.world_size, {"edge_ids": self.shape.edge_dim > 0})
        items = self.items
        if not items.own_sampler:  # the task's items: a step's seeds are its ids (training edges, targets)
            ids = items.train_ids()
            require_training_items(cfg, ids.numel(), items.noun)
            self.sampler, self.train_sampler = whole_samplers(cfg, g, self.state, items.train_sampler,
                                                              items.strict_times)
            self.draws, self.items_per_step = ids, cfg.train.batch_size
            self.steps = steps_per_epoch(ids.numel(), env.world_size, cfg.train.batch_size)
            log.info("graph: %d nodes, %d edges, %d features; %s", g.num_nodes, g.num_edges, g.num_features,
                     items.describe(self.shape))
            return
        require_training_items(cfg, g.train_idx.numel(), "nodes")
        prepared = prepare_sampler(cfg, env, g)  # (collective: what the ranks decide together)
        self.draws, self.items_per_step, self.steps = prepared.items, prepared.items_per_step, prepared.steps
        self.seed_cost = prepared.seed_cost
        # Subgraph batches are each a whole estimate of the mean loss: weigh steps by batches, not seeds.
        self.weigh_by_seeds = not SAMPLER_SPECS[cfg.train.sampler].subgraph
        self.state.arrays.update(prepared.arrays)
        self.graph_on = graph_on(cfg, env, self.device, self.resident_bytes())
        on = g
        if self.graph_on == "device":  # sampled and gathered where the model runs: no copy per step
            t0 = time.perf_counter()
            self.features = on = g.to(self.device)
            log.info("graph copied to %s in %.1f s: sampling and gathering there (%.0f MB)", self.device,
                     time.perf_counter() - t0, self.resident_bytes() / 2**20)
        self.sampler, self.train_sampler = whole_samplers(cfg, on, self.state)
        outputs = self.shape.target.outputs() if self.shape.target is not None else f"{g.num_classes} classes"
        log.info("graph: %d nodes, %d edges, %d features, %s, %d/%d/%d train/val/test", g.num_nodes,
                 g.num_edges, g.num_features, outputs, g.train_idx.numel(), g.val_idx.numel(), g.test_idx.numel())

    def sampler_state(self) -> SamplerState:
        """The rank's place, whether batches carry their edges' ids, and what the ranks decided together (saint_rw's
        inclusion, Cluster-GCN's clusters): what :func:`whole_samplers` built the rank's samplers from."""
        return self.state

    @staticmethod
    def server_side(cfg: RunConfig, state: SamplerState, g: Graph, items) -> tuple[GraphSide, Tensor]:
        """A rank's training sampler built on a sampler server as the rank built it (:func:`whole_samplers`, over
        ``g``, the graph the server opened; ``items``: the task's items' unit, its sampler around their seeds), and
        the degrees its batch transform reads."""
        wrap = None if items.own_sampler else (lambda s: items.server_sampler(cfg, whole_views(g), s))
        return GraphSide(g, whole_samplers(cfg, g, state, wrap, items.strict_times)[1]), g.degree()

    def exact(self, model: torch.nn.Module, gcn_norm: bool = False, layers: int | None = None,
              on_layer=None) -> Exact:
        t, env = self.cfg.train, self.env
        pieces = WholeGraphPieces(self.graph, self.device, t.eval_chunk, env.rank, env.world_size,
                                  self.degree if gcn_norm else None, self.node_tables(),
                                  edge_features=self.shape.edge_dim > 0)
        return self._exact(exact_outputs(model, pieces, layers, on_layer))

    def resident_bytes(self) -> int:
        g = self.graph
        return sum(t.numel() * t.element_size() for t in (g.rowptr, g.col, g.x, g.y))
