"""OGB datasets through the ``ogb`` package's own readers: node property (ogbn-*) and link property (ogbl-*).

The raw download lives under ``<dataset.root>/ogb/<name>`` in OGB's layout; ogb's
readers turn it into arrays once, and hpcgnn keeps the result in its own
memory-mappable cache.
"""

from __future__ import annotations

import gzip
import http.client
import os
import shutil
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from hpcgnn import checks
from hpcgnn.config import DatasetConfig
from hpcgnn.data.graph import Graph
from hpcgnn.data.ooc import NpyAppender
from hpcgnn.errors import ConfigError, DatasetError

NAMES = checks.OGB_NODE_DATASETS
LINK_NAMES = checks.OGB_LINK_DATASETS


class DatasetMissing(DatasetError):
    """The dataset is not on disk and this process may not download it."""


def prepare_command(cfg: DatasetConfig) -> str:
    """The command that prepares ``cfg``'s dataset (run where the internet is)."""
    root = f" dataset.root={cfg.root}" if cfg.root != DatasetConfig.root else ""
    task = f" task={cfg.prepared_for}" if cfg.prepared_for in ("link", "graph") else ""
    return f"python -m hpcgnn.data prepare{task} dataset={cfg.name}{root}"


def ogb_root(cfg: DatasetConfig) -> Path:
    return Path(cfg.root).expanduser() / "ogb"


def ogb_folder(cfg: DatasetConfig) -> Path:
    """Where OGB's layout of this dataset lives (``ogbn-arxiv`` -> ``ogb/ogbn_arxiv``)."""
    return ogb_root(cfg) / cfg.name.replace("-", "_")


def pcqm_folder(cfg: DatasetConfig) -> Path:
    """Where OGB-LSC's PCQM4Mv2 lies: ``<dataset.root>/ogb/pcqm4m-v2`` (``raw/data.csv.gz``, ``split_dict.pt``)."""
    return ogb_root(cfg) / "pcqm4m-v2"


def has_raw(cfg: DatasetConfig) -> bool:
    if cfg.name == "pcqm4mv2":  # (OGB-LSC's layout: its molecules as SMILES)
        return (pcqm_folder(cfg) / "raw" / "data.csv.gz").exists()
    return any((ogb_folder(cfg) / p).exists() for p in ("raw/edge.csv.gz", "raw/data.npz", "raw/num-node-dict.csv.gz"))


def ogb_meta(name: str) -> dict:
    """ogb's own metadata row for ``name`` (url, split name, inverse edges, binary layout, classes)."""
    import ogb
    import pandas as pd

    kind = {"ogbl": "linkproppred", "ogbg": "graphproppred"}.get(name[:4], "nodeproppred")
    master = pd.read_csv(Path(ogb.__file__).parent / kind / "master.csv", index_col=0, keep_default_na=False)
    return master[name].to_dict()


def download_command(cfg: DatasetConfig) -> str:
    """The command that only downloads ``cfg``'s raw files (run where the internet is; prepare anywhere)."""
    return prepare_command(cfg).replace(" prepare ", " download ", 1)


def _download(cfg: DatasetConfig, meta: dict, folder: Path) -> None:
    """ogb's download path: fetch the zip (unless it already lies in ``<root>/ogb/``), unpack it, move it into
    place. No network is a user error naming the address, where the files go, and the offline way."""
    from ogb.utils.url import decide_download, download_url, extract_zip

    root, url = ogb_root(cfg), meta["url"]
    archive = root / url.rpartition("/")[2]
    root.mkdir(parents=True, exist_ok=True)
    if not (archive.is_file() and archive.stat().st_size > 0):  # (a zip placed there by hand is used as it is)
        try:
            if not decide_download(url):
                raise DatasetMissing(f"download of {cfg.name} declined")
            download_url(url, str(root))
        except (OSError, RuntimeError, EOFError, http.client.HTTPException) as exc:  # (URLError is an OSError)
            archive.unlink(missing_ok=True)
            raise DatasetMissing(
                f"could not download {cfg.name} from {url} ({getattr(exc, 'reason', exc)}): this machine cannot "
                f"reach it (compute nodes often have no internet). HINT: download it where there is internet (a "
                f"login node):\n    {download_command(cfg)}\nthen prepare it anywhere:\n    {prepare_command(cfg)}\n"
                f"or place OGB's files yourself: the zip from {url} as {archive} (unpacked as it is), or its "
                f"unpacked folder ({meta['download_name']}/) as {folder} (holding raw/ and split/)") from None
    extract_zip(str(archive), str(root))
    os.unlink(archive)
    shutil.rmtree(folder, ignore_errors=True)
    shutil.move(str(root / meta["download_name"]), str(folder))


def raw_folder(cfg: DatasetConfig, meta: dict, allow_download: bool) -> Path:
    folder = ogb_folder(cfg)
    if not has_raw(cfg):
        if not allow_download:
            raise DatasetMissing(
                f"{cfg.name} is not under {ogb_root(cfg)}, and training jobs do not download (compute nodes often "
                f"have no internet). HINT: on a login node run\n    {prepare_command(cfg)}\n(or "
                f"{download_command(cfg)} there, then prepare anywhere)")
        _download(cfg, meta, folder)
    return folder


def download_raw(cfg: DatasetConfig) -> Path:
    """``python -m hpcgnn.data download``: OGB's raw files of ``cfg``'s dataset under ``dataset.root``, nothing else."""
    return raw_folder(cfg, ogb_meta(cfg.name), allow_download=True)


def load_ogb(cfg: DatasetConfig, allow_download: bool) -> Graph:
    """Read OGB's raw files with ogb's own readers (ogb.io), never its pickled processed file.

    ogb 1.3.6's NodePropPredDataset torch.load()s that file without weights_only, which
    torch >= 2.6 refuses; hpcgnn keeps its own cache instead.
    """
    if cfg.name not in NAMES:
        raise ConfigError(f"dataset.name={cfg.name!r} is not an OGB node dataset hpcgnn knows: {', '.join(NAMES)}")
    from ogb.io.read_graph_raw import read_binary_graph_raw, read_csv_graph_raw

    meta = ogb_meta(cfg.name)
    folder = raw_folder(cfg, meta, allow_download)
    raw = folder / "raw"
    if meta["binary"] == "True":
        graph = read_binary_graph_raw(str(raw), add_inverse_edge=False)[0]
    else:
        graph = read_csv_graph_raw(str(raw), add_inverse_edge=meta["add_inverse_edge"] == "True")[0]
    y_np, split = _labels_and_splits(folder, meta)

    n = int(graph["num_nodes"])
    edge_index = torch.from_numpy(np.ascontiguousarray(graph["edge_index"], dtype=np.int64))
    if cfg.to_undirected:
        edge_index = torch.cat([edge_index, edge_index.flip(0)], dim=1)
    if cfg.node_features_from_edges != "none":  # (ogb's reader added each edge's reverse with its features)
        reduce = EdgeReduce(n, graph["edge_feat"].shape[1], both=False)
        reduce.add(graph["edge_index"][0], graph["edge_index"][1], np.asarray(graph["edge_feat"], dtype=np.float64))
        x = reduce.result(cfg.node_features_from_edges)
    else:
        x = torch.from_numpy(np.ascontiguousarray(graph["node_feat"], dtype=np.float32))
    edges = graph.get("edge_feat")
    if edges is not None:  # each edge's features, kept (a reverse added here has its edge's)
        edges = torch.from_numpy(np.asarray(edges, dtype=np.float32))
        edges = torch.cat([edges, edges]) if cfg.to_undirected else edges
    y = torch.from_numpy(y_np)
    idx = {k: torch.from_numpy(v) for k, v in split.items()}
    return Graph.from_edge_index(edge_index, n, x, y, idx["train_idx"], idx["val_idx"], idx["test_idx"],
                                 _outputs(meta), edge_attr=edges)


# ------------------------------------------------------------------------------ streamed (out of core)

STREAM_ROWS = 1 << 21  # edges (or about 2^21 feature values) per chunk read from OGB's raw files


@dataclass(frozen=True)
class OgbShapes:
    """What preparing an ogbn dataset out of core needs before reading it: its sizes and raw layout."""

    folder: Path  # OGB's layout of the dataset (raw/, split/)
    meta: dict  # ogb's master.csv row
    num_nodes: int
    num_edges: int  # directed edges in the raw files
    num_features: int  # the prepared graph's (a dataset without node features: its edges', by node_features_from_edges)
    edge_features: int = 0  # the raw edges' feature width
    from_edges: str = "none"  # dataset.node_features_from_edges: none, or how each node's features come from its edges'

    @property
    def binary(self) -> bool:
        return self.meta.get("binary") == "True"

    @property
    def inverse(self) -> bool:  # ogb adds each edge's reverse (ogbn-products)
        return self.meta["add_inverse_edge"] == "True"


def ogb_shapes(cfg: DatasetConfig, allow_download: bool) -> OgbShapes:
    """Sizes from the small files (csv) or the arrays' headers (binary ``data.npz``), nothing read whole."""
    if cfg.name not in (*NAMES, *LINK_NAMES):
        raise ConfigError(f"dataset.name={cfg.name!r} is not an OGB dataset hpcgnn knows: {', '.join(NAMES + LINK_NAMES)}")
    meta = ogb_meta(cfg.name)
    folder = raw_folder(cfg, meta, allow_download)
    raw = folder / "raw"
    if meta.get("binary") == "True":
        with zipfile.ZipFile(raw / "data.npz") as z:
            n = int(np.load(z.open("num_nodes_list.npy")).sum())
            e = int(np.load(z.open("num_edges_list.npy")).sum())
            f = _npy_header(z.open("node_feat.npy"))[0][1] if "node_feat.npy" in z.namelist() else 0
    else:
        n, e = (int(_read_csv(raw / f"{name}.csv.gz").sum()) for name in ("num-node-list", "num-edge-list"))
        f = _csv_width(raw / "node-feat.csv.gz") if (raw / "node-feat.csv.gz").exists() else 0
        d = _csv_width(raw / "edge-feat.csv.gz") if (raw / "edge-feat.csv.gz").exists() else 0
        if cfg.node_features_from_edges != "none":
            if not d:
                raise DatasetError(f"{raw / 'edge-feat.csv.gz'} is missing: dataset.node_features_from_edges="
                                   f"{cfg.node_features_from_edges} averages the edges' features. HINT: remove "
                                   f"{folder} and prepare again")
            return OgbShapes(folder, meta, n, e, d, d, cfg.node_features_from_edges)
        return OgbShapes(folder, meta, n, e, f, d)
    return OgbShapes(folder, meta, n, e, f)


def _csv_width(path: Path) -> int:
    """The columns of a gzipped csv, from its first line."""
    with gzip.open(path, "rt") as fh:
        return len(fh.readline().split(","))


def _csv_blocks(path: Path, rows: int, dtype=None):
    """A gzipped csv without a header as numpy blocks of ``rows`` rows, read as they are needed."""
    import pandas as pd

    for block in pd.read_csv(path, compression="gzip", header=None, dtype=dtype, chunksize=rows):
        yield block.to_numpy()


def _npy_header(stream) -> tuple[tuple[int, ...], bool, np.dtype]:
    """(shape, fortran order, dtype) of the .npy ``stream``, left at its first data byte."""
    from numpy.lib import format as npy

    version = npy.read_magic(stream)
    read = npy.read_array_header_1_0 if version == (1, 0) else npy.read_array_header_2_0
    return read(stream)


def _npy_flat(z: zipfile.ZipFile, name: str, block: int, skip: int = 0, count: int | None = None):
    """The array ``name`` of the archive in storage order, as flat blocks of ``block`` elements, decompressed
    as they are read: ``count`` elements (default: all) after the first ``skip``."""
    stream = z.open(name)
    shape, _fortran, dtype = _npy_header(stream)
    total = int(np.prod(shape)) - skip if count is None else count
    while skip:
        skip -= len(stream.read(min(skip, STREAM_ROWS) * dtype.itemsize)) // dtype.itemsize
    while total > 0:
        take = min(block, total)
        data = stream.read(take * dtype.itemsize)
        if len(data) != take * dtype.itemsize:
            raise DatasetError(f"{name} in {z.filename} ends early: the download is damaged; remove "
                               f"{Path(z.filename).parent.parent} and prepare again")
        yield np.frombuffer(data, dtype=dtype)
        total -= take


def stream_raw_graph(cfg: DatasetConfig, shapes: OgbShapes, buckets, features, drop: Tensor | None = None,
                     edge_out: Path | None = None) -> None:
    """OGB's raw graph into an out-of-core CSR, a chunk at a time: edges into ``buckets`` (with their reverses
    where ogb adds them or ``dataset.to_undirected`` asks), feature rows into ``features``. ``drop``: sorted
    keys ``target * n + source`` of edges left out (a link dataset's validation and test positives).
    ``edge_out``: the raw edges' features copied there (.npy, float32 [E, D], in the raw order), each edge added
    to the buckets (made ``ids=True``) with its row there as its id."""
    raw = shapes.folder / "raw"
    both, n = shapes.inverse or cfg.to_undirected, shapes.num_nodes
    added = 0

    def add(src: np.ndarray, dst: np.ndarray) -> None:
        nonlocal added
        s, d = (torch.from_numpy(np.array(a, dtype=np.int64)) for a in (src, dst))  # (copies: buffers are read-only)
        ids = torch.arange(added, added + s.numel()) if buckets.ids else None
        added += s.numel()
        # Ids in the order ogb's reader gives the edges (a duplicate keeps the first one's features): each reverse
        # it adds right after its edge (2i, 2i + 1), or the reverses to_undirected adds after every edge (E + i).
        if ids is not None and both:
            ids, back = (2 * ids, 2 * ids + 1) if shapes.inverse else (ids, ids + shapes.num_edges)
        else:
            back = None
        for u, v, e in ((s, d, ids), (d, s, back)) if both else ((s, d, ids),):
            if drop is not None:
                keep = ~torch.isin(v * n + u, drop)
                u, v, e = u[keep], v[keep], e[keep] if e is not None else None
            buckets.add(v, u, ids=e)

    def write_rows(blocks) -> None:
        start = 0
        for block in blocks:
            features.write(start, torch.from_numpy(np.array(block, dtype=np.float32)))  # (a copy: buffers are read-only)
            start += block.shape[0]

    feature_rows = max(STREAM_ROWS // max(shapes.num_features, 1), 1)
    if shapes.binary:
        with zipfile.ZipFile(raw / "data.npz") as z:
            (_, e), fortran, _dtype = _npy_header(z.open("edge_index.npy"))
            if fortran:  # stored column by column: (source, target) pairs
                for pairs in _npy_flat(z, "edge_index.npy", 2 * STREAM_ROWS):
                    add(pairs[0::2], pairs[1::2])
            else:  # the sources, then the targets: two streams side by side
                for src, dst in zip(_npy_flat(z, "edge_index.npy", STREAM_ROWS, count=e),
                                    _npy_flat(z, "edge_index.npy", STREAM_ROWS, skip=e), strict=True):
                    add(src, dst)
            if shapes.num_features:
                f = shapes.num_features
                if _npy_header(z.open("node_feat.npy"))[1]:  # column-major features cannot be read by rows
                    write_rows([np.load(z.open("node_feat.npy"))])
                else:
                    write_rows(b.reshape(-1, f) for b in _npy_flat(z, "node_feat.npy", feature_rows * f))
    elif shapes.edge_features and (edge_out is not None or shapes.from_edges != "none"):  # the edges' features too
        reduce = EdgeReduce(n, shapes.edge_features, both) if shapes.from_edges != "none" else None
        out = NpyAppender(edge_out, np.float32, (shapes.edge_features,)) if edge_out is not None else None
        for pairs, feats in zip(_csv_blocks(raw / "edge.csv.gz", STREAM_ROWS, np.int64),
                                _csv_blocks(raw / "edge-feat.csv.gz", STREAM_ROWS, np.float64), strict=True):
            add(pairs[:, 0], pairs[:, 1])
            if reduce is not None:  # each node's features from its edges'
                reduce.add(pairs[:, 0], pairs[:, 1], feats)
            if out is not None:
                out.append(feats)
        if out is not None:
            out.close()
        if reduce is not None:
            features.write(0, reduce.result(shapes.from_edges))
        elif shapes.num_features:
            write_rows(_csv_blocks(raw / "node-feat.csv.gz", feature_rows))
    else:
        for pairs in _csv_blocks(raw / "edge.csv.gz", STREAM_ROWS, np.int64):
            add(pairs[:, 0], pairs[:, 1])
        if shapes.num_features:
            write_rows(_csv_blocks(raw / "node-feat.csv.gz", feature_rows))
    if not shapes.num_features:
        features.write(0, torch.zeros(shapes.num_nodes, 0))


class EdgeReduce:
    """Each node's features from its in-edges' (both ends of an edge where its reverse is added): their sum or
    mean (0 for a node without edges), accumulated a chunk of edges at a time in float64."""

    def __init__(self, num_nodes: int, width: int, both: bool):
        self.sums = torch.zeros(num_nodes, width, dtype=torch.float64)
        self.counts = torch.zeros(num_nodes, dtype=torch.float64)
        self.both = both

    def add(self, src: np.ndarray, dst: np.ndarray, feats: np.ndarray) -> None:
        values = torch.from_numpy(np.asarray(feats, dtype=np.float64))
        for ends in (dst, src) if self.both else (dst,):
            ends = torch.from_numpy(np.asarray(ends, dtype=np.int64))
            self.sums.index_add_(0, ends, values)
            self.counts += torch.bincount(ends, minlength=self.counts.numel()).double()

    def result(self, how: str) -> Tensor:
        out = self.sums if how == "sum" else self.sums / self.counts.clamp(min=1).unsqueeze(1)
        return out.float()


def stream_ogb(cfg: DatasetConfig, shapes: OgbShapes, buckets, features, edge_out: Path | None = None
               ) -> tuple[np.ndarray, dict, int]:
    """An ogbn dataset's raw files into an out-of-core CSR (:func:`stream_raw_graph`; ``edge_out``: its edges'
    features copied there); returns (labels, splits, classes), as :func:`load_ogb` reads them (only the labels and
    the splits, a few bytes per node, are read whole)."""
    stream_raw_graph(cfg, shapes, buckets, features, edge_out=edge_out)
    y, splits = _labels_and_splits(shapes.folder, shapes.meta)
    return y, splits, _outputs(shapes.meta)


def _outputs(meta: dict) -> int:
    """The model's outputs: one per task of a multi-task dataset (ogbn-proteins' 112 binary labels), else the
    classes."""
    tasks = int(meta["num tasks"])
    return tasks if tasks > 1 else int(meta["num classes"])


def _labels_and_splits(folder: Path, meta: dict) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """An ogbn dataset's int64 labels (papers100M labels only a subset of nodes, NaN elsewhere: those become
    -1 and lie in no split), or a multi-task dataset's float32 [N, tasks], and its official split as
    ``train_idx``/``val_idx``/``test_idx``."""
    raw = folder / "raw"
    labels = np.load(raw / "node-label.npz")["node_label"] if meta["binary"] == "True" else _read_csv(
        raw / "node-label.csv.gz")
    split_dir = folder / "split" / meta["split"]
    splits = {f"{k}_idx": _read_csv(split_dir / f"{part}.csv.gz").reshape(-1).astype(np.int64)
              for k, part in (("train", "train"), ("val", "valid"), ("test", "test"))}
    if int(meta["num tasks"]) > 1:  # several binary labels per node (ogbn-proteins): float32 [N, tasks], NaN unknown
        return np.asarray(labels, dtype=np.float32).reshape(len(labels), -1), splits
    y = np.asarray(labels, dtype=np.float64).reshape(-1)
    return np.where(np.isnan(y), -1, y).astype(np.int64), splits


# ogbn-mag: the types without features get the mean of their in-neighbours' along these relations, in this
# order (an institution's from its authors', which come from their papers').
MAG_FEATURES = {"author": ("paper", "rev_writes", "author"),
                "field_of_study": ("paper", "has_topic", "field_of_study"),
                "institution": ("author", "affiliated_with", "institution")}


def _typed_raw(cfg: DatasetConfig, allow_download: bool) -> tuple[Path, dict]:
    if cfg.name not in checks.OGB_TYPED_DATASETS:
        raise ConfigError(f"dataset.name={cfg.name!r} is not an OGB typed dataset hpcgnn knows: "
                          f"{', '.join(checks.OGB_TYPED_DATASETS)}")
    meta = ogb_meta(cfg.name)
    return raw_folder(cfg, meta, allow_download), meta


def _typed_labels(folder: Path, meta: dict) -> tuple[str, Tensor, dict[str, Tensor]]:
    """(the labelled type, its int64 labels, its official split by ``train``/``valid``/``test``), by ogb.io's
    readers: a few bytes per node of that type, read whole."""
    from ogb.io.read_graph_raw import read_node_label_hetero, read_nodesplitidx_split_hetero

    labels = read_node_label_hetero(str(folder / "raw"))
    train, valid, test = read_nodesplitidx_split_hetero(str(folder / "split" / meta["split"]))
    (target,) = labels  # ogbn-mag labels one type: paper
    y = torch.from_numpy(np.array(labels[target], dtype=np.int64).reshape(-1))  # a writable copy
    return target, y, {k: torch.from_numpy(np.array(v[target], dtype=np.int64)) for k, v in
                       (("train", train), ("valid", valid), ("test", test))}


def load_ogb_typed(cfg: DatasetConfig, allow_download: bool):
    """ogbn-mag through ogb.io's heterogeneous readers and the official time split of its papers; reverse
    relations added and citations made undirected, as is customary; featureless types by MAG_FEATURES.
    (In memory: ``prepare`` streams the raw files instead, :func:`ogb_typed_source`.)"""
    from ogb.io.read_graph_raw import read_csv_heterograph_raw

    from hpcgnn.data.typed import TypedGraph

    folder, meta = _typed_raw(cfg, allow_download)
    graph = read_csv_heterograph_raw(str(folder / "raw"), add_inverse_edge=False)[0]
    target, y, idx = _typed_labels(folder, meta)
    num_nodes = {t: int(n[0]) if isinstance(n, list) else int(n) for t, n in graph["num_nodes_dict"].items()}
    edges = {tuple(rel): torch.from_numpy(np.ascontiguousarray(ei, dtype=np.int64))
             for rel, ei in graph["edge_index_dict"].items()}
    x = {t: torch.from_numpy(np.ascontiguousarray(v, dtype=np.float32)) for t, v in graph["node_feat_dict"].items()
         if v is not None}
    rules = {t: rel for t, rel in MAG_FEATURES.items() if t in num_nodes and t not in x}
    return TypedGraph.from_edges(num_nodes, edges, x, target, y, idx["train"], idx["valid"], idx["test"],
                                 int(meta["num classes"]), reverse=True, feature_from=rules)


def ogb_typed_source(cfg: DatasetConfig, allow_download: bool):
    """ogbn-mag's raw files as :func:`~hpcgnn.data.prepare` streams them (:class:`~hpcgnn.data.typed.TypedSource`):
    sizes from the small csv files, each relation's ``edge.csv.gz`` and each type's ``node-feat.csv.gz`` read a
    chunk of rows at a time; the graph :func:`load_ogb_typed` reads whole."""
    import pandas as pd

    from hpcgnn.data.typed import TypedSource

    folder, meta = _typed_raw(cfg, allow_download)
    raw = folder / "raw"
    counts = pd.read_csv(raw / "num-node-dict.csv.gz", compression="gzip")
    num_nodes = {t: int(counts[t].astype(np.int64).sum()) for t in sorted(counts.keys())}  # ogb.io's order
    relations = sorted(tuple(r) for r in _read_csv(raw / "triplet-type-list.csv.gz").tolist())
    expected = {r: int(_read_csv(raw / "relations" / "___".join(r) / "num-edge-list.csv.gz").sum()) for r in relations}
    featured = [t for t in num_nodes if (raw / "node-feat" / t / "node-feat.csv.gz").exists()]
    widths = {t: _csv_width(raw / "node-feat" / t / "node-feat.csv.gz") for t in featured}
    if len(set(widths.values())) != 1:
        raise DatasetError(f"{raw / 'node-feat'}: the types with features need one width; got {widths}")
    target, y, idx = _typed_labels(folder, meta)

    def feed(writer):
        for rel in relations:
            for block in _csv_blocks(raw / "relations" / "___".join(rel) / "edge.csv.gz", STREAM_ROWS, np.int64):
                pairs = torch.from_numpy(block)
                writer.add(rel, pairs[:, 0], pairs[:, 1])
        for t in featured:
            start = 0
            for block in _csv_blocks(raw / "node-feat" / t / "node-feat.csv.gz", max(STREAM_ROWS // widths[t], 1)):
                writer.write_features(t, start, torch.from_numpy(np.array(block, dtype=np.float32)))
                start += len(block)
        return y, idx["train"], idx["valid"], idx["test"]

    rules = {t: rel for t, rel in MAG_FEATURES.items() if t in num_nodes and t not in featured}
    return TypedSource(num_nodes, relations, expected, next(iter(widths.values())), target,
                       int(meta["num classes"]), rules, feed)


def _read_csv(path: Path) -> np.ndarray:
    import pandas as pd

    return pd.read_csv(path, compression="gzip", header=None).values


# ------------------------------------------------------------------------------ link prediction


def read_split_file(path: Path) -> dict:
    """One of OGB's split files (``split/<name>/train.pt``: a dict of numpy arrays, pickled by torch).

    Read with ``torch.load(weights_only=True)``, allowing only numpy's array reconstruction
    (under its numpy 1 and numpy 2 names): a split file can hold arrays and nothing else.
    """
    import numpy as np

    core = getattr(np, "_core", None) or np.core
    reconstruct = core.multiarray._reconstruct
    allowed = [(reconstruct, "numpy.core.multiarray._reconstruct"),
               (reconstruct, "numpy._core.multiarray._reconstruct"), np.ndarray, np.dtype,
               *(getattr(np.dtypes, n) for n in dir(getattr(np, "dtypes", object)) if n.endswith("DType"))]
    with torch.serialization.safe_globals(allowed):
        data = torch.load(path, map_location="cpu", weights_only=True)
    return {k: torch.as_tensor(np.asarray(v)) for k, v in data.items()}


def ogb_link_splits(folder: Path, meta: dict) -> dict:
    """The official split of an ogbl dataset (:class:`LinkSplit` by name): collab's positives and shared
    negatives (``pairs``), citation2's sources with their candidate targets (``targets``)."""
    from hpcgnn.data.link import LinkSplit

    split_dir = folder / "split" / meta["split"]
    raw = {part: read_split_file(split_dir / f"{part}.pt") for part in ("train", "valid", "test")}
    splits = {}
    for name, part in (("train", "train"), ("val", "valid"), ("test", "test")):
        d = raw[part]
        if "edge" in d:  # collab: [E, 2] pairs, shared negatives [M, 2]
            pos = d["edge"].long().t().contiguous()
            if name == "train":
                pos = torch.unique(pos, dim=1)  # the same pair recurs across years
            neg = d["edge_neg"].long().t().contiguous() if "edge_neg" in d else None
            kind = "pairs"
        else:  # citation2: sources, targets, [E, 1000] candidate targets
            pos = torch.stack([d["source_node"].long(), d["target_node"].long()])
            neg = d["target_node_neg"].long().contiguous() if "target_node_neg" in d else None
            kind = "targets"
        splits[name] = LinkSplit(pos, neg, kind if neg is not None else "none")
    return splits


def held_out_keys(splits: dict, num_nodes: int) -> Tensor:
    """Sorted keys ``target * n + source`` of the validation and test positives, both directions: the edges
    kept out of message passing."""
    from hpcgnn.data.link import pair_keys

    return torch.unique(pair_keys(torch.cat([splits["val"].pos, splits["test"].pos], 1), num_nodes))


def load_ogb_link(cfg: DatasetConfig, allow_download: bool):
    """ogbl-collab / ogbl-citation2: the raw graph (training edges) and the official split.

    collab: positives and shared negatives per split (``edge``, ``edge_neg``), ranked for Hits@50;
    citation2: per-source 1000 candidate targets (``target_node_neg``), ranked for MRR. The
    validation and test positives are removed from message passing in both directions, should the
    raw graph hold any.
    """
    from ogb.io.read_graph_raw import read_csv_graph_raw

    from hpcgnn.data.link import LinkData, message_passing_graph, without_edges

    if cfg.name not in LINK_NAMES:
        raise ConfigError(f"dataset.name={cfg.name!r} is not an OGB link dataset hpcgnn knows: {', '.join(LINK_NAMES)}")
    meta = ogb_meta(cfg.name)
    folder = raw_folder(cfg, meta, allow_download)
    graph = read_csv_graph_raw(str(folder / "raw"), add_inverse_edge=meta["add_inverse_edge"] == "True")[0]
    n = int(graph["num_nodes"])
    edge_index = torch.from_numpy(np.ascontiguousarray(graph["edge_index"], dtype=np.int64))
    if cfg.to_undirected:
        edge_index = torch.cat([edge_index, edge_index.flip(0)], dim=1)
    x = torch.from_numpy(np.ascontiguousarray(graph["node_feat"], dtype=np.float32))
    splits = ogb_link_splits(folder, meta)
    mp = message_passing_graph(edge_index, n, x)
    mp = without_edges(mp, torch.cat([splits["val"].pos, splits["test"].pos], 1))
    metric = meta["eval metric"]  # hits@50 (collab) or mrr (citation2)
    return LinkData(mp, splits["train"], splits["val"], splits["test"], metric)
