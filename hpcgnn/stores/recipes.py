"""A sampler server's builder of its trainers' samplers: each built as the trainer's rank built its own, through
the same function (a store kind's ``server_side``), from the run's config, the graph the server opens and the
rank's :class:`~hpcgnn.sampling.shipping.SamplerState`."""

from __future__ import annotations

import threading

from hpcgnn.checks import is_graph_set, is_typed
from hpcgnn.config import RunConfig
from hpcgnn.sampling.shipping import Recipe, SamplerState
from hpcgnn.stores.partitioned import PartitionedStore
from hpcgnn.stores.replicated import ReplicatedStore
from hpcgnn.stores.typed import TypedStore


class ServerRecipes:
    """A sampler server's builder of its trainers' samplers (``recipes(state)``): each built from the run's config,
    the graph the server opens (a whole graph once for all its trainers; a rank's parts for that rank), and what
    the rank wrote into its :class:`~hpcgnn.sampling.shipping.SamplerState`, as the rank built its own
    (:meth:`Store.graph_side`): nothing of the trainer's travels as code. Each trainer gets its own sampler (a
    sampler's scratch holds one batch at a time)."""

    def __init__(self, cfg: RunConfig, items):
        self.cfg, self.items = cfg, items  # (items: the task's items' unit, a class: its sampler around their seeds)
        self.lock = threading.Lock()
        self.whole = None  # the graph, opened once (mapped: the node's one copy in the page cache)

    def __getstate__(self) -> dict:  # (pickled to a relay's sampler process: the config and a class by name)
        return {"cfg": self.cfg, "items": self.items}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["cfg"], state["items"])

    def _graph(self):
        from hpcgnn.data import cache_folder, open_graph, open_typed
        from hpcgnn.data.graphs import open_graphs

        with self.lock:
            if self.whole is None:
                d = self.cfg.dataset
                self.whole = (open_graphs(cache_folder(d)) if is_graph_set(d) else
                              open_typed(d) if is_typed(d) else open_graph(d))
            return self.whole

    def __call__(self, state: SamplerState) -> Recipe:
        from hpcgnn.models import batch_transform

        cfg = self.cfg
        kind = {"replicated": "typed" if is_typed(cfg.dataset) else "whole"}.get(cfg.graph.mode, "parts")
        kind = "graphs" if is_graph_set(cfg.dataset) else kind
        if state.kind != kind:
            raise ValueError(f"rank {state.rank} asks for a sampler over a {state.kind} graph; this server's run is "
                             f"graph.mode={cfg.graph.mode} (a {kind} graph)")
        if kind == "graphs":  # (whole graphs of a graph set, assembled as the rank assembles them)
            from hpcgnn.stores.graphs import GraphSetStore

            side, degree = GraphSetStore.server_side(self._graph()), None
        elif kind == "parts":
            side, degree = PartitionedStore.server_side(cfg, state, self.items)
        elif kind == "typed":
            side, degree = TypedStore.server_side(cfg, state, self._graph(), self.items)
        else:
            side, degree = ReplicatedStore.server_side(cfg, state, self._graph(), self.items)
        stats = side.exchange.stats if side.exchange is not None else None
        return Recipe(side.features, side.sampler, batch_transform(cfg.model, degree), stats)
