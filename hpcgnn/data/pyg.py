"""A graph a user already has in PyG (``dataset=pyg dataset._target_=...``): a ``torch_geometric.datasets`` class,
or any callable returning a ``Data`` (or a dataset of one), prepared once into hpcgnn's memory-mapped format.

- ``dataset._target_``: the class or function, ``pkg.module.Name``; ``dataset.kwargs``: its keyword arguments.
  A class that takes ``root`` and is not given one gets ``<dataset.root>/pyg/<Name>`` (where PyG's datasets keep
  their raw and processed files). Built under ``torch.manual_seed(dataset.seed)``, so a generated graph
  (``FakeDataset``) is the same every time it is prepared.
- A dataset of several graphs serves its first (node tasks train on one graph).
- Splits: the graph's ``train_mask``/``val_mask``/``test_mask`` where it has them (a mask with one column per
  split, as WikiCS has: column ``dataset.split_index``), else a seeded split of the nodes by
  ``dataset.train_fraction`` and ``dataset.val_fraction`` (the rest is test).
- Labels: ``y``, one class per node (``y`` of shape [N] or [N, 1]); ``x``: the features (none: a constant 1).

The prepared graph's key covers the target, its arguments, the split settings and the seed: change any and it
is prepared again. The graph then serves every mode (replicated, partitioned, sampler processes and servers).
"""

from __future__ import annotations

import contextlib

import torch

from hpcgnn.checks import locate
from hpcgnn.config import DatasetConfig
from hpcgnn.data.graph import Graph
from hpcgnn.errors import DatasetError
from hpcgnn.rng import rng_state, set_rng_state


def target_object(cfg: DatasetConfig):
    """What ``dataset._target_`` names (refused, naming the fix, when it cannot be imported)."""
    obj, why = locate(cfg._target_)
    if obj is None or not callable(obj):
        raise DatasetError(f"dataset._target_={cfg._target_} cannot be imported{why}. HINT: name a class or function "
                           "as package.module.Name, e.g. torch_geometric.datasets.FakeDataset; the job imports it "
                           "too (install it in the job's environment, or put it on PYTHONPATH)")
    return obj


@contextlib.contextmanager
def _seeded(seed: int):
    """torch's, numpy's and Python's generators seeded (a generated graph is the same each time it is made), and
    put back after (:func:`hpcgnn.rng.rng_state`)."""
    import random

    import numpy as np

    state = rng_state()
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)
    try:
        yield
    finally:
        set_rng_state(state)


def pyg_data(cfg: DatasetConfig, allow_download: bool = False):
    """The ``Data`` the target makes (the first graph of a dataset)."""
    import inspect

    from torch_geometric.data import Data, HeteroData

    obj = target_object(cfg)
    kwargs = dict(cfg.kwargs)
    try:
        takes = inspect.signature(obj).parameters
    except (TypeError, ValueError):
        takes = {}
    if "root" in takes and "root" not in kwargs:
        from pathlib import Path

        kwargs["root"] = str(Path(cfg.root).expanduser() / "pyg" / cfg._target_.rpartition(".")[2])
    with _seeded(cfg.seed):
        try:
            made = obj(**kwargs)
        except Exception as exc:
            raise DatasetError(f"dataset._target_={cfg._target_}({', '.join(f'{k}={v!r}' for k, v in kwargs.items())}) "
                               f"failed: {type(exc).__name__}: {exc}. HINT: its arguments go in dataset.kwargs "
                               "('+dataset.kwargs.NAME=VALUE'); a dataset that downloads must find its files under "
                               "root (prepare it once where there is internet)") from None
    data = made if isinstance(made, (Data, HeteroData)) else (made[0] if len(made) else None)
    if isinstance(data, HeteroData):
        raise DatasetError(f"dataset._target_={cfg._target_} gives a HeteroData: typed PyG graphs are not read yet. "
                           "HINT: export it as a typed files folder (docs/datasets.md), or use its homogeneous view "
                           "(HeteroData.to_homogeneous) in a function of your own")
    if not isinstance(data, Data):
        raise DatasetError(f"dataset._target_={cfg._target_} gave {type(made).__name__}, not a torch_geometric Data "
                           "or a dataset of them")
    return data


def _labels(cfg: DatasetConfig, data) -> tuple[torch.Tensor, int]:
    y = getattr(data, "y", None)
    if y is None:
        raise DatasetError(f"dataset._target_={cfg._target_}: its graph has no labels (y): node classification needs "
                           "them. HINT: task=link trains on the edges alone")
    if y.dim() == 2 and y.size(1) == 1:
        y = y.view(-1)
    if y.dim() != 1 or y.size(0) != data.num_nodes or y.is_floating_point():
        raise DatasetError(f"dataset._target_={cfg._target_}: y has shape {tuple(y.shape)} ({y.dtype}); hpcgnn's node "
                           f"task takes one class per node (integers, shape [{data.num_nodes}])")
    return y.long(), int(y.max()) + 1 if y.numel() else 0


def _splits(cfg: DatasetConfig, data, n: int) -> list[torch.Tensor]:
    masks = [getattr(data, f"{s}_mask", None) for s in ("train", "val", "test")]
    if all(m is not None for m in masks):
        picked = []
        for m in masks:
            if m.dim() == 2:
                if not 0 <= cfg.split_index < m.size(1):
                    raise DatasetError(f"dataset.split_index={cfg.split_index}: the graph's masks hold {m.size(1)} "
                                       f"splits (0..{m.size(1) - 1})")
                m = m[:, cfg.split_index]
            picked.append(m.nonzero().view(-1))
        return picked
    order = torch.randperm(n, generator=torch.Generator().manual_seed(cfg.seed))
    a, b = int(cfg.train_fraction * n), int((cfg.train_fraction + cfg.val_fraction) * n)
    return [order[:a].sort().values, order[a:b].sort().values, order[b:].sort().values]


def load_pyg(cfg: DatasetConfig, allow_download: bool = False) -> Graph:
    """The target's graph as hpcgnn's :class:`Graph` (in memory; prepared into the cache by the caller)."""
    data = pyg_data(cfg, allow_download)
    n = data.num_nodes
    x = data.x if getattr(data, "x", None) is not None else torch.ones(n, 1)
    if cfg.prepared_for == "link":
        y, classes = torch.zeros(n, dtype=torch.long), 1
    else:
        y, classes = _labels(cfg, data)
    edge_index = data.edge_index
    if cfg.to_undirected:
        edge_index = torch.cat([edge_index, edge_index.flip(0)], dim=1)
    train, val, test = _splits(cfg, data, n)
    return Graph.from_edge_index(edge_index, n, x.float(), y, train, val, test, num_classes=classes)
