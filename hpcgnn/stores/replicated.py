"""A graph every rank of a node maps whole: one copy per node in the page cache (or on a rank's GPU)."""

from __future__ import annotations

import logging
import time

import torch
from torch import Tensor

from hpcgnn.config import RunConfig
from hpcgnn.data import Graph, open_graph, open_link, prepare
from hpcgnn.data.graph import csr_has_edge
from hpcgnn.env import RankEnv
from hpcgnn.sampling import CSRNeighborSampler, steps_per_epoch
from hpcgnn.sampling.link import EdgeTargetSampler
from hpcgnn.sampling.loader import LocalFeatures
from hpcgnn.sampling.producers import GraphSide
from hpcgnn.sampling.shipping import SamplerState
from hpcgnn.specs.samplers import SPECS as SAMPLER_SPECS
from hpcgnn.stores.base import (
    WholeGraphStore,
    edge_targets,
    fanouts,
    graph_shape,
    link_sampler,
    on_local_rank0,
    pair_features_read,
    require_training_items,
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
    servers: they sample the graph on the host), the sampler and task run there (``sampler=neighbor``, a node
    task: classification, multi-label or regression) and the ranks sharing that GPU together hold at most
    ``train.graph_on_fraction`` of its memory; the host otherwise.
    """
    from hpcgnn.checks import sampler_servers

    t = cfg.train
    if t.graph_on != "auto":
        return t.graph_on
    if (device.type != "cuda" or t.sampler != "neighbor" or cfg.task.name != "node" or t.sampler_procs
            or sampler_servers(cfg)):
        return "host"
    sharing = env.local_world_size if torch.cuda.device_count() < env.local_world_size else 1
    total = torch.cuda.get_device_properties(device).total_memory
    fits = graph_bytes * sharing <= t.graph_on_fraction * total
    log.info("train.graph_on=auto: the graph takes %.1f GB x %d rank(s) of the GPU's %.1f GB: sampling on the %s",
             graph_bytes / 1e9, sharing, total / 1e9, "device" if fits else "host")
    return "device" if fits else "host"


def pair_ids_of(cfg: RunConfig, g: Graph, targets):
    """Where the decoder reads an edge task's targets' own features: target ids -> their edges' CSR positions (the
    row's start plus the pair's place; -1: a pair that is no edge); else None."""
    if not pair_features_read(cfg, g.edge_dim):
        return None
    return lambda items: targets.edge_ids(items, lambda nodes: g.rowptr.index_select(0, nodes))


def edge_target_sampler(cfg: RunConfig, sampler, g: Graph, targets) -> EdgeTargetSampler:
    """An edge task's sampler over target ids (training's and evaluation's alike): around both ends of each."""
    return EdgeTargetSampler(sampler, targets, drop_targets=cfg.task.target_edges == "drop",
                             pair_ids=pair_ids_of(cfg, g, targets))


def whole_samplers(cfg: RunConfig, g: Graph, state: SamplerState, link=None, targets=None) -> tuple:
    """Evaluation's neighbour sampler over the whole graph ``g`` and training's, from what the rank decided
    (``state``: whether batches carry their edges' ids, the arrays its sampler's ``prepare`` decided), with a link
    task's splits (``link``) or an edge task's targets (``targets``): the one builder of the rank, its sampler
    processes and its sampler servers."""
    sampler = CSRNeighborSampler(g.rowptr, g.col, fanouts(cfg), edge_ids=bool(state.values.get("edge_ids")))
    if link is not None:  # link prediction: around the endpoints of its positive training edges
        return sampler, link_sampler(cfg, sampler, link.train.pos, g.num_nodes, csr_has_edge(g.rowptr, g.col))
    if targets is not None:  # an edge task: around both ends of its targets
        return sampler, edge_target_sampler(cfg, sampler, g, targets)
    return sampler, build_sampler(cfg, g, sampler, state.arrays)


class ReplicatedStore(WholeGraphStore):
    """Every rank maps the whole prepared graph; seeds (nodes, or edges for link prediction) are split across ranks."""

    def __init__(self, cfg: RunConfig, env: RankEnv, device: torch.device | None = None):
        super().__init__(cfg, env, device or torch.device("cpu"))
        self.graph = g = open_shared_graph(cfg, env)
        self.link = open_link(cfg.dataset) if cfg.dataset.prepared_for == "link" else None
        self.features = g
        self.degree = g.degree()
        if cfg.task.name == "edge":  # its targets beside the graph, their labels the model's outputs
            self.targets = edge_targets(cfg, env)
            self.edge_rows = LocalFeatures(g)
        labels = self.targets.labels if self.targets is not None else g.labels
        self.shape = graph_shape(cfg, g.num_features, g.num_classes, g.num_nodes, labels, edge_dim=g.edge_dim)
        # batches say which edges they hold where the model reads their features (gathered with the nodes')
        self.state = SamplerState("whole", env.rank, env.world_size, {"edge_ids": self.shape.edge_dim > 0})
        if self.link is not None:  # link prediction: a step's seeds are positive training edges
            train = self.link.train.pos
            require_training_items(cfg, train.size(1), "edges")
            self.sampler, self.train_sampler = whole_samplers(cfg, g, self.state, link=self.link)
            self.items, self.items_per_step = torch.arange(train.size(1)), cfg.train.batch_size
            self.steps = steps_per_epoch(train.size(1), env.world_size, cfg.train.batch_size)
            log.info("graph: %d nodes, %d message-passing edges, %d features; %d/%d/%d train/val/test edges to "
                     "predict", g.num_nodes, g.num_edges, g.num_features, train.size(1), self.link.val.pos.size(1),
                     self.link.test.pos.size(1))
            return
        if self.targets is not None:  # an edge task: a step's seeds are training targets (edges to label)
            k, targets = cfg.task, self.targets
            train = targets.split("train")
            require_training_items(cfg, train.numel(), "target edges")
            self.sampler, self.train_sampler = whole_samplers(cfg, g, self.state, targets=targets)
            self.eval_pairs, self.pair_ids = self.train_sampler, self.train_sampler.pair_ids
            self.items, self.items_per_step = train, cfg.train.batch_size
            self.steps = steps_per_epoch(train.numel(), env.world_size, cfg.train.batch_size)
            log.info("graph: %d nodes, %d edges, %d features; %d/%d/%d train/val/test target edges (%s), target "
                     "edges %s in their batches", g.num_nodes, g.num_edges, g.num_features, train.numel(),
                     targets.split("val").numel(), targets.split("test").numel(), self.shape.target.outputs(),
                     "left out" if k.target_edges == "drop" else "kept")
            return
        require_training_items(cfg, g.train_idx.numel(), "nodes")
        prepared = prepare_sampler(cfg, env, g)  # (collective: what the ranks decide together)
        self.items, self.items_per_step, self.steps = prepared.items, prepared.items_per_step, prepared.steps
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
    def server_side(cfg: RunConfig, state: SamplerState, g: Graph) -> tuple[GraphSide, Tensor]:
        """A rank's training sampler built on a sampler server as the rank built it (:func:`whole_samplers`, over
        ``g``, the graph the server opened), and the degrees its batch transform reads."""
        link = open_link(cfg.dataset) if cfg.dataset.prepared_for == "link" else None
        targets = None
        if cfg.task.name == "edge":
            from hpcgnn.data.edges import open_targets

            targets = open_targets(cfg.dataset)
        return GraphSide(g, whole_samplers(cfg, g, state, link, targets)[1]), g.degree()

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
