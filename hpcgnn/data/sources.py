"""Where graphs come from: each dataset name's builders, as its spec names them (:mod:`hpcgnn.specs.datasets`: synthetic,
OGB, files, PyG; typed and link variants), and the graph built whole in memory.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from hpcgnn.checks import check_dataset_config
from hpcgnn.config import DatasetConfig
from hpcgnn.data.graph import Graph
from hpcgnn.data.link import LinkData, split_edges, time_split_edges
from hpcgnn.data.typed import TypedGraph, TypedSource
from hpcgnn.specs import datasets


def _builder(path: str) -> Callable:
    """The function a spec names, ``"module:function"``."""
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def _view(build_typed: Callable[[DatasetConfig, bool], TypedGraph]) -> Callable[[DatasetConfig, bool], Graph]:
    """A typed source's homogeneous view (dataset.erase_types=true)."""
    return lambda cfg, allow_download: build_typed(cfg, allow_download).homogeneous()


def _split(build: Callable[[DatasetConfig, bool], Graph]) -> Callable[[DatasetConfig, bool], LinkData]:
    """A link dataset from a graph source: a seeded split of its edges (``dataset.edge_split``); a graph whose edges
    have times, a chronological one (:func:`time_split_edges`: each link predicted as of its time)."""
    def split(cfg: DatasetConfig, allow_download: bool) -> LinkData:
        graph = build(cfg, allow_download)
        if graph.timeline is not None:
            return time_split_edges(graph, tuple(cfg.edge_split), getattr(cfg, "time_split", None),
                                    f"dataset={cfg.name}")
        return split_edges(graph, tuple(cfg.edge_split), cfg.seed)
    return split


_SPECS = datasets.SPECS.values()

# name -> builder(cfg, allow_download), each from its spec (hpcgnn.specs.datasets): the graph (a typed one's view) ...
LOADERS: dict[str, Callable[[DatasetConfig, bool], Graph]] = {
    s.name: _builder(s.graph) if s.graph else _view(_builder(s.typed_graph)) for s in _SPECS if "node" in s.tasks}
# ... the typed graph ...
TYPED_LOADERS: dict[str, Callable[[DatasetConfig, bool], TypedGraph]] = {
    s.name: _builder(s.typed_graph) for s in _SPECS if s.typed}
# ... the typed source as prepare streams it (types erased or not: the view comes from the same stream) ...
TYPED_SOURCES: dict[str, Callable[[DatasetConfig, bool], TypedSource]] = {
    s.name: _builder(s.typed_source) for s in _SPECS if s.typed}
# ... and the link dataset: its official split, or its graph's edges split here.
LINK_LOADERS: dict[str, Callable[[DatasetConfig, bool], LinkData]] = {
    s.name: _split(_builder(s.graph)) if s.split_edges else _builder(s.link) for s in _SPECS if "link" in s.tasks}


def build_graph(cfg: DatasetConfig, allow_download: bool = False) -> Graph:
    """The graph from its source, in memory, without touching the cache."""
    check_dataset_config(cfg)
    return LOADERS[cfg.name](cfg, allow_download)


def build_link(cfg: DatasetConfig, allow_download: bool = False) -> LinkData:
    """The link dataset from its source, in memory, without touching the cache."""
    check_dataset_config(cfg)
    return LINK_LOADERS[cfg.name](cfg, allow_download)
