"""What a rank trains on: the whole graph (replicated) or its own parts (partitioned).

A store hands out loaders, the only way batches are made:

- ``train_loader(epoch, start_step, transform)``: this rank's batches of one epoch, ``steps``
  of them (equal on all ranks: DDP's all-reduce and the partitioned sampler's exchanges
  need it), each sampled with a generator seeded per (seed, epoch, rank, step), from step
  ``start_step`` on (an exact resume), prefetched in a background thread, on the device;
  ``loader.sizes`` weighs each step's loss;
- ``eval_loader(split, transform)``: this rank's share of a split (padded with empty
  batches where the others need this rank's exchanges);
- ``counters()``: a snapshot of the communication counters (partitioned), never reset.

Both stores also give the model's dimensions, every node's in-degree (``degree``, by
global id), and the bytes they hold.
"""

from __future__ import annotations

import abc
import logging
import math
import time

import numpy as np
import torch
from torch import Tensor

from hpcgnn import dist
from hpcgnn.checks import is_typed
from hpcgnn.config import RunConfig
from hpcgnn.data import (
    Graph,
    cache,
    cache_folder,
    open_graph,
    open_link,
    open_link_splits,
    open_typed,
    prepare,
)
from hpcgnn.env import RankEnv
from hpcgnn.errors import AllocationError, AnotherRankFailed, ConfigError, DatasetError, PartitionError
from hpcgnn.io import write_npy
from hpcgnn.models import uses_edges
from hpcgnn.rng import derive_seed, generator
from hpcgnn.sampling import BatchLoader, CSRNeighborSampler, PrefetchLoader, rank_seeds, steps_per_epoch
from hpcgnn.sampling import subgraph as sub
from hpcgnn.sampling.distributed import CommStats
from hpcgnn.sampling.link import LinkSampler, csr_has_edge, pair_sampler, share


def owned_has_edge(view):
    """Edge membership where this rank holds the target's row (its own nodes); False elsewhere. Enough for
    strict negatives of an owned source on an undirected graph: its neighbours are its in-neighbours."""
    parts = view.parts
    has = csr_has_edge(parts.rowptr, parts.col)

    def has_edge(src: Tensor, dst: Tensor) -> Tensor:
        out = torch.zeros(dst.numel(), dtype=torch.bool)
        owned = view.owner(dst) == view.rank
        if bool(owned.any()):
            out[owned] = has(src[owned], view.row(dst[owned]))
        return out

    return has_edge

log = logging.getLogger(__name__)


def on_local_rank0(env: RankEnv, what: str, fn) -> None:
    """Run ``fn()`` on every node's local rank 0 while the other ranks wait.

    A failure there fails every rank at once instead of leaving them in a barrier.
    """
    error: Exception | None = None
    if env.local_rank == 0:
        try:
            fn()
        except Exception as exc:  # reported below, after the others heard of it
            error = exc
    failed = dist.all_reduce_max(torch.tensor([0 if error is None else 1]))
    if error is not None:
        raise error
    if int(failed.item()):
        raise AnotherRankFailed(f"rank {env.rank}: a node's local rank 0 failed to {what} (see its error)")


def require_training_items(cfg: RunConfig, count: int, what: str) -> None:
    """A dataset whose training split is empty cannot train: say so before the loaders find nothing to share out."""
    if count < 1:
        raise DatasetError(f"dataset {cfg.dataset.name} has no training {what}: nothing to train on. HINT: a larger "
                           "graph (dataset.num_nodes), a larger training split (dataset.train_fraction or "
                           "dataset.edge_split), or a files folder whose training split is not empty")


def open_shared_graph(cfg: RunConfig, env: RankEnv) -> Graph:
    """One graph copy per node: local rank 0 prepares the cache if needed, then every rank maps it.

    The mapped pages live once in the node's page cache, however many ranks map them.
    """
    # prepare() never downloads: that is `python -m hpcgnn.data prepare`'s job
    on_local_rank0(env, f"prepare {cfg.dataset.name}", lambda: prepare(cfg.dataset))
    return open_graph(cfg.dataset)


def cluster_assignment(cfg: RunConfig, env: RankEnv, graph: Graph, num_clusters: int) -> Tensor:
    """Cluster-GCN's METIS clusters of the whole graph, computed once per node and cached beside it."""
    from hpcgnn.partition import compute_parts

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


def fanouts(cfg: RunConfig) -> tuple[int, ...]:
    """Hops to sample: ``train.fanouts``, or none for a model that reads no edges."""
    return tuple(cfg.train.fanouts) if uses_edges(cfg.model) else ()


def graph_on(cfg: RunConfig, env: RankEnv, device: torch.device, graph_bytes: int) -> str:
    """Where a replicated rank samples and gathers: ``train.graph_on``, with ``auto`` resolved.

    ``auto`` picks the GPU when the rank trains on one, the sampler and task run there
    (``sampler=neighbor``, node classification) and the ranks sharing that GPU together
    hold at most ``train.graph_on_fraction`` of its memory; the host otherwise.
    """
    t = cfg.train
    if t.graph_on != "auto":
        return t.graph_on
    if device.type != "cuda" or t.sampler != "neighbor" or cfg.task.name != "node":
        return "host"
    sharing = env.local_world_size if torch.cuda.device_count() < env.local_world_size else 1
    total = torch.cuda.get_device_properties(device).total_memory
    fits = graph_bytes * sharing <= t.graph_on_fraction * total
    log.info("train.graph_on=auto: the graph takes %.1f GB x %d rank(s) of the GPU's %.1f GB: sampling on the %s",
             graph_bytes / 1e9, sharing, total / 1e9, "device" if fits else "host")
    return "device" if fits else "host"


class Store(abc.ABC):
    """What both stores share: how a loader is assembled from a rank's batches."""

    mode: str
    steps: int
    weigh_by_seeds: bool = True
    link = None  # a link task's splits (LinkData), else None
    graph_on = "host"  # where batches are made: host, or device (a replicated graph copied to the GPU)
    typed = False  # batches are HeteroData (a typed graph); then ``schema`` holds its types and relations
    schema = None

    def __init__(self, cfg: RunConfig, env: RankEnv, device: torch.device):
        self.cfg, self.env, self.device = cfg, env, device

    @abc.abstractmethod
    def train_batches(self, epoch: int) -> list[Tensor]:
        """This rank's batches of seeds (items) for ``epoch``: ``steps`` of them."""

    def train_loader(self, epoch: int, start_step: int = 0, transform=None):
        """This rank's batches of ``epoch`` from ``start_step`` on, on the device, prefetched."""
        t = self.cfg.train
        loader = BatchLoader(self.features, self.train_sampler, self.train_batches(epoch),
                             batch_seed=derive_seed(t.seed, "train", epoch, self.env.rank), start=start_step,
                             num_batches=self.steps, device=self.device, pin_memory=self.device.type == "cuda",
                             transform=transform, weigh_by_seeds=self.weigh_by_seeds)
        return PrefetchLoader(loader, t.prefetch) if t.prefetch else loader

    def eval_loader(self, split: str, transform=None) -> BatchLoader:
        """This rank's share of ``split`` in batches of ``train.eval_batch_size`` (link: pairs to score)."""
        t = self.cfg.train
        seeds, num_batches = self.eval_seeds(split)
        sampler = self.sampler if self.link is None else pair_sampler(self.sampler, self.link.split(split))
        return BatchLoader(self.features, sampler, seeds, self.eval_batch_size(split),
                           batch_seed=derive_seed(t.seed, "eval", split, self.env.rank), num_batches=num_batches,
                           device=self.device, pin_memory=self.device.type == "cuda", transform=transform)

    @abc.abstractmethod
    def eval_seeds(self, split: str) -> tuple[Tensor, int | None]:
        """This rank's share of ``split`` and the batch count to pad to (None: no padding needed)."""

    def eval_batch_size(self, split: str) -> int:
        """Items per evaluation batch: ``train.eval_batch_size`` seeds, or pairs (a positive with K candidate
        targets counts 1 + K)."""
        s = self.link.split(split) if self.link is not None else None
        per_item = 1 + s.neg.size(1) if s is not None and s.neg_kind == "targets" else 1
        return max(1, self.cfg.train.eval_batch_size // per_item)

    def eval_items(self, split: str) -> Tensor:
        """This rank's contiguous share of a link split's items: its pairs (positives first), or its
        positives, each with its candidate targets."""
        s = self.link.split(split)
        total = s.pos.size(1) + (s.neg.size(1) if s.neg_kind == "pairs" else 0)
        lo, hi = share(total, self.env.rank, self.env.world_size)
        return torch.arange(lo, hi)

    def _link_sampler(self, node_sampler, train_pos: Tensor, has_edge) -> LinkSampler:
        k = self.cfg.task
        return LinkSampler(node_sampler, train_pos, self.num_nodes, k.negatives, k.num_negatives, k.neg_retries,
                           k.form, has_edge=has_edge, drop_targets=k.target_edges == "drop")

    def counters(self) -> CommStats:
        return CommStats()


class ReplicatedStore(Store):
    """Every rank maps the whole prepared graph; seeds (nodes, or edges for link prediction) are split across ranks."""

    mode = "replicated"

    def __init__(self, cfg: RunConfig, env: RankEnv, device: torch.device | None = None):
        super().__init__(cfg, env, device or torch.device("cpu"))
        self.graph = g = open_shared_graph(cfg, env)
        self.link = open_link(cfg.dataset) if cfg.dataset.prepared_for == "link" else None
        self.features = g
        self.degree = g.degree()
        self.num_nodes = g.num_nodes
        self.sampler = CSRNeighborSampler(g.rowptr, g.col, fanouts(cfg))  # evaluation, and training by default
        self.num_features, self.num_classes = g.num_features, g.num_classes
        self.seed_cost: Tensor | None = None
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
        require_training_items(cfg, g.train_idx.numel(), "nodes")
        self.steps = steps_per_epoch(g.train_idx.numel(), env.world_size, cfg.train.batch_size)
        self.graph_on = graph_on(cfg, env, self.device, self.resident_bytes())
        if self.graph_on == "device":  # sampled and gathered where the model runs: no copy per step
            t0 = time.perf_counter()
            self.features = on_device = g.to(self.device)
            self.sampler = CSRNeighborSampler(on_device.rowptr, on_device.col, fanouts(cfg))
            log.info("graph copied to %s in %.1f s: sampling and gathering there (%.0f MB)", self.device,
                     time.perf_counter() - t0, self.resident_bytes() / 2**20)
        self.train_sampler, self.items, self.items_per_step = self.sampler, g.train_idx, cfg.train.batch_size
        self._setup_sampler()
        log.info("graph: %d nodes, %d edges, %d features, %d classes, %d/%d/%d train/val/test", g.num_nodes,
                 g.num_edges, g.num_features, g.num_classes, g.train_idx.numel(), g.val_idx.numel(),
                 g.test_idx.numel())

    def _setup_sampler(self) -> None:
        """The training sampler of ``train.sampler``, what its steps draw from, and the steps per epoch."""
        t, g, env = self.cfg.train, self.graph, self.env
        n, n_train, world = g.num_nodes, g.train_idx.numel(), env.world_size
        if t.sampler == "ladies":
            self.train_sampler = sub.LadiesSampler(g.rowptr, g.col, fanouts(self.cfg))
        elif t.sampler in ("saint_node", "saint_edge"):
            # Sized so that a subgraph holds about batch_size training nodes; a step draws afresh.
            cls, per_draw = (sub.SaintNodeSampler, 1) if t.sampler == "saint_node" else (sub.SaintEdgeSampler, 2)
            self.train_sampler = cls(g.rowptr, g.col, g.train_idx, math.ceil(t.batch_size * n / (n_train * per_draw)))
            self.items, self.items_per_step = torch.arange(self.steps * world), 1
        elif t.sampler == "saint_rw":  # the step's seeds are the walks' roots
            s = self.train_sampler = sub.SaintWalkSampler(g.rowptr, g.col, g.train_idx, len(t.fanouts))
            total = math.ceil(t.saint_coverage * n / (t.batch_size * (len(t.fanouts) + 1)))
            mine = math.ceil(total / world)  # the pre-sampling is shared out over the ranks
            counts = s.count_inclusion(t.batch_size, mine, generator(t.seed, "saint_rw_inclusion", env.rank))
            s.inclusion = dist.all_reduce_sum(counts) / (mine * world)
        elif t.sampler == "cluster":
            num = t.num_clusters or t.clusters_per_batch * math.ceil(n_train / t.batch_size)
            if num > n:
                raise ConfigError(f"train.num_clusters={num} exceeds the graph's {n} nodes: lower train.num_clusters "
                                  "or raise train.batch_size")
            self.train_sampler = sub.ClusterSampler(g.rowptr, g.col, g.train_idx,
                                                    cluster_assignment(self.cfg, env, g, num))
            self.items, self.items_per_step = torch.arange(num), t.clusters_per_batch
            self.steps = steps_per_epoch(num, world, t.clusters_per_batch)
        if t.edge_budget:
            self.seed_cost = sub.expected_edges(g.rowptr, g.col, t.fanouts)
            total_cost = float(self.seed_cost.index_select(0, g.train_idx).double().sum())
            self.steps = sub.batches_for_budget(total_cost, world, t.edge_budget, math.ceil(n_train / world))
        # Subgraph batches are each a whole estimate of the mean loss: weigh steps by batches, not seeds.
        self.weigh_by_seeds = not isinstance(self.train_sampler, sub.SubgraphSampler)

    def train_seeds(self, epoch: int) -> Tensor:
        """This rank's seeds (items) for one epoch, in order (shuffled alike on every rank, then shared out)."""
        return rank_seeds(self.items, self.env.world_size, self.env.rank, generator(self.cfg.train.seed, "epoch", epoch))

    def train_batches(self, epoch: int) -> list[Tensor]:
        """This rank's batches for one epoch: ``steps`` of them (the last ones may be short)."""
        seeds = self.train_seeds(epoch)
        if self.seed_cost is not None:
            return sub.split_by_cost(seeds, self.seed_cost.index_select(0, seeds), self.steps)
        return list(seeds.split(self.items_per_step))

    def eval_seeds(self, split: str) -> tuple[Tensor, int | None]:
        """This rank's share of ``split`` and the batch count to pad to (None: no padding needed).

        Link splits: a contiguous range of the split's items (pairs, or positives with their candidates).
        """
        if self.link is not None:
            return self.eval_items(split), None
        return getattr(self.graph, f"{split}_idx")[self.env.rank::self.env.world_size], None

    def resident_bytes(self) -> int:
        g = self.graph
        return sum(t.numel() * t.element_size() for t in (g.rowptr, g.col, g.x, g.y))


class PartitionedStore(Store):
    """Each rank holds its parts; remote neighbours and features travel over a second process group."""

    mode = "partitioned"

    def __init__(self, cfg: RunConfig, env: RankEnv, device: torch.device | None = None):
        from hpcgnn.partition import open_parts
        from hpcgnn.sampling import distributed as d

        super().__init__(cfg, env, device or torch.device("cpu"))
        g, t = cfg.graph, cfg.train
        num_parts = g.num_parts or env.world_size
        if num_parts % env.world_size:  # the config check knew only the configured world size
            raise AllocationError(f"graph.num_parts={num_parts} cannot be shared by the {env.world_size} ranks started. "
                                  f"HINT: use a multiple of {env.world_size}, or graph.num_parts=0 (one part per rank)")
        per_rank = num_parts // env.world_size
        owned = list(range(env.rank * per_rank, (env.rank + 1) * per_rank))
        self.parts = parts = open_parts(cfg.dataset, g, num_parts, owned)
        self.stats_ = d.CommStats()
        self.exchange = d.Exchange(dist.new_group(cfg.dist), env.rank, env.world_size, dist.comm_device(), self.stats_)
        self.view = d.PartitionView(parts, env.rank, per_rank)
        self.degree = parts.degree
        self.num_nodes = parts.num_nodes
        self.weigh_by_seeds = True
        self.num_features, self.num_classes = parts.num_features, parts.num_classes
        # Link prediction: a rank's training edges are those whose source it owns; their endpoints, like any
        # other node, are sampled and fetched wherever they live. Evaluation reads the splits' (small) arrays.
        self.link = open_link_splits(cfg.dataset) if cfg.dataset.prepared_for == "link" else None
        # The rank's rows of other ranks' nodes (the hot-node cache, over every node type) and where they come from.
        self.cache = self.features = d.PartitionedFeatures(self.view, self.exchange, labels=self.link is None)
        self.seed_offset = 0  # global id -> sampler seed (a typed graph's sampler takes target-type ids)
        if parts.typed is not None:  # batches are HeteroData; seeds are the target type's own ids
            from hpcgnn.sampling.typed import PartitionedTypedFeatures, PartitionedTypedSampler

            self.typed, self.schema = True, parts.typed.schema
            self.seed_offset = self.schema.offsets()[self.schema.target]
            self.sampler = PartitionedTypedSampler(self.view, typed_fanouts(cfg, self.schema), self.exchange,
                                                   g.boundary_fraction)
            self.features = PartitionedTypedFeatures(self.cache, self.sampler)
        else:
            self.sampler = d.PartitionedNeighborSampler(self.view, fanouts(cfg), self.exchange, g.boundary_fraction)
        self.train_sampler = self.sampler
        own = parts.train_idx.numel() if self.link is None else parts.train_pos.size(1)
        if self.link is not None:
            self.train_sampler = self._link_sampler(self.sampler, parts.train_pos, owned_has_edge(self.view))
        most, fewest = dist.all_reduce_max(torch.tensor([own, -own])).tolist()
        if -fewest == 0:  # decided together: one rank failing alone would leave the others in an exchange
            raise PartitionError(f"a rank owns no training {'nodes' if self.link is None else 'edges'} in the "
                                 f"{num_parts}-part partition. HINT: use fewer parts, or graph.balance_train=true "
                                 "with graph.method=metis")
        self.seeds_per_rank = most
        self.steps = math.ceil(self.seeds_per_rank / t.batch_size)
        self.row_cost: Tensor | None = None
        if t.edge_budget:  # as many steps as the rank with the costliest seeds needs, on every rank
            self.row_cost = sub.expected_edges_of_rows(parts.rowptr, parts.col, parts.degree, t.fanouts)
            own = self.row_cost.index_select(0, self._rows(parts.train_idx)).double()
            need = sub.batches_for_budget(float(own.mean()) * self.seeds_per_rank, 1, t.edge_budget, self.seeds_per_rank)
            self.steps = int(dist.all_reduce_max(torch.tensor([need])).item())
        if g.cache_mb > 0:
            budget = int(g.cache_mb * 2**20) // (parts.num_features * parts.x.element_size() + 8)
            gen = generator(t.seed, "cache_warmup", env.rank)
            warm = self.train_seeds(0).split(t.batch_size)[: g.warmup_batches]
            if self.link is not None:  # the warm-up samples around the edges' endpoints
                warm = [torch.unique(parts.train_pos[:, ids].reshape(-1)) for ids in warm]
            warm = list(warm) + [warm[0][:0]] * (g.warmup_batches - len(warm))
            ids = d.hot_nodes(self.view, budget, g.cache_policy, self.sampler, warm, gen)
            self.cache.fill_cache(ids)
        log.info("rank %d: parts %s of %d: %d nodes, %d edges, %d train seeds (padded to %d), cache %s rows "
                 "(%s), holds %s", env.rank, owned, num_parts, parts.nodes.numel(), parts.col.numel(),
                 own, self.seeds_per_rank, self.cache.cache_ids.numel(), g.cache_policy,
                 cache.human_bytes(self.resident_bytes()))
        if self.typed:
            off, cached = self.schema.offsets(), self.cache.cache_ids
            log.info("rank %d: cached rows by node type: %s", env.rank,
                     {t: int(((cached >= off[t]) & (cached < off[t] + n)).sum()) for t, n in self.schema.num_nodes.items()})

    def train_seeds(self, epoch: int) -> Tensor:
        """The rank's own training seeds (nodes; link: ids of its edges), shuffled and padded (wrapping) to
        the largest rank's count."""
        own = self.parts.train_idx - self.seed_offset if self.link is None else torch.arange(self.parts.train_pos.size(1))
        order = own[torch.randperm(own.numel(), generator=generator(self.cfg.train.seed, "epoch", epoch))]
        return order.repeat(math.ceil(self.seeds_per_rank / max(own.numel(), 1)))[: self.seeds_per_rank]

    def _rows(self, ids: Tensor) -> Tensor:
        """Rows of owned nodes (global ``ids``) in this rank's CSR."""
        p = self.parts
        return p.part_offset.index_select(0, p.node_part.index_select(0, ids).long()) + \
            p.node_local.index_select(0, ids).long()

    def train_batches(self, epoch: int) -> list[Tensor]:
        seeds = self.train_seeds(epoch)
        if self.row_cost is not None:
            return sub.split_by_cost(seeds, self.row_cost.index_select(0, self._rows(seeds)), self.steps)
        return list(seeds.split(self.cfg.train.batch_size))

    def eval_seeds(self, split: str) -> tuple[Tensor, int | None]:
        """This rank's share of ``split`` and the batch count every rank walks (the most any rank needs)."""
        mine = self.eval_items(split) if self.link is not None else getattr(self.parts, f"{split}_idx") - self.seed_offset
        batches = math.ceil(mine.numel() / self.eval_batch_size(split))
        return mine, int(dist.all_reduce_max(torch.tensor([batches])).item())

    def counters(self) -> CommStats:
        """A snapshot of the communication counters (subtract two for what happened between them)."""
        return self.stats_.snapshot()

    def resident_bytes(self) -> int:
        return self.parts.nbytes() + self.cache.cache_bytes()


def typed_fanouts(cfg: RunConfig, graph) -> dict:
    """Each relation's fanouts: ``train.fanouts``, or its entry in ``train.relation_fanouts``; ``graph``:
    anything with the relations (a TypedGraph, a TypedSchema)."""
    from hpcgnn.data.typed import relation_key

    t = cfg.train
    known = {relation_key(r): r for r in graph.relations}
    unknown = sorted(set(t.relation_fanouts) - set(known))
    if unknown:
        raise ConfigError(f"train.relation_fanouts names {', '.join(unknown)}, not a relation of {cfg.dataset.name}. "
                          f"HINT: use {', '.join(known)}")
    out = {r: tuple(int(f) for f in t.relation_fanouts.get(k, t.fanouts)) for k, r in known.items()}
    bad = [k for k, r in known.items() if len(out[r]) != len(t.fanouts)]
    if bad:
        raise ConfigError(f"train.relation_fanouts: {', '.join(bad)} need {len(t.fanouts)} hops like train.fanouts")
    return out


class TypedStore(Store):
    """A typed graph, whole on every rank (one mapped copy per node); seeds are the target type's
    training nodes, split across ranks as in the replicated store; batches are ``HeteroData``."""

    mode = "replicated"
    typed = True

    def __init__(self, cfg: RunConfig, env: RankEnv, device: torch.device | None = None):
        from hpcgnn.sampling.typed import TypedNeighborSampler

        super().__init__(cfg, env, device or torch.device("cpu"))
        on_local_rank0(env, f"prepare {cfg.dataset.name}", lambda: prepare(cfg.dataset))
        self.graph = self.features = g = open_typed(cfg.dataset)
        self.schema = g.schema
        self.degree = None
        self.num_nodes, self.num_features, self.num_classes = sum(g.num_nodes.values()), g.num_features, g.num_classes
        self.graph_on = graph_on(cfg, env, self.device, self.resident_bytes())
        if self.graph_on == "device":  # sampled and gathered where the model runs
            t0 = time.perf_counter()
            self.features = g.to(self.device)
            log.info("typed graph copied to %s in %.1f s: sampling and gathering there (%.0f MB)", self.device,
                     time.perf_counter() - t0, self.resident_bytes() / 2**20)
        self.sampler = self.train_sampler = TypedNeighborSampler(self.features, typed_fanouts(cfg, g))
        require_training_items(cfg, g.train_idx.numel(), f"{g.target} nodes")
        self.steps = steps_per_epoch(g.train_idx.numel(), env.world_size, cfg.train.batch_size)
        log.info("typed graph: %s nodes; %s edges; target %s: %d features, %d classes, %d/%d/%d train/val/test; "
                 "features of %s", g.num_nodes, {"__".join(r): g.num_edges(r) for r in g.relations}, g.target,
                 g.num_features, g.num_classes, g.train_idx.numel(), g.val_idx.numel(), g.test_idx.numel(),
                 {t: rule for t, rule in g.feature_rule.items() if rule != "given"})

    def train_batches(self, epoch: int) -> list[Tensor]:
        g, t = self.graph, self.cfg.train
        seeds = rank_seeds(g.train_idx, self.env.world_size, self.env.rank, generator(t.seed, "epoch", epoch))
        return list(seeds.split(t.batch_size))

    def eval_seeds(self, split: str) -> tuple[Tensor, int | None]:
        return getattr(self.graph, f"{split}_idx")[self.env.rank::self.env.world_size], None

    def resident_bytes(self) -> int:
        g = self.graph
        tensors = [*g.rowptr.values(), *g.col.values(), *g.x.values(), g.y]
        return sum(t.numel() * t.element_size() for t in tensors)


def open_store(cfg: RunConfig, env: RankEnv, device: torch.device | None = None) -> Store:
    if is_typed(cfg.dataset) and cfg.graph.mode != "partitioned":
        return TypedStore(cfg, env, device)
    cls = PartitionedStore if cfg.graph.mode == "partitioned" else ReplicatedStore
    return cls(cfg, env, device)
