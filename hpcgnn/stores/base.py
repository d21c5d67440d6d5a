"""The store contract: what a rank holds of the graph, and all a task may ask of it.

A store is the one seam between a graph mode (the whole graph on every rank, a rank's parts; homogeneous
or typed; on the host or the GPU) and a task. A task never asks which one it holds; it asks:

- ``shape`` (:class:`GraphShape`): the model's dimensions, and a typed graph's schema;
- ``degree``: every node's in-degree by global id (batch transforms: GCN's normalisation), or None;
- ``link``: a link task's splits (:class:`~hpcgnn.data.link.LinkData`), or None;
- ``steps``: batches per epoch, equal on every rank (DDP's all-reduce and the exchanges need it);
- ``train_plan(epoch, start_step)``: this rank's batches of an epoch (an :class:`EpochPlan`), each sampled with
  a generator seeded per (seed, epoch, rank, step), from ``start_step`` on (an exact resume); ``plan.sizes``
  weighs each step's loss; ``graph_side()``: what they are made of (the producer that makes them is chosen in
  :mod:`hpcgnn.sampling.producers`);
- ``eval_loader(split, transform)``, ``eval_items(split)``: this rank's share of a split in batches
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
from pathlib import Path

import torch
from torch import Tensor

from hpcgnn import dist
from hpcgnn.config import ModelConfig, RunConfig
from hpcgnn.data.graph import GraphShape
from hpcgnn.env import RankEnv
from hpcgnn.errors import AnotherRankFailed, ConfigError, DatasetError
from hpcgnn.labels import resolve, where_labels
from hpcgnn.models import decoder_reads_edges, edge_features_read, uses_edges
from hpcgnn.rng import derive_seed, generator
from hpcgnn.sampling import BatchLoader, rank_seeds
from hpcgnn.sampling import subgraph as sub
from hpcgnn.sampling.distributed import CommStats
from hpcgnn.sampling.link import LinkSampler, pair_sampler, share
from hpcgnn.sampling.loader import EpochPlan, target_edge_features
from hpcgnn.sampling.producers import GraphSide
from hpcgnn.sampling.shipping import SamplerState
from hpcgnn.stores.exact import Exact

log = logging.getLogger(__name__)


def graph_shape(cfg: RunConfig, num_features: int, num_classes: int, num_nodes: int, labels: dict | None,
                schema=None, edge_dim: int = 0, target_edge_dim: int | None = None) -> GraphShape:
    """The model's dimensions; a node task's outputs those of its target (:func:`hpcgnn.labels.resolve`: the labels'
    kind and ``task.kind``; an edge task's: those of its targets' labels, ``labels``), refused with the fix where they
    are at odds; the width of the edge features the model reads (``edge_dim``: the graph's;
    :func:`hpcgnn.models.edge_features_read`; ``target_edge_dim``: an edge task's target edges' own width where it is not the
    graph's, a typed relation's)."""
    read = edge_features_read(cfg.model, edge_dim, cfg.dataset.name, typed=schema is not None)
    if cfg.task.name not in ("node", "edge"):
        unread_edge_features(cfg, edge_dim, read, schema is not None)
        return GraphShape(num_features, num_classes, num_nodes, schema, edge_dim=read)
    k = cfg.task
    if k.name == "edge":
        from hpcgnn.data.edges import where_targets

        target = resolve(labels, k.kind, k.loss, 0, where_targets(cfg.dataset))
    else:
        target = resolve(labels, k.kind, k.loss, num_classes, where_labels(cfg.dataset))
    pairs = pair_features_read(cfg, edge_dim if target_edge_dim is None else target_edge_dim)
    unread_edge_features(cfg, edge_dim, read, schema is not None, pairs)
    return GraphShape(num_features, target.width, num_nodes, schema, target, read, pairs)


def unread_edge_features(cfg: RunConfig, edge_dim: int, read: int, typed: bool = False, pairs: int = 0) -> None:
    """Says whether the run reads the graph's edge features: which part reads how many (the model, ``read``; an
    edge task's decoder, its targets' own, ``pairs``), or, where nothing does, that they cost nothing (none
    gathered) and what would read them (``typed``: a typed graph's, ``edge_dim`` its widest relation's)."""
    if not edge_dim:
        return
    if read or pairs:
        parts = ([f"the model (model={cfg.model.name}) reads {read} per edge in message passing"] if read else []) + \
            ([f"the decoder (task.decoder={cfg.task.decoder}) reads each target edge's own {pairs}"] if pairs else [])
        log.info("edge features: the graph's edges carry %d; %s", edge_dim, "; ".join(parts))
        return
    readers = [f"model.edge_dim={edge_dim} (gat, gin)"] if not typed else []
    readers.append("a model of your own whose forward takes edge_attr")
    if cfg.task.name == "edge":
        readers.append("task.decoder=concat (the target edges' own)")
    log.info("edge features: the graph's edges carry %d, which nothing in this run reads (model=%s%s); %s would",
             edge_dim, cfg.model.name, f", task.decoder={cfg.task.decoder}" if cfg.task.name == "edge" else "",
             ", ".join(readers[:-1]) + (" or " if len(readers) > 1 else "") + readers[-1])


def pair_features_read(cfg: RunConfig, edge_dim: int) -> int:
    """The width of the target edges' own features an edge task's decoder reads (0: none): ``concat``'s, or a
    decoder of the user's own whose ``forward`` takes ``edge_attr``, on a graph whose edges have ``edge_dim``."""
    if cfg.task.name != "edge" or not edge_dim or not decoder_reads_edges(cfg.task.decoder):
        return 0
    return edge_dim


class Store(abc.ABC):
    """What a rank holds and the batches it hands out (see the module for the contract)."""

    steps: int
    shape: GraphShape
    features: object  # what batches' rows are gathered from (the graph, its copy on the GPU, the parts and cache)
    sampler: object  # evaluation's sampler (and training's, unless train_sampler differs)
    train_sampler: object
    degree: Tensor | None = None
    link = None  # a link task's splits (LinkData), else None
    targets = None  # an edge task's targets (hpcgnn.data.edges.EdgeTargets), else None
    eval_pairs = None  # an edge task's evaluation sampler over target ids (EdgeTargetSampler)
    pair_ids = None  # an edge task whose decoder reads its targets' own features: target ids -> their edges' ids
    edge_rows = None  # where edges' features are read by id (gather_edges): the graph's, or the parts'
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

    def sampler_state(self) -> SamplerState | None:
        """What a sampler server needs, besides the run's config and the graph it opens, to build this rank's
        training sampler as the rank did (its subclass's ``server_side`` builds it); None: servers cannot."""
        return None

    def eval_loader(self, split: str, transform=None) -> BatchLoader:
        """This rank's share of ``split`` in batches of ``train.eval_batch_size`` (link: pairs to score)."""
        t = self.cfg.train
        if self.targets is not None:  # an edge task: its split's targets, their ends' neighbourhoods around them
            seeds, num_batches = self.eval_seeds(split)
            return BatchLoader(self.features, self.eval_pairs, seeds, t.eval_batch_size,
                               batch_seed=derive_seed(t.seed, "eval", split, self.env.rank), num_batches=num_batches,
                               device=self.device, pin_memory=self.device.type == "cuda", transform=transform)
        if self.link is None:
            return self.node_loader(split, transform)
        seeds, num_batches = self.eval_seeds(split)
        return BatchLoader(self.features, pair_sampler(self.sampler, self.link.split(split)), seeds,
                           self.eval_batch_size(split), batch_seed=derive_seed(t.seed, "eval", split, self.env.rank),
                           num_batches=num_batches, device=self.device, pin_memory=self.device.type == "cuda",
                           transform=transform)

    def node_loader(self, split: str, transform=None) -> BatchLoader:
        """This rank's share of a node split (``all``: every node; a link task's too: its encoder's inputs) in
        batches of ``train.eval_batch_size`` seeds, sampled as evaluation samples them (the same seeds)."""
        t = self.cfg.train
        seeds, num_batches = self.node_share(split)
        return BatchLoader(self.features, self.sampler, seeds, t.eval_batch_size,
                           batch_seed=derive_seed(t.seed, "eval", split, self.env.rank), num_batches=num_batches,
                           device=self.device, pin_memory=self.device.type == "cuda", transform=transform)

    def eval_seeds(self, split: str) -> tuple[Tensor, int | None]:
        """This rank's share of ``split`` (link: of its items) and the batch count to pad to (None: no padding
        needed)."""
        return (self.eval_items(split), None) if self.link is not None or self.targets is not None else \
            self.node_share(split)

    @abc.abstractmethod
    def node_share(self, split: str) -> tuple[Tensor, int | None]:
        """This rank's share of a node split (``all``: of every node; a typed graph: of its labelled type), in the
        task's ids, and the batch count to pad to (None: no padding needed)."""

    def eval_batch_size(self, split: str) -> int:
        """Items per evaluation batch: ``train.eval_batch_size`` seeds, or pairs (a positive with K candidate
        targets counts 1 + K)."""
        s = self.link.split(split) if self.link is not None else None
        per_item = 1 + s.neg.size(1) if s is not None and s.neg_kind == "targets" else 1
        return max(1, self.cfg.train.eval_batch_size // per_item)

    def eval_items(self, split: str) -> Tensor:
        """This rank's contiguous share of a link split's items: its pairs (positives first), or its
        positives, each with its candidate targets; an edge task's: the split's target ids."""
        if self.targets is not None:
            ids = self.targets.split(split)
            lo, hi = share(ids.numel(), self.env.rank, self.env.world_size)
            return ids[lo:hi]
        s = self.link.split(split)
        total = s.pos.size(1) + (s.neg.size(1) if s.neg_kind == "pairs" else 0)
        lo, hi = share(total, self.env.rank, self.env.world_size)
        return torch.arange(lo, hi)

    def pair_features(self, items: Tensor) -> Tensor:
        """Targets' own edge features (float32; zeros for a pair that is no edge of the graph), for a decoder that
        reads them; on a partitioned graph a collective (every rank calls it as often, with no items or some), unless
        the targets keep their own apart (``targets.own``: then every rank reads them there)."""
        own = self.targets.own_features(items)
        return own if own is not None else target_edge_features(self.edge_rows, self.pair_ids(items))

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

    items: Tensor
    items_per_step: int
    seed_cost: Tensor | None = None
    graph = None

    def train_seeds(self, epoch: int) -> Tensor:
        """This rank's seeds (items) for one epoch, in order (shuffled alike on every rank, then shared out)."""
        return rank_seeds(self.items, self.env.world_size, self.env.rank, generator(self.cfg.train.seed, "epoch", epoch))

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


def link_sampler(cfg: RunConfig, node_sampler, train_pos: Tensor, num_nodes: int, has_edge) -> LinkSampler:
    """A link task's training sampler: around the endpoints of its positive edges ``train_pos``, with negatives."""
    k = cfg.task
    return LinkSampler(node_sampler, train_pos, num_nodes, k.negatives, k.num_negatives, k.neg_retries, k.form,
                       has_edge=has_edge, drop_targets=k.target_edges == "drop")


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


def pairs_folder(cfg: RunConfig) -> Path:
    """Where a prediction of the pairs of a file (``predict.pairs``) keeps them as targets, in its own folder (removed
    at its end): named by the file's path, size and time, so that another file, or this one changed, is found
    afresh."""
    import hashlib

    stat = Path(cfg.predict.pairs).stat()
    key = hashlib.sha256(f"{Path(cfg.predict.pairs).resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()
    return Path(cfg.run_dir) / f".pairs-{key[:12]}"


def edge_targets(cfg: RunConfig, env: RankEnv):
    """An edge task's targets: those prepared beside the graph (by every node's local rank 0, unless they are), or,
    for a prediction of the pairs of a file (``predict.pairs``), those pairs in their place."""
    from hpcgnn.data.edges import open_targets, pairs_as_targets, prepare_pairs, prepare_targets

    on_local_rank0(env, f"prepare the edge targets of {cfg.dataset.name}", lambda: prepare_targets(cfg.dataset))
    targets = open_targets(cfg.dataset)
    if cfg.predict.model_file and cfg.predict.pairs:  # (the prediction's own folder: found once per node, mapped)
        folder, pairs = pairs_folder(cfg), cfg.predict.pairs
        on_local_rank0(env, f"find the pairs of {pairs} in the graph",
                       lambda: prepare_pairs(cfg.dataset, targets, pairs, folder))
        return pairs_as_targets(targets, folder)
    return targets


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

