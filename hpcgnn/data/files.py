"""A user's own graph from a folder of .npy / .pt files, checked before any training.

Expected files (``.npy``, or ``.pt`` tensors read with ``weights_only=True``):
``edge_index`` [2, E] int (source, target), ``x`` [N, F] float, ``y`` [N] int
(-1 for unlabeled nodes), ``train_idx``, ``val_idx``, ``test_idx`` [k] int.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from hpcgnn.config import DatasetConfig
from hpcgnn.data.graph import Graph
from hpcgnn.errors import ConfigError, DatasetError

FILES = ("edge_index", "x", "y", "train_idx", "val_idx", "test_idx")


class DatasetFileError(DatasetError):
    """A dataset file is missing or wrong; the message names the file."""


def _read(folder: Path, name: str) -> tuple[Path, np.ndarray]:
    for suffix in (".npy", ".pt"):
        path = folder / f"{name}{suffix}"
        if path.is_file():
            try:
                if suffix == ".npy":
                    return path, np.load(path, allow_pickle=False)
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


def load_files(cfg: DatasetConfig, allow_download: bool = False) -> Graph:
    folder = files_folder(cfg)
    arrays = {name: _read(folder, name) for name in FILES}

    px, x = arrays["x"]
    if x.ndim != 2 or not np.issubdtype(x.dtype, np.floating):
        raise DatasetFileError(f"{px}: features must be a float array of shape [num_nodes, num_features], "
                               f"got {x.dtype} {tuple(x.shape)}")
    bad = ~np.isfinite(x).all(axis=1)
    if bad.any():
        raise DatasetFileError(f"{px}: features contain NaN or inf ({int(bad.sum())} nodes, first node "
                               f"{int(np.argmax(bad))})")
    n = x.shape[0]

    pe, ei = arrays["edge_index"]
    if ei.ndim != 2 or ei.shape[0] != 2 or not np.issubdtype(ei.dtype, np.integer):
        raise DatasetFileError(f"{pe}: edge_index must be an integer array of shape [2, num_edges], "
                               f"got {ei.dtype} {tuple(ei.shape)}")
    if ei.size and (ei.min() < 0 or ei.max() >= n):
        raise DatasetFileError(f"{pe}: node ids must lie in [0, {n}) ({n} = rows of {px.name}); found "
                               f"min {int(ei.min())}, max {int(ei.max())}")

    py, y = arrays["y"]
    if y.shape != (n,) or not np.issubdtype(y.dtype, np.integer):
        raise DatasetFileError(f"{py}: labels must be an integer array of shape [{n}], got {y.dtype} {tuple(y.shape)}")
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
        if (y[idx] < 0).any():
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

    edge_index = torch.from_numpy(ei.astype(np.int64))
    if cfg.to_undirected:
        edge_index = torch.cat([edge_index, edge_index.flip(0)], dim=1)
    return Graph.from_edge_index(edge_index, n, torch.from_numpy(x.astype(np.float32)), torch.from_numpy(y.astype(np.int64)),
                                 *(torch.from_numpy(splits[k][1].astype(np.int64)) for k in names),
                                 num_classes=int(y.max()) + 1)
