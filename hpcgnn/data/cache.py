"""Prepared graphs on disk: one folder of .npy arrays plus meta.json, memory-mapped on load.

Loading maps the arrays copy-on-write (``np.load(mmap_mode="c")``): nothing is
unpickled, nothing is re-processed, and every process on a node that maps the
same folder shares the same page-cache pages, so replicated ranks hold one copy
of the graph per node, not one per rank.
"""

from __future__ import annotations

import contextlib
import json
import shutil
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import numpy as np
import torch

from hpcgnn.data.graph import Graph
from hpcgnn.data.ooc import FeatureWriter, load_features
from hpcgnn.data.times import load_timeline, save_timeline
from hpcgnn.errors import DatasetError
from hpcgnn.io import atomic_folder, human_bytes, write_json
from hpcgnn.labels import profile

FORMAT_VERSION = 1
ARRAYS = ("rowptr", "col", "x", "y", "train_idx", "val_idx", "test_idx")


@dataclass(frozen=True)
class GraphMeta:
    """A prepared graph's ``meta.json``, read and written here only: its sizes, the labels' profile
    (:func:`hpcgnn.labels.profile`), the width of its edge features, how its features are stored, the bytes of its
    arrays, where it came from, the extra arrays beside it, and a kind's own records (``more``: a typed graph's
    ``typed``, a link dataset's ``link``), written at the top level as they always were."""

    num_nodes: int
    num_edges: int
    num_features: int
    num_classes: int
    labels: dict | None = None
    edge_dim: int = 0
    feature_dtype: str = "float32"
    bytes: int = 0
    source: dict = field(default_factory=dict)
    extra: tuple[str, ...] = ()
    more: dict = field(default_factory=dict)
    format_version: int = FORMAT_VERSION

    def write(self, tmp: Path) -> None:
        record = {k: v for k, v in asdict(self).items() if k != "more"}
        record["extra"] = list(self.extra)
        write_json(tmp / "meta.json", {**record, **self.more})

    @classmethod
    def read(cls, folder: Path) -> GraphMeta:
        """The meta.json of the prepared graph in ``folder``; a DatasetError naming the fix where it is another
        format's."""
        record = json.loads((folder / "meta.json").read_text())
        if record.get("format_version") != FORMAT_VERSION:
            raise DatasetError(f"{folder} holds format {record.get('format_version')}, this hpcgnn reads "
                               f"{FORMAT_VERSION}. HINT: delete the folder to prepare the dataset again")
        known = {f.name for f in fields(cls)} - {"more"}
        given = {k: v for k, v in record.items() if k in known}
        given["extra"] = tuple(given.get("extra", ()))
        return cls(**given, more={k: v for k, v in record.items() if k not in known})


def is_complete(folder: Path) -> bool:
    meta = folder / "meta.json"
    if not meta.is_file():
        return False
    with contextlib.suppress(OSError, ValueError):
        return json.loads(meta.read_text()).get("format_version") == FORMAT_VERSION
    return False


def save(graph: Graph, folder: Path, source: dict, extra: dict[str, torch.Tensor] | None = None,
         extra_meta: dict | None = None) -> Path:
    """Write ``graph`` to ``folder`` atomically: a reader sees all of it or nothing.

    ``extra``: more named arrays kept beside the graph (a link dataset's splits), read back by
    :func:`load_extra`; ``extra_meta``: more fields of meta.json. Several writers (one per node on
    a shared file system) may race: each writes its own temporary folder and the first rename
    wins; the others are discarded.
    """
    extra = extra or {}
    folder.parent.mkdir(parents=True, exist_ok=True)
    edges = [graph.edge_attr] if graph.edge_attr is not None else []
    need = sum(t.numel() * t.element_size() for t in [*(getattr(graph, n) for n in ARRAYS), *extra.values(), *edges])
    free = shutil.disk_usage(folder.parent).free
    if need * 1.02 + 2**20 > free:
        raise OSError(f"preparing the graph needs {human_bytes(need)} in {folder.parent}, but only "
                      f"{human_bytes(free)} are free: set dataset.root to a larger file system")
    feature_dtype = (source.get("dataset") or {}).get("feature_dtype", "float32")
    with atomic_folder(folder) as tmp:
        names = [*ARRAYS, *extra]
        for name in ARRAYS:
            if name == "x":  # in the stored feature dtype
                writer = FeatureWriter(tmp / "x.npy", graph.num_nodes, graph.num_features, feature_dtype)
                writer.write(0, graph.x)
                writer.close()
                continue
            np.save(tmp / f"{name}.npy", getattr(graph, name).numpy())
        if graph.edge_attr is not None:  # in the stored feature dtype too
            writer = FeatureWriter(tmp / "edge_attr.npy", graph.num_edges, graph.edge_dim, feature_dtype)
            writer.write(0, graph.edge_attr)
            writer.close()
            names.append("edge_attr")
        for name, array in extra.items():
            np.save(tmp / f"{name}.npy", array.numpy())
        more = dict(extra_meta or {})
        if graph.timeline is not None:  # a timed graph's edges in time (hpcgnn.data.times)
            more["times"], timeline = save_timeline(tmp, graph.timeline)
            names += timeline
        GraphMeta(graph.num_nodes, graph.num_edges, graph.num_features, graph.num_classes, graph_labels(graph),
                  graph.edge_dim, feature_dtype, sum((tmp / f"{n}.npy").stat().st_size for n in names), source,
                  tuple(sorted(extra)), more).write(tmp)
    return folder


def graph_labels(graph: Graph) -> dict | None:
    """The profile of a node graph's labels (:func:`hpcgnn.labels.profile`); None for a link graph (no labels)."""
    if graph.labels is not None or not graph.y.numel():
        return graph.labels
    return profile(graph.y.numpy(), {s: getattr(graph, f"{s}_idx").numpy() for s in ("train", "val", "test")})


def write_edge_features(tmp: Path, source: np.ndarray, feature_dtype: str, interleaved: bool = False,
                        rows: int = 1 << 18) -> int:
    """``tmp/edge_attr.npy``: each CSR edge's features, the rows of ``source`` (a source's [E, D], mapped) that
    ``tmp/eid.npy`` names, a chunk of edges at a time: id i is row i, a reverse's id E + i (``interleaved``:
    edge i's id 2i and its reverse's 2i + 1) row i. eid.npy is removed. Returns D."""
    eid = np.load(tmp / "eid.npy", mmap_mode="r")
    writer = FeatureWriter(tmp / "edge_attr.npy", eid.shape[0], source.shape[1], feature_dtype)
    for a in range(0, eid.shape[0], rows):
        ids = np.asarray(eid[a:a + rows])
        at = ids // 2 if interleaved else ids % max(source.shape[0], 1)
        writer.write(a, torch.from_numpy(np.asarray(source[at], dtype=np.float32)))
    writer.close()
    del eid
    (tmp / "eid.npy").unlink()
    return int(source.shape[1])


def write_meta(tmp: Path, num_nodes: int, num_edges: int, num_features: int, num_classes: int, source: dict,
               feature_dtype: str, extra: list[str] | None = None, extra_meta: dict | None = None,
               labels: dict | None = None, edge_dim: int = 0, sized: list[str] | None = None) -> None:
    """meta.json of a graph written array by array into ``tmp`` (the out-of-core path); ``extra``: the
    names of more arrays beside it (:func:`load_extra`), ``extra_meta``: more fields; ``labels``: the labels'
    profile (:func:`hpcgnn.labels.profile`); ``sized``: arrays besides those, counted in its bytes (a timeline's)."""
    extra = sorted(extra or [])
    size = sum((tmp / f"{n}.npy").stat().st_size
               for n in [*ARRAYS, *extra, *(["edge_attr"] if edge_dim else []), *(sized or [])])
    GraphMeta(num_nodes, num_edges, num_features, num_classes, labels, edge_dim, feature_dtype, size, source,
              tuple(extra), dict(extra_meta or {})).write(tmp)


def load(folder: Path, mmap: bool = True) -> Graph:
    """Memory-map a prepared graph (no copy until a page is written, which hpcgnn never does).

    ``mmap=False`` reads private copies instead (what a per-process load costs).
    """
    meta = GraphMeta.read(folder)
    mode = "c" if mmap else None
    arrays = {name: torch.from_numpy(np.load(folder / f"{name}.npy", mmap_mode=mode)) for name in ARRAYS if name != "x"}
    arrays["x"] = load_features(folder / "x.npy", meta.feature_dtype, mode)
    if meta.edge_dim:  # each CSR edge's features, in the stored feature dtype
        arrays["edge_attr"] = load_features(folder / "edge_attr.npy", meta.feature_dtype, mode)
    if "times" in meta.more:  # a timed graph's edges in time (hpcgnn.data.times)
        arrays["timeline"] = load_timeline(folder, meta.more["times"], mode)
    return Graph(**arrays, num_classes=int(meta.num_classes), labels=meta.labels)


def load_extra(folder: Path) -> tuple[dict[str, torch.Tensor], GraphMeta]:
    """The extra arrays saved beside a prepared graph (memory-mapped), and its meta.json."""
    meta = GraphMeta.read(folder)
    arrays = {name: torch.from_numpy(np.load(folder / f"{name}.npy", mmap_mode="c")) for name in meta.extra}
    return arrays, meta


def size_bytes(folder: Path) -> int:
    return GraphMeta.read(folder).bytes

