"""A user's own graph from a folder of .npy / .pt files, checked before any training.

Expected files (``.npy``, or ``.pt`` tensors read with ``weights_only=True``):
``edge_index`` [2, E] int (source, target), ``x`` [N, F] float, optionally ``edge_attr`` [E, D] float (each
edge's features, in edge_index's order), ``y``: [N] int class ids (-1 for unlabeled
nodes), or [N, C] binary labels (NaN or -1: unknown), or float values [N] or [N, D] (NaN: unknown) (what the
task makes of them: :mod:`hpcgnn.labels`), ``train_idx``, ``val_idx``, ``test_idx`` [k] int. An edge task's folder
(``task=edge``: its targets in ``edge_label_index`` and ``edge_label``, :mod:`hpcgnn.data.edges`) may give no ``y``
and no node splits.

A typed graph (a folder with ``edges/``; :func:`load_typed_files`)::

    nodes/<type>/x            [N_type, F] float; every type with features has the same F
    nodes/<type>/num_nodes    [] or [1] int, for a type without x
    nodes/<target>/y, train_idx, val_idx, test_idx
                              the one type with labels is the target
    edges/<src>__<name>__<dst>/edge_index
                              [2, E] int (source, target) in the two types' own ids
    edges/<src>__<name>__<dst>/edge_attr
                              [E, D] float, optional: each edge's features (a relation's own width)
    edges/<src>__<name>__<dst>/edge_time
                              [E] int or float, optional (every relation's, or none): each edge's time; then
    nodes/<target>/seed_time  [N_target]: when each label is asked (:mod:`hpcgnn.data.times`)

Give each relation in one direction: it gains its reverse (``rev_<name>``; a relation inside one
type becomes undirected), as is customary for typed graphs (ogbn-mag). A type without
features gets the mean of its in-neighbours' along the relation with the most edges into it
from a type with features (recorded as the graph's ``feature_rule``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from hpcgnn.config import DatasetConfig
from hpcgnn.data.graph import Graph
from hpcgnn.data.ooc import drop_pages
from hpcgnn.data.times import read_times, read_typed_times, time_parts
from hpcgnn.errors import ConfigError, DatasetError
from hpcgnn.labels import profile, stored

FILES = ("edge_index", "x", "y", "train_idx", "val_idx", "test_idx")


STREAM_VALUES = 1 << 22  # edges (or feature values) read at a time from a folder's mapped arrays


class DatasetFileError(DatasetError):
    """A dataset file is missing or wrong; the message names the file."""


def read_array(folder: Path, name: str, mmap: bool = False) -> tuple[Path, np.ndarray]:
    """The array in ``name``.npy (memory-mapped with ``mmap``) or ``name``.pt (read whole)."""
    for suffix in (".npy", ".pt"):
        path = folder / f"{name}{suffix}"
        if path.is_file():
            try:
                if suffix == ".npy":
                    return path, np.load(path, allow_pickle=False, mmap_mode="r" if mmap else None)
                value = torch.load(path, weights_only=True, map_location="cpu")
            except Exception as exc:
                raise DatasetFileError(f"{path}: cannot be read ({exc})") from exc
            if not isinstance(value, torch.Tensor):
                raise DatasetFileError(f"{path}: must hold one tensor, found {type(value).__name__}")
            return path, value.numpy()
    raise DatasetFileError(f"{folder}: {name}.npy or {name}.pt is missing (dataset=files needs {', '.join(FILES)})")


def files_folder(cfg: DatasetConfig) -> Path:
    """The folder ``dataset.path`` names, checked to exist."""
    if not cfg.path:
        raise ConfigError("dataset=files needs the folder of your graph: set dataset.path=/path/to/graph")
    folder = Path(cfg.path).expanduser().resolve()
    if not folder.is_dir():
        raise DatasetFileError(f"dataset.path={cfg.path} is not a folder")
    return folder


def _blocks(a: np.ndarray, rows: int):
    """``a``'s blocks of ``rows`` rows, each handed back once the caller has read it (a mapped file's pages
    would otherwise stay in this process's RSS: checking a large folder touches all of it)."""
    for start in range(0, a.shape[0], rows):
        block = a[start:start + rows]
        yield start, block
        drop_pages(block)


def _edge_chunks(ei: np.ndarray, chunk: int):
    """``ei`` [2, E] (mapped) as int64 (sources, targets) tensors of ``chunk`` edges, pages handed back as read."""
    for (_, src), (_, dst) in zip(_blocks(ei[0], chunk), _blocks(ei[1], chunk), strict=True):
        yield torch.from_numpy(np.array(src, dtype=np.int64)), torch.from_numpy(np.array(dst, dtype=np.int64))


def _feature_chunks(x: np.ndarray, values: int):
    """``x`` [N, F] (mapped) as (first row, float32 rows) of about ``values`` values each."""
    for start, rows in _blocks(x, max(values // max(x.shape[1], 1), 1)):
        yield start, torch.from_numpy(np.array(rows, dtype=np.float32))


def check_features(px: Path, x: np.ndarray, what: str = "features", shape: str = "num_nodes, num_features") -> None:
    if x.ndim != 2 or not np.issubdtype(x.dtype, np.floating):
        raise DatasetFileError(f"{px}: {what} must be a float array of shape [{shape}], got {x.dtype} {tuple(x.shape)}")
    bad, first = 0, None
    for start, block in _blocks(x, max(STREAM_VALUES // max(x.shape[1], 1), 1)):
        rows = ~np.isfinite(block).all(axis=1)
        if rows.any():
            bad += int(rows.sum())
            first = start + int(np.argmax(rows)) if first is None else first
    if bad:
        rows = "nodes, first node" if what == "features" else "edges, first edge"
        raise DatasetFileError(f"{px}: {what} contain NaN or inf ({bad} {rows} {first})")


def check_edges(pe: Path, ei: np.ndarray, num_src: int, num_dst: int, what: str) -> None:
    """``ei`` [2, E]: sources in [0, num_src), targets in [0, num_dst); ``what`` says where the counts come from."""
    if ei.ndim != 2 or ei.shape[0] != 2 or not np.issubdtype(ei.dtype, np.integer):
        raise DatasetFileError(f"{pe}: edge_index must be an integer array of shape [2, num_edges], "
                               f"got {ei.dtype} {tuple(ei.shape)}")
    if not ei.shape[1]:
        return
    bounds = []
    for ids in (ei[0], ei[1]):  # a chunk of ids at a time
        lo = hi = None
        for _, block in _blocks(ids, STREAM_VALUES):
            lo = int(block.min()) if lo is None else min(lo, int(block.min()))
            hi = int(block.max()) if hi is None else max(hi, int(block.max()))
        bounds.append((lo, hi))
    (s0, s1), (d0, d1) = bounds
    ends = ([((min(s0, d0), max(s1, d1)), num_src, "node")] if num_src == num_dst else
            [((s0, s1), num_src, "source"), ((d0, d1), num_dst, "target")])
    for (lo, hi), n, end in ends:
        if lo < 0 or hi >= n:
            raise DatasetFileError(f"{pe}: {end} ids must lie in [0, {n}) ({what}); found min {lo}, max {hi}")


def label_classes(py: Path, y: np.ndarray, declared: int) -> int:
    """The classes of the model: ``dataset.num_classes`` when given (every label below it), else the labels'
    own, which must then be every id from 0 to the largest (a stray label 99 among classes 0..3 would make a
    100-class model without a word)."""
    labelled = y[y >= 0]
    top = int(labelled.max()) + 1 if labelled.size else 0
    if declared:
        if top > declared:
            raise DatasetFileError(f"{py}: label {top - 1} is not below dataset.num_classes={declared}. HINT: "
                                   f"set dataset.num_classes={top} or more, or fix the label")
        return declared
    used = np.unique(labelled)
    if used.size != top:
        gaps = np.setdiff1d(np.arange(top), used)
        raise DatasetFileError(
            f"{py}: labels run up to {top - 1} but only {used.size} classes have nodes ({gaps.size} ids in between "
            f"have none, e.g. {int(gaps[0])}): a stray label would make a {top}-class model. HINT: number the "
            f"classes 0..{used.size - 1}, or set dataset.num_classes={top} if the model should have those classes")
    return top


def is_class_ids(y: np.ndarray) -> bool:
    """One integer column: a class per node (``[N]``, or ``[N, 1]``)."""
    return np.issubdtype(y.dtype, np.integer) and (y.ndim == 1 or y.ndim == 2 and y.shape[1] == 1)


def check_labels_and_splits(arrays: dict, n: int) -> dict[str, tuple[Path, np.ndarray]]:
    """Labels (class ids [n], -1: unlabeled; or binary labels or values [n] or [n, C], NaN or -1: unknown) and three
    disjoint splits, the training split non-empty (class ids: every split node labelled)."""
    py, y = arrays["y"]
    numeric = np.issubdtype(y.dtype, np.integer) or np.issubdtype(y.dtype, np.floating) or y.dtype == np.bool_
    if y.ndim not in (1, 2) or y.shape[0] != n or not numeric:
        raise DatasetFileError(f"{py}: labels must be an array of shape [{n}] (class ids, or values) or [{n}, C] "
                               f"(binary labels, or values), got {y.dtype} {tuple(y.shape)}")
    classes = is_class_ids(y)
    if classes:
        y = y.reshape(-1)
        if (y < -1).any():
            raise DatasetFileError(f"{py}: labels must be class ids >= 0, or -1 for unlabeled nodes")
    splits = {}
    for name in ("train_idx", "val_idx", "test_idx"):
        path, idx = arrays[name]
        if idx.ndim != 1 or not np.issubdtype(idx.dtype, np.integer):
            raise DatasetFileError(f"{path}: must be a 1-D integer array of node ids, got {idx.dtype} {tuple(idx.shape)}")
        if idx.size and (idx.min() < 0 or idx.max() >= n):
            raise DatasetFileError(f"{path}: node ids must lie in [0, {n}); found min {int(idx.min())}, max {int(idx.max())}")
        if np.unique(idx).size != idx.size:
            raise DatasetFileError(f"{path}: lists some nodes twice")
        if classes and (y[idx] < 0).any():
            raise DatasetFileError(f"{path}: contains unlabeled nodes (y = -1 in {py.name}), e.g. node "
                                   f"{int(idx[np.argmax(y[idx] < 0)])}")
        splits[name] = (path, idx)
    names = list(splits)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            common = np.intersect1d(splits[a][1], splits[b][1])
            if common.size:
                raise DatasetFileError(f"{splits[a][0]} and {splits[b][0]} overlap in {common.size} nodes "
                                       f"(e.g. node {int(common[0])}): splits must be disjoint")
    if splits["train_idx"][1].size == 0:
        raise DatasetFileError(f"{splits['train_idx'][0]}: the training split is empty")
    return splits


def read_checked(cfg: DatasetConfig, mmap: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict, int,
                                                                  np.ndarray | None]:
    """(edge_index [2, E], x [N, F], y [N], splits, classes, edge_attr [E, D] or None) of a homogeneous folder,
    every file checked; ``mmap``: .npy files memory-mapped (the checks read them a pass at a time; nothing is
    copied whole)."""
    folder = files_folder(cfg)
    unlabelled = without_node_labels(cfg, folder)
    arrays = {name: read_array(folder, name, mmap) for name in (FILES[:2] if unlabelled else FILES[:3])}
    if not unlabelled:
        arrays.update(split_files(cfg, folder, arrays["y"][1], mmap))
    px, x = arrays["x"]
    check_features(px, x)
    n = x.shape[0]
    pe, ei = arrays["edge_index"]
    check_edges(pe, ei, n, n, f"{n} = rows of {px.name}")
    if unlabelled:  # an edge task's graph: its targets are edges; its nodes need no labels nor splits
        empty = np.empty(0, dtype=np.int64)
        y, classes, splits = np.full(n, -1, dtype=np.int64), 0, {k: (folder, empty) for k in FILES[3:]}
    else:
        splits = check_labels_and_splits(arrays, n)
        y, classes = node_labels(*arrays["y"], cfg.num_classes)
    edge_attr = read_edge_features(folder, pe, ei.shape[1], mmap)
    return ei, x, y, {k: v[1] for k, v in splits.items()}, classes, edge_attr


def without_node_labels(cfg: DatasetConfig, folder: Path) -> bool:
    """An edge task's folder that gives no node labels (no ``y``): its nodes get none (-1) and no splits; its targets
    are its edges' (:mod:`hpcgnn.data.edges`)."""
    return cfg.prepared_for == "edge" and not any((folder / f"y{suffix}").is_file() for suffix in (".npy", ".pt"))


def read_edge_features(folder: Path, edges_file: Path, num_edges: int, mmap: bool = False) -> np.ndarray | None:
    """``folder``'s edge features (``edge_attr``, [E, D], a row per edge of ``edges_file``), checked; None without."""
    if not has_edge_features(folder):
        return None
    pa, edge_attr = read_array(folder, "edge_attr", mmap)
    check_features(pa, edge_attr, "edge features", "num_edges, edge features")
    if edge_attr.shape[0] != num_edges:
        raise DatasetFileError(f"{pa}: {edge_attr.shape[0]} rows of edge features for the {num_edges} edges of "
                               f"{edges_file.name}: one row per edge, in its order")
    return edge_attr


def has_edge_features(folder: Path) -> bool:
    """Whether a folder gives its edges' features (``edge_attr.npy`` or ``.pt``, [E, D], a row per edge)."""
    return any((folder / f"edge_attr{suffix}").is_file() for suffix in (".npy", ".pt"))


def node_labels(py: Path, y: np.ndarray, declared: int) -> tuple[np.ndarray, int]:
    """The labels in their stored form (:func:`hpcgnn.labels.stored`) and the model's outputs: class ids' classes
    (:func:`label_classes`), else one per column."""
    try:
        kept = stored(y, str(py))
    except DatasetError as exc:  # (naming the file: a DatasetFileError)
        raise DatasetFileError(str(exc)) from None
    if is_class_ids(y):
        return kept, label_classes(py, y.reshape(-1), declared)
    return kept, (y.shape[1] if y.ndim == 2 else 1)


def split_files(cfg: DatasetConfig, folder: Path, y: np.ndarray, mmap: bool = False) -> dict:
    """The three splits of a folder's nodes, as ``(path, ids)`` read from its files; or, with ``dataset.time_split``
    ([t_val, t_test]), its labelled nodes by ``seed_time``: before t_val training, before t_test validation, the
    rest test (the folder's own split files, if any, not read). A link task's cut times split its edges instead
    (:func:`hpcgnn.data.link.time_split_edges`), an edge task's its targets (:func:`hpcgnn.data.edges.prepare_targets`),
    a table's its entries (:mod:`hpcgnn.data.tables`)."""
    from hpcgnn.checks import has_table

    cut = getattr(cfg, "time_split", None)
    if cut is None or cfg.prepared_for in ("link", "edge") or has_table(cfg):
        return {name: read_array(folder, name, mmap) for name in FILES[3:]}
    ps, when = read_array(folder, "seed_time", mmap=True)
    if when.ndim != 1 or when.shape[0] != y.shape[0]:
        raise DatasetFileError(f"{ps}: shape {tuple(when.shape)}, expected [{y.shape[0]}]: one time per node")
    labelled, when = _known(np.asarray(y)), np.asarray(when)
    return {name: (ps, np.flatnonzero(labelled & part)) for name, part in zip(FILES[3:], time_parts(when, cut),
                                                                              strict=True)}


def _known(y: np.ndarray) -> np.ndarray:
    """Which nodes have a label: a class id >= 0; a value or binary label not unknown (NaN; -1 in integer columns)."""
    if is_class_ids(y):
        return y.reshape(-1) >= 0
    unknown = np.isnan(y.astype(np.float64)) if y.dtype.kind == "f" else y == -1
    return ~unknown if y.ndim == 1 else ~unknown.all(axis=1)


def read_labels(cfg: DatasetConfig) -> tuple[dict, int]:
    """A homogeneous folder's labels as the launcher checks them before submitting: their profile
    (:func:`hpcgnn.labels.profile`) and the model's outputs; y and the splits read, the features and edges not."""
    folder = files_folder(cfg)
    arrays = {"y": read_array(folder, "y", mmap=True)}
    arrays.update(split_files(cfg, folder, arrays["y"][1]))
    splits = check_labels_and_splits(arrays, arrays["y"][1].shape[0])
    y, classes = node_labels(*arrays["y"], cfg.num_classes)
    return profile(y, {k.removesuffix("_idx"): v[1] for k, v in splits.items()}), classes


def stream_files(cfg: DatasetConfig, buckets, features, chunk: int = STREAM_VALUES
                 ) -> tuple[np.ndarray, dict, int, np.ndarray | None]:
    """A homogeneous folder into an out-of-core CSR: edges a chunk at a time into ``buckets`` (with their
    reverses for ``dataset.to_undirected``; with their ids, buckets made ``ids=True``: a reverse's is its edge's
    plus E, as if the reverses followed the edges),
    feature rows into ``features``; returns (y, splits, classes, the edges' features, mapped, or None, and the
    edges' and seeds' times: :func:`hpcgnn.data.times.read_times`)."""
    ei, x, y, splits, classes, edge_attr = read_checked(cfg, mmap=True)
    timed = read_times(files_folder(cfg), ei.shape[1], x.shape[0], lambda f, name: read_array(f, name, mmap=True))
    start = 0
    for src, dst in _edge_chunks(ei, chunk):
        ids = torch.arange(start, start + src.numel()) if buckets.ids else None
        buckets.add(dst, src, ids=ids)
        if cfg.to_undirected:  # a reverse's id: after every given edge's (a duplicate keeps the edge given first)
            buckets.add(src, dst, ids=ids + ei.shape[1] if ids is not None else None)
        start += src.numel()
    for a, rows in _feature_chunks(x, chunk):
        features.write(a, rows)
    return y, {k: np.asarray(v, dtype=np.int64) for k, v in splits.items()}, classes, edge_attr, timed


def read_shapes(cfg: DatasetConfig) -> dict:
    """Node, feature and edge counts of a homogeneous folder, and the width of its edges' features (0: none; None:
    not an [E, D] array, which preparing refuses), from the arrays' headers (.npy: mapped)."""
    folder = files_folder(cfg)
    _, x = read_array(folder, "x", mmap=True)
    _, ei = read_array(folder, "edge_index", mmap=True)
    edge_attr = read_array(folder, "edge_attr", mmap=True)[1] if has_edge_features(folder) else None
    return {"num_nodes": x.shape[0], "num_features": x.shape[1] if x.ndim == 2 else 0,
            "num_edges": ei.shape[1] if ei.ndim == 2 else 0,
            "edge_dim": 0 if edge_attr is None else edge_attr.shape[1] if edge_attr.ndim == 2 else None}


def load_files(cfg: DatasetConfig, allow_download: bool = False) -> Graph:
    folder = files_folder(cfg)
    if is_typed_folder(folder):  # served homogeneous: dataset.erase_types=true
        return load_typed_files(cfg).homogeneous()
    ei, x, y, splits, classes, edge_attr = read_checked(cfg)
    n = x.shape[0]
    edge_index = torch.from_numpy(ei.astype(np.int64))
    edges = torch.from_numpy(np.asarray(edge_attr, dtype=np.float32)) if edge_attr is not None else None
    if cfg.to_undirected:
        edge_index = torch.cat([edge_index, edge_index.flip(0)], dim=1)
        edges = torch.cat([edges, edges]) if edges is not None else None
    return Graph.from_edge_index(edge_index, n, torch.from_numpy(x.astype(np.float32)), torch.from_numpy(y),
                                 *(torch.from_numpy(splits[k].astype(np.int64)) for k in splits),
                                 num_classes=classes, edge_attr=edges)


def is_typed_folder(folder: Path) -> bool:
    return (folder / "edges").is_dir()


@dataclass
class TypedFolder:
    """A typed folder's arrays, every file checked (.npy files memory-mapped with ``mmap``)."""

    num_nodes: dict[str, int]  # sorted by type
    x: dict[str, np.ndarray]  # the types with features
    target: str
    y: np.ndarray  # in the stored form (hpcgnn.labels.stored): class ids, or floats
    splits: dict[str, np.ndarray]  # train_idx, val_idx, test_idx
    edges: dict[tuple[str, str, str], np.ndarray]  # [2, E] per given relation, sorted by folder name
    feature_from: dict[str, tuple[str, str, str]]
    num_classes: int
    edge_attr: dict[tuple[str, str, str], np.ndarray]  # [E, D] per given relation whose edges have features
    edge_time: dict[tuple[str, str, str], np.ndarray] = None  # [E] per given relation (every one, or none: {})
    seed_time: np.ndarray | None = None  # [N_target]: when each target node's label is asked (its edges have times)


def read_typed_folder(cfg: DatasetConfig, mmap: bool = False) -> TypedFolder:
    """A typed graph from ``dataset.path`` laid out as ``nodes/<type>/...`` and ``edges/<src>__<name>__<dst>/``
    (see the module's docstring); every file checked, errors naming the file and the fix."""
    from hpcgnn.data.typed import expand_relations

    folder = files_folder(cfg)
    nodes_dir, edges_dir = folder / "nodes", folder / "edges"
    types = sorted(p.name for p in nodes_dir.iterdir() if p.is_dir()) if nodes_dir.is_dir() else []
    if not types:
        raise DatasetFileError(f"{nodes_dir}: a typed graph needs a folder per node type (nodes/<type>/x.npy ...)")
    num_nodes, x = {}, {}
    for t in types:
        if any((nodes_dir / t / f"x{suffix}").is_file() for suffix in (".npy", ".pt")):
            px, xt = read_array(nodes_dir / t, "x", mmap)
            check_features(px, xt)
            x[t], num_nodes[t] = xt, xt.shape[0]
        elif any((nodes_dir / t / f"num_nodes{suffix}").is_file() for suffix in (".npy", ".pt")):
            pn, count = read_array(nodes_dir / t, "num_nodes")
            if count.size != 1 or not np.issubdtype(count.dtype, np.integer) or int(count.reshape(-1)[0]) < 1:
                raise DatasetFileError(f"{pn}: must hold one positive integer, the number of {t} nodes")
            num_nodes[t] = int(count.reshape(-1)[0])
        else:
            raise DatasetFileError(f"{nodes_dir / t}: x.npy (features) or num_nodes.npy (a type without features) "
                                   "is missing")
    if not x:
        raise DatasetFileError(f"{nodes_dir}: no node type has features (nodes/<type>/x.npy)")
    widths = {v.shape[1] for v in x.values()}
    if len(widths) != 1:
        raise DatasetFileError(f"{nodes_dir}: every type with features needs the same width; got "
                               f"{ {t: v.shape[1] for t, v in x.items()} }")
    labelled = [t for t in types if any((nodes_dir / t / f"y{sfx}").is_file() for sfx in (".npy", ".pt"))]
    rels = sorted(p.name for p in edges_dir.iterdir() if p.is_dir())
    if not labelled and cfg.prepared_for == "edge":  # an edge task's graph: its targets are a relation's edges
        target = labelled_relation(edges_dir, rels)[2]  # (no node labels: none known, no node splits)
        y, classes = np.full(num_nodes[target], -1, dtype=np.int64), 0
        splits = {s: (nodes_dir, np.empty(0, dtype=np.int64)) for s in ("train_idx", "val_idx", "test_idx")}
    else:
        if len(labelled) != 1:
            raise DatasetFileError(f"{nodes_dir}: exactly one node type has labels (nodes/<type>/y.npy): the type to "
                                   f"classify; found {labelled or 'none'}")
        target = labelled[0]
        arrays = {name: read_array(nodes_dir / target, name) for name in ("y", "train_idx", "val_idx", "test_idx")}
        splits = check_labels_and_splits(arrays, num_nodes[target])
        y, classes = node_labels(*arrays["y"], cfg.num_classes)
    edges, edge_attr = {}, {}
    for key in rels:
        rel = tuple(key.split("__"))
        if len(rel) != 3 or rel[0] not in num_nodes or rel[2] not in num_nodes:
            raise DatasetFileError(f"{edges_dir / key}: a relation's folder is named <source type>__<name>__<target "
                                   f"type>, with types among {', '.join(types)}")
        if rel[0] != rel[2] and rel[1].startswith("rev_"):  # (it would merge into, or pile onto, an added reverse)
            forward = f"{rel[2]}__{rel[1].removeprefix('rev_')}__{rel[0]}"
            twin = f" It is the very reverse added to {forward}." if forward in rels else ""
            raise DatasetFileError(f"{edges_dir / key}: relation names starting with rev_ are the reverses hpcgnn adds "
                                   f"(every relation between two types gains rev_<name>).{twin} HINT: remove this "
                                   "folder if it holds another relation's reverse (it is added for you), or rename "
                                   "the relation without rev_")
        pe, ei = read_array(edges_dir / key, "edge_index", mmap)
        check_edges(pe, ei, num_nodes[rel[0]], num_nodes[rel[2]], f"the {rel[0]} and {rel[2]} counts")
        edges[rel] = ei
        rows = read_edge_features(edges_dir / key, pe, ei.shape[1], mmap)
        if rows is not None:
            edge_attr[rel] = rows
    if not edges:
        raise DatasetFileError(f"{edges_dir}: no relation (edges/<src>__<name>__<dst>/edge_index.npy)")
    feature_from = {}
    for t in types:
        if t in x:
            continue
        into = [(int(ei.shape[1]), r) for given, ei in edges.items() for r in expand_relations([given], True)
                if r[2] == t and r[0] in x]  # (the stored relations, reverses too; edge counts before duplicates go)
        if not into:
            raise DatasetFileError(f"{nodes_dir / t}: {t} has no features and no relation from a type with features "
                                   f"to take their mean over: add nodes/{t}/x.npy, or such a relation")
        feature_from[t] = max(into, key=lambda c: (c[0], c[1]))[1]
    edge_time, seed_time = read_typed_times(edges_dir, nodes_dir, target, {r: int(ei.shape[1]) for r, ei in edges.items()},
                                            num_nodes[target], lambda f, name: read_array(f, name, mmap))
    return TypedFolder(num_nodes, x, target, y, {k: v[1] for k, v in splits.items()}, edges, feature_from, classes,
                       edge_attr, edge_time, seed_time)


def labelled_relation(edges_dir: Path, rels: list[str]) -> tuple[str, str, str]:
    """The one relation of a typed folder whose edges are an edge task's targets (its folder holds edge_label)."""
    found = [key for key in rels if any((edges_dir / key / f"edge_label{sfx}").is_file() for sfx in (".npy", ".pt"))]
    if len(found) != 1:
        raise DatasetFileError(f"{edges_dir}: task=edge on a typed graph takes one relation's edges as its targets: "
                               f"exactly one relation folder holds edge_label.npy (a row per edge of its "
                               f"edge_index); found {found or 'none'}")
    return tuple(found[0].split("__"))


def load_typed_files(cfg: DatasetConfig, allow_download: bool = False):
    """A typed folder (:func:`read_typed_folder`) in memory; ``prepare`` streams it instead (:func:`typed_files_source`)."""
    from hpcgnn.data.typed import TypedGraph

    f = read_typed_folder(cfg)
    y = torch.from_numpy(np.asarray(f.y))  # (its stored form: class ids, or floats)
    return TypedGraph.from_edges(f.num_nodes, {r: torch.from_numpy(ei.astype(np.int64)) for r, ei in f.edges.items()},
                                 {t: torch.from_numpy(v.astype(np.float32)) for t, v in f.x.items()}, f.target, y,
                                 *(torch.from_numpy(f.splits[k].astype(np.int64)) for k in f.splits),
                                 num_classes=f.num_classes, feature_from=f.feature_from,
                                 edge_attr={r: torch.from_numpy(np.asarray(v, dtype=np.float32))
                                            for r, v in f.edge_attr.items()})


def typed_files_source(cfg: DatasetConfig, allow_download: bool = False):
    """A typed folder as :func:`~hpcgnn.data.prepare` streams it (:class:`~hpcgnn.data.typed.TypedSource`): its
    .npy files memory-mapped, edges and feature rows read STREAM_VALUES values at a time."""
    from hpcgnn.data.typed import TypedSource

    f = read_typed_folder(cfg, mmap=True)
    y = torch.from_numpy(np.asarray(f.y))  # (its stored form: class ids, or floats)

    def feed(writer):
        for rel, ei in f.edges.items():
            start = 0
            for src, dst in _edge_chunks(ei, STREAM_VALUES):  # (with their places, where features and times are)
                ids = torch.arange(start, start + src.numel()) if rel in f.edge_attr or rel in f.edge_time else None
                writer.add(rel, src, dst, ids=ids)
                start += src.numel()
        for t, x in f.x.items():
            for a, rows in _feature_chunks(x, STREAM_VALUES):
                writer.write_features(t, a, rows)
        return y, *(torch.from_numpy(np.asarray(f.splits[k], dtype=np.int64)) for k in f.splits)

    return TypedSource(f.num_nodes, list(f.edges), {r: int(ei.shape[1]) for r, ei in f.edges.items()},
                       next(iter(f.x.values())).shape[1], f.target, f.num_classes, f.feature_from, feed,
                       edge_attr=f.edge_attr, edge_time=f.edge_time, seed_time=f.seed_time)


