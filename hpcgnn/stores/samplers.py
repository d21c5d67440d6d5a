"""The training samplers of a whole graph, each by its spec (:mod:`hpcgnn.specs.samplers`): ``prepare`` (what
the ranks decide together before the first batch: the items a step draws from, the steps per epoch, and the arrays
the sampler is built from) and ``build`` (the sampler, from the graph and those arrays).

``build`` is the one builder: the rank calls it with what it prepared, its sampler processes and servers with what
the rank's :class:`~hpcgnn.sampling.shipping.SamplerState` carries (the same arrays), over the same graph.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from hpcgnn import dist
from hpcgnn.config import RunConfig
from hpcgnn.data import Graph, cache_folder
from hpcgnn.env import RankEnv
from hpcgnn.errors import ConfigError
from hpcgnn.io import write_npy
from hpcgnn.rng import generator
from hpcgnn.sampling import steps_per_epoch
from hpcgnn.sampling import subgraph as sub
from hpcgnn.specs import load, samplers
from hpcgnn.stores.base import fanouts, on_local_rank0

log = logging.getLogger(__name__)


@dataclass
class Prepared:
    """What a rank's training sampler draws from, decided before the first batch (collective)."""

    items: Tensor  # what a step's seeds are drawn from (nodes, clusters, draws)
    items_per_step: int
    steps: int  # batches per epoch, equal on every rank
    arrays: dict[str, Tensor] = field(default_factory=dict)  # decided together: build() takes them (servers too)
    seed_cost: Tensor | None = None  # an edge budget's: each node's expected sampled edges


def prepare(cfg: RunConfig, env: RankEnv, g: Graph) -> Prepared:
    """``train.sampler``'s items, steps and arrays over the whole graph ``g`` (collective)."""
    return load(samplers.SPECS[cfg.train.sampler].prepare)(cfg, env, g)


def build(cfg: RunConfig, g: Graph, node_sampler, arrays: dict[str, Tensor]):
    """``train.sampler`` over ``g`` from the arrays its ``prepare`` decided (``node_sampler``: the neighbour
    sampler, evaluation's); its batches carry their edges' ids where the neighbour sampler's do."""
    s = load(samplers.SPECS[cfg.train.sampler].build)(cfg, g, node_sampler, arrays)
    if s is not node_sampler:
        s.edge_ids = node_sampler.edge_ids
    return s


# ---------------------------------------------------------------------- prepare: each sampler's


def prepare_seeds(cfg: RunConfig, env: RankEnv, g: Graph) -> Prepared:
    """Training nodes, ``train.batch_size`` to a step; with ``train.edge_budget``, cut by their sampling cost."""
    t, world, n_train = cfg.train, env.world_size, g.train_idx.numel()
    if not t.edge_budget:
        return Prepared(g.train_idx, t.batch_size, steps_per_epoch(n_train, world, t.batch_size))
    cost = sub.expected_edges(g.rowptr, g.col, t.fanouts)
    total = float(cost.index_select(0, g.train_idx).double().sum())
    steps = sub.batches_for_budget(total, world, t.edge_budget, math.ceil(n_train / world))
    return Prepared(g.train_idx, t.batch_size, steps, seed_cost=cost)


def prepare_draws(cfg: RunConfig, env: RankEnv, g: Graph) -> Prepared:
    """GraphSAINT's node or edge draws: a step draws afresh, as many steps as neighbour sampling would take."""
    steps = steps_per_epoch(g.train_idx.numel(), env.world_size, cfg.train.batch_size)
    return Prepared(torch.arange(steps * env.world_size), 1, steps)


def prepare_walks(cfg: RunConfig, env: RankEnv, g: Graph) -> Prepared:
    """GraphSAINT's random walks from the step's seeds, and each node's inclusion probability, counted by the ranks
    together (the pre-sampling shared out over them)."""
    t, world, n = cfg.train, env.world_size, g.num_nodes
    total = math.ceil(t.saint_coverage * n / (t.batch_size * (len(t.fanouts) + 1)))
    mine = math.ceil(total / world)
    walker = sub.SaintWalkSampler(g.rowptr, g.col, g.train_idx, len(t.fanouts))
    counts = walker.count_inclusion(t.batch_size, mine, generator(t.seed, "saint_rw_inclusion", env.rank))
    inclusion = dist.all_reduce_sum(counts) / (mine * world)
    return Prepared(g.train_idx, t.batch_size, steps_per_epoch(g.train_idx.numel(), world, t.batch_size),
                    {"inclusion": inclusion})


def prepare_clusters(cfg: RunConfig, env: RankEnv, g: Graph) -> Prepared:
    """Cluster-GCN's METIS clusters of the whole graph, ``train.clusters_per_batch`` to a step."""
    t, n = cfg.train, g.num_nodes
    num = t.num_clusters or t.clusters_per_batch * math.ceil(g.train_idx.numel() / t.batch_size)
    if num > n:
        raise ConfigError(f"train.num_clusters={num} exceeds the graph's {n} nodes: lower train.num_clusters "
                          "or raise train.batch_size")
    clusters = cluster_assignment(cfg, env, g, num)
    return Prepared(torch.arange(num), t.clusters_per_batch, steps_per_epoch(num, env.world_size, t.clusters_per_batch),
                    {"clusters": clusters})


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


# ---------------------------------------------------------------------- build: each sampler's


def build_neighbor(cfg: RunConfig, g: Graph, node_sampler, arrays: dict):
    return node_sampler


def build_ladies(cfg: RunConfig, g: Graph, node_sampler, arrays: dict):
    return sub.LadiesSampler(g.rowptr, g.col, fanouts(cfg))


def _saint_draws(g: Graph, cfg: RunConfig, per_draw: int) -> int:
    """Draws per subgraph, sized so that it holds about ``train.batch_size`` training nodes."""
    return math.ceil(cfg.train.batch_size * g.num_nodes / (g.train_idx.numel() * per_draw))


def build_saint_node(cfg: RunConfig, g: Graph, node_sampler, arrays: dict):
    return sub.SaintNodeSampler(g.rowptr, g.col, g.train_idx, _saint_draws(g, cfg, 1))


def build_saint_edge(cfg: RunConfig, g: Graph, node_sampler, arrays: dict):
    return sub.SaintEdgeSampler(g.rowptr, g.col, g.train_idx, _saint_draws(g, cfg, 2))


def build_saint_rw(cfg: RunConfig, g: Graph, node_sampler, arrays: dict):
    s = sub.SaintWalkSampler(g.rowptr, g.col, g.train_idx, len(cfg.train.fanouts))
    s.inclusion = arrays["inclusion"]
    return s


def build_cluster(cfg: RunConfig, g: Graph, node_sampler, arrays: dict):
    return sub.ClusterSampler(g.rowptr, g.col, g.train_idx, arrays["clusters"])
