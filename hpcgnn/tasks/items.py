"""A task's items: what a step's seeds are, the sampler around them, and the targets' shape, over the graph views a
store hands out (:class:`hpcgnn.stores.base.GraphViews`). A store holds the graph; it asks its task's items (each
task's spec names its unit, :attr:`hpcgnn.specs.tasks.TaskSpec.batches`) which ids a step draws, which ids a split
scores, and the sampler they are drawn with; it shuffles, shares out, pads and loads them, whatever they are.

- :class:`NodeItems`: the graph's own labelled nodes, sampled by ``train.sampler`` (the store's);
- :class:`LinkItems`: a link graph's training edges (with negatives) and its splits' pairs;
- :class:`EdgeItems`: an edge task's targets (given pairs with labels), around both ends of each.

A sampler server builds a rank's training sampler with the same unit (:meth:`Items.server_sampler`): from the run's
config and the graph it opened, the task's data opened there.
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from hpcgnn.config import RunConfig
from hpcgnn.data.graph import GraphShape
from hpcgnn.env import RankEnv
from hpcgnn.errors import ConfigError
from hpcgnn.labels import resolve, where_labels
from hpcgnn.models import decoder_reads_edges, edge_features_read
from hpcgnn.sampling.link import EdgeTargetSampler, LinkSampler, pair_sampler, share
from hpcgnn.sampling.loader import target_edge_features

log = logging.getLogger(__name__)


class Items:
    """A task's items over a store's graph views (the node task's: the graph's own nodes, which the store samples
    with ``train.sampler``; a task of other items overrides what differs)."""

    noun = "nodes"  # what they are, in words (a refusal names them)
    relation = None  # a typed graph's relation whose edges they are (a typed edge task's targets)
    own_sampler = True  # the store's training sampler (train.sampler over its nodes, on the GPU where it may be)
    strict_times = False  # a timed graph's seeds sampled strictly before their times (not at or before)
    embeds_items = False  # predict's embeddings are of its items (a graph's), not of the graph's nodes

    def __init__(self, cfg: RunConfig, env: RankEnv, views):
        self.cfg, self.env, self.views = cfg, env, views

    def shape(self) -> GraphShape:
        """The model's dimensions (the graph's, the target's)."""
        v = self.views
        return graph_shape(self.cfg, v, v.labels, v.num_classes, where_labels(self.cfg.dataset))

    def train_ids(self) -> Tensor | None:
        """The ids a rank's training steps draw from (a whole graph: every rank's; parts: this rank's own); None:
        the store's nodes, as its sampler prepares them."""
        return None

    def eval_ids(self, split: str) -> Tensor | None:
        """This rank's share of ``split``'s items; None: the store's share of its nodes."""
        return None

    def eval_batch_size(self, split: str) -> int:
        """Items per evaluation batch."""
        return self.cfg.train.eval_batch_size

    def ends(self, ids: Tensor) -> Tensor:
        """The nodes (the graph's ids) a batch of ``ids`` samples around: a partitioned graph's cache warms on them."""
        return ids

    def train_sampler(self, node_sampler):
        """Training's sampler around a step's items (``node_sampler``: the store's, over the graph's nodes)."""
        return node_sampler

    def eval_sampler(self, split: str, node_sampler):
        """Evaluation's sampler of ``split``'s items (``node_sampler``: the store's neighbour sampler)."""
        return node_sampler

    def predicted(self, split: str):
        """The ids (ascending, numpy) of ``split``'s items whose predictions predict writes, where they are not the
        graph's nodes (None: they are)."""
        return None

    def describe(self, shape: GraphShape) -> str | None:
        """The items in a log line (None: the store's own line says them)."""
        return None

    @classmethod
    def server_sampler(cls, cfg: RunConfig, views, node_sampler):
        """A rank's training sampler, built on a sampler server from the graph it opened (``views``) as the rank
        built its own (the task's data opened there)."""
        return node_sampler


NodeItems = Items


class LinkItems(Items):
    """A link graph's training edges, each a step's seed with its negatives, and each split's pairs to score
    (held whole by every rank: small)."""

    noun = "edges"
    own_sampler = False
    strict_times = True  # (a positive's own edge is at its time)

    def __init__(self, cfg: RunConfig, env: RankEnv, views):
        super().__init__(cfg, env, views)
        self.data = link_splits(cfg)
        self.positives, self.times = training_positives(views, self.data)

    def shape(self) -> GraphShape:
        """The graph's dimensions; a link model has no target."""
        v, typed = self.views, self.views.schema is not None
        read = edge_features_read(self.cfg.model, v.edge_dim, self.cfg.dataset.name, typed=typed)
        unread_edge_features(self.cfg, v.edge_dim, read, typed)
        return GraphShape(v.num_features, v.num_classes, v.num_nodes, v.schema, edge_dim=read)

    def train_ids(self) -> Tensor:
        return torch.arange(self.positives.size(1))

    def eval_ids(self, split: str) -> Tensor:
        """This rank's contiguous share of the split's items: its pairs (positives first), or its positives, each
        with its candidate targets."""
        s = self.data.split(split)
        total = s.pos.size(1) + (s.neg.size(1) if s.neg_kind == "pairs" else 0)
        lo, hi = share(total, self.env.rank, self.env.world_size)
        return torch.arange(lo, hi)

    def eval_batch_size(self, split: str) -> int:
        """Pairs per batch (a positive with K candidate targets counts 1 + K)."""
        s = self.data.split(split)
        per_item = 1 + s.neg.size(1) if s.neg_kind == "targets" else 1
        return max(1, self.cfg.train.eval_batch_size // per_item)

    def ends(self, ids: Tensor) -> Tensor:
        return torch.unique(self.positives[:, ids].reshape(-1))

    def train_sampler(self, node_sampler):
        return self.wrap(self.cfg, self.views, node_sampler, self.positives, self.times, self.data)

    def eval_sampler(self, split: str, node_sampler):
        return pair_sampler(node_sampler, self.data.split(split))

    def describe(self, shape: GraphShape) -> str:
        d = self.data
        line = f"{self.positives.size(1)}/{d.val.pos.size(1)}/{d.test.pos.size(1)} train/val/test edges to predict"
        if d.timed:
            line += (f", in time order (each as of its time; validation and test against {self.cfg.task.eval_negatives}"
                     " negatives each, half of them destinations its source met before)")
        return line + ("" if self.views.whole else " (train: this rank's own)")

    @staticmethod
    def wrap(cfg: RunConfig, views, node_sampler, positives: Tensor, times: Tensor | None, data) -> LinkSampler:
        """Around the endpoints of positive edges ``positives``, with negatives (``data``: the link dataset's splits;
        a chronological split's positives have ``times``, and its history gives historical negatives)."""
        k = cfg.task
        return LinkSampler(node_sampler, positives, views.num_nodes, k.negatives, k.num_negatives, k.neg_retries,
                           k.form, has_edge=views.has_edge(), drop_targets=k.target_edges == "drop",
                           times=times, history=data.history)

    @classmethod
    def server_sampler(cls, cfg: RunConfig, views, node_sampler):
        data = link_splits(cfg, evaluated=False)
        return cls.wrap(cfg, views, node_sampler, *training_positives(views, data), data)


def training_positives(views, data) -> tuple[Tensor, Tensor | None]:
    """The training positives a rank steps over and their times (a timed graph's): a whole graph's every one, a
    rank's parts' those whose source it owns."""
    if views.link_train is not None:  # (a timed graph's parts hold their times: open_parts refuses older ones)
        return views.link_train, views.link_train_time
    return data.train.pos, data.train.time


def link_splits(cfg: RunConfig, evaluated: bool = True):
    """The prepared link dataset's splits; ``evaluated``: a chronological split's validation and test positives each
    with ``task.eval_negatives`` negatives, drawn from its seed (:func:`hpcgnn.data.link.with_eval_negatives`)."""
    from hpcgnn.data import open_link_splits
    from hpcgnn.data.link import with_eval_negatives

    data = open_link_splits(cfg.dataset)
    if evaluated and data.timed:
        return with_eval_negatives(data, cfg.task.eval_negatives, cfg.dataset.seed)
    return data


class TableItems(Items):
    """A node task's entries of a table of (node, time, label) (:class:`hpcgnn.data.tables.NodeTable`): a step's seeds
    are training entries, each its node asked as of its time; a split's, its entries (a node perhaps at several
    times). A rank of a partitioned graph trains on its own nodes' entries and evaluates a share of any."""

    noun = "table entries"
    own_sampler = False

    def __init__(self, cfg: RunConfig, env: RankEnv, views):
        from hpcgnn.data.tables import open_table

        super().__init__(cfg, env, views)
        self.table = open_table(cfg.dataset, views.num_nodes, views.time_dtype)

    def shape(self) -> GraphShape:
        return graph_shape(self.cfg, self.views, self.table.labels, 0, f"{self.cfg.dataset.path}/table_label")

    def train_ids(self) -> Tensor:
        """The training entries: every one (a whole graph), or those of the rank's own nodes (its parts)."""
        ids = self.table.split("train")
        return ids if self.views.whole else ids[self.views.owns(self.table.node.index_select(0, ids))]

    def eval_ids(self, split: str) -> Tensor:
        ids = self.table.split(split)
        lo, hi = share(ids.numel(), self.env.rank, self.env.world_size)
        return ids[lo:hi]

    def ends(self, ids: Tensor) -> Tensor:
        return torch.unique(self.table.node.index_select(0, ids))

    def train_sampler(self, node_sampler):
        return self.wrap(node_sampler, self.table)

    def eval_sampler(self, split: str, node_sampler):
        return self.wrap(node_sampler, self.table)

    def predicted(self, split: str):
        """Every entry of ``split`` (entry ids: rows of the table)."""
        return np.sort(self.table.split(split).numpy())

    def describe(self, shape: GraphShape) -> str:
        t = self.table
        nodes = int(torch.unique(t.node).numel())
        return (f"a table of {t.count} (node, time, label) entries over {nodes} nodes, "
                f"{'/'.join(str(t.split(s).numel()) for s in ('train', 'val', 'test'))} train/val/test "
                f"({shape.target.outputs()}), each node asked as of its entry's time")

    @staticmethod
    def wrap(node_sampler, table):
        from hpcgnn.sampling.temporal import TableSampler

        if getattr(node_sampler, "timeline", None) is None:
            raise ConfigError("a table's entries are each asked as of a time: its graph's edges need times (edge_time) "
                              "and time.respect=true. HINT: add edge_time.npy, or drop time.respect=false")
        return TableSampler(node_sampler, table)

    @classmethod
    def server_sampler(cls, cfg: RunConfig, views, node_sampler):
        from hpcgnn.data.tables import open_table

        return cls.wrap(node_sampler, open_table(cfg.dataset, views.num_nodes, views.time_dtype))


class EdgeItems(Items):
    """An edge task's targets (:class:`hpcgnn.data.edges.EdgeTargets`): a step's seeds are training targets, sampled
    around both ends of each; a rank of a partitioned graph's are those whose target node it owns."""

    noun = "target edges"
    own_sampler = False
    strict_times = True  # (a target asked at its time: its own edge, and those at its time, unseen)

    def __init__(self, cfg: RunConfig, env: RankEnv, views):
        super().__init__(cfg, env, views)
        self.targets = t = edge_targets(cfg, env)
        self.relation = t.relation
        self.owned = None if views.whole else views.owns(self.global_pairs(t.index)[1])  # bool [M]
        self.sampler = None

    def shape(self) -> GraphShape:
        from hpcgnn.data.edges import where_targets

        v, rel = self.views, self.relation  # (the targets' own labels, of no graph's classes)
        pairs = pair_features_read(self.cfg, v.schema.edge_dim(rel) if rel else v.edge_dim)
        return graph_shape(self.cfg, v, self.targets.labels, 0, where_targets(self.cfg.dataset), pairs,
                           self.cfg.task.decoder)

    def global_pairs(self, pairs: Tensor) -> Tensor:
        """Target pairs [2, k] in the graph's global ids (a typed relation's: each end's type offset)."""
        if self.relation is None:
            return pairs
        off, (s, _, d) = self.views.schema.offsets(), self.relation
        return pairs + torch.tensor([[off[s]], [off[d]]])

    def mine(self, split: str) -> Tensor:
        """The ids of ``split``'s targets this rank may take (parts: those whose target node it owns), ascending."""
        ids = self.targets.split(split)
        return ids if self.owned is None else ids[self.owned.index_select(0, ids)]

    def train_ids(self) -> Tensor:
        return self.mine("train")

    def eval_ids(self, split: str) -> Tensor:
        """A whole graph's: this rank's contiguous share of the split's targets; parts: its own."""
        ids = self.mine(split)
        if self.owned is not None:
            return ids
        lo, hi = share(ids.numel(), self.env.rank, self.env.world_size)
        return ids[lo:hi]

    def ends(self, ids: Tensor) -> Tensor:
        return torch.unique(self.global_pairs(self.targets.index[:, ids]).reshape(-1))

    def train_sampler(self, node_sampler):
        self.sampler = self.wrap(self.cfg, self.views, node_sampler, self.targets)
        return self.sampler

    def eval_sampler(self, split: str, node_sampler):
        return self.sampler  # (training's: the same batches around a split's targets)

    def predicted(self, split: str):
        """Every target of ``split`` (a file's pairs, in the targets' place: all of them)."""
        return np.sort(self.targets.split(split).numpy())

    def pair_features(self, ids: Tensor) -> Tensor:
        """Targets' own edge features (float32; zeros for a pair that is no edge of the graph), for a decoder that
        reads them; on a partitioned graph a collective (every rank calls it as often, with no ids or some), unless
        the targets keep their own apart (then every rank reads them there)."""
        if self.relation is not None:
            return self.sampler.pair_features(ids)
        own = self.targets.own_features(ids)
        return own if own is not None else target_edge_features(self.views.edge_rows, self.sampler.pair_ids(ids))

    def describe(self, shape: GraphShape) -> str:
        rel = f" of {'__'.join(self.relation)}" if self.relation else ""
        return (f"{self.mine('train').numel()}/{self.mine('val').numel()}/{self.mine('test').numel()} train/val/test "
                f"target edges{rel} ({shape.target.outputs()}), "
                + ("each asked as of its time" if self.sampler is not None and getattr(self.sampler, "times", None)
                   is not None else
                   f"target edges {'left out' if self.cfg.task.target_edges == 'drop' else 'kept'} in their batches")
                + ("" if self.owned is None else " (this rank's own)"))

    @staticmethod
    def wrap(cfg: RunConfig, views, node_sampler, targets):
        """Around both ends of each target; with each target's own features where the decoder reads them."""
        timed = any(getattr(node_sampler, name, None) is not None for name in ("timeline", "timelines"))
        if timed and targets.time is None:  # (a PyG graph's: known here)
            from hpcgnn.checks import untimed_targets

            raise untimed_targets(f"dataset={cfg.dataset.name}", "data.edge_label_time")
        drop = cfg.task.target_edges == "drop"
        if targets.relation is not None:  # a typed graph's: a relation's edges, around both ends' types
            rel = targets.relation
            reads = pair_features_read(cfg, views.schema.edge_dim(rel)) > 0 and rel in (views.typed.edge_attr or {})
            return typed_edge_target_sampler(views, node_sampler, targets, drop, reads)
        pair_ids, row_starts = None, views.row_starts  # (what a sampler process gets: this, not every view)
        if pair_features_read(cfg, views.edge_dim):  # target ids -> their edges' ids (the row's start + the place)
            pair_ids = lambda items: targets.edge_ids(items, row_starts)  # noqa: E731
        return EdgeTargetSampler(node_sampler, targets, drop_targets=drop, pair_ids=pair_ids)

    @classmethod
    def server_sampler(cls, cfg: RunConfig, views, node_sampler):
        from hpcgnn.data.edges import open_targets

        return cls.wrap(cfg, views, node_sampler, open_targets(cfg.dataset))  # (prepared by the ranks)


def typed_edge_target_sampler(views, sampler, targets, drop: bool, pair_features: bool):
    """An edge task's sampler over target ids on a typed graph: around both ends of each target, a relation's edge;
    ``pair_features``: with each target's own edge features (its decoder reads them), read from the typed graph
    the views hold (a whole one, or a rank's typed parts: its rows of the relation, for the targets whose target
    node it holds)."""
    from hpcgnn.data.edges import reverse_relation
    from hpcgnn.sampling.loader import gather_rows
    from hpcgnn.sampling.typed import TypedEdgeTargetSampler

    g, rel, typed_rows = views.typed, targets.relation, views.typed_rows

    def own_features(items: Tensor) -> Tensor:  # (their edges' rows: the target node's row start + place)
        own = targets.own_features(items)  # (kept apart: parallel edges, one in the graph)
        if own is not None:
            return own
        ids = targets.edge_ids(items, lambda nodes: g.rowptr[rel].index_select(0, typed_rows(rel[2], nodes)))
        rows = gather_rows(g.edge_attr[rel], ids.clamp(min=0), dtype=torch.float32)
        return rows.masked_fill_((ids < 0).unsqueeze(1), 0.0)

    return TypedEdgeTargetSampler(sampler, targets, reverse_relation(g, rel), drop_targets=drop,
                                  pair_features=own_features if pair_features else None)


# ---------------------------------------------------------------------- the targets' shape


def graph_shape(cfg: RunConfig, v, labels: dict | None, num_classes: int, where: str, pairs: int = 0,
                decoder: str | None = None) -> GraphShape:
    """The model's dimensions over graph views ``v``; its outputs those of the target its ``labels`` give
    (:func:`hpcgnn.labels.resolve`: the labels' kind and ``task.kind``; ``num_classes``, ``where``: the classes and
    the place the labels are said to come from), refused with the fix where they are at odds; the width of the edge
    features the model reads (:func:`hpcgnn.models.edge_features_read`), and of the target edges' own its decoder
    reads (``pairs``; ``decoder``: an edge task's, which may read them)."""
    k, typed = cfg.task, v.schema is not None
    read = edge_features_read(cfg.model, v.edge_dim, cfg.dataset.name, typed=typed)
    target = resolve(labels, k.kind, k.loss, num_classes, where)
    unread_edge_features(cfg, v.edge_dim, read, typed, pairs, decoder)
    return GraphShape(v.num_features, target.width, v.num_nodes, v.schema, target, read, pairs)


def unread_edge_features(cfg: RunConfig, edge_dim: int, read: int, typed: bool = False, pairs: int = 0,
                         decoder: str | None = None) -> None:
    """Says whether the run reads the graph's edge features: which part reads how many (the model, ``read``; an
    edge task's decoder, ``decoder``, its targets' own, ``pairs``), or, where nothing does, that they cost nothing
    (none gathered) and what would read them (``typed``: a typed graph's, ``edge_dim`` its widest relation's)."""
    if not edge_dim:
        return
    if read or pairs:
        parts = ([f"the model (model={cfg.model.name}) reads {read} per edge in message passing"] if read else []) + \
            ([f"the decoder (task.decoder={decoder}) reads each target edge's own {pairs}"] if pairs else [])
        log.info("edge features: the graph's edges carry %d; %s", edge_dim, "; ".join(parts))
        return
    readers = [f"model.edge_dim={edge_dim} (gat, gin)"] if not typed else []
    readers.append("a model of your own whose forward takes edge_attr")
    if decoder is not None:
        readers.append("task.decoder=concat (the target edges' own)")
    log.info("edge features: the graph's edges carry %d, which nothing in this run reads (model=%s%s); %s would",
             edge_dim, cfg.model.name, f", task.decoder={decoder}" if decoder is not None else "",
             ", ".join(readers[:-1]) + (" or " if len(readers) > 1 else "") + readers[-1])


def pair_features_read(cfg: RunConfig, edge_dim: int) -> int:
    """The width of the target edges' own features an edge task's decoder reads (0: none): ``concat``'s, or a
    decoder of the user's own whose ``forward`` takes ``edge_attr``, on a graph whose edges have ``edge_dim``."""
    if not edge_dim or not decoder_reads_edges(cfg.task.decoder):
        return 0
    return edge_dim


# ---------------------------------------------------------------------- an edge task's targets


def pairs_folder(cfg: RunConfig) -> Path:
    """Where a prediction of the pairs of a file (``predict.pairs``) keeps them as targets, in its own folder (removed
    at its end): named by the file's path, size and time, so that another file, or this one changed, is found
    afresh."""
    stat = Path(cfg.predict.pairs).stat()
    key = hashlib.sha256(f"{Path(cfg.predict.pairs).resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()
    return Path(cfg.run_dir) / f".pairs-{key[:12]}"


def edge_targets(cfg: RunConfig, env: RankEnv):
    """An edge task's targets: those prepared beside the graph (by every node's local rank 0, unless they are), or,
    for a prediction of the pairs of a file (``predict.pairs``), those pairs in their place."""
    from hpcgnn.data.edges import open_targets, pairs_as_targets, prepare_pairs, prepare_targets
    from hpcgnn.stores.base import on_local_rank0

    on_local_rank0(env, f"prepare the edge targets of {cfg.dataset.name}", lambda: prepare_targets(cfg.dataset))
    targets = open_targets(cfg.dataset)
    if cfg.predict.model_file and cfg.predict.pairs:  # (the prediction's own folder: found once per node, mapped)
        folder, pairs = pairs_folder(cfg), cfg.predict.pairs
        on_local_rank0(env, f"find the pairs of {pairs} in the graph",
                       lambda: prepare_pairs(cfg.dataset, targets, pairs, folder))
        return pairs_as_targets(targets, folder)
    return targets


class GraphItems(Items):
    """A dataset of many graphs' graphs (:mod:`hpcgnn.data.graphs`): each a step's item, whole (nothing sampled),
    its label the graph's. The store deals them out (a split's batches cut first, so that every graph's outputs are
    the same floats on any number of ranks)."""

    noun = "graphs"
    own_sampler = False
    embeds_items = True

    def shape(self) -> GraphShape:
        """The graph set's dimensions and the target: ``task.kind`` (auto: what the dataset says, OGB's task type,
        else the labels), and the metric that selects the epoch (``task.metric``; auto: the dataset's, else the
        kind's)."""
        from dataclasses import replace

        from hpcgnn.specs import tasks

        v, k = self.views, self.cfg.task
        gs = v.graph_set
        where = f"the labels (y) of dataset={self.cfg.dataset.name}"
        kind, why = k.kind, None
        p = v.labels or {}
        if kind == "auto" and gs.kind:
            kind, why = gs.kind, f"dataset={self.cfg.dataset.name} says {gs.kind}"
        elif kind == "auto" and p.get("dtype") == "float" and p.get("binary") and p.get("columns", 0) >= 1:
            # (a graph's float columns of 0 and 1, NaN unknown: binary labels, as MoleculeNet's and OGB's molecules)
            kind, why = "multilabel", f"{p['columns']} float column(s) of 0 and 1"
        target = resolve(v.labels, kind, k.loss, 0, where)
        if why is not None:
            target = replace(target, inferred=True, reasons=(why,))
        reports = tasks.KINDS[target.kind].metrics
        select = k.metric if k.metric != "auto" else (gs.metric if gs.metric in reports else "")
        if select and select not in reports:
            raise ConfigError(f"task.metric={select}: a {target.kind} target reports {', '.join(reports)}. HINT: "
                              "task.metric=auto, or one of those")
        if select:
            target = replace(target, select=select)
        if target.kind == "classification" and target.width < 2:
            from hpcgnn.errors import DatasetError
            from hpcgnn.specs.datasets import single_class

            raise DatasetError(single_class(f"dataset {self.cfg.dataset.name} has {target.width} class"))
        return GraphShape(gs.num_features, target.width, gs.num_graphs, None, target, gs.edge_dim,
                          x_vocab=gs.x_vocab, edge_vocab=gs.edge_vocab)

    def train_ids(self) -> Tensor:
        return self.views.graph_set.train_idx.clone()

    def eval_ids(self, split: str) -> Tensor:
        """The split's graphs, every one (the store deals their batches to the ranks)."""
        return self.views.graph_set.split(split).clone()

    def describe(self, shape: GraphShape) -> str:
        return shape.target.outputs() + " per graph"

    def predicted(self, split: str) -> np.ndarray:
        """The split's graphs (``all``: every graph), ascending: what predict writes a row of."""
        return np.sort(self.views.graph_set.split(split).numpy())

    def batching(self) -> tuple[Tensor | None, int]:
        """How a step's graphs are counted: (each graph's cost by id, the budget of a batch) with a budget
        (``task.batch_by=nodes|edges``: its nodes or edges; ``task.budget``, 0: ``train.batch_size`` times the
        training graphs' mean), or (None, ``train.batch_size`` graphs)."""
        k, t = self.cfg.task, self.cfg.train
        if k.batch_by == "graphs":
            return None, t.batch_size
        gs = self.views.graph_set
        cost = gs.sizes(k.batch_by)
        budget = k.budget or max(1, round(t.batch_size * float(cost.index_select(0, gs.train_idx).double().mean())))
        return cost, budget

    def batch_noun(self) -> str:
        """What a batch's budget counts, in words."""
        return "graphs" if self.cfg.task.batch_by == "graphs" else self.cfg.task.batch_by
