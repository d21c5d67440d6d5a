"""Out-of-core preparation: edges stream into an on-disk CSR with a bounded working set.

A source hands edges over in chunks (:meth:`EdgeBuckets.add`); they are appended to bucket files
by target range, never held whole. :meth:`EdgeBuckets.write_csr` then sorts and deduplicates one
bucket at a time into ``rowptr.npy`` (int64) and ``col.npy`` (int32 while the node count allows,
half the bytes of int64), appended as it goes. Peak memory is about ``BYTES_PER_EDGE`` times one
bucket's edges, and buckets are sized from ``dataset.prepare_mem_gb``.

Features are written row chunk by row chunk into a memory-mapped ``x.npy`` in
``dataset.feature_dtype`` (float32, float16, or bfloat16 stored as its 16 bits, which numpy
lacks); readers upcast each batch's rows to float32.
"""

from __future__ import annotations

import ctypes
import math
import mmap
import os
import shutil
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from hpcgnn.logs import Progress

BYTES_PER_EDGE = 32  # sorting one bucket: the keys, the sort's copy and its output, the columns out
MIN_BUCKET_EDGES = 1 << 16  # fewer per bucket: more files than the sort saves
ADD_EDGES = 1 << 21  # edges bucketed at a time by EdgeBuckets.add: about 100 MB of temporaries
FEATURE_DTYPES = {"float32": (torch.float32, np.float32), "float16": (torch.float16, np.float16),
                  "bfloat16": (torch.bfloat16, np.uint16)}  # numpy has no bfloat16: its bits as uint16


def stored_rows(t: Tensor) -> np.ndarray:
    """Rows as they are written to a .npy file: the one bfloat16 storage rule (numpy has no bfloat16: its 16 bits
    as uint16; meta.json's feature_dtype says which), read back by :func:`rows_as_stored`."""
    return (t.view(torch.uint16) if t.dtype == torch.bfloat16 else t).numpy()


def rows_as_stored(t: Tensor, feature_dtype: str | None) -> Tensor:
    """Rows read from a .npy file in the graph's feature dtype (``feature_dtype``: bfloat16 from its bits)."""
    return t.view(torch.bfloat16) if feature_dtype == "bfloat16" else t


def index_dtype(num_nodes: int) -> np.dtype:
    """int32 node ids while they fit, else int64."""
    return np.dtype(np.int32) if num_nodes < 2**31 else np.dtype(np.int64)


class NpyAppender:
    """A .npy file written by appending rows (plain writes: no mapped pages, so the pages written do not
    count in this process's RSS); the row count goes into the header on close, and the file is synced
    (a reader that maps it can hand its pages back, :func:`drop_pages`: the kernel keeps dirty pages)."""

    HEADER = 128  # bytes: magic, version, header length, the dict padded with spaces

    def __init__(self, path: Path, dtype: np.dtype, row_shape: tuple[int, ...] = ()):
        self.path, self.dtype, self.row_shape, self.length = path, np.dtype(dtype), tuple(row_shape), 0
        self.file = open(path, "wb")
        self.file.write(b"\0" * self.HEADER)

    def append(self, array: np.ndarray) -> None:
        if tuple(array.shape[1:]) != self.row_shape:
            raise ValueError(f"rows of shape {tuple(array.shape[1:])} appended to {self.path} of rows {self.row_shape}")
        self.file.write(np.ascontiguousarray(array, dtype=self.dtype).tobytes())
        self.length += int(array.shape[0])

    def close(self, shape: tuple[int, ...] | None = None) -> None:
        """``shape``: what the header says instead of (rows, *row_shape), the same element count."""
        shape = (self.length, *self.row_shape) if shape is None else tuple(shape)
        if math.prod(shape) != self.length * math.prod(self.row_shape):
            raise ValueError(f"{self.path}: shape {shape} for {self.length} rows of {self.row_shape}")
        self.file.seek(0)
        np.lib.format.write_array_header_1_0(self.file, {"descr": np.lib.format.dtype_to_descr(self.dtype),
                                                          "fortran_order": False, "shape": shape})
        if self.file.tell() != self.HEADER:  # an internal invariant: numpy pads to 64 bytes; shapes of 10^15 rows fit
            raise RuntimeError(f"{self.path}: numpy's .npy header of {shape} is {self.file.tell()} bytes, not "
                               f"{self.HEADER}")
        self.file.flush()
        os.fdatasync(self.file.fileno())
        self.file.close()


def stack_rows(path: Path, parts: list[Path]) -> None:
    """The .npy files ``parts`` (1-D, equal lengths and dtypes) as the rows of one array ``path``,
    copied a block at a time; the parts are removed."""
    arrays = [np.load(p, mmap_mode="r") for p in parts]
    if len({(a.shape, a.dtype) for a in arrays}) > 1 or any(a.ndim != 1 for a in arrays):
        raise ValueError(f"{path}: rows of different shapes or dtypes: {[(a.shape, a.dtype) for a in arrays]}")
    out = NpyAppender(path, arrays[0].dtype)
    for a in arrays:
        for lo in range(0, a.shape[0], 1 << 22):
            out.append(np.asarray(a[lo:lo + (1 << 22)]))
    out.close(shape=(len(arrays), arrays[0].shape[0]))
    del arrays
    for p in parts:
        p.unlink()


class EdgeBuckets:
    """Edges (target, source) collected on disk by target range, then written as one CSR (``num_nodes``
    rows; ``num_src``: the sources' id space when it is not the targets', a typed relation's).

    ``weighted``: duplicates are summed into ``weight.npy`` (int64) instead of dropped, each added edge
    weighing its given weight or 1 (a partitioner's coarse graph: the edges between two clusters).
    ``ids``: each edge is added with its id (its position in the source), and ``eid.npy`` (int64) holds each
    CSR edge's id, a duplicate's first (the lowest): where its features are in the source's rows; with ``parallel``,
    every edge added is kept, duplicates too, in the order of their ids within a pair (a timed graph's events).

    Buckets are ranges of target rows: equal ranges, or, given ``row_edges`` (int64 [num_nodes]: about how
    many edges each row will get), ranges of about equal edges, so that no bucket's sort outgrows the
    budget where rows differ (a coarse level's clusters: a large cluster gets the edges of its members)."""

    def __init__(self, num_nodes: int, expected_edges: int, scratch: Path, mem_bytes: int, weighted: bool = False,
                 num_src: int | None = None, row_edges: Tensor | None = None, ids: bool = False,
                 parallel: bool = False):
        if weighted and ids:
            raise ValueError("edge buckets carry weights or edge ids, not both")
        if parallel and not ids:
            raise ValueError("parallel edges are kept by their ids: make the buckets with ids=True")
        self.n, self.scratch, self.weighted, self.ids, self.parallel = num_nodes, scratch, weighted, ids, parallel
        self.m = num_nodes if num_src is None else max(num_src, 1)  # sources' id space (a typed relation's)
        self.dtype = index_dtype(max(num_nodes, self.m))
        per_bucket = max(mem_bytes // (BYTES_PER_EDGE + 24 * weighted), MIN_BUCKET_EDGES)  # weights: their sort order too
        self.num_buckets = max(1, math.ceil(1.25 * expected_edges / per_bucket))
        if row_edges is None:
            rows = max(1, math.ceil(num_nodes / self.num_buckets))
            self.bounds = (torch.arange(self.num_buckets + 1) * rows).clamp(max=num_nodes)
        else:  # the first row of bucket b: where the cumulative edges pass b / num_buckets of them
            cum = torch.cumsum(row_edges, 0)
            share = torch.arange(1, self.num_buckets) * (int(cum[-1]) if num_nodes else 0) // self.num_buckets
            inner = torch.searchsorted(cum, share, right=True) if num_nodes else torch.zeros(0, dtype=torch.long)
            self.bounds = torch.cat([torch.zeros(1, dtype=torch.long), inner, torch.tensor([num_nodes])])
        scratch.mkdir(parents=True, exist_ok=True)
        self.added = 0
        self.progress = Progress("reading edges", expected_edges, "edges")

    def _file(self, b: int, which: str) -> Path:
        return self.scratch / f"bucket{b:05d}.{which}"

    def add(self, dst: Tensor, src: Tensor, weight: Tensor | None = None, ids: Tensor | None = None) -> None:
        """Edges ``src -> dst`` (``dst`` aggregates ``src``); duplicates are removed (or summed) at the end.
        ``ids``: the edges' ids, with buckets made ``ids=True`` (where each edge's features are)."""
        if weight is not None and not self.weighted:
            raise ValueError("weights given to unweighted buckets")
        if (ids is not None) != self.ids:
            raise ValueError("edge ids are given to buckets made with ids=True, and only there")
        weight = ids if ids is not None else weight  # (the one payload column: weights or ids)
        # A slice at a time: the sort's temporaries stay bounded however large the chunk handed over
        # (a source's chunk of a dense graph); stable by bucket, so the files are those of one pass.
        for lo in range(0, dst.numel(), ADD_EDGES):
            hi = lo + ADD_EDGES
            self._add(dst[lo:hi], src[lo:hi], weight[lo:hi] if weight is not None else None)

    def _add(self, dst: Tensor, src: Tensor, weight: Tensor | None) -> None:
        bucket = torch.searchsorted(self.bounds, dst, right=True) - 1  # (an empty bucket's rows: the next one's)
        # numpy's stable argsort of small integers is a radix sort: 2-4x torch's stable argsort here
        small = np.int16 if self.num_buckets < 2**15 else np.int64
        order = torch.from_numpy(np.argsort(bucket.numpy().astype(small), kind="stable"))
        columns = [("dst", dst[order], self.dtype), ("src", src[order], self.dtype)]
        if weight is not None:
            columns.append(("w", weight[order], np.dtype(np.int64)))
        elif self.weighted:  # mixing weighted and unweighted adds: every edge needs its weight
            columns.append(("w", torch.ones(dst.numel(), dtype=torch.long), np.dtype(np.int64)))
        cuts = [0, *torch.cumsum(torch.bincount(bucket, minlength=self.num_buckets), 0).tolist()]
        for b in range(self.num_buckets):
            lo, hi = cuts[b], cuts[b + 1]
            if hi > lo:
                for which, t, dtype in columns:
                    with open(self._file(b, which), "ab") as f:
                        f.write(t[lo:hi].numpy().astype(dtype).tobytes())
        self.added += dst.numel()
        self.progress.advance(dst.numel())

    def write_csr(self, folder: Path) -> int:
        """``folder/rowptr.npy`` and ``folder/col.npy`` (and ``weight.npy``), bucket by bucket; returns the
        edge count."""
        self.progress.finish()
        sorting = Progress("sorting the edges into rows", self.num_buckets, "buckets")

        def merged():
            for b in range(self.num_buckets):
                counts, c, w = self.merge_bucket(b, [self])
                sorting.advance(1)
                if counts is not None:
                    yield counts, c, w
            sorting.finish()

        total = self._write_rows(folder, merged())
        shutil.rmtree(self.scratch, ignore_errors=True)
        return total

    def _write_rows(self, folder: Path, rows) -> int:
        """Append ``(edges per row, columns, weights)`` runs of rows, in order, as one CSR in ``folder``."""
        rowptr = NpyAppender(folder / "rowptr.npy", np.int64)
        rowptr.append(np.zeros(1, dtype=np.int64))
        col = NpyAppender(folder / "col.npy", self.dtype)
        weight = NpyAppender(folder / ("weight.npy" if self.weighted else "eid.npy"), np.int64) \
            if self.weighted or self.ids else None
        total = 0
        for counts, c, w in rows:
            col.append(c)
            if weight is not None:
                weight.append(w)
            rowptr.append((torch.cumsum(counts, 0) + total).numpy())
            total += int(counts.sum())
        for out in (col, rowptr, weight):
            if out is not None:
                out.close()
        return total

    def merge_bucket(self, b: int, sources: list[EdgeBuckets]) -> tuple[Tensor | None, np.ndarray, np.ndarray]:
        """Bucket ``b`` of every source (the same layout: several tasks' folders), sorted: (edges per row of
        the bucket, columns, summed weights or None); (None, ...) for a bucket of no rows. Its files are removed."""
        lo, hi = int(self.bounds[b]), int(self.bounds[b + 1])
        if lo >= hi:
            return None, np.zeros(0, self.dtype), np.zeros(0, np.int64)
        files = [s for s in sources if s._file(b, "dst").exists()]
        if not files:
            return torch.zeros(hi - lo, dtype=torch.long), np.zeros(0, self.dtype), np.zeros(0, np.int64)
        key = torch.cat([torch.from_numpy(np.fromfile(s._file(b, "dst"), dtype=self.dtype)) for s in files]).long()
        key.sub_(lo).mul_(self.m).add_(
            torch.cat([torch.from_numpy(np.fromfile(s._file(b, "src"), dtype=self.dtype)) for s in files]))
        w = None
        if self.weighted:  # sort, then sum each run of equal keys
            key, order = torch.sort(key)
            w = torch.cat([torch.from_numpy(np.fromfile(s._file(b, "w"), dtype=np.int64))
                           for s in files]).index_select(0, order)
            del order
            key, run = torch.unique_consecutive(key, return_counts=True)
            sums = torch.cumsum(w, 0).index_select(0, torch.cumsum(run, 0) - 1)
            w = torch.diff(sums, prepend=sums.new_zeros(1)).numpy()
        elif self.ids:  # sort by (key, id), then keep each run's first: a duplicate's lowest id
            ids = torch.cat([torch.from_numpy(np.fromfile(s._file(b, "w"), dtype=np.int64)) for s in files])
            order = torch.argsort(ids)
            key, ids = key.index_select(0, order), ids.index_select(0, order)
            key, order = torch.sort(key, stable=True)
            ids = ids.index_select(0, order)
            del order
            if self.parallel:  # every edge, each pair's in the order of their ids
                w = ids.numpy()
            else:
                key, run = torch.unique_consecutive(key, return_counts=True)
                w = ids.index_select(0, torch.cumsum(run, 0) - run).numpy()
        else:
            key = torch.unique(key)  # sorted by target, then source; no duplicates
        counts = torch.bincount(key // self.m, minlength=hi - lo)
        col = key.remainder_(self.m).numpy().astype(self.dtype)
        for s in files:
            for which in ("dst", "src", "w"):
                s._file(b, which).unlink(missing_ok=True)
        return counts, col, w

    def write_pieces(self, folder: Path, mine: list[int], sources: list[EdgeBuckets]) -> None:
        """Buckets ``mine`` of all ``sources`` (every task's folder), each as ``piece<b>.*.npy`` in ``folder``
        (one task's share of a job's sorting; :meth:`join_pieces` makes them one CSR)."""
        for b in mine:
            counts, c, w = self.merge_bucket(b, sources)
            if counts is None:
                continue
            np.save(folder / f"piece{b:05d}.counts.npy", counts.numpy())
            np.save(folder / f"piece{b:05d}.col.npy", c)
            if w is not None:
                np.save(folder / f"piece{b:05d}.weight.npy", w)

    def join_pieces(self, folder: Path) -> int:
        """The pieces of :meth:`write_pieces`, in bucket order, as ``rowptr``/``col``/``weight`` .npy files."""
        def pieces():
            for b in range(self.num_buckets):
                piece = folder / f"piece{b:05d}"
                if not piece.with_suffix(".counts.npy").exists():
                    continue
                yield (torch.from_numpy(np.load(piece.with_suffix(".counts.npy"))),
                       np.load(piece.with_suffix(".col.npy"), mmap_mode="r"),
                       np.load(piece.with_suffix(".weight.npy"), mmap_mode="r") if self.weighted else None)

        total = self._write_rows(folder, pieces())
        for piece in folder.glob("piece*.npy"):
            piece.unlink()
        return total


class FeatureWriter:
    """``x.npy`` [num_nodes, num_features] in the stored feature dtype, written row range after row range."""

    def __init__(self, path: Path, num_nodes: int, num_features: int, dtype: str):
        if dtype not in FEATURE_DTYPES:
            raise ValueError(f"dataset.feature_dtype={dtype!r}: use one of {', '.join(FEATURE_DTYPES)}")
        self.torch_dtype, np_dtype = FEATURE_DTYPES[dtype]
        self.num_nodes = num_nodes
        self.out = NpyAppender(path, np_dtype, (num_features,))

    def write(self, start: int, rows: Tensor) -> None:
        if start != self.out.length:
            raise ValueError(f"feature rows from {start} written after {self.out.length} rows: write them in order")
        t = rows.to(self.torch_dtype)
        self.out.append(stored_rows(t))

    def close(self) -> None:
        if self.out.length != self.num_nodes:
            raise ValueError(f"{self.out.length} feature rows written, {self.num_nodes} expected")
        self.out.close()


def load_features(path: Path, dtype: str, mmap_mode: str | None = "c") -> Tensor:
    """The stored features as a torch tensor of their dtype (bfloat16 reinterpreted from its bits)."""
    array = np.load(path, mmap_mode=mmap_mode)
    return rows_as_stored(torch.from_numpy(array), dtype)


_MADV_PAGEOUT = 21  # Linux 5.4+: reclaim these pages now; anonymous memory without swap stays as it is


def _madvise():
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        return libc.madvise
    except (OSError, AttributeError):
        return None


_MADVISE = _madvise()


def drop_pages(t: Tensor | np.ndarray) -> None:
    """Hand back the pages of a memory-mapped tensor's (or numpy memmap's) range once it has been read (a pass
    over a mapped graph would otherwise keep every page it touched in this process's RSS). Safe on any tensor:
    the kernel re-reads file pages when touched again, and leaves anonymous memory alone (no swap); numpy
    arrays that are not memmaps are left alone."""
    if isinstance(t, np.ndarray):
        if not isinstance(t, np.memmap) or t.size == 0:
            return
        addr, nbytes = t.ctypes.data, t.nbytes
    else:
        if t.numel() == 0 or t.device.type != "cpu":
            return
        addr, nbytes = t.data_ptr(), t.numel() * t.element_size()
    if _MADVISE is None:
        return
    page = mmap.PAGESIZE
    start, end = (addr + page - 1) // page * page, (addr + nbytes) // page * page
    if end > start:
        _MADVISE(start, end - start, _MADV_PAGEOUT)


def chunks(rowptr: Tensor, chunk_edges: int, max_rows: int | None = None) -> list[tuple[int, int]]:
    """Row ranges [a, b) of about ``chunk_edges`` edges each (and at most ``max_rows`` rows)."""
    n, m = rowptr.numel() - 1, int(rowptr[-1])
    if n == 0:
        return []
    targets = torch.arange(chunk_edges, max(m, chunk_edges), chunk_edges, dtype=torch.long)
    cuts = torch.searchsorted(rowptr, targets).tolist() if targets.numel() else []
    if max_rows:
        cuts += list(range(max_rows, n, max_rows))
    bounds = sorted({0, n, *(int(c) for c in cuts if 0 < c < n)})
    return list(zip(bounds[:-1], bounds[1:], strict=False))


def trim_heap() -> None:
    """Give freed heap memory back to the kernel (glibc keeps large freed blocks for reuse; between the
    phases of a long preparation or partitioning that is RSS held for nothing)."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass


def gather_sorted(src: Tensor, index: Tensor, chunk: int = 1 << 18) -> Tensor:
    """``src.index_select(0, index)`` for an ascending ``index`` into a memory-mapped ``src``, a chunk at a
    time, handing each chunk's pages back once read (:func:`drop_pages`): RSS grows by the output alone."""
    out = src.new_empty((index.numel(), *src.shape[1:]))
    for a in range(0, index.numel(), chunk):
        idx = index[a:a + chunk]
        out[a:a + idx.numel()] = src.index_select(0, idx)
        drop_pages(src[int(idx[0]):int(idx[-1]) + 1])
    return out
