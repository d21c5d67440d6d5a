"""Edge times: a files folder's ``edge_time`` (one per edge) and ``seed_time`` (one per node: when its label is
asked), checked; and the timeline of a prepared graph, written beside its CSR out of core.

A timed graph's edges are events: a pair given more than once (a user editing a page again, a reply) is an edge each
time, with its own time and features (an untimed graph merges them: :func:`hpcgnn.data.graph.report_merged`). The
timeline (:class:`hpcgnn.data.graph.Timeline`) is each row's edges sorted by time: ``time_col.npy``,
``time_sorted.npy``, ``time_edge.npy`` (each one's CSR position), ``time_given.npy`` (whether the source gave it, or
``dataset.to_undirected`` added it as a reverse: a link task predicts the given ones), and ``seed_time.npy`` where
given.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from hpcgnn.checks import gives
from hpcgnn.data.graph import Timeline
from hpcgnn.data.ooc import NpyAppender, chunks
from hpcgnn.errors import DatasetError
from hpcgnn.io import write_npy

ARRAYS = ("time_col", "time_sorted", "time_edge")
TIMELINE_VERSION = 2  # in a timed folder's cache key: 2 keeps every edge given (events), 1 merged repeated pairs
CHUNK_EDGES = 1 << 22


def kind_of(path: Path, a: np.ndarray) -> np.dtype:
    """The dtype times are kept in: int64 for integers, float64 for floats; anything else refused."""
    if a.dtype.kind in "iu":
        return np.dtype(np.int64)
    if a.dtype.kind == "f":
        return np.dtype(np.float64)
    raise DatasetError(f"{path}: times must be integers or floats, found {a.dtype}")


def read_times(folder: Path, num_edges: int, num_nodes: int, read) -> tuple[np.ndarray | None, np.ndarray | None]:
    """A files folder's (edge times [E], seed times [N] or None), checked (``read(folder, name)``: the folder's
    array reader); (None, None) where it gives no edge times, and a ``seed_time`` without them refused."""
    given_seed = gives(folder, "seed_time")
    if not gives(folder, "edge_time"):
        if given_seed:
            raise DatasetError(f"{folder}: seed_time gives when each node's label is asked, but the edges have no "
                               "times. HINT: add edge_time.npy (one time per edge of edge_index), or remove "
                               "seed_time.npy")
        return None, None
    pt, edge_time = read(folder, "edge_time")
    _check(pt, edge_time, num_edges, "edges of edge_index")
    seed_time = None
    if given_seed:
        ps, seed_time = read(folder, "seed_time")
        _check(ps, seed_time, num_nodes, "nodes (rows of x)")
        if kind_of(ps, seed_time) != kind_of(pt, edge_time):
            raise DatasetError(f"{ps}: seed times are {seed_time.dtype} but the edges' times {edge_time.dtype}: "
                               "give both as integers or both as floats, in the same unit")
    return edge_time, seed_time


def read_typed_times(edges_dir: Path, nodes_dir: Path, target: str, counts: dict, num_target: int,
                     read) -> tuple[dict, np.ndarray | None]:
    """A typed folder's times, checked: each given relation's ``edges/<relation>/edge_time`` ({relation: [E]}, every
    relation or none: an edge without a time would be seen as of any time), and the target type's
    ``nodes/<target>/seed_time`` ([N_target] or None), all of one kind. ``counts``: each relation's edges."""
    timed = {rel: gives(edges_dir / "__".join(rel), "edge_time") for rel in counts}
    seed = nodes_dir / target
    if not any(timed.values()):
        if gives(seed, "seed_time"):
            raise DatasetError(f"{seed}: seed_time gives when each node's label is asked, but the edges have no "
                               "times. HINT: add edge_time.npy to every relation's folder (one time per edge of its "
                               "edge_index), or remove seed_time.npy")
        return {}, None
    missing = ["__".join(r) for r, has in timed.items() if not has]
    if missing:
        raise DatasetError(f"{edges_dir}: some relations' edges have times, and {', '.join(missing)} not: every "
                           "relation's edges need theirs. HINT: add edge_time.npy to those folders (an edge there "
                           "at all times: the earliest time), or remove the others")
    out, kinds = {}, set()
    for rel, count in counts.items():
        path, times = read(edges_dir / "__".join(rel), "edge_time")
        _check(path, times, count, "edges of edge_index")
        out[rel] = times
        kinds.add(kind_of(path, times))
    seed_time = None
    if gives(seed, "seed_time"):
        path, seed_time = read(seed, "seed_time")
        _check(path, seed_time, num_target, f"{target} nodes")
        kinds.add(kind_of(path, seed_time))
    if len(kinds) > 1:
        raise DatasetError(f"{edges_dir}: the relations' times (and the seed times) mix integers and floats: give "
                           "them all as integers or all as floats, in one unit")
    return out, seed_time


def time_parts(when: np.ndarray, cut) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Masks of ``when``'s entries before ``cut[0]`` (training), before ``cut[1]`` (validation) and from it (test):
    ``dataset.time_split``'s rule, for nodes, edge targets and a table's entries alike."""
    return when < cut[0], (when >= cut[0]) & (when < cut[1]), when >= cut[1]


def _check(path: Path, a: np.ndarray, count: int, what: str) -> None:
    kind_of(path, a)
    if a.ndim != 1 or a.shape[0] != count:
        raise DatasetError(f"{path}: shape {tuple(a.shape)}, expected [{count}]: one time per {what[:-1]}, in "
                           f"the order of the {what}")
    for lo in range(0, a.shape[0], CHUNK_EDGES):
        part = np.asarray(a[lo:lo + CHUNK_EDGES])
        if part.dtype.kind == "f" and not np.isfinite(part).all():
            bad = lo + int(np.flatnonzero(~np.isfinite(part))[0])
            raise DatasetError(f"{path}: entry {bad} is {part[bad - lo]}: every time must be a finite number")


def pyg_times(what: str, data, num_edges: int, num_nodes: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """A PyG graph's (edge times [E], seed times [N] or None), checked as a folder's are: ``data.edge_time``, else
    ``data.time`` where it holds one time per edge; ``data.seed_time``, when each node's label is asked (``what``:
    the dataset, as messages name it)."""
    edge_time = getattr(data, "edge_time", None)
    name = "edge_time"
    if edge_time is None and getattr(data, "time", None) is not None:
        edge_time, name = data.time, "time"
        if edge_time.numel() != num_edges:
            raise DatasetError(f"{what}: data.time has {edge_time.numel()} entries for the graph's {num_edges} edges. "
                               "HINT: give the edges' times as data.edge_time, one per edge of edge_index")
    seed_time = getattr(data, "seed_time", None)
    if edge_time is None:
        if seed_time is not None:
            raise DatasetError(f"{what}: data.seed_time gives when each node's label is asked, but the edges have no "
                               "times. HINT: give them as data.edge_time, one per edge of edge_index")
        return None, None
    t = edge_time.detach().cpu()
    t = t.reshape(-1) if t.dim() == 2 and t.size(1) == 1 else t
    _check(f"{what}: data.{name}", t.numpy(), num_edges, "edges of edge_index")
    if seed_time is not None:
        _check(f"{what}: data.seed_time", seed_time.numpy(), num_nodes, "nodes (rows of x)")
        if seed_time.is_floating_point() != t.is_floating_point():
            raise DatasetError(f"{what}: data.seed_time is {seed_time.dtype} but the edges' times {t.dtype}: give both "
                               "as integers or both as floats, in the same unit")
    kind = torch.float64 if t.is_floating_point() else torch.int64
    return t.to(kind), None if seed_time is None else seed_time.to(kind)


def save_timeline(tmp: Path, timeline: Timeline) -> tuple[dict, list[str]]:
    """A timeline held in memory into a prepared graph's folder: its meta.json record and its arrays' names."""
    for name, t in zip(ARRAYS, (timeline.col, timeline.time, timeline.edge), strict=True):
        write_npy(tmp / f"{name}.npy", t.numpy())
    seed_time = None if timeline.seed_time is None else timeline.seed_time.numpy()
    given = None if timeline.given is None else timeline.given.numpy()
    return _record(tmp, timeline.time.numpy().dtype, seed_time, given)


def _record(tmp: Path, dtype: np.dtype, seed_time: np.ndarray | None,
            given: np.ndarray | None) -> tuple[dict, list[str]]:
    """The seed times (where given) and which edges were given (a bool each) beside a timeline just written in
    ``tmp``; its meta.json record (the times' dtype, whether the nodes have times and which edges were given) and its
    arrays' names."""
    names = [*ARRAYS]
    if seed_time is not None:
        write_npy(tmp / "seed_time.npy", np.asarray(seed_time, dtype=dtype))
        names.append("seed_time")
    if given is not None:
        write_npy(tmp / "time_given.npy", np.asarray(given, dtype=np.bool_))
        names.append("time_given")
    return {"dtype": np.dtype(dtype).name, "seed_time": seed_time is not None, "given": given is not None}, names


def time_order(row: torch.Tensor, time: torch.Tensor) -> torch.Tensor:
    """The order of edges by row, then by time, ties by their place (two stable sorts): a timeline's order."""
    order = torch.argsort(time, stable=True)
    return order.index_select(0, torch.argsort(row.index_select(0, order), stable=True))


def write_timeline(tmp: Path, edge_time: np.ndarray, seed_time: np.ndarray | None) -> tuple[dict, list[str]]:
    """The timeline of the CSR in ``tmp`` (``rowptr.npy``, ``col.npy``, and ``eid.npy``: each CSR edge's id in the
    source, a reverse's that of its edge plus E), from the source's ``edge_time``, a chunk of rows at a time, and the
    seed times beside it: its meta.json record and its arrays' names (:func:`save_timeline`'s)."""
    dtype = np.int64 if edge_time.dtype.kind in "iu" else np.float64
    rowptr = torch.from_numpy(np.load(tmp / "rowptr.npy", mmap_mode="r").copy())
    col, eid = np.load(tmp / "col.npy", mmap_mode="r"), np.load(tmp / "eid.npy", mmap_mode="r")
    out = {"time_col": NpyAppender(tmp / "time_col.npy", col.dtype),
           "time_sorted": NpyAppender(tmp / "time_sorted.npy", dtype),
           "time_edge": NpyAppender(tmp / "time_edge.npy", np.int64),
           "time_given": NpyAppender(tmp / "time_given.npy", np.bool_)}
    given = max(edge_time.shape[0], 1)
    for a, b in chunks(rowptr, CHUNK_EDGES):
        lo, hi = int(rowptr[a]), int(rowptr[b])
        ids = np.asarray(eid[lo:hi])
        times = torch.from_numpy(np.asarray(edge_time[ids % given], dtype=dtype))
        order = time_order(torch.repeat_interleave(torch.arange(b - a), rowptr[a + 1:b + 1] - rowptr[a:b]), times)
        out["time_col"].append(np.asarray(col[lo:hi])[order.numpy()])
        out["time_sorted"].append(times.index_select(0, order).numpy())
        out["time_edge"].append((order + lo).numpy())
        out["time_given"].append(ids[order.numpy()] < edge_time.shape[0])
    for writer in out.values():
        writer.close()
    record, names = _record(tmp, np.dtype(dtype), seed_time, None)
    return {**record, "given": True}, [*names, "time_given"]


def load_timeline(folder: Path, meta_times: dict, mode: str | None) -> Timeline:
    """The timeline :func:`write_timeline` left in a prepared graph's ``folder`` (memory-mapped with ``mode``)."""
    def load(name):
        return torch.from_numpy(np.load(folder / f"{name}.npy", mmap_mode=mode))

    return Timeline(*(load(n) for n in ARRAYS), load("seed_time") if meta_times.get("seed_time") else None,
                    load("time_given") if meta_times.get("given") else None)


def timeline_of(rowptr: torch.Tensor, col: torch.Tensor, time: torch.Tensor, seed_time: torch.Tensor | None = None,
                given: torch.Tensor | None = None) -> Timeline:
    """The timeline of a CSR held in memory whose edges have times (``time[e]``: CSR edge e's; ``given[e]``: whether
    the source gave it, not a reverse added): each row's edges ordered by time, ties by their place in the CSR (the
    order :func:`write_timeline` writes)."""
    order = time_order(torch.repeat_interleave(torch.arange(rowptr.numel() - 1), rowptr[1:] - rowptr[:-1]), time)
    return Timeline(col.index_select(0, order), time.index_select(0, order).contiguous(), order, seed_time,
                    None if given is None else given.index_select(0, order))


def events_csr(edge_index: torch.Tensor, num_nodes: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The in-edge CSR of a timed graph's edges, every one kept (events: a pair given twice is two edges), sorted by
    target, then source, then their order given: (rowptr, col, order: each CSR edge's position in ``edge_index``)."""
    src, dst = edge_index[0].long(), edge_index[1].long()
    order = torch.argsort(dst * num_nodes + src, stable=True)
    rowptr = torch.zeros(num_nodes + 1, dtype=torch.long)
    rowptr[1:] = torch.cumsum(torch.bincount(dst, minlength=num_nodes), 0)
    return rowptr, src.index_select(0, order), order


def as_of(graph, at: float):
    """``graph`` (a :class:`~hpcgnn.data.graph.Graph` with a timeline) as of time ``at``: its edges strictly before
    it, each row's in the CSR's order with their features, and no timeline (what an exact pass as of ``at`` reads:
    every edge it holds may be seen). A copy of the kept edges, in memory."""
    import dataclasses

    rowptr, keep = kept_before(graph.rowptr, graph.timeline, at)
    edge_attr = graph.edge_attr[keep] if graph.edge_attr is not None else None
    return dataclasses.replace(graph, rowptr=rowptr, col=graph.col[keep], edge_attr=edge_attr, timeline=None)


def typed_as_of(graph, at: float):
    """A :class:`~hpcgnn.data.typed.TypedGraph` with timelines as of time ``at``: each relation's edges strictly before
    it (:func:`as_of`'s, relation by relation), no timelines and no seed times."""
    import dataclasses

    rowptr, col, edge_attr = {}, {}, {}
    for rel in graph.relations:
        rowptr[rel], keep = kept_before(graph.rowptr[rel], graph.timelines[rel], at)
        col[rel] = graph.col[rel][keep]
        if graph.edge_attr and rel in graph.edge_attr:
            edge_attr[rel] = graph.edge_attr[rel][keep]
    return dataclasses.replace(graph, rowptr=rowptr, col=col, edge_attr=edge_attr or None,
                               timelines=None, seed_time=None)


def kept_before(rowptr: torch.Tensor, timeline: Timeline, at: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The rowptr of a CSR's edges strictly before ``at`` (its ``timeline``'s rows), and which of its edges they are
    (bool, in the CSR's order)."""
    n = rowptr.numel() - 1
    keep = torch.zeros(int(rowptr[-1]), dtype=torch.bool)
    keep[timeline.edge[timeline.time < at]] = True
    row = torch.repeat_interleave(torch.arange(n), rowptr[1:] - rowptr[:-1])
    out = torch.zeros(n + 1, dtype=torch.long)
    out[1:] = torch.cumsum(torch.bincount(row[keep], minlength=n), 0)
    return out, keep
