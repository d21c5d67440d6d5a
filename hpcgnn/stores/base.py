"""The store contract: what a rank holds of the graph, and all a task may ask of it.

A store is the one seam between a graph mode (the whole graph on every rank, a rank's parts; homogeneous
or typed; on the host or the GPU) and a task. It holds the graph and nothing of a task: it opens the task's items
(:mod:`hpcgnn.tasks.items`: what a step's seeds are and the sampler around them) over its graph's views
(:class:`GraphViews`), and shuffles, shares out, pads and loads them. A task never asks which store it holds; it
asks:

- ``shape`` (:class:`GraphShape`): the model's dimensions, and a typed graph's schema;
- ``items``: the task's items, opened over this graph;
- ``degree``: every node's in-degree by global id (batch transforms: GCN's normalisation), or None;
- ``steps``: batches per epoch, equal on every rank (DDP's all-reduce and the exchanges need it);
- ``train_plan(epoch, start_step)``: this rank's batches of an epoch (an :class:`EpochPlan`), each sampled with
  a generator seeded per (seed, epoch, rank, step), from ``start_step`` on (an exact resume); ``plan.sizes``
  weighs each step's loss; ``graph_side()``: what they are made of (the producer that makes them is chosen in
  :mod:`hpcgnn.sampling.producers`);
- ``eval_loader(split, transform)``, ``eval_seeds(split)``: this rank's share of a split in batches
  (padded with empty ones where the other ranks need this rank's exchanges), and which items they are;
- ``exact(model, gcn_norm)``: the model's exact outputs (:class:`~hpcgnn.stores.exact.Exact`),
  and ``check_exact(model_cfg)`` at start, whether they will fit;
- ``counters()`` and ``comm(before)``: what crossed between ranks per batch since a snapshot;
- ``graph_on`` and ``resident_bytes()``: where batches are made, and what the rank holds (the summary).

Adding a store kind adds a subclass here, nothing in the tasks or the trainer.
"""

from __future__ import annotations

import abc
import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from hpcgnn import dist
from hpcgnn.config import ModelConfig, RunConfig
from hpcgnn.data.graph import GraphShape
from hpcgnn.env import RankEnv
from hpcgnn.errors import AnotherRankFailed, ConfigError, DatasetError
from hpcgnn.models import uses_edges
from hpcgnn.rng import derive_seed, generator
from hpcgnn.sampling import BatchLoader, rank_seeds
from hpcgnn.sampling import subgraph as sub
from hpcgnn.sampling.distributed import CommStats
from hpcgnn.sampling.loader import EpochPlan
from hpcgnn.sampling.producers import GraphSide
from hpcgnn.sampling.shipping import SamplerState
from hpcgnn.stores.exact import Exact

log = logging.getLogger(__name__)


@dataclass
class GraphViews:
    """What a task's items (:mod:`hpcgnn.tasks.items`) read of the graph a rank holds, or a sampler server opened,
    whichever its mode: its dimensions, whether it is whole on the rank, and views into it."""

    num_features: int
    num_classes: int
    num_nodes: int  # of every type (a typed graph)
    labels: dict | None  # the graph's labels' profile (:func:`hpcgnn.labels.resolve` reads it)
    schema: object | None  # a typed graph's (TypedSchema)
    edge_dim: int  # its edges' features' width (a typed graph: the widest relation's)
    whole: bool  # every rank holds the whole graph (items are shared out), or its own parts (it owns some)
    has_edge: Callable[[], Callable] | None = None  # a homogeneous graph's membership test (made on first ask)
    row_starts: Callable[[Tensor], Tensor] | None = None  # nodes -> the ids of their CSR rows' first edges
    owns: Callable[[Tensor], Tensor] | None = None  # global node ids -> bool: the rank's own (parts)
    link_train: Tensor | None = None  # a link graph's training positives the rank owns (parts; whole: None)
    link_train_time: Tensor | None = None  # ... and their times (a timed graph's; None: none, or a whole graph)
    typed: object | None = None  # a typed graph's CSRs by relation (the graph, or the rank's typed parts)
    typed_rows: Callable[[str, Tensor], Tensor] | None = None  # (node type, its ids) -> rows of ``typed``'s CSRs
    edge_rows: object | None = None  # where edges' features are read by id (gather_edges)
    time_dtype: object | None = None  # a timed graph's edge times' dtype (None: its edges have no times)
    graph_set: object | None = None  # a dataset of many graphs (hpcgnn.data.graphs.GraphSet): its graphs are the items


class Store(abc.ABC):
    """What a rank holds and the batches it hands out (see the module for the contract)."""

    steps: int
    shape: GraphShape
    seeds_unit = "seeds"  # what a step's items are, as the throughput's word (seeds/s; a graph set's: graphs/s)
    features: object  # what batches' rows are gathered from (the graph, its copy on the GPU, the parts and cache)
    sampler: object  # evaluation's sampler (and training's, unless train_sampler differs)
    train_sampler: object
    items: object  # the task's items (hpcgnn.tasks.items): what a step's seeds are, the samplers around them
    degree: Tensor | None = None
    graph_on = "host"  # where batches are made: host, or device (a replicated graph copied to the GPU)
    weigh_by_seeds: bool = True  # steps' losses weighed by their seeds (subgraph samplers: by batches)
    exchange = None  # a partitioned graph's (its samplers fetch across parts with it); None: a whole graph

    def __init__(self, cfg: RunConfig, env: RankEnv, device: torch.device):
        self.cfg, self.env, self.device = cfg, env, device
        self._node_tables = dist.NodeTables()

    def node_tables(self) -> dist.NodeTables | None:
        """Where exact inference's layer tables come from when every rank is on this node (one copy they all
        map; None: the ranks all-gather theirs): kept from one evaluation to the next where
        ``train.keep_freed_memory`` (no table made or faulted in again), else a pool of its own each time."""
        if not self.env.one_node:
            return None
        return self._node_tables if self.cfg.train.keep_freed_memory else dist.NodeTables()

    # ------------------------------------------------------------------ batches

    @abc.abstractmethod
    def train_batches(self, epoch: int) -> list[Tensor]:
        """This rank's batches of seeds (items) for ``epoch``: ``steps`` of them."""

    def train_plan(self, epoch: int, start_step: int = 0) -> EpochPlan:
        """This rank's batches of ``epoch`` from ``start_step`` on, described once (seeds, each batch's generator
        seed, weights): whichever producer makes them (:mod:`hpcgnn.sampling.producers`) walks this."""
        t = self.cfg.train
        return EpochPlan.cut(self.train_batches(epoch), batch_seed=derive_seed(t.seed, "train", epoch, self.env.rank),
                             start=start_step, num_batches=self.steps, weigh_by_seeds=self.weigh_by_seeds)

    def graph_side(self) -> GraphSide:
        """What this rank's training batches are made of, for the producer that makes them."""
        return GraphSide(self.features, self.train_sampler, self.exchange, self.sampler_state())

    def epoch_in_words(self) -> str:
        """What an epoch's steps are, for the log's start: the graph, the sampler, the steps and their seeds."""
        t = self.cfg.train
        seeds = f"~{t.edge_budget} sampled edges" if t.edge_budget else f"{t.batch_size} seeds"
        return (f"{self.cfg.graph.mode} graph, {t.sampler} sampler on the {self.graph_on}: {self.steps} steps/epoch of "
                f"{seeds} per rank, fanouts {list(t.fanouts)}")

    def step_batch(self) -> tuple[str, int, str]:
        """A rank's batch in the log's words: ("~" where it is about that much, its size, what it counts)."""
        return "", self.cfg.train.batch_size, self.seeds_unit

    def sampler_state(self) -> SamplerState | None:
        """What a sampler server needs, besides the run's config and the graph it opens, to build this rank's
        training sampler as the rank did (its subclass's ``server_side`` builds it); None: servers cannot."""
        return None

    def eval_loader(self, split: str, transform=None) -> BatchLoader:
        """This rank's share of ``split``'s items in batches, sampled as the task's items sample them (nodes: the
        neighbour sampler, ``train.eval_batch_size`` seeds; pairs to score; targets, around both ends)."""
        t, items = self.cfg.train, self.items
        seeds, num_batches = self.eval_seeds(split)
        return BatchLoader(self.features, items.eval_sampler(split, self.sampler), seeds, items.eval_batch_size(split),
                           batch_seed=derive_seed(t.seed, "eval", split, self.env.rank), num_batches=num_batches,
                           device=self.device, pin_memory=self.device.type == "cuda", transform=transform)

    def node_loader(self, split: str, transform=None) -> BatchLoader:
        """This rank's share of a node split (``all``: every node; a link task's too: its encoder's inputs) in
        batches of ``train.eval_batch_size`` seeds, sampled as evaluation samples them (the same seeds)."""
        t = self.cfg.train
        seeds, num_batches = self.node_share(split)
        return BatchLoader(self.features, self.sampler, seeds, t.eval_batch_size,
                           batch_seed=derive_seed(t.seed, "eval", split, self.env.rank), num_batches=num_batches,
                           device=self.device, pin_memory=self.device.type == "cuda", transform=transform)

    def eval_seeds(self, split: str) -> tuple[Tensor, int | None]:
        """This rank's share of ``split``'s items (the task's; nodes: the store's share of them) and the batch count
        to pad to (None: no padding needed)."""
        ids = self.items.eval_ids(split)
        return self.node_share(split) if ids is None else self.padded(ids, self.items.eval_batch_size(split))

    def padded(self, ids: Tensor, batch_size: int) -> tuple[Tensor, int | None]:
        """This rank's ``ids`` and the batch count every rank walks in batches of ``batch_size`` (None: a whole
        graph's ranks need no padding: none waits on another's exchanges)."""
        return ids, None

    @abc.abstractmethod
    def node_share(self, split: str) -> tuple[Tensor, int | None]:
        """This rank's share of a node split (``all``: of every node; a typed graph: of its labelled type), in the
        task's ids, and the batch count to pad to (None: no padding needed)."""

    def open_items(self, items, views: GraphViews) -> None:
        """The task's items over this store's graph (``items``: their unit's class), and the model's dimensions."""
        self.items = items(self.cfg, self.env, views)
        self.shape = self.items.shape()

    # ------------------------------------------------------------------ exact outputs

    @abc.abstractmethod
    def exact(self, model: torch.nn.Module, gcn_norm: bool = False, layers: int | None = None,
              on_layer=None) -> Exact:
        """``model``'s outputs with every node's full neighbourhood (collective). ``gcn_norm``: the model is
        normalised as GCN by the whole graph's degrees (the store's, :attr:`degree`). ``layers``: the
        output of that many layers (an embedding: all but the last); None: the model's. ``on_layer(i, of)``:
        called as each layer ends."""

    def check_exact(self, model_cfg: ModelConfig) -> None:
        """At start, together: fail now, naming the fix, when exact outputs would not fit in memory (a whole
        graph's always do: its ranks hold it already, and a layer's outputs are its size)."""
        return None

    # ------------------------------------------------------------------ what it cost and holds

    def counters(self) -> CommStats:
        """A snapshot of the communication counters (subtract two for what happened between them)."""
        return CommStats()

    def comm(self, before: CommStats) -> dict:
        """Per batch, what crossed between ranks since ``before`` (remote rows, bytes, cache hits); nothing
        when nothing does."""
        return {}

    @abc.abstractmethod
    def resident_bytes(self) -> int:
        """Bytes of the graph this rank holds (mapped pages shared by a node's ranks count for each)."""


class WholeGraphStore(Store):
    """A graph every rank holds whole: items (seed nodes, or ids of training edges) shuffled alike on every
    rank and shared out, ``items_per_step`` to a batch (or cut by their sampling cost: ``seed_cost``)."""

    draws: Tensor  # what a step's seeds are drawn from (the task's item ids, or the sampler's: nodes, clusters)
    items_per_step: int
    seed_cost: Tensor | None = None
    graph = None

    def train_seeds(self, epoch: int) -> Tensor:
        """This rank's seeds (items) for one epoch, in order (shuffled alike on every rank, then shared out)."""
        return rank_seeds(self.draws, self.env.world_size, self.env.rank, generator(self.cfg.train.seed, "epoch", epoch))

    def train_batches(self, epoch: int) -> list[Tensor]:
        """This rank's batches for one epoch: ``steps`` of them (the last ones may be short)."""
        seeds = self.train_seeds(epoch)
        if self.seed_cost is not None:
            return sub.split_by_cost(seeds, self.seed_cost.index_select(0, seeds), self.steps)
        return list(seeds.split(self.items_per_step))

    def node_share(self, split: str) -> tuple[Tensor, int | None]:
        """Every world_size-th node of the split."""
        return self._share(split), None

    def _share(self, split: str) -> Tensor:
        """Every world_size-th node of a split (``all``: of every node; a typed graph: of its labelled type)."""
        g = self.graph
        n = g.num_nodes[g.target] if isinstance(g.num_nodes, dict) else g.num_nodes  # (a link graph has no labels)
        ids = torch.arange(n) if split == "all" else getattr(g, f"{split}_idx")
        return ids[self.env.rank::self.env.world_size]

    def _exact(self, table: Tensor) -> Exact:
        """Outputs of every node on every rank: rows are read in place; a split's share is every world_size-th
        of its nodes (as its evaluation batches share it)."""
        g = self.graph

        def split(name: str) -> tuple[Tensor, Tensor]:
            ids = self._share(name)
            return table.index_select(0, ids), labels_of(g.y, ids)

        return Exact(lambda ids: table.index_select(0, ids), split, self._share)


# ---------------------------------------------------------------------- helpers every store kind uses


def labels_of(y: Tensor, rows: Tensor) -> Tensor:
    """``y``'s labels at ``rows``; -1 each where the graph has none (a link task's graph)."""
    return y.index_select(0, rows) if y.numel() else torch.full((rows.numel(),), -1, dtype=torch.long)


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


def fanouts(cfg: RunConfig) -> tuple[int, ...]:
    """Hops to sample: ``train.fanouts``, or none for a model that reads no edges."""
    return tuple(cfg.train.fanouts) if uses_edges(cfg.model) else ()


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


def say_times(cfg: RunConfig, tl, main: bool) -> None:
    """What the log says of a graph whose edges have times (``tl``: its timeline, a whole graph's, a rank's parts' or
    a typed graph's relation's; None: no times): sampled as of each seed's time (and how), or, with
    ``time.respect=false``, that every edge is seen, future ones too."""
    tc = cfg.time
    if tl is None:
        return
    if not tc.respect:
        if main:
            log.warning("the graph's edges have times, and time.respect=false: each seed's neighbourhood takes every edge, "
                        "those after the seed's time too (a model may learn from the future, and its metrics say so)")
        return
    if tc.window is not None and not tl.time.is_floating_point() and tc.window != int(tc.window):
        raise ConfigError(f"time.window={tc.window:g}: the graph's edge times are integers. HINT: a whole number of "
                          f"their unit, e.g. time.window={int(tc.window)}")
    window = f"edges at most {tc.window:g} older than their seed" if tc.window is not None else "edges of any age"
    if main:
        log.info("the graph's edges have times (%s): each seed's neighbourhood as of its own time (%s, %s), a tree per "
                 "seed", tl.time.dtype, "uniform among them" if tc.strategy == "uniform" else "the most recent",
                 window)
