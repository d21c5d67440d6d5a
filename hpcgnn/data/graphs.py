"""Datasets of many graphs (a graph task's): prepared once into one folder of memory-mapped arrays, each graph's rows
contiguous, and mapped by every rank of a node (one copy per node, in the page cache).

The prepared folder (``<dataset.root>/prepared/<name>-<key>``):

- ``x.npy`` ``[N, F]``: every graph's node features, graph after graph; integers (categorical columns: atom types,
  embedded per column by the model) stored in the narrowest type that holds them, or floats;
- ``edges.npy`` ``int32 [E, 2]``: every graph's edges, graph after graph, each end a node's place *within its
  graph* (a batch adds the graph's offset in the batch);
- ``edge_attr.npy`` ``[E, D]`` (where edges have features), as ``x``;
- ``node_ptr.npy``, ``edge_ptr.npy`` ``int64 [G + 1]``: graph ``g``'s nodes are rows ``node_ptr[g]:node_ptr[g+1]``
  of ``x``, its edges rows ``edge_ptr[g]:edge_ptr[g+1]`` of ``edges``;
- ``y.npy``: a label per graph, in :func:`hpcgnn.labels.stored`'s form (classes ``int64 [G]``, binary labels or
  values ``float32 [G, C]``, NaN unknown);
- ``train_idx.npy``, ``val_idx.npy``, ``test_idx.npy``: graph ids;
- ``meta.json``: :class:`hpcgnn.data.cache.GraphMeta` (totals, the labels' profile), and under ``graphs`` the count
  of graphs, each categorical column's range (``x_vocab``, ``edge_vocab``: its largest value + 1), the kind and metric
  a source states (OGB's), and the format's version.

The sources stream whole graphs a chunk at a time into a :class:`GraphWriter` (plain appends: no graph set is ever
whole in memory while it is prepared, but for a PyG dataset, which PyG holds whole anyway): a seeded molecule-like set
(:func:`synthetic_molecules`), a files folder (:func:`files_graphs`), a PyG dataset of ``Data`` objects or a callable
returning a list of them (:func:`pyg_graphs`), and OGB's graph property datasets read from OGB's raw files
(:func:`ogb_graphs`, the files ``ogb.io.read_csv_graph_raw`` reads, read here a chunk at a time).
"""

from __future__ import annotations

import itertools
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

import hpcgnn.data.cache as cache
from hpcgnn.config import DatasetConfig
from hpcgnn.data.ooc import NpyAppender
from hpcgnn.errors import DatasetError
from hpcgnn.io import atomic_folder, write_npy
from hpcgnn.labels import profile, stored

log = logging.getLogger(__name__)

GRAPHS_VERSION = 1
SPLITS = ("train", "val", "test")
CHUNK_GRAPHS = 65536  # graphs a source hands the writer at once


@dataclass(frozen=True)
class Chunk:
    """Whole graphs, in order: their nodes' features, their edges (each end a place within its graph), the edges'
    features, and each graph's node and edge counts."""

    x: np.ndarray  # [n, F]
    edges: np.ndarray  # [e, 2], local ids
    edge_attr: np.ndarray | None  # [e, D]
    nodes: np.ndarray  # int64 [graphs]
    num_edges: np.ndarray  # int64 [graphs]


class GraphWriter:
    """A graph set written a chunk of whole graphs at a time into ``tmp``: the rows appended (no array whole in
    memory), each graph's offsets, each categorical column's largest value."""

    def __init__(self, tmp: Path, x_dtype, x_width: int, edge_dtype=None, edge_width: int = 0):
        self.tmp = tmp
        self.x = NpyAppender(tmp / "x.npy", x_dtype, (x_width,))
        self.edges = NpyAppender(tmp / "edges.npy", np.int32, (2,))
        self.edge_attr = NpyAppender(tmp / "edge_attr.npy", edge_dtype, (edge_width,)) if edge_width else None
        self.node_ptr, self.edge_ptr = [np.zeros(1, np.int64)], [np.zeros(1, np.int64)]
        self.nodes = self.num_edges = self.graphs = 0
        self.x_top = np.full(x_width, -1, np.int64)
        self.edge_top = np.full(edge_width, -1, np.int64)
        self.x_int = np.issubdtype(np.dtype(x_dtype), np.integer)
        self.edge_int = edge_width > 0 and np.issubdtype(np.dtype(edge_dtype), np.integer)

    def add(self, c: Chunk, where: str) -> None:
        nodes, edges = np.asarray(c.nodes, np.int64), np.asarray(c.num_edges, np.int64)
        if c.x.shape[0] != nodes.sum() or c.edges.shape[0] != edges.sum():
            raise DatasetError(f"{where}: {c.x.shape[0]} node rows and {c.edges.shape[0]} edges for graphs of "
                               f"{int(nodes.sum())} nodes and {int(edges.sum())} edges")
        if (nodes < 1).any():
            raise DatasetError(f"{where}: graph {self.graphs + int(np.argmax(nodes < 1))} has no node. HINT: drop "
                               "empty graphs from the dataset")
        if edges.size and c.edges.size:  # each end within its own graph
            limit = np.repeat(nodes, edges)
            bad = (c.edges < 0).any(1) | (c.edges >= limit[:, None]).any(1)
            if bad.any():
                i = int(np.argmax(bad))
                g = self.graphs + int(np.searchsorted(np.cumsum(edges), i, side="right"))
                raise DatasetError(f"{where}: edge {tuple(int(v) for v in c.edges[i])} of graph {g} names a node "
                                   f"outside its {int(limit[i])} nodes (edges number a graph's nodes from 0)")
        for top, rows, integer, what in ((self.x_top, c.x, self.x_int, "x"),
                                         (self.edge_top, c.edge_attr, self.edge_int, "edge_attr")):
            if integer and rows is not None and rows.shape[0]:
                if (rows < 0).any():
                    raise DatasetError(f"{where}: integer {what} holds negative values; categorical features are "
                                       "codes 0..K-1 (or give them as floats)")
                np.maximum(top, rows.max(axis=0).astype(np.int64), out=top)
        self.x.append(c.x)
        self.edges.append(c.edges)
        if self.edge_attr is not None:
            self.edge_attr.append(c.edge_attr)
        self.node_ptr.append(self.nodes + np.cumsum(nodes))
        self.edge_ptr.append(self.num_edges + np.cumsum(edges))
        self.nodes += int(nodes.sum())
        self.num_edges += int(edges.sum())
        self.graphs += nodes.size

    def close(self, y: np.ndarray, splits: dict[str, np.ndarray], source: dict, where: str, *,
              x_vocab: tuple[int, ...] | None = None, edge_vocab: tuple[int, ...] | None = None,
              kind: str | None = None, metric: str | None = None) -> None:
        """The arrays closed, the labels, splits and meta.json written. ``x_vocab``, ``edge_vocab``: each
        categorical column's range as the source states it (OGB's feature dims; None: the largest value + 1)."""
        self.x.close()
        self.edges.close()
        if self.edge_attr is not None:
            self.edge_attr.close()
        write_npy(self.tmp / "node_ptr.npy", np.concatenate(self.node_ptr))
        write_npy(self.tmp / "edge_ptr.npy", np.concatenate(self.edge_ptr))
        y = stored(y, f"{where}'s labels")
        if y.shape[0] != self.graphs:
            raise DatasetError(f"{where}: {y.shape[0]} labels for {self.graphs} graphs: a graph task takes one label "
                               "(or a row of them) per graph")
        write_npy(self.tmp / "y.npy", y)
        for s in SPLITS:
            ids = np.asarray(splits[s], np.int64)
            if ids.size and (ids.min() < 0 or ids.max() >= self.graphs):
                raise DatasetError(f"{where}: the {s} split names graph {int(ids.max())}, of {self.graphs} graphs")
            write_npy(self.tmp / f"{s}_idx.npy", ids)
        vocab = [x_vocab, edge_vocab]
        for i, (top, integer) in enumerate(((self.x_top, self.x_int), (self.edge_top, self.edge_int))):
            found = tuple(int(t) + 1 for t in top) if integer else ()
            if vocab[i] is not None and integer:
                if any(f > v for f, v in zip(found, vocab[i], strict=True)):
                    raise DatasetError(f"{where}: categorical values beyond the stated ranges {list(vocab[i])}")
                found = tuple(int(v) for v in vocab[i])
            vocab[i] = found
        graphs = {"num_graphs": self.graphs, "x_vocab": list(vocab[0]), "edge_vocab": list(vocab[1]),
                  "kind": kind, "metric": metric, "version": GRAPHS_VERSION}
        integer = np.issubdtype(y.dtype, np.integer)
        classes = (int(y.max()) + 1 if y.size else 0) if y.ndim == 1 and integer else (y.shape[1] if y.ndim == 2 else 1)
        meta = cache.GraphMeta(self.nodes, self.num_edges, self.x.row_shape[0], classes,
                               labels=profile(y, splits), edge_dim=self.edge_attr.row_shape[0] if self.edge_attr else 0,
                               feature_dtype=str(self.x.dtype), source=source, more={"graphs": graphs},
                               bytes=sum(p.stat().st_size for p in self.tmp.glob("*.npy")))
        meta.write(self.tmp)


@dataclass(frozen=True)
class GraphSet:
    """A prepared graph set, memory-mapped (see the module)."""

    x: Tensor
    edges: Tensor  # int32 [E, 2]
    edge_attr: Tensor | None
    node_ptr: Tensor  # int64 [G + 1]
    edge_ptr: Tensor
    y: Tensor
    train_idx: Tensor
    val_idx: Tensor
    test_idx: Tensor
    x_vocab: tuple[int, ...]
    edge_vocab: tuple[int, ...]
    labels: dict
    kind: str | None = None  # what the source says its labels are (OGB's task type), and its metric
    metric: str | None = None

    @property
    def num_graphs(self) -> int:
        return self.node_ptr.numel() - 1

    @property
    def num_features(self) -> int:
        return self.x.size(1)

    @property
    def edge_dim(self) -> int:
        return 0 if self.edge_attr is None else self.edge_attr.size(1)

    def sizes(self, what: str = "nodes") -> Tensor:
        """Each graph's node (or edge) count."""
        ptr = self.node_ptr if what == "nodes" else self.edge_ptr
        return ptr[1:] - ptr[:-1]

    def split(self, name: str) -> Tensor:
        """The graph ids of split ``name`` (``all``: every graph)."""
        if name == "all":
            return torch.arange(self.num_graphs)
        return {"train": self.train_idx, "val": self.val_idx, "test": self.test_idx}[name]

    def resident_bytes(self) -> int:
        arrays = (self.x, self.edges, self.edge_attr, self.node_ptr, self.edge_ptr, self.y)
        return sum(t.numel() * t.element_size() for t in arrays if t is not None)


def _mapped(path: Path) -> Tensor:
    return torch.from_numpy(np.load(path, mmap_mode="c"))


def open_graphs(folder: Path) -> GraphSet:
    """The graph set prepared in ``folder``, memory-mapped copy-on-write (nothing unpickled)."""
    meta = cache.GraphMeta.read(folder)
    g = meta.more.get("graphs")
    if not g or g.get("version") != GRAPHS_VERSION:
        raise DatasetError(f"{folder} is not a graph set of this hpcgnn's format. HINT: delete it to prepare again")
    edge_attr = _mapped(folder / "edge_attr.npy") if meta.edge_dim else None
    return GraphSet(_mapped(folder / "x.npy"), _mapped(folder / "edges.npy"), edge_attr,
                    _mapped(folder / "node_ptr.npy"), _mapped(folder / "edge_ptr.npy"), _mapped(folder / "y.npy"),
                    *(_mapped(folder / f"{s}_idx.npy") for s in SPLITS), tuple(g["x_vocab"]), tuple(g["edge_vocab"]),
                    meta.labels, g.get("kind"), g.get("metric"))


def prepare_graphs(cfg: DatasetConfig, folder: Path, source: dict, allow_download: bool = False) -> Path:
    """The graph set of ``cfg`` into ``folder`` (its source's builder, as its spec names it), streamed."""
    from hpcgnn.specs import datasets, load

    spec = datasets.spec(cfg.name)
    with atomic_folder(folder) as tmp:
        load(spec.graphs)(cfg, tmp, source, allow_download)
    log.info("prepared %s: %s", cfg.name, describe(open_graphs(folder)))
    return folder


def describe(gs: GraphSet) -> str:
    nodes, edges = gs.sizes("nodes").double(), gs.sizes("edges").double()
    return (f"{gs.num_graphs} graphs, {nodes.mean():.1f} nodes and {edges.mean():.1f} edges each on average (at most "
            f"{int(nodes.max())} nodes), {gs.num_features} {'categorical ' if gs.x_vocab else ''}node features"
            + (f", {gs.edge_dim} {'categorical ' if gs.edge_vocab else ''}edge features" if gs.edge_dim else ""))


def random_splits(cfg: DatasetConfig, graphs: int) -> dict[str, np.ndarray]:
    """Graphs split by ``dataset.train_fraction`` and ``val_fraction`` (the rest test), seeded by ``dataset.seed``."""
    order = np.random.default_rng(cfg.seed).permutation(graphs)
    a, b = int(cfg.train_fraction * graphs), int((cfg.train_fraction + cfg.val_fraction) * graphs)
    return {"train": np.sort(order[:a]), "val": np.sort(order[a:b]), "test": np.sort(order[b:])}


def narrowest(top: int) -> np.dtype:
    """The narrowest signed integer type that holds codes 0..top."""
    for dt in (np.int8, np.int16, np.int32):
        if top <= np.iinfo(dt).max:
            return np.dtype(dt)
    return np.dtype(np.int64)


# ---------------------------------------------------------------------- the sources


def synthetic_molecules(cfg, tmp: Path, source: dict, allow_download: bool = False) -> None:
    """A seeded molecule-like set (``dataset=synthetic_graphs``): each graph a chain of atoms with a few rings closed
    over it (about ``dataset.avg_nodes`` atoms, bonds both ways), nine categorical atom columns and three bond columns
    in OGB's ranges, and a label of the chosen kind from the graph's make-up (how many atoms of a few types, how many
    rings): learnable, not trivially (a noisy rule over counts a GNN's sum readout sees)."""
    from ogb.utils.features import get_atom_feature_dims, get_bond_feature_dims

    atom_dims, bond_dims = get_atom_feature_dims(), get_bond_feature_dims()
    G = cfg.num_graphs
    rng = np.random.default_rng([cfg.seed, 0])
    nodes = np.clip(rng.poisson(cfg.avg_nodes - 2, G) + 2, 2, None).astype(np.int64)
    rings = rng.binomial(3, 0.45, G).astype(np.int64)
    rings = np.minimum(rings, np.maximum(nodes - 3, 0) // 3)
    num_edges = 2 * (nodes - 1 + rings)
    writer = GraphWriter(tmp, np.int16, len(atom_dims), np.int16, len(bond_dims))
    labels = []
    for c, lo in enumerate(range(0, G, CHUNK_GRAPHS)):
        hi = min(G, lo + CHUNK_GRAPHS)
        r = np.random.default_rng([cfg.seed, 1, c])
        n, k = nodes[lo:hi], rings[lo:hi]
        total = int(n.sum())
        first = np.repeat(np.cumsum(n) - n, n)  # each atom's graph's first row
        local = np.arange(total) - first
        # atoms: a common element mostly (C, N, O, ...), the rest of the columns small codes in OGB's ranges
        element = r.choice([5, 6, 7, 8, 15, 16, 0, 34], size=total, p=[.55, .14, .14, .04, .04, .03, .03, .03])
        x = np.empty((total, len(atom_dims)), np.int16)
        x[:, 0] = element
        for j, d in enumerate(atom_dims[1:], start=1):
            x[:, j] = np.minimum(r.geometric(0.6, total) - 1, d - 1)
        # bonds: the chain (i - 1, i), then each ring from an atom back to one three or more places before it
        chain_dst = local[local > 0]
        graph_of_chain = np.repeat(np.arange(hi - lo), n - 1)
        ring_graph = np.repeat(np.arange(hi - lo), k)
        ring_end = (r.random(ring_graph.size) * (n[ring_graph] - 3)).astype(np.int64) + 3
        ring_start = ring_end - 3 - (r.random(ring_graph.size) * (ring_end - 2)).astype(np.int64).clip(0, None)
        ring_start = np.minimum(ring_start, ring_end - 3)
        src = np.concatenate([chain_dst - 1, ring_start])
        dst = np.concatenate([chain_dst, ring_end])
        owner = np.concatenate([graph_of_chain, ring_graph])
        order = np.argsort(owner, kind="stable")
        src, dst, owner = src[order], dst[order], owner[order]
        bond = np.empty((src.size, len(bond_dims)), np.int16)
        bond[:, 0] = np.where(r.random(src.size) < 0.2, 1, 0) + np.where(r.random(src.size) < 0.1, 3, 0)
        bond[:, 1] = np.minimum(r.geometric(0.8, src.size) - 1, bond_dims[1] - 1)
        bond[:, 2] = r.random(src.size) < 0.3
        # both ways, each graph's bonds together: a graph's forward bonds, then their reverses
        both = np.empty((2 * src.size, 2), np.int32)
        attr = np.empty((2 * src.size, len(bond_dims)), np.int16)
        bonds = np.bincount(owner, minlength=hi - lo)
        start = np.cumsum(bonds) - bonds
        place = 2 * start[owner] + (np.arange(src.size) - start[owner])
        both[place, 0], both[place, 1] = src, dst
        both[place + bonds[owner], 0], both[place + bonds[owner], 1] = dst, src
        attr[place], attr[place + bonds[owner]] = bond, bond
        writer.add(Chunk(x, both, attr, n, num_edges[lo:hi]), "dataset=synthetic_graphs")
        # the label: a noisy rule over the graph's make-up
        counts = np.stack([np.bincount(first_graph, weights=(element == e), minlength=hi - lo)
                           for first_graph in [np.repeat(np.arange(hi - lo), n)] for e in (7, 8, 16)], 1)
        score = (1.2 * counts[:, 0] - 0.8 * counts[:, 1] + 2.0 * counts[:, 2] + 1.5 * k
                 - 0.08 * n + r.normal(0, 1.0, hi - lo))
        labels.append(score)
    score = np.concatenate(labels) if labels else np.zeros(0)
    y = _synthetic_labels(cfg, score)
    writer.close(y, random_splits(cfg, G), source, "dataset=synthetic_graphs",
                 x_vocab=tuple(atom_dims), edge_vocab=tuple(bond_dims))


def _synthetic_labels(cfg, score: np.ndarray) -> np.ndarray:
    """A score per graph as labels of ``dataset.label_kind``: classes by quantile (``num_classes``), binary labels
    (above thresholds of it, ``num_classes`` columns), or the score itself (a value)."""
    if cfg.label_kind == "regression":
        return score.astype(np.float32).reshape(-1, 1)
    qs = np.quantile(score, np.linspace(0, 1, cfg.num_classes + 1)[1:-1]) if score.size else []
    if cfg.label_kind == "classification":
        return np.searchsorted(qs, score).astype(np.int64)
    cuts = np.quantile(score, np.linspace(0.2, 0.8, cfg.num_classes)) if score.size else np.zeros(cfg.num_classes)
    return (score[:, None] > cuts[None, :]).astype(np.float32)


def _read(folder: Path, name: str, mmap: bool = False) -> np.ndarray | None:
    """``name``.npy (mapped with ``mmap``) or .pt of a files folder (None: neither)."""
    from hpcgnn.data.files import read_array

    if not any((folder / f"{name}{suffix}").is_file() for suffix in (".npy", ".pt")):
        return None
    return read_array(folder, name, mmap)[1]


def files_graphs(cfg, tmp: Path, source: dict, allow_download: bool = False) -> None:
    """A folder of your own (``dataset=graph_files``): ``edge_index`` ``[2, E]`` over every graph's nodes numbered
    together (graph g's nodes are ``graph_ptr[g]:graph_ptr[g+1]``), ``graph_ptr`` ``[G + 1]``, ``y`` (a label per
    graph), and optionally ``x`` ``[N, F]`` (integers: categorical), ``edge_attr`` ``[E, D]`` and ``train_idx``,
    ``val_idx``, ``test_idx`` (graph ids; else a seeded split). An edge joining two graphs is refused.

    Out of core: ``.npy`` files are mapped and read a block at a time (a ``.pt`` file is read whole). An edge list in
    graph order (each graph's edges together, graphs in order) streams a chunk of graphs at a time; in another
    order its edges are sorted by graph first, in memory (16 bytes an edge)."""
    from hpcgnn.data.files import files_folder

    folder = files_folder(cfg)
    where = f"dataset.path={cfg.path}"
    ptr, ei, y = (_read(folder, n, mmap=True) for n in ("graph_ptr", "edge_index", "y"))
    missing = [n for n, a in (("graph_ptr", ptr), ("edge_index", ei), ("y", y)) if a is None]
    if missing:
        raise DatasetError(f"{where}: a graph dataset's folder needs {', '.join(missing)} (.npy or .pt). HINT: "
                           "docs/graph-tasks.md lists its files")
    ptr = np.asarray(ptr, np.int64).reshape(-1)
    if ptr.size < 2 or ptr[0] != 0 or (np.diff(ptr) < 1).any():
        raise DatasetError(f"{where}: graph_ptr must start at 0 and rise by at least 1 per graph (each graph's first "
                           "node, then the node count)")
    n, G = int(ptr[-1]), ptr.size - 1
    if ei.ndim != 2 or ei.shape[0] != 2:
        raise DatasetError(f"{where}: edge_index must have shape [2, E], got {tuple(ei.shape)}")
    E = ei.shape[1]
    x = _read(folder, "x", mmap=True)
    if x is not None:
        x = x.reshape(n, -1) if x.ndim == 1 and x.shape[0] == n else x
        if x.shape[0] != n:
            raise DatasetError(f"{where}: x has {x.shape[0]} rows, graph_ptr counts {n} nodes")
    attr = _read(folder, "edge_attr", mmap=True)
    if attr is not None:
        attr = attr.reshape(E, -1)
    # one pass over the edges: each end's graph, an edge joining two refused; whether they come in graph order
    counts, in_order, last = np.zeros(G, np.int64), True, -1
    for lo in range(0, E, STREAM_EDGES):
        block = np.asarray(ei[:, lo:lo + STREAM_EDGES])
        if block.size and (block.min() < 0 or block.max() >= n):
            raise DatasetError(f"{where}: edge_index names node {int(block.max())}, of the {n} graph_ptr counts")
        owner = np.searchsorted(ptr, block, side="right") - 1
        joins = owner[0] != owner[1]
        if joins.any():
            i = int(np.argmax(joins))
            raise DatasetError(f"{where}: edge_index's edge {lo + i} ({int(block[0, i])} -> {int(block[1, i])}) joins "
                               f"graph {int(owner[0, i])} to graph {int(owner[1, i])}: each edge lies within one graph")
        counts += np.bincount(owner[0], minlength=G)
        in_order = in_order and bool(owner[0].size == 0 or (owner[0, 0] >= last and (np.diff(owner[0]) >= 0).all()))
        last = int(owner[0, -1]) if owner[0].size else last
    order = None
    if not in_order:  # (sorted by graph, in memory)
        owner = np.concatenate([np.searchsorted(ptr, np.asarray(ei[0, lo:lo + STREAM_EDGES]), side="right") - 1
                                for lo in range(0, E, STREAM_EDGES)]) if E else np.zeros(0, np.int64)
        order = np.argsort(owner, kind="stable")
        del owner
    x_dtype = _stored_dtype(x)
    e_dtype = _stored_dtype(attr) if attr is not None else None
    writer = GraphWriter(tmp, x_dtype, x.shape[1] if x is not None else 1, e_dtype,
                         attr.shape[1] if attr is not None else 0)
    edge_ptr = np.concatenate([[0], np.cumsum(counts)])
    for g0 in range(0, G, CHUNK_GRAPHS):
        g1 = min(G, g0 + CHUNK_GRAPHS)
        a, b, c, d = int(ptr[g0]), int(ptr[g1]), int(edge_ptr[g0]), int(edge_ptr[g1])
        rows = slice(c, d) if order is None else order[c:d]  # (a graph's edges in the file's order: a stable sort)
        block = np.asarray(ei[:, rows])
        owner = np.repeat(np.arange(g0, g1), counts[g0:g1])
        local = (block - ptr[owner][None, :]).T.astype(np.int32)
        xs = np.ones((b - a, 1), np.float32) if x is None else np.asarray(x[a:b]).astype(x_dtype, copy=False)
        feats = None if attr is None else np.asarray(attr[rows]).astype(e_dtype, copy=False)
        writer.add(Chunk(xs, local, feats, np.diff(ptr[g0:g1 + 1]), counts[g0:g1]), where)
    given = [_read(folder, f"{s}_idx") for s in SPLITS]
    splits = (dict(zip(SPLITS, (np.asarray(s, np.int64).reshape(-1) for s in given), strict=True))
              if all(s is not None for s in given) else random_splits(cfg, G))
    writer.close(np.asarray(y), splits, source, where)


STREAM_EDGES = 1 << 22  # edges of a files folder read at once


def _stored_dtype(a) -> np.dtype:
    """How a files folder's features are stored: integers in the narrowest type that holds their largest value
    (read a block at a time), floats as float32."""
    if a is None:
        return np.dtype(np.float32)
    if not np.issubdtype(a.dtype, np.integer):
        return np.dtype(np.float32)
    top = 0
    for lo in range(0, a.shape[0], STREAM_EDGES):
        block = np.asarray(a[lo:lo + STREAM_EDGES])
        top = max(top, int(block.max()) if block.size else 0)
    return narrowest(top)


def pyg_graphs(cfg, tmp: Path, source: dict, allow_download: bool = False) -> None:
    """A PyG dataset of ``Data`` objects by ``dataset._target_`` (``TUDataset``, ``MoleculeNet``, an
    ``InMemoryDataset`` of yours) or a callable returning a list of them (``dataset=pyg_graphs``): each graph's
    ``x`` (integers: categorical; none: a column of ones), ``edge_index``, ``edge_attr`` and ``y``; the splits a
    seeded one of ``dataset.train_fraction``/``val_fraction``, or the dataset's own ``split_idx`` where it gives
    ``get_idx_split()``. Written a chunk of graphs at a time."""
    from hpcgnn.data.pyg import pyg_made

    where = f"dataset._target_={cfg._target_}"
    made = pyg_made(cfg)
    try:
        count = len(made)
    except TypeError:
        raise DatasetError(f"{where} gave {type(made).__name__}, not a dataset or list of torch_geometric Data "
                           "graphs. HINT: a graph task reads many graphs; a single graph trains task=node") from None
    if count == 0:
        raise DatasetError(f"{where} holds no graph")
    first = made[0]
    for need in ("edge_index", "y"):
        if getattr(first, need, None) is None:
            raise DatasetError(f"{where}: its graphs have no {need}: a graph task needs edge_index and a label (y) "
                               "per graph")
    fx, fe = getattr(first, "x", None), getattr(first, "edge_attr", None)
    x_width = 1 if fx is None else (fx.size(1) if fx.dim() == 2 else 1)
    x_int = fx is not None and not fx.is_floating_point()
    e_width = 0 if fe is None else (fe.size(1) if fe.dim() == 2 else 1)
    e_int = fe is not None and not fe.is_floating_point()
    x_dtype, e_dtype = (np.int32 if x_int else np.float32), (np.int32 if e_int else np.float32)
    writer = GraphWriter(tmp, x_dtype, x_width, e_dtype if e_width else None, e_width)
    ys = []
    for lo in range(0, count, 4096):
        xs, es, attrs, nodes, edges = [], [], [], [], []
        for i in range(lo, min(count, lo + 4096)):
            d = made[i]
            n = int(d.num_nodes)
            x = d.x if getattr(d, "x", None) is not None else torch.ones(n, 1)
            xs.append(x.reshape(n, -1).numpy().astype(x_dtype, copy=False))
            es.append(d.edge_index.t().numpy().astype(np.int32))
            if e_width:
                attrs.append(d.edge_attr.reshape(d.edge_index.size(1), -1).numpy().astype(e_dtype, copy=False))
            nodes.append(n)
            edges.append(d.edge_index.size(1))
            ys.append(d.y.reshape(1, -1).numpy() if d.y.dim() > 1 or d.y.numel() > 1 or d.y.is_floating_point()
                      else d.y.reshape(-1).numpy())
        writer.add(Chunk(np.concatenate(xs), np.concatenate(es), np.concatenate(attrs) if e_width else None,
                         np.asarray(nodes), np.asarray(edges)), where)
    y = np.concatenate(ys)
    if y.ndim == 1 and np.issubdtype(y.dtype, np.integer):
        y = y.astype(np.int64)
    split = getattr(made, "get_idx_split", None)
    splits = random_splits(cfg, count)
    if callable(split):
        given = split()
        splits = {s: np.asarray(given["valid" if s == "val" else s]).reshape(-1) for s in SPLITS}
    writer.close(y, splits, source, where)


# ---------------------------------------------------------------------- OGB's graph property datasets


_OGB_KINDS = {"binary classification": "multilabel", "multiclass classification": "classification",
              "regression": "regression"}
_OGB_METRICS = ("rocauc", "ap", "acc", "mae", "rmse")  # OGB's eval metrics that are hpcgnn's metrics, by name


def _csv_chunks(path: Path, dtype, rows: int = 1 << 20) -> Iterator[np.ndarray]:
    """A raw .csv.gz file of OGB's (no header, comma-separated numbers) a block of rows at a time, as
    ``ogb.io.read_csv_graph_raw`` reads it whole."""
    import pandas as pd

    for block in pd.read_csv(path, compression="gzip", header=None, chunksize=rows):
        yield block.values.astype(dtype)


class _Rows:
    """Rows of a chunked file taken a count at a time (its first block read at once: ``width``, its columns)."""

    def __init__(self, chunks: Iterator[np.ndarray] | None):
        self.chunks, self.buf, self.have, self.width = chunks, [], 0, 0
        if chunks is not None:
            first = next(chunks)
            self.buf, self.have, self.width = [first], first.shape[0], first.shape[1]

    def take(self, n: int) -> np.ndarray | None:
        if self.chunks is None:
            return None
        while self.have < n:
            block = next(self.chunks)
            self.buf.append(block)
            self.have += block.shape[0]
        whole = np.concatenate(self.buf) if len(self.buf) > 1 else self.buf[0]
        self.buf, self.have = [whole[n:]], whole.shape[0] - n
        return whole[:n]


def ogb_graphs(cfg, tmp: Path, source: dict, allow_download: bool = False) -> None:
    """OGB's graph property dataset from its raw files (``<dataset.root>/ogb/<name>/raw``: edge.csv.gz,
    num-node-list, num-edge-list, node-feat, edge-feat, graph-label; ``split/<its split>/``), read a block of graphs at
    a time (the files ``ogb.io.read_csv_graph_raw`` reads; its inverse edges added as it adds them: each edge
    followed by its reverse), with OGB's split, task type and metric."""
    from hpcgnn.data.ogb import DatasetMissing, ogb_meta, raw_folder

    meta = ogb_meta(cfg.name)
    folder = raw_folder(cfg, meta, allow_download)  # (downloaded where allowed: python -m hpcgnn.data prepare)
    raw = folder / "raw"
    inverse = str(meta["add_inverse_edge"]) == "True"
    nodes = next(_csv_chunks(raw / "num-node-list.csv.gz", np.int64, 1 << 40)).reshape(-1)
    edges = next(_csv_chunks(raw / "num-edge-list.csv.gz", np.int64, 1 << 40)).reshape(-1)
    has_x, has_e = (raw / "node-feat.csv.gz").exists(), (raw / "edge-feat.csv.gz").exists()
    molecule = meta.get("data type") == "mol"
    x_vocab = e_vocab = None
    if molecule:
        from ogb.utils.features import get_atom_feature_dims, get_bond_feature_dims

        x_vocab, e_vocab = tuple(get_atom_feature_dims()), tuple(get_bond_feature_dims())
    x_dtype = np.int16 if molecule else np.float32
    e_dtype = np.int16 if molecule else np.float32
    x_rows = _Rows(_csv_chunks(raw / "node-feat.csv.gz", x_dtype) if has_x else None)
    e_rows = _Rows(_csv_chunks(raw / "edge.csv.gz", np.int64))
    a_rows = _Rows(_csv_chunks(raw / "edge-feat.csv.gz", e_dtype) if has_e else None)
    x_width, e_width = x_rows.width or 1, a_rows.width
    if not has_x:  # (ogbg-ppa: no node features; OGB's baseline embeds one code for every node)
        x_dtype, x_vocab = np.int16, (1,)
    writer = GraphWriter(tmp, x_dtype, x_width, e_dtype if e_width else None, e_width)
    for lo in range(0, nodes.size, CHUNK_GRAPHS):
        n, e = nodes[lo:lo + CHUNK_GRAPHS], edges[lo:lo + CHUNK_GRAPHS]
        x = x_rows.take(int(n.sum()))
        x = np.zeros((int(n.sum()), 1), np.int16) if x is None else x
        ei = e_rows.take(int(e.sum())).astype(np.int32)
        attr = a_rows.take(int(e.sum()))
        if inverse:  # each edge followed by its reverse (as ogb.io adds them)
            ei, attr, e = _with_inverse(ei, attr, e)
        writer.add(Chunk(x, ei, attr, n, e), f"dataset={cfg.name}")
    y = next(_csv_chunks(raw / "graph-label.csv.gz", np.float64, 1 << 40))
    kind = _OGB_KINDS.get(meta["task type"])
    if kind is None:
        raise DatasetError(f"dataset={cfg.name}: OGB's task type {meta['task type']!r} is not one hpcgnn trains")
    y = y.astype(np.float32) if kind != "classification" else y.reshape(-1).astype(np.int64)
    split = folder / "split" / meta["split"]
    if not (split / "train.csv.gz").exists():
        raise DatasetMissing(f"dataset={cfg.name}: OGB's split is not under {split}. HINT: put its download's split/ "
                             "folder there")
    splits = {s: next(_csv_chunks(split / f"{f}.csv.gz", np.int64, 1 << 40)).reshape(-1)
              for s, f in zip(SPLITS, ("train", "valid", "test"), strict=True)}
    writer.close(y, splits, source, f"dataset={cfg.name}", x_vocab=x_vocab, edge_vocab=e_vocab, kind=kind,
                 metric=meta["eval metric"] if meta["eval metric"] in _OGB_METRICS else None)


PCQM_URL = "https://dgl-data.s3-accelerate.amazonaws.com/dataset/OGB-LSC/pcqm4m-v2.zip"  # (ogb.lsc's)
SMILES_ROWS = 50_000  # molecules read at once (a reader's block)
SMILES_READERS = 16  # reader processes at most (one per usable CPU below that)


def pcqm4mv2(cfg, tmp: Path, source: dict, allow_download: bool = False) -> None:
    """OGB-LSC's PCQM4Mv2 (``dataset=pcqm4mv2``): 3.7M molecules as SMILES with their HOMO-LUMO gap, each read into a
    graph by OGB's own ``smiles2graph`` (RDKit: ``pip install rdkit``) a block of molecules at a time, by a pool of
    reader processes (one per usable CPU, at most ``SMILES_READERS``; memory bounded: two blocks a reader ahead at
    most, written in the file's order); regression,
    MAE as its evaluator; OGB's split (train, and valid as the validation split: test-dev's and test-challenge's
    labels are hidden, so there is no test split; ``hpcgnn predict RUN split=all`` writes their predictions)."""
    import pandas as pd

    from hpcgnn.data.ogb import DatasetMissing, pcqm_folder, prepare_command
    from hpcgnn.errors import MissingExtra

    try:
        from ogb.utils import smiles2graph  # noqa: F401  (the readers': smiles_chunk)
        from ogb.utils.features import get_atom_feature_dims, get_bond_feature_dims
        from rdkit import Chem  # noqa: F401  (smiles2graph's; its import error says nothing of the fix)
    except ImportError:
        raise MissingExtra("dataset=pcqm4mv2 reads its molecules' SMILES with RDKit, which is not installed. HINT: "
                           "pip install rdkit (or hpcgnn[molecules])") from None
    folder = pcqm_folder(cfg)
    raw = folder / "raw" / "data.csv.gz"
    if not raw.exists() and allow_download:
        from ogb.utils.url import download_url, extract_zip

        try:
            path = download_url(PCQM_URL, str(folder.parent))
        except OSError as exc:
            raise DatasetMissing(f"could not download pcqm4mv2 from {PCQM_URL} ({exc}). HINT: put its unpacked zip as "
                                 f"{folder} (raw/data.csv.gz, split_dict.pt)") from None
        extract_zip(path, str(folder.parent))
        Path(path).unlink()
    if not raw.exists():
        raise DatasetMissing(f"pcqm4mv2 is not under {folder}, and training jobs do not download. HINT: on a login "
                             f"node run\n    {prepare_command(cfg)}\n(or put its zip's pcqm4m-v2/ there)")
    writer = GraphWriter(tmp, np.int16, len(get_atom_feature_dims()), np.int16, len(get_bond_feature_dims()))
    labels = []

    def smiles():
        first = 0
        for block in pd.read_csv(raw, chunksize=SMILES_ROWS):
            labels.append(block["homolumogap"].values.astype(np.float32))
            yield list(block["smiles"].values), first, str(raw)
            first += len(block)

    readers = min(SMILES_READERS, len(os.sched_getaffinity(0)))
    for chunk in _read_smiles(smiles(), readers):
        writer.add(chunk, f"dataset=pcqm4mv2 ({raw})")
    given = _pcqm_splits(folder / "split_dict.pt")
    splits = {"train": given["train"], "val": given["valid"], "test": np.zeros(0, np.int64)}
    writer.close(np.concatenate(labels), splits, source, "dataset=pcqm4mv2", x_vocab=tuple(get_atom_feature_dims()),
                 edge_vocab=tuple(get_bond_feature_dims()), kind="regression", metric="mae")


def smiles_chunk(smiles: list[str], first: int = 0, where: str = "") -> Chunk:
    """A block of molecules' SMILES (``first``: the first one's row in ``where``) as a chunk of graphs, each by OGB's
    ``smiles2graph`` (a reader process's work); a SMILES RDKit cannot read is refused naming its row."""
    from ogb.utils import smiles2graph
    from rdkit import Chem

    graphs = []
    for i, s in enumerate(smiles):
        try:
            graphs.append(smiles2graph(s))  # (it parses the SMILES once; a refused one fails on RDKit's None)
        except AttributeError:
            if Chem.MolFromSmiles(s) is not None:
                raise
            raise DatasetError(f"{where}: row {first + i} holds SMILES {s!r}, which RDKit cannot read (its message is "
                               "above). HINT: mend or drop that molecule, or read it with the RDKit the file was "
                               "made with") from None
    return Chunk(np.concatenate([g["node_feat"] for g in graphs]).astype(np.int16),
                 np.concatenate([g["edge_index"].T for g in graphs]).astype(np.int32),
                 np.concatenate([g["edge_feat"] for g in graphs]).astype(np.int16),
                 np.array([g["num_nodes"] for g in graphs]), np.array([g["edge_index"].shape[1] for g in graphs]))


def _read_smiles(blocks: Iterator[tuple], readers: int) -> Iterator[Chunk]:
    """``blocks`` of SMILES (:func:`smiles_chunk`'s arguments) read into chunks in their order: here (one reader, or
    a file of one block), or by ``readers`` processes, at most two blocks a reader ahead of the writer (memory stays
    bounded)."""
    ahead = [b for b in (next(blocks, None), next(blocks, None)) if b is not None]
    if len(ahead) < 2 or readers < 2:
        for block in itertools.chain(ahead, blocks):
            yield smiles_chunk(*block)
        return
    from collections import deque
    from concurrent.futures import ProcessPoolExecutor

    from hpcgnn.process import start_context

    with ProcessPoolExecutor(readers, mp_context=start_context()) as pool:
        pending = deque(pool.submit(smiles_chunk, *b) for b in ahead)
        for block in blocks:
            if len(pending) >= 2 * readers:
                yield pending.popleft().result()
            pending.append(pool.submit(smiles_chunk, *block))
        while pending:
            yield pending.popleft().result()


def _pcqm_splits(path: Path) -> dict[str, np.ndarray]:
    """OGB-LSC's ``split_dict.pt`` (index arrays by split), read without running its pickle's code: torch's weights-only
    loader, numpy's arrays allowed."""
    if not path.exists():
        raise DatasetError(f"{path} is missing: PCQM4Mv2's split. HINT: put its zip's split_dict.pt there")
    reconstruct = np._core.multiarray._reconstruct
    int64 = type(np.dtype(np.int64))
    allowed = [(reconstruct, f"{m}.multiarray._reconstruct") for m in ("numpy.core", "numpy._core")]
    allowed += [np.ndarray, np.dtype, int64, (int64, "numpy.dtype[int64]")]  # (numpy 1's names and numpy 2's)
    try:
        with torch.serialization.safe_globals(allowed):
            split = torch.load(path, weights_only=True)
    except Exception as exc:
        raise DatasetError(f"{path} cannot be read as PCQM4Mv2's split (index arrays by split): {exc}") from None
    return {k: np.asarray(v, dtype=np.int64).reshape(-1) for k, v in split.items()}


def _with_inverse(ei: np.ndarray, attr: np.ndarray | None, e: np.ndarray):
    """Each edge followed by its reverse, with the same features (``ogb.io``'s add_inverse_edge: each graph's edges
    stay together)."""
    out = np.repeat(ei, 2, axis=0)
    out[1::2] = ei[:, ::-1]
    return out, None if attr is None else np.repeat(attr, 2, axis=0), 2 * e
