"""A graph every rank of a node maps whole: one copy per node in the page cache (or on a rank's GPU)."""

from __future__ import annotations

import logging
import math
import time

import numpy as np
import torch
from torch import Tensor

from hpcgnn import dist
from hpcgnn.config import RunConfig
from hpcgnn.data import Graph, cache_folder, open_graph, open_link, prepare
from hpcgnn.data.graph import csr_has_edge
from hpcgnn.env import RankEnv
from hpcgnn.errors import ConfigError
from hpcgnn.io import write_npy
from hpcgnn.rng import generator
from hpcgnn.sampling import CSRNeighborSampler, steps_per_epoch
from hpcgnn.sampling import subgraph as sub
from hpcgnn.sampling.link import EdgeTargetSampler
from hpcgnn.sampling.loader import LocalFeatures
from hpcgnn.sampling.producers import GraphSide
from hpcgnn.sampling.shipping import SamplerState
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

log = logging.getLogger(__name__)


def open_shared_graph(cfg: RunConfig, env: RankEnv) -> Graph:
    """One graph copy per node: local rank 0 prepares the cache if needed, then every rank maps it.

    The mapped pages live once in the node's page cache, however many ranks map them.
    """
    # prepare() never downloads: that is `python -m hpcgnn.data prepare`'s job
    on_local_rank0(env, f"prepare {cfg.dataset.name}", lambda: prepare(cfg.dataset))
    return open_graph(cfg.dataset)


def cluster_assignment(cfg: RunConfig, env: RankEnv, graph: Graph, num_clusters: int) -> Tensor:
    """Cluster-GCN's METIS clusters of the whole graph, computed once per node and cached beside it."""
    from hpcgnn.partition.compute import compute_parts

    path = cache_folder(cfg.dataset) / "clusters" / f"metis-c{num_clusters}-s{cfg.graph.seed}.npy"

    def compute() -> None:
        if path.is_file():
            return
        t0 = time.perf_counter()
        part = compute_parts(graph, num_clusters, "metis", cfg.graph.seed, balance_train=True)
        write_npy(path, part.numpy())  # whole or not at all: another node may race us
        log.info("%d METIS clusters in %.1f s: %s", num_clusters, time.perf_counter() - t0, path)

    on_local_rank0(env, f"compute {num_clusters} clusters", compute)
    return torch.from_numpy(np.load(path))


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


def training_sampler(cfg: RunConfig, g: Graph, sampler, clusters: Tensor | None = None):
    """The training sampler of ``train.sampler`` over the whole graph ``g`` (``sampler``: the neighbour sampler,
    evaluation's; ``clusters``: Cluster-GCN's assignment), as a rank and its sampler servers build it. saint_rw's
    inclusion probabilities are the ranks' to compute together, and set after. Its batches carry their edges' ids
    where the neighbour sampler's do (the model reads their features)."""
    t = cfg.train
    n, n_train = g.num_nodes, g.train_idx.numel()
    if t.sampler == "ladies":
        return sub.LadiesSampler(g.rowptr, g.col, fanouts(cfg), edge_ids=sampler.edge_ids)
    if t.sampler in ("saint_node", "saint_edge"):
        # Sized so that a subgraph holds about batch_size training nodes.
        cls, per_draw = (sub.SaintNodeSampler, 1) if t.sampler == "saint_node" else (sub.SaintEdgeSampler, 2)
        s = cls(g.rowptr, g.col, g.train_idx, math.ceil(t.batch_size * n / (n_train * per_draw)))
    elif t.sampler == "saint_rw":
        s = sub.SaintWalkSampler(g.rowptr, g.col, g.train_idx, len(t.fanouts))
    elif t.sampler == "cluster":
        s = sub.ClusterSampler(g.rowptr, g.col, g.train_idx, clusters)
    else:
        return sampler
    s.edge_ids = sampler.edge_ids
    return s


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


class ReplicatedStore(WholeGraphStore):
    """Every rank maps the whole prepared graph; seeds (nodes, or edges for link prediction) are split across ranks."""

    def __init__(self, cfg: RunConfig, env: RankEnv, device: torch.device | None = None):
        super().__init__(cfg, env, device or torch.device("cpu"))
        self.decided: dict[str, Tensor] = {}  # what the ranks computed together for the training sampler
        self.graph = g = open_shared_graph(cfg, env)
        self.link = open_link(cfg.dataset) if cfg.dataset.prepared_for == "link" else None
        self.features = g
        self.degree = g.degree()
        if cfg.task.name == "edge":  # its targets beside the graph, their labels the model's outputs
            self.targets = edge_targets(cfg, env)
            self.pair_ids, self.edge_rows = pair_ids_of(cfg, g, self.targets), LocalFeatures(g)
        labels = self.targets.labels if self.targets is not None else g.labels
        self.shape = graph_shape(cfg, g.num_features, g.num_classes, g.num_nodes, labels, edge_dim=g.edge_dim)
        # evaluation's, and training's by default; its batches say which edges they hold where the model reads their
        # features (gathered with the nodes')
        self.sampler = CSRNeighborSampler(g.rowptr, g.col, fanouts(cfg), edge_ids=self.shape.edge_dim > 0)
        if self.link is not None:  # link prediction: a step's seeds are positive training edges
            train = self.link.train.pos
            require_training_items(cfg, train.size(1), "edges")
            self.train_sampler = self._link_sampler(self.sampler, train, csr_has_edge(g.rowptr, g.col))
            self.items, self.items_per_step = torch.arange(train.size(1)), cfg.train.batch_size
            self.steps = steps_per_epoch(train.size(1), env.world_size, cfg.train.batch_size)
            self.weigh_by_seeds = True
            log.info("graph: %d nodes, %d message-passing edges, %d features; %d/%d/%d train/val/test edges to "
                     "predict", g.num_nodes, g.num_edges, g.num_features, train.size(1), self.link.val.pos.size(1),
                     self.link.test.pos.size(1))
            return
        if self.targets is not None:  # an edge task: a step's seeds are training targets (edges to label)
            k, targets = cfg.task, self.targets
            train = targets.split("train")
            require_training_items(cfg, train.numel(), "target edges")
            self.train_sampler = self.eval_pairs = edge_target_sampler(cfg, self.sampler, g, targets)
            self.items, self.items_per_step = train, cfg.train.batch_size
            self.steps = steps_per_epoch(train.numel(), env.world_size, cfg.train.batch_size)
            log.info("graph: %d nodes, %d edges, %d features; %d/%d/%d train/val/test target edges (%s), target "
                     "edges %s in their batches", g.num_nodes, g.num_edges, g.num_features, train.numel(),
                     targets.split("val").numel(), targets.split("test").numel(), self.shape.target.outputs(),
                     "left out" if k.target_edges == "drop" else "kept")
            return
        require_training_items(cfg, g.train_idx.numel(), "nodes")
        self.steps = steps_per_epoch(g.train_idx.numel(), env.world_size, cfg.train.batch_size)
        self.graph_on = graph_on(cfg, env, self.device, self.resident_bytes())
        if self.graph_on == "device":  # sampled and gathered where the model runs: no copy per step
            t0 = time.perf_counter()
            self.features = on_device = g.to(self.device)
            self.sampler = CSRNeighborSampler(on_device.rowptr, on_device.col, fanouts(cfg),
                                              edge_ids=self.shape.edge_dim > 0)
            log.info("graph copied to %s in %.1f s: sampling and gathering there (%.0f MB)", self.device,
                     time.perf_counter() - t0, self.resident_bytes() / 2**20)
        self.train_sampler, self.items, self.items_per_step = self.sampler, g.train_idx, cfg.train.batch_size
        self._setup_sampler()
        outputs = self.shape.target.outputs() if self.shape.target is not None else f"{g.num_classes} classes"
        log.info("graph: %d nodes, %d edges, %d features, %s, %d/%d/%d train/val/test", g.num_nodes,
                 g.num_edges, g.num_features, outputs, g.train_idx.numel(), g.val_idx.numel(), g.test_idx.numel())

    def _setup_sampler(self) -> None:
        """The training sampler of ``train.sampler``, what its steps draw from, and the steps per epoch."""
        t, g, env = self.cfg.train, self.graph, self.env
        n, n_train, world = g.num_nodes, g.train_idx.numel(), env.world_size
        clusters = None
        if t.sampler == "cluster":
            num = t.num_clusters or t.clusters_per_batch * math.ceil(n_train / t.batch_size)
            if num > n:
                raise ConfigError(f"train.num_clusters={num} exceeds the graph's {n} nodes: lower train.num_clusters "
                                  "or raise train.batch_size")
            clusters = self.decided["clusters"] = cluster_assignment(self.cfg, env, g, num)
            self.items, self.items_per_step = torch.arange(num), t.clusters_per_batch
            self.steps = steps_per_epoch(num, world, t.clusters_per_batch)
        self.train_sampler = s = training_sampler(self.cfg, g, self.sampler, clusters)
        if t.sampler in ("saint_node", "saint_edge"):  # a step draws afresh
            self.items, self.items_per_step = torch.arange(self.steps * world), 1
        elif t.sampler == "saint_rw":  # the step's seeds are the walks' roots
            total = math.ceil(t.saint_coverage * n / (t.batch_size * (len(t.fanouts) + 1)))
            mine = math.ceil(total / world)  # the pre-sampling is shared out over the ranks
            counts = s.count_inclusion(t.batch_size, mine, generator(t.seed, "saint_rw_inclusion", env.rank))
            s.inclusion = self.decided["inclusion"] = dist.all_reduce_sum(counts) / (mine * world)
        if t.edge_budget:
            self.seed_cost = sub.expected_edges(g.rowptr, g.col, t.fanouts)
            total_cost = float(self.seed_cost.index_select(0, g.train_idx).double().sum())
            self.steps = sub.batches_for_budget(total_cost, world, t.edge_budget, math.ceil(n_train / world))
        # Subgraph batches are each a whole estimate of the mean loss: weigh steps by batches, not seeds.
        self.weigh_by_seeds = not isinstance(self.train_sampler, sub.SubgraphSampler)

    def sampler_state(self) -> SamplerState:
        """The rank's place, whether batches carry their edges' ids, and what the ranks computed together (saint_rw's
        inclusion, Cluster-GCN's clusters)."""
        return SamplerState("whole", self.env.rank, self.env.world_size, {"edge_ids": self.sampler.edge_ids},
                            dict(self.decided))

    @staticmethod
    def server_side(cfg: RunConfig, state: SamplerState, g: Graph) -> tuple[GraphSide, Tensor]:
        """A rank's training sampler built on a sampler server as the rank built it (over ``g``, the graph the
        server opened), and the degrees its batch transform reads."""
        sampler = CSRNeighborSampler(g.rowptr, g.col, fanouts(cfg), edge_ids=bool(state.values.get("edge_ids")))
        if cfg.dataset.prepared_for == "link":
            link = open_link(cfg.dataset)
            train = link_sampler(cfg, sampler, link.train.pos, g.num_nodes, csr_has_edge(g.rowptr, g.col))
        elif cfg.task.name == "edge":
            from hpcgnn.data.edges import open_targets

            train = edge_target_sampler(cfg, sampler, g, open_targets(cfg.dataset))
        else:
            train = training_sampler(cfg, g, sampler, state.arrays.get("clusters"))
            if "inclusion" in state.arrays:
                train.inclusion = state.arrays["inclusion"]
        return GraphSide(g, train), g.degree()

    def exact(self, model: torch.nn.Module, transform_for=None, layers: int | None = None, on_layer=None) -> Exact:
        t, env = self.cfg.train, self.env
        transform = transform_for(self.degree) if transform_for else None
        pieces = WholeGraphPieces(self.graph, self.device, t.eval_chunk, env.rank, env.world_size, transform,
                                  self.node_tables(), edge_features=self.shape.edge_dim > 0)
        return self._exact(exact_outputs(model, pieces, layers, on_layer))

    def resident_bytes(self) -> int:
        g = self.graph
        return sum(t.numel() * t.element_size() for t in (g.rowptr, g.col, g.x, g.y))
