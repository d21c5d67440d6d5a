"""Writing the parts: each part's nodes, in-adjacency, features, labels and splits, a chunk of rows at a time, into the
artifact's folder with a checksum of every file.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from hpcgnn.data import cache
from hpcgnn.data.graph import Graph
from hpcgnn.data.ooc import NpyAppender, drop_pages, gather_sorted, stored_rows, trim_heap
from hpcgnn.data.typed import relation_key
from hpcgnn.io import AtomicFolder, sha256_file
from hpcgnn.partition.compute import csr_rows
from hpcgnn.partition.multilevel import LOCAL, Comm
from hpcgnn.writers import writer_tag

log = logging.getLogger(__name__)

WRITE_ROWS = 1 << 16  # nodes per chunk when a part's columns and features are written


PART_ARRAYS = ("nodes", "rowptr", "col", "x", "y", "train_idx", "val_idx", "test_idx")
EDGE_FEATURES = "edge_attr"  # a part's edges' features, where the graph's edges have some (META: edge_features)
# A timed graph's parts (META: times): each row's in-edges in time, as the prepared timeline holds them (their sources,
# their times, each one's place in the part's CSR), and the part's nodes' seed times where the graph gives them.
TIME_ARRAYS = ("time_col", "time_sorted", "time_edge")


_numpy = stored_rows  # (a tensor as numpy writes it: META names the feature dtype)


def write_parts(graph: Graph, part: Tensor, folder: Path, meta: dict, edges: dict[str, Tensor] | None = None,
                typed=None, comm: Comm = LOCAL) -> None:
    """Write the artifact atomically (temporary folder, fsync'd files, rename).

    ``edges``: a link task's training edges (``train_pos`` [2, E]) and what each edge carries beside them (its
    time, ``train_time`` [E]), shared out by the part that owns each edge's source, written as
    ``part_<i>/<name>.npy``. ``typed``: the :class:`TypedGraph` whose
    homogeneous view ``graph`` is: each part also gets its nodes' in-adjacency per relation.
    Several tasks (``comm``): task t writes parts t, t + tasks, ... into one temporary folder; task 0
    writes the maps and META.json and renames the folder into place.
    """
    num_parts = meta["num_parts"]
    _check_space(graph, num_parts, folder.parent)
    target = AtomicFolder(folder, tag=comm.broadcast_object(writer_tag()))
    try:
        if comm.rank == 0:
            target.create()
        comm.barrier()
        out = _PartFiles(target.tmp)
        for i in range(comm.rank, num_parts, comm.size):
            _write_part(out, i, graph, part, edges or {}, typed)
        if comm.rank == 0:
            _write_maps(out, graph, part, num_parts)
        for other in comm.gather_objects(out.files):
            out.files.update(other)
        if comm.rank == 0:
            (target.tmp / "META.json").write_text(json.dumps({**meta, "files": dict(sorted(out.files.items()))},
                                                             indent=2))
            target.commit()  # another writer may win the race with the same parts
        comm.barrier()
    finally:
        if comm.rank == 0:
            target.discard()


def _check_space(graph: Graph, num_parts: int, where: Path) -> None:
    where.mkdir(parents=True, exist_ok=True)
    arrays = [graph.col, graph.x, graph.y, *([graph.edge_attr] if graph.edge_attr is not None else [])]
    need = sum(a.numel() * a.element_size() for a in arrays) * 1.05
    free = shutil.disk_usage(where).free
    if need > free:
        raise OSError(f"writing {num_parts} parts needs about {cache.human_bytes(need)} in {where}, but "
                      f"only {cache.human_bytes(free)} are free: set dataset.root to a larger file system")


class _PartFiles:
    """The artifact's files under its temporary folder, each with its sha256 (META.json lists them)."""

    def __init__(self, tmp: Path):
        self.tmp, self.files = tmp, {}

    def save(self, rel: str, array: Tensor) -> None:
        path = self.tmp / rel
        path.parent.mkdir(exist_ok=True)
        with open(path, "wb") as f:  # (bfloat16, which numpy lacks, as its 16 bits; META says which)
            np.save(f, _numpy(array))
        self.files[rel] = sha256_file(path)

    def save_rows(self, rel: str, source: Tensor, rows) -> None:
        """``source``'s rows at the ascending indices of each of ``rows``, appended chunk by chunk."""
        self.save_chunks(rel, source[:0], (gather_sorted(source, index) for index in rows))

    def save_chunks(self, rel: str, like: Tensor, chunks) -> None:
        """One array of ``like``'s dtype and row shape, from ``chunks`` appended one after another."""
        path = self.tmp / rel
        path.parent.mkdir(exist_ok=True)
        out = NpyAppender(path, _numpy(like[:0]).dtype, tuple(like.shape[1:]))
        for chunk in chunks:
            out.append(_numpy(chunk))
        out.close()
        self.files[rel] = sha256_file(path)


def _write_part(out: _PartFiles, i: int, graph: Graph, part: Tensor, edges: dict[str, Tensor], typed) -> None:
    """Part ``i``'s files: its nodes' columns and features a chunk of rows at a time (never whole in memory),
    then its small arrays (nodes, rowptr, labels, splits, owned edges, per-relation adjacency)."""
    mine = part == i
    nodes = mine.nonzero().flatten()
    runs = [nodes[a:a + WRITE_ROWS] for a in range(0, nodes.numel(), WRITE_ROWS)]
    out.save_rows(f"part_{i}/col.npy", graph.col, (csr_rows(graph.rowptr, r)[1] for r in runs))
    out.save_rows(f"part_{i}/x.npy", graph.x, runs)
    if graph.edge_attr is not None:  # each edge's features, in the part's CSR order (its columns')
        out.save_rows(f"part_{i}/edge_attr.npy", graph.edge_attr, (csr_rows(graph.rowptr, r)[1] for r in runs))
    if graph.timeline is not None:
        _write_timeline(out, i, graph, runs)
    rowptr = torch.zeros(nodes.numel() + 1, dtype=torch.long)
    rowptr[1:] = torch.cumsum(graph.rowptr.index_select(0, nodes + 1) - graph.rowptr.index_select(0, nodes), 0)
    arrays = {"nodes": nodes, "rowptr": rowptr,
              "y": graph.y.index_select(0, nodes) if graph.y.numel() else graph.y}  # a link graph: no labels
    for split in ("train_idx", "val_idx", "test_idx"):
        idx = getattr(graph, split)
        arrays[split] = idx[mine[idx]]
    if graph.timeline is not None and graph.timeline.seed_time is not None:  # (in the part's row order)
        arrays["seed_time"] = graph.timeline.seed_time.index_select(0, nodes)
    if edges:  # (every array of edges by the training edges' sources)
        owned = mine.index_select(0, edges["train_pos"][0])
        for name, a in edges.items():
            arrays[name] = a[..., owned].contiguous()
    if typed is not None:  # per relation, the rows of the part's nodes of its target type
        off = typed.offsets()
        for rel in typed.relations:
            t = rel[2]
            own = nodes[(nodes >= off[t]) & (nodes < off[t] + typed.num_nodes[t])] - off[t]
            rp, pos = csr_rows(typed.rowptr[rel], own)
            arrays[f"rowptr__{relation_key(rel)}"] = rp
            arrays[f"col__{relation_key(rel)}"] = typed.col[rel].index_select(0, pos)
            if typed.edge_attr and rel in typed.edge_attr:  # the relation's edges' features, in the same order
                out.save_rows(f"part_{i}/{EDGE_FEATURES}__{relation_key(rel)}.npy", typed.edge_attr[rel], [pos])
            if typed.timelines:  # the relation's rows in time (each edge's place: in the part's CSR of it)
                tl, key = typed.timelines[rel], relation_key(rel)
                arrays[f"time_col__{key}"] = tl.col.index_select(0, pos)
                arrays[f"time_sorted__{key}"] = tl.time.index_select(0, pos)
                arrays[f"time_edge__{key}"] = tl.edge.index_select(0, pos) - pos + torch.arange(pos.numel())
        if typed.seed_time is not None:  # the part's target-type nodes' seed times, in their typed rows' order
            t = typed.target
            own = nodes[(nodes >= off[t]) & (nodes < off[t] + typed.num_nodes[t])] - off[t]
            arrays[f"seed_time__{t}"] = typed.seed_time.index_select(0, own)
    for name, array in arrays.items():
        out.save(f"part_{i}/{name}.npy", array)
    del arrays, rowptr, nodes, mine, runs
    timeline = graph.timeline
    for mapped in (graph.x, graph.col, graph.rowptr, *([graph.edge_attr] if graph.edge_attr is not None else []),
                   *((timeline.col, timeline.time, timeline.edge) if timeline is not None else ())):
        # a part's rows are all over the graph's pages
        drop_pages(mapped)
    trim_heap()
    log.debug("part %d written", i)


def _write_timeline(out: _PartFiles, i: int, graph: Graph, runs: list[Tensor]) -> None:
    """Part ``i``'s rows of the graph's timeline, a chunk of rows at a time: their sources and times, and each edge's
    place in the part's CSR (the timeline's rows are the CSR's: an edge at timeline position p of a row holds, in the
    part, its place in that row plus the row's start there)."""
    tl = graph.timeline
    out.save_rows(f"part_{i}/time_col.npy", tl.col, (csr_rows(graph.rowptr, r)[1] for r in runs))
    out.save_rows(f"part_{i}/time_sorted.npy", tl.time, (csr_rows(graph.rowptr, r)[1] for r in runs))

    def places():
        start = 0
        for r in runs:
            pos = csr_rows(graph.rowptr, r)[1]
            # tl.edge[p] - p: the edge's place in its row less p's own; p's place in the part is start + its index
            yield gather_sorted(tl.edge, pos) - pos + torch.arange(start, start + pos.numel())
            start += pos.numel()

    out.save_chunks(f"part_{i}/time_edge.npy", tl.edge, places())


def time_arrays(graph: Graph) -> list[str]:
    """The timeline arrays of a timed graph's parts (none where its edges have no times)."""
    tl = graph.timeline
    if tl is None:
        return []
    return [*TIME_ARRAYS, *(["seed_time"] if tl.seed_time is not None else [])]


def _write_maps(out: _PartFiles, graph: Graph, part: Tensor, num_parts: int) -> None:
    """The maps every rank reads whole: each node's part, its row there, and its in-degree."""
    local = torch.empty(graph.num_nodes, dtype=torch.int32)
    for i in range(num_parts):
        nodes = (part == i).nonzero().flatten()
        local[nodes] = torch.arange(nodes.numel(), dtype=torch.int32)
    out.save("node_part.npy", part.to(torch.int16) if num_parts < 2**15 else part)  # mapped by every rank
    out.save("node_local.npy", local)
    out.save("degree.npy", graph.degree().int())


def typed_arrays(typed) -> list[str]:
    """The per-relation arrays of a typed graph's parts (none for a homogeneous graph): each relation's CSR, its
    edges' features where it has some, and a timed graph's rows in time and target-type seed times."""
    if typed is None:
        return []
    times = [f"{kind}__{relation_key(r)}" for r in typed.relations for kind in TIME_ARRAYS] if typed.timelines else []
    return [f"{kind}__{relation_key(r)}" for r in typed.relations for kind in ("rowptr", "col")] + \
        [f"{EDGE_FEATURES}__{relation_key(r)}" for r in typed.relations if typed.edge_attr and r in typed.edge_attr] + \
        times + ([f"seed_time__{typed.target}"] if typed.seed_time is not None else [])

