"""Preparing a dataset once into its cache folder: the cache key, and the graph built whole or streamed out of core (a
chunk of rows at a time, in buckets of the memory it may use).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import shutil
from pathlib import Path

import numpy as np

import hpcgnn.data.cache as cache
import hpcgnn.data.link as link
import hpcgnn.data.ooc as ooc
import hpcgnn.data.times as times
from hpcgnn import env, paths
from hpcgnn.checks import ON_DISK, gives, is_timed, is_typed
from hpcgnn.config import DatasetConfig
from hpcgnn.data.files import (
    files_folder,
    has_edge_features,
    is_typed_folder,
    read_labels,
    read_shapes,
    stream_files,
)
from hpcgnn.data.graph import report_merged
from hpcgnn.data.link import SPLITS, LinkData, link_arrays, link_meta, split_rows
from hpcgnn.data.ogb import (
    DatasetMissing,
    has_raw,
    held_out_keys,
    ogb_link_splits,
    ogb_shapes,
    prepare_command,
    stream_ogb,
    stream_raw_graph,
)
from hpcgnn.data.pyg import target_object
from hpcgnn.data.sources import TYPED_SOURCES, build_graph, build_link
from hpcgnn.data.synthetic import (
    GENERATOR_VERSION,
    expected_edges,
    generate_synthetic,
)
from hpcgnn.data.typed import (
    TypedSchema,
    TypedSource,
    TypedWriter,
    relation_key,
    view_labels,
)
from hpcgnn.errors import DatasetError
from hpcgnn.io import atomic_folder, write_npy
from hpcgnn.labels import profile, resolve, where_labels
from hpcgnn.specs import datasets

log = logging.getLogger(__name__)

# The fields that change what each source builds (the cache key).
def cache_folder(cfg: DatasetConfig) -> Path:
    """``<root>/prepared/<name>-<key>``: the key covers every setting that changes the graph."""
    spec = datasets.spec(cfg.name)
    fields = {k: getattr(cfg, k) for k in spec.key}
    if spec.user_folder:
        folder = files_folder(cfg)
        fields["path"] = str(folder)
        # Replaced files must not be served from an old cache.
        fields["files"] = sorted((str(p.relative_to(folder)), p.stat().st_size, p.stat().st_mtime_ns)
                                 for p in folder.rglob("*") if p.suffix in (".npy", ".pt"))
        if cfg.name == "files" and is_typed_folder(folder):  # typed, or its homogeneous view
            fields["erase_types"] = cfg.erase_types
    if cfg.name in ("synthetic", "synthetic_hetero"):
        fields["generator"] = GENERATOR_VERSION
    if datasets.spec(cfg.name).graphs:  # (a graph set's format)
        from hpcgnn.data.graphs import GRAPHS_VERSION

        fields["graphs"] = GRAPHS_VERSION
    if cfg.name == "files" and cfg.num_classes:  # declared classes (0, the labels' own, keeps the keys as they were)
        fields["num_classes"] = cfg.num_classes
    if cfg.name == "files" and getattr(cfg, "time_split", None) is not None:  # (None keeps the keys as they were)
        fields["time_split"] = list(cfg.time_split)
    if is_timed(cfg):  # (an untimed folder's key as it was)
        fields["timeline"] = times.TIMELINE_VERSION
    if cfg.feature_dtype != "float32":  # float32 keeps the keys graphs had before the option
        fields["feature_dtype"] = cfg.feature_dtype
    name = cfg.name
    if cfg.prepared_for == "link":
        fields.update({"edge_split": cfg.edge_split} if spec.split_edges else {}, seed=cfg.seed, link=True)
        if spec.split_edges:  # how the edges are split (2: a seeded hash of each pair)
            fields["split_version"] = link.SPLIT_VERSION
        name = f"{cfg.name}-link" if spec.split_edges else cfg.name
    key = hashlib.sha256(json.dumps({"name": cfg.name, **fields}, sort_keys=True, default=str).encode()).hexdigest()
    return Path(cfg.root).expanduser() / "prepared" / f"{name}-{key[:12]}"


def timed(dataset: DatasetConfig) -> bool:
    """Whether a dataset's edges have times: its prepared graph says so, or (not prepared yet) its files folder gives
    ``edge_time`` (:func:`hpcgnn.checks.is_timed`). What a rank asks before it evaluates or predicts exactly."""
    folder = cache_folder(dataset)
    if cache.is_complete(folder):
        more = cache.GraphMeta.read(folder).more
        return "times" in more or "times" in more.get("typed", {})
    return is_timed(dataset)


def check_root(cfg: DatasetConfig) -> None:
    """Refuse a data root any part of which this dataset reads, at any depth, that users other than you may have
    written (:func:`hpcgnn.paths.check_tree`): the root; its ``pyg/`` and ``ogb/`` (PyG's datasets unpickle their
    processed files); ``prepared/`` and this dataset's prepared graph with its edge targets and partitions (a graph
    or labels replaced by another user would be trained on); a files dataset's folder. Unless
    ``dataset.trust_root``: a root your lab controls, trusted as a whole (:func:`hpcgnn.paths.trust_root`)."""
    root, spec = Path(cfg.root).expanduser(), datasets.spec(cfg.name)
    pyg_root = dict(cfg.kwargs or {}).get("root") if spec.needs_target else None  # (PyG's datasets)
    if cfg.trust_root:
        for trusted in (root, cfg.path if spec.user_folder else None, pyg_root):
            if trusted:
                paths.trust_root(trusted)
        return
    hint = ("use a data root only you can write (dataset.root=...), or dataset.trust_root=true for a root your lab "
            "controls")
    folder = cache_folder(cfg) if not spec.user_folder or cfg.path else None
    mine = [str(Path(os.path.relpath(folder, root)))] if folder is not None else []
    paths.check_tree(root, "the data root", hint, only=("pyg", "ogb", *mine))
    if pyg_root:  # (PyG unpickles what it finds there)
        paths.check_tree(pyg_root, "the PyG dataset's root (dataset.kwargs.root)", hint)
    if spec.user_folder and cfg.path:
        paths.check_tree(files_folder(cfg), "the dataset's folder (dataset.path)",
                         "keep your graph's files in a folder only you can write, or dataset.trust_root=true for "
                         "one your lab controls")


def prepare(cfg: DatasetConfig, allow_download: bool = False) -> Path:
    """Build the graph (a link task: the link dataset) into the cache unless it is there; returns the folder."""
    check_root(cfg)
    folder = cache_folder(cfg)
    if cache.is_complete(folder):
        return folder
    log.info("preparing %s into %s", cfg.name, folder)
    source = {"dataset": dataclasses.asdict(cfg)}
    if datasets.spec(cfg.name).graphs:  # a dataset of many graphs: one graph set (hpcgnn.data.graphs)
        from hpcgnn.data.graphs import prepare_graphs

        return prepare_graphs(cfg, folder, source, allow_download)
    homogeneous_files = cfg.name == "files" and not is_typed_folder(files_folder(cfg))
    if cfg.name in TYPED_SOURCES and not homogeneous_files and (cfg.prepared_for != "link" or cfg.name == "files"):
        # typed sources, out of core (types erased: the view alone; a typed folder's link dataset: split from it)
        return prepare_typed_streamed(cfg, folder, source, allow_download)
    streamed = datasets.spec(cfg.name).streamed or homogeneous_files
    if cfg.prepared_for == "link" and streamed:
        return prepare_streamed(cfg, folder, source, allow_download)  # (split chunk by chunk)
    if cfg.prepared_for == "link":
        data = build_link(cfg, allow_download)
        arrays, meta = link_arrays(data)
        return cache.save(data.graph, folder, source, extra=arrays, extra_meta=meta)
    if streamed:
        # streamed to disk: edges in buckets, never the whole edge list in memory
        return prepare_streamed(cfg, folder, source, allow_download)
    return cache.save(build_graph(cfg, allow_download), folder, source)


def prepare_typed_streamed(cfg: DatasetConfig, folder: Path, source: dict, allow_download: bool = False) -> Path:
    """A typed graph drawn or read a chunk at a time into ``folder`` (:class:`TypedWriter`): each relation's
    CSR and the homogeneous view's bucketed on disk, features written as they come, rule types' features
    computed from the written CSR; with ``dataset.erase_types=true`` the view alone. A link dataset (of a
    typed folder, types erased): the view whole first, then split a chunk of rows at a time."""
    relations_too = is_typed(cfg) and cfg.prepared_for != "link"
    src = TYPED_SOURCES[cfg.name](cfg, allow_download)
    folder.parent.mkdir(parents=True, exist_ok=True)
    total, edges = sum(src.num_nodes.values()), 2 * sum(src.expected.values())
    need = edges * ooc.index_dtype(total).itemsize * (6 if relations_too else 3) + total * (src.num_features * 8 + 32)
    _check_space(folder, need)
    with atomic_folder(folder) as tmp:
        if cfg.prepared_for == "link":
            _stream_typed(cfg, src, tmp / "whole", source, relations_too=False)
            _split_streamed(cfg, tmp / "whole", tmp, source)
        else:
            _stream_typed(cfg, src, tmp, source, relations_too)
    return folder


def _stream_typed(cfg: DatasetConfig, src: TypedSource, tmp: Path, source: dict, relations_too: bool) -> None:
    tmp.mkdir(exist_ok=True)
    sizes, total = src.num_nodes, sum(src.num_nodes.values())
    if src.edge_time and not relations_too:  # (the homogeneous view keeps no times: never read as if untimed)
        raise DatasetError(f"dataset.path={cfg.path} is a typed graph whose edges have times, which its homogeneous "
                          "view (dataset.erase_types=true, or a link task's) does not keep. HINT: give it as one "
                          "homogeneous folder (edge_index, edge_time; its types as features), or train it typed")
    writer = TypedWriter(tmp, sizes, src.relations, src.expected, src.num_features, prepare_mem_bytes(cfg), src.reverse,
                         relations_too=relations_too, edge_attr=src.edge_attr, edge_time=src.edge_time)
    y, *splits = src.feed(writer)
    num_edges, rule, arrays = writer.close(src.feature_from, cfg.feature_dtype)
    for rel, (given, kept) in writer.merged.items():  # (inside one type, a relation holds its reverses too)
        undirected = src.reverse and rel[0] == rel[2]
        report_merged(cfg, given, kept, f"edges of {relation_key(rel)}", reverses=undirected)
    t0 = writer.off[src.target]
    y_all = view_labels(y, total)  # (the other types' nodes: no label)
    y_all[t0:t0 + sizes[src.target]] = y
    np.save(tmp / "y.npy", y_all.numpy())
    ids = {}
    for name, idx in zip(("train", "val", "test"), splits, strict=True):
        ids[name] = (idx.long() + t0).numpy()
        np.save(tmp / f"{name}_idx.npy", ids[name])
    schema = TypedSchema(sizes, writer.schema.relations, src.target, writer.edge_dims)
    meta = {"typed": {**schema.to_meta(), "feature_rule": rule}} if relations_too else None
    if src.edge_time:  # every relation's timeline beside its CSR; the target type's seed times
        dtype = times.kind_of(Path(cfg.path), np.asarray(next(iter(src.edge_time.values()))[:0]))
        meta["typed"]["times"] = {"dtype": dtype.name, "seed_time": src.seed_time is not None}
        if src.seed_time is not None:
            write_npy(tmp / "seed_time.npy", np.asarray(src.seed_time, dtype=dtype))
            arrays.append("seed_time")
    cache.write_meta(tmp, total, num_edges, src.num_features, src.num_classes, source, cfg.feature_dtype,
                     extra=arrays, extra_meta=meta, labels=profile(y_all.numpy(), ids))


def _check_space(folder: Path, need: float) -> None:
    """Refuse before writing when ``folder``'s file system lacks ``need`` bytes (the graph and its scratch)."""
    free = shutil.disk_usage(folder.parent).free
    if need > free:
        raise DatasetError(f"preparing the graph needs about {cache.human_bytes(need)} in {folder.parent} (with "
                           f"its scratch), but only {cache.human_bytes(free)} are free. HINT: set dataset.root to a "
                           "larger file system")


def prepare_mem_bytes(cfg: DatasetConfig) -> int:
    """What sorting a bucket of edges may hold: ``dataset.prepare_mem_gb``, or a quarter of what is free and
    at most 256 MiB (bigger buckets are not faster: the sort's cost is per edge; fewer buckets only save
    file appends)."""
    if cfg.prepare_mem_gb is not None:
        return int(cfg.prepare_mem_gb * 2**30)
    return max(min(env.available_memory() // 4, 256 << 20), 64 << 20)


def prepare_streamed(cfg: DatasetConfig, folder: Path, source: dict, allow_download: bool = False) -> Path:
    """The synthetic graph drawn chunk by chunk (a ``files`` folder read a chunk at a time from its
    memory-mapped .npy files, an ogbn dataset from OGB's raw files) into ``folder``: edges bucketed on disk
    by target and sorted bucket by bucket (:class:`EdgeBuckets`), features written as they come."""
    shapes, spec = None, datasets.spec(cfg.name)
    if cfg.name == "files":
        ei = read_shapes(cfg)
        n, num_features, edges = ei["num_nodes"], ei["num_features"], ei["num_edges"] * (2 if cfg.to_undirected else 1)
    elif spec.source == "ogb":
        shapes = ogb_shapes(cfg, allow_download)
        n, num_features = shapes.num_nodes, shapes.num_features
        edges = shapes.num_edges * (2 if shapes.inverse or cfg.to_undirected else 1)
    else:
        n, num_features, edges = cfg.num_nodes, cfg.num_features, expected_edges(cfg)
    folder.parent.mkdir(parents=True, exist_ok=True)
    edge_dim = shapes.edge_features if shapes is not None else 0  # (a files folder's: not known before reading)
    need = edges * (ooc.index_dtype(n).itemsize * 3 + 8 * edge_dim) + n * num_features * 4 + n * 32
    _check_space(folder, need)
    with atomic_folder(folder) as tmp:
        if spec.link:  # the official split; its held-out edges dropped as they stream by
            _stream_ogb_link(cfg, tmp, shapes, edges, source)
        elif cfg.prepared_for == "link" and is_timed(cfg):
            _stream_graph(cfg, tmp, n, num_features, edges, shapes, source)  # (every edge passes messages, in time)
            _time_split_prepared(cfg, tmp)
        elif cfg.prepared_for == "link":  # the whole graph first, then split a chunk of rows at a time
            _stream_graph(cfg, tmp / "whole", n, num_features, edges, shapes)
            _split_streamed(cfg, tmp / "whole", tmp, source)
        else:
            _stream_graph(cfg, tmp, n, num_features, edges, shapes, source)
    return folder


def _stream_graph(cfg: DatasetConfig, tmp: Path, n: int, num_features: int, edges: int, shapes,
                  source: dict | None = None) -> None:
    tmp.mkdir(exist_ok=True)
    timed = cfg.name == "files" and gives(files_folder(cfg), "edge_time")
    with_edges = has_edge_features(files_folder(cfg)) if cfg.name == "files" else \
        bool(getattr(shapes, "edge_features", 0))  # (kept: each CSR edge's features, by its id in the source)
    with_edges = with_edges or timed  # (and its time: by the same id)
    buckets = ooc.EdgeBuckets(n, edges, tmp / "scratch", prepare_mem_bytes(cfg), ids=with_edges,
                              parallel=timed)  # (a timed graph's edges are events: a pair given twice, twice)
    features = ooc.FeatureWriter(tmp / "x.npy", n, num_features, cfg.feature_dtype)
    edge_attr = None
    edge_time = seed_time = None
    if cfg.name == "files":
        y, splits, num_classes, edge_attr, (edge_time, seed_time) = stream_files(cfg, buckets, features)
        arrays = {"y": y, **splits}
    elif datasets.spec(cfg.name).source == "ogb":
        copied = tmp / "scratch-edge-features.npy" if with_edges else None  # (random access: the csv has none)
        y, splits, num_classes = stream_ogb(cfg, shapes, buckets, features, edge_out=copied)
        arrays = {"y": y, **splits}
        edge_attr = np.load(copied, mmap_mode="r") if copied is not None else None
    else:
        y, train_idx, val_idx, test_idx = generate_synthetic(cfg, lambda s, d: buckets.add(d, s), features.write)
        arrays = {"y": y.numpy(), "train_idx": train_idx.numpy(), "val_idx": val_idx.numpy(),
                  "test_idx": test_idx.numpy()}
        num_classes = cfg.num_classes
    features.close()
    num_edges = buckets.write_csr(tmp)
    report_merged(cfg, buckets.added, num_edges, reverses=cfg.to_undirected and cfg.name != "synthetic")
    interleaved = shapes is not None and getattr(shapes, "inverse", False)  # (ogb's reverses: 2i + 1)
    more, timeline = {}, []
    if edge_time is not None:  # (before the features: they drop eid.npy)
        more["times"], timeline = times.write_timeline(tmp, edge_time, seed_time)
    edge_dim = cache.write_edge_features(tmp, edge_attr, cfg.feature_dtype, interleaved) if edge_attr is not None \
        else 0
    (tmp / "eid.npy").unlink(missing_ok=True)
    (tmp / "scratch-edge-features.npy").unlink(missing_ok=True)
    for name, array in arrays.items():
        np.save(tmp / f"{name}.npy", array)
    splits = {s: arrays[f"{s}_idx"] for s in ("train", "val", "test")}
    cache.write_meta(tmp, n, num_edges, num_features, num_classes, source or {}, cfg.feature_dtype,
                     labels=profile(arrays["y"], splits), edge_dim=edge_dim, extra_meta=more, sized=timeline)


def _stream_ogb_link(cfg: DatasetConfig, tmp: Path, shapes, edges: int, source: dict) -> None:
    """An ogbl dataset: the raw graph streamed into the message-passing CSR without the validation and test
    positives (either direction), the official splits (held whole: positives and negatives) beside it."""
    splits = ogb_link_splits(shapes.folder, shapes.meta)
    n = shapes.num_nodes
    buckets = ooc.EdgeBuckets(n, edges, tmp / "scratch", prepare_mem_bytes(cfg))
    features = ooc.FeatureWriter(tmp / "x.npy", n, shapes.num_features, cfg.feature_dtype)
    stream_raw_graph(cfg, shapes, buckets, features, drop=held_out_keys(splits, n))
    features.close()
    num_edges = buckets.write_csr(tmp)
    _save_no_labels(tmp)
    data = LinkData(None, splits["train"], splits["val"], splits["test"], shapes.meta["eval metric"])
    arrays, meta = link_arrays(data)
    for name, array in arrays.items():
        np.save(tmp / f"{name}.npy", array.numpy())
    cache.write_meta(tmp, n, num_edges, shapes.num_features, 0, source, cfg.feature_dtype, extra=list(arrays),
                     extra_meta=meta)


def _split_streamed(cfg: DatasetConfig, whole: Path, tmp: Path, source: dict) -> None:
    """A link dataset from the prepared graph in ``whole``: its edges split a chunk of rows at a time
    (:func:`split_rows`: the split :func:`split_edges` makes of the graph read whole), the training edges
    bucketed into the message-passing CSR, the positives and negatives appended to their files; the training
    edges' features (where the graph's edges have some) written in the message-passing CSR's order, which is
    theirs in the graph's (:func:`split_rows`' ``mp_at``)."""
    from hpcgnn.data.graph import csr_has_edge

    graph = cache.load(whole)
    n, has_edge = graph.num_nodes, csr_has_edge(graph.rowptr, graph.col)
    buckets = ooc.EdgeBuckets(n, graph.num_edges, tmp / "scratch", prepare_mem_bytes(cfg))
    names = [f"{s}_pos" for s in SPLITS] + ["val_neg", "test_neg"]
    rows = {(name, r): ooc.NpyAppender(tmp / f"{name}.{r}.part", np.int64) for name in names for r in (0, 1)}
    edge_rows = ooc.NpyAppender(tmp / "edge_attr.npy", ooc.FEATURE_DTYPES[cfg.feature_dtype][1],
                                (graph.edge_dim,)) if graph.edge_dim else None
    for a, b in ooc.chunks(graph.rowptr, link.SPLIT_CHUNK_EDGES):
        parts = split_rows(graph.rowptr, graph.col, a, b, tuple(cfg.edge_split), cfg.seed, has_edge)
        buckets.add(parts["mp"][1], parts["mp"][0])
        for (name, r), out in rows.items():
            out.append(parts[name][r].numpy())
        if edge_rows is not None:  # (the stored rows as they are: the same dtype)
            kept = graph.edge_attr.index_select(0, parts["mp_at"])
            edge_rows.append(ooc.stored_rows(kept))
        ooc.drop_pages(graph.col[int(graph.rowptr[a]):int(graph.rowptr[b])])
    num_edges = buckets.write_csr(tmp)
    if edge_rows is not None:
        edge_rows.close()
        if edge_rows.length != num_edges:  # (the message-passing CSR is the graph's at mp_at, in order)
            raise RuntimeError(f"{edge_rows.length} edge feature rows for {num_edges} message-passing edges")
    for out in rows.values():
        out.close()
    for name in names:  # [2, P]: the sources' file, then the targets'
        ooc.stack_rows(tmp / f"{name}.npy", [tmp / f"{name}.{r}.part" for r in (0, 1)])
    (whole / "x.npy").rename(tmp / "x.npy")
    num_features, edge_dim = graph.num_features, graph.edge_dim
    del graph, has_edge
    shutil.rmtree(whole)
    _save_no_labels(tmp)
    kinds = {s: "none" if s == "train" else "pairs" for s in SPLITS}
    cache.write_meta(tmp, n, num_edges, num_features, 0, source, cfg.feature_dtype, extra=names,
                     extra_meta=link_meta("auc", kinds), edge_dim=edge_dim)


def _time_split_prepared(cfg: DatasetConfig, tmp: Path) -> None:
    """A timed graph prepared whole in ``tmp`` made a link dataset: its chronological split and its edges' history
    (:func:`hpcgnn.data.link.time_split_edges`) beside it, named in its meta.json."""
    graph = cache.load(tmp)
    arrays, record = link_arrays(link.time_split_edges(graph, tuple(cfg.edge_split), getattr(cfg, "time_split", None),
                                                       f"dataset.path={cfg.path}"))
    del graph
    for name, array in arrays.items():
        write_npy(tmp / f"{name}.npy", array.numpy())
    meta = cache.GraphMeta.read(tmp)
    dataclasses.replace(meta, bytes=meta.bytes + sum((tmp / f"{n}.npy").stat().st_size for n in arrays),
                        extra=tuple(sorted({*meta.extra, *arrays})), more={**meta.more, **record}).write(tmp)


def _save_no_labels(tmp: Path) -> None:
    """A link dataset's graph has no node labels and no node splits: empty arrays in their places."""
    empty = np.zeros(0, dtype=np.int64)
    for name in ("y", "train_idx", "val_idx", "test_idx"):
        np.save(tmp / f"{name}.npy", empty)


def check_target(cfg: DatasetConfig, task):
    """Before submitting, where the labels can be read here (a prepared graph's profile, or a folder's y): the node
    task's kind (``task.kind``) against them, refused with the fix (:func:`hpcgnn.labels.resolve`). Returns the
    resolved target, or None where the labels cannot be read yet (an edge task's:
    :func:`hpcgnn.data.edges.check_target`)."""
    if task.name != "node" or (is_typed(cfg) and not cfg.erase_types):
        return None
    folder = cache_folder(cfg)
    if cache.is_complete(folder):
        meta = cache.GraphMeta.read(folder)
        labels, classes = meta.labels, meta.num_classes
    elif cfg.name == "files" and not is_typed_folder(files_folder(cfg)):
        labels, classes = read_labels(cfg)
    else:
        return None
    return resolve(labels, task.kind, task.loss, classes, where_labels(cfg))


def edge_width(cfg: DatasetConfig) -> int | None:
    """The width of a homogeneous dataset's edge features (0: its edges have none) where it is known before the
    graph is prepared, here: a prepared graph's meta.json, a files folder's ``edge_attr`` (its header), a source
    whose edges never have any; None where only preparing tells (a PyG dataset, OGB's raw files). What a model that
    reads edge features is checked against at submit."""
    folder = cache_folder(cfg)
    if cache.is_complete(folder):
        return cache.GraphMeta.read(folder).edge_dim
    spec = datasets.spec(cfg.name)
    if spec.source == "synthetic" or (spec.source == "ogb" and not spec.edge_features):
        return 0
    if cfg.name == "files" and not is_typed_folder(files_folder(cfg)):
        return read_shapes(cfg)["edge_dim"]
    return None


def check_available(cfg: DatasetConfig) -> None:
    """Before submitting: fail now, not on a compute node, when the data cannot be there."""
    check_root(cfg)
    spec = datasets.spec(cfg.name)
    if spec.user_folder:
        files_folder(cfg)
    elif spec.needs_target:
        target_object(cfg)  # (importable here; a dataset that downloads does so when prepared)
    elif cfg.name in ON_DISK and not cache.is_complete(cache_folder(cfg)) and not has_raw(cfg):
        raise DatasetMissing(f"{cfg.name} is not under {Path(cfg.root).expanduser()}: jobs do not download. "
                             f"HINT: first run\n    {prepare_command(cfg)}")
