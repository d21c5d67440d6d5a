"""The graph store: topology as CSR over incoming edges, plus features, labels and splits."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from hpcgnn.specs import datasets

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GraphShape:
    """What a model is built for: feature width, outputs (classes, binary labels or values: ``target``), and a
    typed graph's node types and relations."""

    num_features: int
    num_classes: int  # the model's outputs per node
    num_nodes: int
    schema: object = None  # a typed graph's TypedSchema (node types, relations, target); None: homogeneous
    target: object = None  # a node task's hpcgnn.labels.Target (its kind, loss and scale); None: class ids
    edge_dim: int = 0  # the width of the edges' features the model reads (0: it reads none)
    pair_edge_dim: int = 0  # an edge task's: the width of its target edges' own features the decoder reads (0: none)
    x_vocab: tuple[int, ...] = ()  # categorical node features (a graph set's): each column's range, embedded per column
    edge_vocab: tuple[int, ...] = ()  # ... its edges'


@dataclass(frozen=True)
class Timeline:
    """A timed graph's in-edges in time: within each row of the graph's CSR (its ``rowptr``), sorted by time, ties by
    their place in the CSR (:mod:`hpcgnn.data.times` writes it; :mod:`hpcgnn.sampling.temporal` samples from it)."""

    col: Tensor  # int64 or int32 [E]: each edge's source, in time order within its row
    time: Tensor  # int64 or float64 [E]: each edge's time, sorted within its row
    edge: Tensor  # int64 [E]: each edge's position in the graph's CSR (its id: the row of its features)
    seed_time: Tensor | None = None  # [N], the times' dtype: when each node's label is asked (None: not given)
    given: Tensor | None = None  # bool [E], in time order: an edge the source gave (not a reverse dataset.to_undirected
    # added); None: a timeline prepared before they were told apart

    def to(self, device: torch.device) -> Timeline:
        return Timeline(*(t.to(device) if t is not None else None for t in (self.col, self.time, self.edge,
                                                                          self.seed_time, self.given)))


@dataclass(frozen=True)
class Graph:
    """A node-classification graph held in memory by every rank (replicated mode).

    ``col[rowptr[v]:rowptr[v + 1]]`` are the in-neighbours of ``v``: the nodes whose
    messages ``v`` aggregates. Samplers read only ``rowptr`` and ``col``.
    """

    rowptr: Tensor  # int64 [num_nodes + 1]
    col: Tensor  # int64 [num_edges], neighbour ids sorted within each row
    x: Tensor  # float32 [num_nodes, num_features]
    y: Tensor  # int64 [num_nodes] class ids (-1: none), or float32 [num_nodes(, C)] labels or values (NaN: unknown)
    train_idx: Tensor  # int64, node ids of the training split
    val_idx: Tensor  # int64, node ids of the validation split
    test_idx: Tensor  # int64, node ids of the test split
    num_classes: int
    labels: dict | None = None  # what the labels are (hpcgnn.labels.profile; None: class ids, from before profiles)
    edge_attr: Tensor | None = None  # [num_edges, D] each CSR edge's features, in col's order (None: none)
    timeline: Timeline | None = None  # a timed graph's edges in time (None: its edges have no times)

    @property
    def num_nodes(self) -> int:
        return self.rowptr.numel() - 1

    @property
    def num_edges(self) -> int:
        return self.col.numel()

    @property
    def num_features(self) -> int:
        return self.x.size(1)

    def to(self, device: torch.device) -> Graph:
        """A copy with every tensor on ``device`` (the GPU sampler's graph)."""
        return Graph(*(getattr(self, f).to(device) for f in ("rowptr", "col", "x", "y", "train_idx", "val_idx",
                                                              "test_idx")), self.num_classes, self.labels,
                     self.edge_attr.to(device) if self.edge_attr is not None else None,
                     self.timeline.to(device) if self.timeline is not None else None)

    @property
    def edge_dim(self) -> int:
        """The width of the edges' features (0: none)."""
        return self.edge_attr.size(1) if self.edge_attr is not None else 0

    def degree(self) -> Tensor:
        return self.rowptr[1:] - self.rowptr[:-1]

    def edge_index(self) -> Tensor:
        """[2, E] (source, target) pairs, the PyG orientation."""
        dst = torch.repeat_interleave(torch.arange(self.num_nodes), self.degree())
        return torch.stack([self.col.long(), dst])

    @classmethod
    def from_edge_index(cls, edge_index: Tensor, num_nodes: int, x: Tensor, y: Tensor, train_idx: Tensor,
                        val_idx: Tensor, test_idx: Tensor, num_classes: int, labels: dict | None = None,
                        edge_attr: Tensor | None = None) -> Graph:
        """Build the CSR from (source, target) pairs; duplicate edges are removed (the first keeps its features,
        ``edge_attr`` [E, D]: each pair's). ``y``: class ids (int64), or float labels kept as they are
        (:mod:`hpcgnn.labels`)."""
        rowptr, col, edge_attr = csr_of_pairs(edge_index, num_nodes, num_nodes,
                                              edge_attr.float() if edge_attr is not None else None)
        return cls(rowptr, col, x.float().contiguous(), y.float() if y.is_floating_point() else y.long(),
                   train_idx.long(), val_idx.long(), test_idx.long(), num_classes, labels, edge_attr)


def csr_of_pairs(edge_index: Tensor, num_src: int, num_dst: int,
                 edge_attr: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor | None]:
    """In-edge CSR over the targets of (source, target) pairs: (rowptr [num_dst + 1], sources sorted within rows,
    and each CSR edge's row of ``edge_attr`` or None); duplicates removed, the first given keeping its features
    (a typed relation's sources and targets may be of two types: ``num_src``, ``num_dst``)."""
    src, dst = edge_index[0].long(), edge_index[1].long()
    key = dst * num_src + src
    if edge_attr is not None:  # sorted by (target, source), stable: each run's first is the pair first given
        key, order = torch.sort(key, stable=True)
        first = torch.ones_like(key, dtype=torch.bool)
        first[1:] = key[1:] != key[:-1]
        key, edge_attr = key[first], edge_attr.index_select(0, order[first]).contiguous()
    else:
        key = torch.unique(key)  # sorted by target, then source
    dst, src = key // num_src, key % num_src
    rowptr = torch.zeros(num_dst + 1, dtype=torch.long)
    rowptr[1:] = torch.cumsum(torch.bincount(dst, minlength=num_dst), 0)
    return rowptr, src.contiguous(), edge_attr


def report_merged(cfg, given: int, kept: int, what: str = "edges", reverses: bool = False) -> None:
    """Says so where edges given repeat a (source, target) pair given before: the prepared graph holds one edge per
    pair (its features, where it has some, the first given's), so a multigraph's parallel edges are one edge in
    message passing. A generated graph's repeats (the synthetic ones') are its own, and go unsaid. ``reverses``:
    ``given`` counts the edges and the reverses ``dataset.to_undirected`` added, and a reverse that meets an edge
    given the other way is no repeat of the source's: said as what it is (pairs that coincide), not as repeats."""
    if given <= kept or datasets.spec(cfg.name).source == "synthetic":
        return
    if reverses:
        log.info("dataset=%s: its %d %s and their reverses (dataset.to_undirected) hold %d distinct (source, target) "
                 "pairs: %d coincide with another (an edge given in both directions, or given twice), each merged "
                 "into one edge", cfg.name, given // 2, what, kept, given - kept)
        return
    log.info("dataset=%s: %d of its %d %s repeat a (source, target) pair given before, each merged into the first "
             "(the graph holds one edge per pair, with the first one's features where edges have some)",
             cfg.name, given - kept, given, what)


HasEdge = Callable[[Tensor, Tensor], Tensor]  # (src, dst) -> bool: is src -> dst an edge of the graph


def csr_edge_id(rowptr: Tensor, col: Tensor) -> Callable[[Tensor, Tensor], Tensor]:
    """``(src, dst) -> position``: each pair's edge in a CSR of in-edges (sources sorted within each row), its row
    of the edges' features; -1 where ``src -> dst`` is no edge. A vectorised binary search."""
    max_deg = int((rowptr[1:] - rowptr[:-1]).max()) if rowptr.numel() > 1 else 0
    steps = max(1, max_deg.bit_length())

    def edge_id(src: Tensor, dst: Tensor) -> Tensor:
        lo, hi = rowptr.index_select(0, dst).clone(), rowptr.index_select(0, dst + 1).clone()
        for _ in range(steps):  # invariant: src, if present, lies in col[lo:hi]
            active = lo < hi
            mid = torch.where(active, (lo + hi) // 2, lo)
            value = col.index_select(0, mid.clamp(max=max(col.numel() - 1, 0)))
            go_right = active & (value < src)
            lo = torch.where(go_right, mid + 1, lo)
            hi = torch.where(active & ~go_right, mid, hi)
        found = (lo < rowptr.index_select(0, dst + 1)) & (col.index_select(0, lo.clamp(max=max(col.numel() - 1, 0)))
                                                          == src)
        return torch.where(found, lo, torch.full_like(lo, -1))

    return edge_id


def csr_has_edge(rowptr: Tensor, col: Tensor) -> HasEdge:
    """Edge membership in a CSR of in-edges (:func:`csr_edge_id`)."""
    edge_id = csr_edge_id(rowptr, col)
    return lambda src, dst: edge_id(src, dst) >= 0
