"""What a rank trains on, behind one contract (:mod:`hpcgnn.stores.base`): the whole graph (replicated),
a typed graph (whole), or the rank's own parts (partitioned); exact inference beside them (exact.py); the training
samplers of a whole graph (samplers.py); a sampler server's builder of its trainers' samplers (recipes.py)."""

from __future__ import annotations

import torch

from hpcgnn.checks import is_graph_set, is_typed
from hpcgnn.config import RunConfig
from hpcgnn.data.graph import GraphShape
from hpcgnn.env import RankEnv
from hpcgnn.stores.base import Store
from hpcgnn.stores.exact import Exact
from hpcgnn.stores.partitioned import PartitionedStore
from hpcgnn.stores.recipes import ServerRecipes
from hpcgnn.stores.replicated import ReplicatedStore
from hpcgnn.stores.typed import TypedStore

__all__ = ["Exact", "GraphShape", "PartitionedStore", "ReplicatedStore", "ServerRecipes", "Store", "TypedStore",
           "open_store"]


def open_store(cfg: RunConfig, env: RankEnv, device: torch.device | None, items) -> Store:
    """The store of ``cfg``'s graph mode (parts when partitioned, else the whole graph, typed or not), with the task's
    items over it (``items``: their unit, :func:`hpcgnn.tasks.task_items`; :func:`hpcgnn.tasks.open_store` passes
    the run's)."""
    if is_graph_set(cfg.dataset):  # (many graphs: mapped whole, graph.mode aside; hpcgnn.checks.check_graph)
        from hpcgnn.stores.graphs import GraphSetStore

        return GraphSetStore(cfg, env, device, items)
    if cfg.graph.mode == "partitioned":
        return PartitionedStore(cfg, env, device, items)
    return (TypedStore if is_typed(cfg.dataset) else ReplicatedStore)(cfg, env, device, items)
