"""A table of (node, time, label) entries: a node task whose labels are asked at times of their own, a node perhaps at
several (RelBench's training tables: a customer's churn asked every week).

A files folder gives it beside its graph, whose edges have times (``edge_time``):

- ``table_node`` int [R]: each entry's node (a row of ``x``);
- ``table_time`` [R]: when its label is asked, in the edges' kind and unit; its neighbourhood is sampled as of then
  (the edges at or before it, as a node's at its ``seed_time``: :class:`hpcgnn.sampling.temporal.TableSampler`);
- ``table_label`` [R] or [R, C]: its label, in any form a node label takes (class ids, several binary labels, values;
  NaN or -1 unknown: :func:`hpcgnn.labels.stored`);
- the split: ``dataset.time_split=[t_val, t_test]`` by the entries' times, or ``table_train_idx``, ``table_val_idx``,
  ``table_test_idx`` (entry ids).

Read memory-mapped from the folder by each rank (small beside the graph), checked naming the file.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from hpcgnn.checks import gives
from hpcgnn.errors import DatasetError
from hpcgnn.labels import SPLITS, profile, stored

NAMES = ("table_node", "table_time", "table_label")


@dataclass(frozen=True)
class NodeTable:
    node: Tensor  # int64 [R]
    time: Tensor  # [R], the edges' times' dtype
    label: Tensor  # the labels' stored form: int64 [R] or float32 [R(, C)]
    splits: dict  # split name -> int64 entry ids
    labels: dict  # the labels' profile (hpcgnn.labels.profile)

    @property
    def count(self) -> int:
        return int(self.node.numel())

    def split(self, name: str) -> Tensor:
        return torch.arange(self.count) if name == "all" else self.splits[name]


def open_table(dataset, num_nodes: int, time_dtype: torch.dtype) -> NodeTable:
    """The folder's table, checked against the graph (``num_nodes``; its edges' times' dtype)."""
    from hpcgnn.data.files import files_folder, read_array
    from hpcgnn.data.times import _check, kind_of, time_parts

    folder = files_folder(dataset)
    read = {name: read_array(folder, name, mmap=True) for name in NAMES}
    (pn, node), (pt, time), (pl, label) = (read[n] for n in NAMES)
    r = node.shape[0] if node.ndim == 1 else -1
    if node.ndim != 1 or not np.issubdtype(node.dtype, np.integer):
        raise DatasetError(f"{pn}: one node id per entry (integers, shape [R]); got {node.dtype} {tuple(node.shape)}")
    node = np.array(node, dtype=np.int64)  # (copies: small beside the graph, and writable for torch)
    if r and (node.min() < 0 or node.max() >= num_nodes):
        raise DatasetError(f"{pn}: node ids must lie in [0, {num_nodes}) (the rows of x); found {int(node.min())} to "
                           f"{int(node.max())}")
    _check(pt, time, r, "entries of table_node")
    want = torch.empty(0, dtype=time_dtype).numpy().dtype
    if kind_of(pt, time) != want:
        raise DatasetError(f"{pt}: the entries' times are {time.dtype} but the edges' {want}: give both as integers or "
                           "both as floats, in the same unit")
    label = np.array(stored(np.asarray(label), str(pl)))
    if label.shape[0] != r:
        raise DatasetError(f"{pl}: {label.shape[0]} labels for {r} entries of table_node: one row per entry")
    time = np.array(time, dtype=want)
    cut = getattr(dataset, "time_split", None)
    names = [f"table_{s}_idx" for s in SPLITS]
    if cut is not None:
        splits = {s: np.flatnonzero(m) for s, m in zip(SPLITS, time_parts(time, cut), strict=True)}
    elif all(gives(folder, n) for n in names):
        splits = {}
        for s, n in zip(SPLITS, names, strict=True):
            p, ids = read_array(folder, n)
            ids = np.asarray(ids)
            if ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer) or (ids.size and (ids.min() < 0 or
                                                                                         ids.max() >= r)):
                raise DatasetError(f"{p}: entry ids in [0, {r}) (rows of table_node), integers of shape [k]")
            splits[s] = ids.astype(np.int64)
    else:
        raise DatasetError(f"{folder}: a table's entries need a split. HINT: dataset.time_split=[t_val,t_test] (by "
                           f"their times), or {', '.join(names)}")
    return NodeTable(torch.from_numpy(node), torch.from_numpy(time), torch.from_numpy(label),
                     {s: torch.from_numpy(v) for s, v in splits.items()}, profile(label, splits))
