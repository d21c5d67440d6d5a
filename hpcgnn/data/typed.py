"""Typed (heterogeneous) graphs: node types with their own features, one CSR of in-edges per relation.

A relation is ``(source type, name, target type)``, as in PyG's ``HeteroData``. Each relation
keeps its in-edges as CSR over its target type (``col[rel][rowptr[rel][v]:rowptr[rel][v + 1]]``
are the sources, in their own type's ids, of the edges into target ``v``), so sampling a
relation is the homogeneous sampler on that CSR. Node ids are local to their type; the
homogeneous view (types erased: :meth:`TypedGraph.homogeneous`) numbers the types one after
another, in ``node_types`` order, as DGL does.

Types without features get them when the graph is prepared, by a rule recorded with the graph
(``feature_rule``): the mean of the features of their in-neighbours along one relation (an
author: the mean of the papers it wrote). Learnable embedding tables would make DDP all-reduce
a dense gradient of the whole table every step; the computed mean costs one pass at preparation
and nothing per step.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor

from hpcgnn.data.graph import Graph, Timeline, csr_of_pairs
from hpcgnn.data.times import write_timeline

Relation = tuple[str, str, str]  # (source type, relation name, target type)


def relation_key(rel: Relation) -> str:
    """``paper__cites__paper``: the relation as a file or dictionary name."""
    return "__".join(rel)


@dataclass(frozen=True)
class TypedSchema:
    """A typed graph's shape without its arrays: what models and a partitioned rank need to know."""

    num_nodes: dict[str, int]  # node type -> count (of the whole graph)
    relations: tuple[Relation, ...]
    target: str
    edge_dims: dict[str, int] = field(default_factory=dict)  # relation key -> its edges' feature width (none: absent)

    @classmethod
    def from_meta(cls, typed: dict) -> TypedSchema:
        """From the ``typed`` record of a prepared graph's meta.json or a partition's META.json."""
        return cls({k: int(v) for k, v in typed["num_nodes"].items()}, tuple(tuple(r) for r in typed["relations"]),
                   typed["target"], {k: int(v) for k, v in typed.get("edge_dims", {}).items()})

    def to_meta(self) -> dict:
        return {"num_nodes": self.num_nodes, "relations": [list(r) for r in self.relations], "target": self.target,
                "edge_dims": self.edge_dims}

    def edge_dim(self, rel: Relation) -> int:
        """The width of ``rel``'s edge features (0: none)."""
        return self.edge_dims.get(relation_key(rel), 0)

    @property
    def node_types(self) -> tuple[str, ...]:
        return tuple(self.num_nodes)

    def offsets(self) -> dict[str, int]:
        """Where each type's ids start in the homogeneous view (types one after another, as DGL numbers them)."""
        out, start = {}, 0
        for t in self.node_types:
            out[t] = start
            start += self.num_nodes[t]
        return out

    def type_of(self) -> Tensor:
        """int8 [all nodes]: each homogeneous id's node type, as its index in ``node_types``."""
        counts = torch.tensor([self.num_nodes[t] for t in self.node_types])
        return torch.repeat_interleave(torch.arange(len(counts), dtype=torch.int8), counts)


@dataclass(frozen=True)
class TypedGraph:
    num_nodes: dict[str, int]  # node type -> count
    rowptr: dict[Relation, Tensor]  # int64 [num_nodes[target] + 1] per relation
    col: dict[Relation, Tensor]  # int64 [edges]: source ids (local to the source type), sorted within each row
    x: dict[str, Tensor]  # float32 [num_nodes[t], num_features] per node type
    target: str  # the node type whose labels are predicted
    y: Tensor  # int64 [num_nodes[target]] class ids, or float32 [num_nodes[target](, C)] (hpcgnn.labels)
    train_idx: Tensor  # target-type ids of the training split
    val_idx: Tensor
    test_idx: Tensor
    num_classes: int
    feature_rule: dict[str, str]  # node type -> "given" or "mean over <relation key>"
    labels: dict | None = None  # what the labels are (hpcgnn.labels.profile, in the view's ids; None: class ids)
    edge_attr: dict[Relation, Tensor] | None = None  # [edges, D] per relation with edge features, in its CSR's order
    # a timed graph's: each relation's in-edges in time (its CSR's rows), and the target type's seed times ([N_target]:
    # when each label is asked; None: not given); None: its edges have no times
    timelines: dict[Relation, Timeline] | None = None
    seed_time: Tensor | None = None

    @property
    def node_types(self) -> tuple[str, ...]:
        return tuple(self.num_nodes)

    @property
    def relations(self) -> tuple[Relation, ...]:
        return tuple(self.rowptr)

    @property
    def num_features(self) -> int:
        return self.x[self.target].size(1)

    def num_edges(self, rel: Relation | None = None) -> int:
        return sum(self.col[r].numel() for r in self.relations) if rel is None else self.col[rel].numel()

    def degree(self, rel: Relation) -> Tensor:
        """In-degree of every target-type node along ``rel``."""
        return self.rowptr[rel][1:] - self.rowptr[rel][:-1]

    def edge_index(self, rel: Relation) -> Tensor:
        """[2, E] (source, target) pairs of ``rel``, in the types' own ids."""
        dst = torch.repeat_interleave(torch.arange(self.num_nodes[rel[2]]), self.degree(rel))
        return torch.stack([self.col[rel], dst])

    def to(self, device: torch.device) -> TypedGraph:
        """A copy with every tensor on ``device`` (the GPU sampler's graph)."""
        return TypedGraph(dict(self.num_nodes), {r: v.to(device) for r, v in self.rowptr.items()},
                          {r: v.to(device) for r, v in self.col.items()}, {t: v.to(device) for t, v in self.x.items()},
                          self.target, self.y.to(device), self.train_idx.to(device), self.val_idx.to(device),
                          self.test_idx.to(device), self.num_classes, dict(self.feature_rule), self.labels,
                          {r: v.to(device) for r, v in self.edge_attr.items()} if self.edge_attr else None,
                          {r: v.to(device) for r, v in self.timelines.items()} if self.timelines else None,
                          self.seed_time.to(device) if self.seed_time is not None else None)

    @property
    def schema(self) -> TypedSchema:
        return TypedSchema(dict(self.num_nodes), self.relations, self.target,
                           {relation_key(r): int(v.size(1)) for r, v in (self.edge_attr or {}).items()})

    def offsets(self) -> dict[str, int]:
        """Where each type's ids start in the homogeneous view."""
        return self.schema.offsets()

    def gather_types(self, n_id: dict[str, Tensor], batch_size: int) -> tuple[dict[str, Tensor], Tensor]:
        """Features of the batch's nodes per type, and the labels of its ``batch_size`` seeds."""
        x = {t: self.x[t].index_select(0, ids.to(self.x[t].device)) for t, ids in n_id.items()}
        return x, self.y.index_select(0, n_id[self.target][:batch_size].to(self.y.device))

    def homogeneous(self) -> Graph:
        """The same graph with types erased: one id space (types one after another), every relation's
        edges in one CSR, features stacked (every type must have the same width), labels -1 off target; the
        relations' edge features are not kept (they may differ in width)."""
        off, n = self.offsets(), sum(self.num_nodes.values())
        ei = torch.cat([self.edge_index(r) + torch.tensor([[off[r[0]]], [off[r[2]]]]) for r in self.relations], 1)
        widths = {x.size(1) for x in self.x.values()}
        if len(widths) != 1:
            raise ValueError(f"types erased need one feature width, got {sorted(widths)}")
        y = view_labels(self.y, n)
        t0 = off[self.target]
        y[t0:t0 + self.num_nodes[self.target]] = self.y
        x = torch.cat([self.x[t] for t in self.node_types])
        return Graph.from_edge_index(ei, n, x, y, self.train_idx + t0, self.val_idx + t0, self.test_idx + t0,
                                     self.num_classes)

    def to_hetero_data(self):
        """The whole graph as PyG's ``HeteroData`` (features, labels, every relation's edges)."""
        from torch_geometric.data import HeteroData

        data = HeteroData()
        for t in self.node_types:
            data[t].x = self.x[t]
            data[t].num_nodes = self.num_nodes[t]
        data[self.target].y = self.y
        for rel in self.relations:
            data[rel].edge_index = self.edge_index(rel)
            if self.edge_attr and rel in self.edge_attr:
                data[rel].edge_attr = self.edge_attr[rel].float()
        return data

    @classmethod
    def from_edges(cls, num_nodes: dict[str, int], edges: dict[Relation, Tensor], x: dict[str, Tensor], target: str,
                   y: Tensor, train_idx: Tensor, val_idx: Tensor, test_idx: Tensor, num_classes: int,
                   reverse: bool = True, feature_from: dict[str, Relation] | None = None,
                   edge_attr: dict[Relation, Tensor] | None = None) -> TypedGraph:
        """Build the per-relation CSRs from (source, target) pairs; duplicates are removed (the first keeps its
        features: ``edge_attr``, [E, D] for a given relation whose edges have them).

        ``reverse``: as is customary for ogbn-mag, a relation between two types gains its reverse
        (``rev_<name>``) and a relation inside one type becomes undirected; a reverse edge has its edge's
        features. ``feature_from``: node type -> the relation (after reversing) whose sources' mean features
        become that type's.
        """
        edge_attr = edge_attr or {}
        pieces: dict[Relation, list[Tensor]] = {}
        rows: dict[Relation, list[Tensor]] = {}
        for rel, ei in edges.items():
            for r, src, dst in with_reverses(rel, ei[0].long(), ei[1].long(), reverse):
                pieces.setdefault(r, []).append(torch.stack([src, dst]))
                if rel in edge_attr:
                    rows.setdefault(r, []).append(edge_attr[rel].float())
        rowptr, col, attr = {}, {}, {}
        for rel, eis in pieces.items():
            rowptr[rel], col[rel], kept = csr_of_pairs(torch.cat(eis, 1), num_nodes[rel[0]], num_nodes[rel[2]],
                                                       torch.cat(rows[rel]) if rel in rows else None)
            if kept is not None:
                attr[rel] = kept
        x = {t: v.float().contiguous() for t, v in x.items()}
        rule = {t: "given" for t in x}
        for t, rel in (feature_from or {}).items():
            if rel not in rowptr or rel[2] != t or rel[0] not in x:
                raise ValueError(f"features of {t!r} from {rel}: need a relation into {t!r} from a type with features")
            x[t] = mean_over(rowptr[rel], col[rel], x[rel[0]])
            rule[t] = f"mean over {relation_key(rel)}"
        missing = set(num_nodes) - set(x)
        if missing:
            raise ValueError(f"node types without features and without a rule: {sorted(missing)}")
        return cls(dict(num_nodes), rowptr, col, {t: x[t] for t in num_nodes}, target,
                   y.float() if y.is_floating_point() else y.long(), train_idx.long(), val_idx.long(), test_idx.long(),
                   num_classes, {t: rule[t] for t in num_nodes}, edge_attr=attr or None)


def view_labels(y: Tensor, total: int) -> Tensor:
    """The homogeneous view's labels, ready for the target type's: ``total`` rows of ``y``'s width, none known
    (class ids -1, floats NaN)."""
    if y.is_floating_point():
        return torch.full((total, *y.shape[1:]), float("nan"), dtype=torch.float32)
    return torch.full((total,), -1, dtype=torch.long)


def mean_over(rowptr: Tensor, col: Tensor, x_src: Tensor) -> Tensor:
    """Each target's mean of its in-neighbours' features (zeros without in-neighbours)."""
    deg = rowptr[1:] - rowptr[:-1]
    dst = torch.repeat_interleave(torch.arange(deg.numel()), deg)
    out = torch.zeros(deg.numel(), x_src.size(1), dtype=torch.float32)
    out.index_add_(0, dst, x_src.index_select(0, col).float())
    return out / deg.clamp(min=1).unsqueeze(1).float()


def expand_relations(relations: list[Relation], reverse: bool) -> list[Relation]:
    """The relations a typed graph stores, in :meth:`TypedGraph.from_edges`'s order: with ``reverse``, a
    relation between two types is followed by its ``rev_<name>``, one inside a type is made undirected."""
    out = []
    for s, name, d in relations:
        out.append((s, name, d))
        if reverse and s != d:
            out.append((d, f"rev_{name}", s))
    return out


def with_reverses(rel: Relation, src: Tensor, dst: Tensor, reverse: bool) -> list[tuple[Relation, Tensor, Tensor]]:
    """The (relation, sources, targets) a typed graph stores for edges ``src -> dst`` of ``rel``: as given and,
    with ``reverse``, flipped into ``rev_<name>`` (between two types) or into ``rel`` itself (inside one type:
    undirected), as :func:`expand_relations` names them."""
    pieces = [(rel, src, dst)]
    if reverse:
        pieces.append((expand_relations([rel], True)[-1], dst, src))
    return pieces


@dataclass(frozen=True)
class TypedSource:
    """A typed graph's source as preparing it out of core reads it (``synthetic_hetero``, ogbn-mag, a typed
    ``files`` folder): its sizes, known before any edge is read, and ``feed``, which streams its edges and its
    given features into a :class:`TypedWriter` a chunk at a time and returns the target type's (labels,
    training, validation and test ids), in that type's own ids."""

    num_nodes: dict[str, int]  # in the view's order
    relations: list[Relation]  # as given: the writer adds the reverses
    expected: dict[Relation, int]  # edges per given relation (before duplicates go)
    num_features: int
    target: str
    num_classes: int
    feature_from: dict[str, Relation]  # featureless type -> the relation whose sources' mean it takes
    feed: Callable[[TypedWriter], tuple[Tensor, Tensor, Tensor, Tensor]]
    reverse: bool = True  # the writer adds each relation's reverse (expand_relations)
    # given relation -> its edges' features [E, D] (a mapped array: rows by the edge's place in the source, which
    # ``feed`` hands the writer with each edge, ``ids``); a relation without features is absent
    edge_attr: dict[Relation, object] = field(default_factory=dict)
    # given relation -> its edges' times [E] (by the edge's place in the source, as its features: every relation's,
    # or none); the target type's seed times [N_target] (when each label is asked), where its edges have times
    edge_time: dict[Relation, object] = field(default_factory=dict)
    seed_time: object | None = None

    def edge_dims(self) -> dict[str, int]:
        """Relation key -> edge feature width, of every stored relation (reverses too) whose edges have features."""
        return {relation_key(r): int(rows.shape[1]) for given, rows in self.edge_attr.items()
                for r in expand_relations([given], self.reverse)}


TIMELINE_ARRAYS = ("time_col", "time_sorted", "time_edge", "time_given")  # a timed relation's, beside its CSR


class TypedWriter:
    """A typed graph prepared out of core into a cache folder, as :meth:`TypedGraph.from_edges` and the
    cache would hold it in memory: each relation's in-edge CSR and the homogeneous view's are bucketed on
    disk (:class:`~hpcgnn.data.ooc.EdgeBuckets`) as edge chunks arrive (:meth:`add`), each type's given
    features are written as row chunks arrive (:meth:`write_features`), and :meth:`close` sorts the buckets,
    computes the rule types' features a chunk of rows at a time (the mean over a relation) and stacks every
    type's rows into the view's ``x.npy``. ``relations_too=False``: the homogeneous view alone
    (``dataset.erase_types=true``). ``edge_attr``: the given relations' edge features (rows by the ids
    :meth:`add` is given with their edges), each stored relation's written in its CSR's order (a reverse has its
    edge's; a duplicate keeps the first given's); the view keeps none."""

    def __init__(self, tmp: Path, num_nodes: dict[str, int], relations: list[Relation], expected: dict[Relation, int],
                 num_features: int, mem_bytes: int, reverse: bool = True, relations_too: bool = True,
                 edge_attr: dict[Relation, object] | None = None, edge_time: dict[Relation, object] | None = None):
        from hpcgnn.data.ooc import EdgeBuckets, FeatureWriter

        self.tmp, self.num_nodes, self.reverse, self.relations_too = tmp, dict(num_nodes), reverse, relations_too
        self.schema = TypedSchema(self.num_nodes, tuple(expand_relations(relations, reverse)), "")
        self.off, total = self.schema.offsets(), sum(self.num_nodes.values())
        both = {r: expected[r] * (2 if reverse else 1) for r in relations}
        share = mem_bytes // (len(self.schema.relations) + 1)  # (EdgeBuckets keeps a floor)
        self.view = EdgeBuckets(total, sum(both.values()), tmp / "scratch" / "view", share)
        self.edge_attr = dict(edge_attr or {}) if relations_too else {}
        self.edge_time = dict(edge_time or {}) if relations_too else {}
        self.feature_source = {}  # stored relation -> the given relation whose rows its edges' features are
        self.id_source = {}  # ... whose rows its edges' features or times are (its edges are added with their ids)
        self.buckets = {}  # (every relation: the rule types' features are averaged over theirs)
        for s, name, d in relations:
            for rel in expand_relations([(s, name, d)], reverse):
                if (s, name, d) in self.edge_attr:
                    self.feature_source[rel] = (s, name, d)
                with_ids = (s, name, d) in self.edge_attr or (s, name, d) in self.edge_time
                if with_ids:
                    self.id_source[rel] = (s, name, d)
                # (a timed relation's edges are events: a pair given twice is two edges, each with its own time)
                self.buckets[rel] = EdgeBuckets(num_nodes[rel[2]], both[(s, name, d)],
                                                tmp / "scratch" / relation_key(rel), share, num_src=num_nodes[rel[0]],
                                                ids=with_ids, parallel=(s, name, d) in self.edge_time)
        self.given = list(relations)
        self.merged: dict[Relation, tuple[int, int]] = {}  # given relation -> (edges added, kept), where some merged
        self.num_features = num_features
        self.features = {}  # type -> FeatureWriter of its given rows (float32: rule types average them)
        self._feature_writer = lambda t: FeatureWriter(tmp / f"x.{t}.part", num_nodes[t], num_features, "float32")

    def add(self, rel: Relation, src: Tensor, dst: Tensor, ids: Tensor | None = None) -> None:
        """Edges ``src -> dst`` of ``rel`` as given (types' own ids); reverses are added as :meth:`from_edges` adds them.
        ``ids``: the edges' places in the source (where their features are), for a relation with edge features."""
        if (rel in self.edge_attr or rel in self.edge_time) != (ids is not None) and self.relations_too:
            raise ValueError(f"{relation_key(rel)}: edge ids go with the edges of a relation with features or times, "
                             "and only there")
        given = len(self.edge_attr[rel]) if rel in self.edge_attr else len(self.edge_time.get(rel, ()))
        for i, (r, u, v) in enumerate(with_reverses(rel, src.long(), dst.long(), self.reverse)):
            if r in self.id_source:  # a reverse inside one type: ids past the given ones (E + i), as the view's
                self.buckets[r].add(v, u, ids=ids.long() + (given if i and r == rel else 0))
            else:
                self.buckets[r].add(v, u)
            self.view.add(v + self.off[r[2]], u + self.off[r[0]])

    def write_features(self, node_type: str, start: int, rows: Tensor) -> None:
        if node_type not in self.features:
            self.features[node_type] = self._feature_writer(node_type)
        self.features[node_type].write(start, rows.float())

    def close(self, feature_from: dict[str, Relation], feature_dtype: str) -> tuple[int, dict[str, str], list[str]]:
        """Sort everything into ``tmp``; returns (the view's edge count, each type's feature rule, the names of
        the relation arrays written beside the view)."""
        import numpy as np

        from hpcgnn.data.cache import write_edge_features
        from hpcgnn.data.ooc import FeatureWriter, drop_pages, load_features

        for w in self.features.values():
            w.close()
        arrays = []
        self.edge_dims = {}  # relation key -> width, of the stored relations with edge features
        for rel, buckets in self.buckets.items():
            folder = self.tmp / "scratch" / f"csr__{relation_key(rel)}"
            folder.mkdir(parents=True)
            written = buckets.write_csr(folder)
            if rel in self.given and buckets.added > written:
                self.merged[rel] = (buckets.added, written)
            kinds = ["rowptr", "col"]
            if rel in self.id_source and self.id_source[rel] in self.edge_time:  # (before eid.npy goes)
                write_timeline(folder, self.edge_time[self.id_source[rel]], None)
                kinds += [*TIMELINE_ARRAYS]
            if rel in self.feature_source:  # each CSR edge's row of the given relation's features (eid.npy: which)
                self.edge_dims[relation_key(rel)] = write_edge_features(
                    folder, self.edge_attr[self.feature_source[rel]], feature_dtype)
                kinds.append("edge_attr")
            for kind in kinds:
                (folder / f"{kind}.npy").rename(self.tmp / f"{kind}__{relation_key(rel)}.npy")
                arrays.append(f"{kind}__{relation_key(rel)}")
        num_edges = self.view.write_csr(self.tmp)
        rule = {t: "given" for t in self.features}
        for t, rel in feature_from.items():  # a type's features: the mean over a relation from a type that has them
            # (given, or computed by an earlier rule: ogbn-mag's institutions take their authors')
            if rel not in self.schema.relations or rel[2] != t or rel[0] not in rule:
                raise ValueError(f"features of {t!r} from {rel}: need a relation into {t!r} from a type with features")
            rowptr = torch.from_numpy(np.load(self.tmp / f"rowptr__{relation_key(rel)}.npy", mmap_mode="c"))
            col = torch.from_numpy(np.load(self.tmp / f"col__{relation_key(rel)}.npy", mmap_mode="c"))
            x_src = load_features(self.tmp / f"x.{rel[0]}.part", "float32")
            out = self._feature_writer(t)
            for a in range(0, self.num_nodes[t], 1 << 16):
                b = min(a + (1 << 16), self.num_nodes[t])
                e0, e1 = int(rowptr[a]), int(rowptr[b])
                out.write(a, mean_over(rowptr[a:b + 1] - e0, col[e0:e1].long(), x_src))
                drop_pages(col[e0:e1])
            out.close()
            rule[t] = f"mean over {relation_key(rel)}"
        missing = set(self.num_nodes) - set(rule)
        if missing:
            raise ValueError(f"node types without features and without a rule: {sorted(missing)}")
        x = FeatureWriter(self.tmp / "x.npy", sum(self.num_nodes.values()), self.num_features, feature_dtype)
        for t in self.num_nodes:  # stacked in the view's order, a chunk of rows at a time
            part = self.tmp / f"x.{t}.part"
            rows = load_features(part, "float32")
            for a in range(0, rows.size(0), 1 << 16):
                x.write(self.off[t] + a, rows[a:a + (1 << 16)])
                drop_pages(rows[a:a + (1 << 16)])
            del rows
            part.unlink()
        x.close()
        shutil.rmtree(self.tmp / "scratch", ignore_errors=True)
        if not self.relations_too:  # types erased: the relations served the rules only
            for name in arrays:
                (self.tmp / f"{name}.npy").unlink()
            arrays = []
        return num_edges, {t: rule[t] for t in self.num_nodes}, arrays
