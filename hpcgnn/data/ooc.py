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

import ast
import math
import shutil
import struct
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

BYTES_PER_EDGE = 32  # sorting one bucket: the keys, the sort's copy and its output, the columns out
FEATURE_DTYPES = {"float32": (torch.float32, np.float32), "float16": (torch.float16, np.float16),
                  "bfloat16": (torch.bfloat16, np.uint16)}  # numpy has no bfloat16: its bits as uint16


def index_dtype(num_nodes: int) -> np.dtype:
    """int32 node ids while they fit, else int64."""
    return np.dtype(np.int32) if num_nodes < 2**31 else np.dtype(np.int64)


class NpyAppender:
    """A .npy file written by appending rows (plain writes: no mapped pages, so the pages written do not
    count in this process's RSS); the row count goes into the header on close."""

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

    def close(self) -> None:
        d = {"descr": self.dtype.str, "fortran_order": False, "shape": (self.length, *self.row_shape)}
        text = repr(d).encode("latin1")
        pad = self.HEADER - 10 - len(text) - 1
        header = b"\x93NUMPY\x01\x00" + struct.pack("<H", self.HEADER - 10) + text + b" " * pad + b"\n"
        assert len(header) == self.HEADER and ast.literal_eval(text.decode()) == d
        self.file.seek(0)
        self.file.write(header)
        self.file.close()


class EdgeBuckets:
    """Edges (target, source) collected on disk by target range, then written as one CSR."""

    def __init__(self, num_nodes: int, expected_edges: int, scratch: Path, mem_bytes: int):
        self.n, self.scratch = num_nodes, scratch
        self.dtype = index_dtype(num_nodes)
        per_bucket = max(mem_bytes // BYTES_PER_EDGE, 1 << 16)
        self.num_buckets = max(1, math.ceil(1.25 * expected_edges / per_bucket))
        self.rows = max(1, math.ceil(num_nodes / self.num_buckets))
        scratch.mkdir(parents=True, exist_ok=True)
        self.added = 0

    def _file(self, b: int, which: str) -> Path:
        return self.scratch / f"bucket{b:05d}.{which}"

    def add(self, dst: Tensor, src: Tensor) -> None:
        """Edges ``src -> dst`` (``dst`` aggregates ``src``); duplicates are removed at the end."""
        if dst.numel() == 0:
            return
        bucket = dst // self.rows
        order = torch.argsort(bucket, stable=True)
        bucket, dst, src = bucket[order], dst[order], src[order]
        bounds = torch.searchsorted(bucket, torch.arange(self.num_buckets + 1)).tolist()
        for b in range(self.num_buckets):
            lo, hi = bounds[b], bounds[b + 1]
            if hi > lo:
                for which, t in (("dst", dst), ("src", src)):
                    with open(self._file(b, which), "ab") as f:
                        f.write(t[lo:hi].numpy().astype(self.dtype).tobytes())
        self.added += dst.numel()

    def write_csr(self, folder: Path) -> int:
        """``folder/rowptr.npy`` and ``folder/col.npy``, bucket by bucket; returns the edge count."""
        rowptr = NpyAppender(folder / "rowptr.npy", np.int64)
        rowptr.append(np.zeros(1, dtype=np.int64))
        col = NpyAppender(folder / "col.npy", self.dtype)
        total = 0
        for b in range(self.num_buckets):
            lo, hi = b * self.rows, min((b + 1) * self.rows, self.n)
            if lo >= hi:
                break
            f_dst, f_src = self._file(b, "dst"), self._file(b, "src")
            if f_dst.exists():
                key = torch.from_numpy(np.fromfile(f_dst, dtype=self.dtype)).long()
                key.sub_(lo).mul_(self.n).add_(torch.from_numpy(np.fromfile(f_src, dtype=self.dtype)))
                key = torch.unique(key)  # sorted by target, then source; no duplicates
                counts = torch.bincount(key // self.n, minlength=hi - lo)
                col.append(key.remainder_(self.n).numpy())
                del key
                f_dst.unlink()
                f_src.unlink()
            else:
                counts = torch.zeros(hi - lo, dtype=torch.long)
            rowptr.append((torch.cumsum(counts, 0) + total).numpy())
            total += int(counts.sum())
        col.close()
        rowptr.close()
        shutil.rmtree(self.scratch, ignore_errors=True)
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
        self.out.append((t.view(torch.uint16) if t.dtype == torch.bfloat16 else t).numpy())

    def close(self) -> None:
        if self.out.length != self.num_nodes:
            raise ValueError(f"{self.out.length} feature rows written, {self.num_nodes} expected")
        self.out.close()


def load_features(path: Path, dtype: str, mmap_mode: str | None = "c") -> Tensor:
    """The stored features as a torch tensor of their dtype (bfloat16 reinterpreted from its bits)."""
    array = np.load(path, mmap_mode=mmap_mode)
    t = torch.from_numpy(array)
    return t.view(torch.bfloat16) if dtype == "bfloat16" else t
