"""Where graphs come from: each dataset name's builder (synthetic, OGB, files, PyG; typed and link variants), and the
graph built whole in memory.
"""

from __future__ import annotations

from collections.abc import Callable

from hpcgnn.checks import check_dataset_config
from hpcgnn.config import DatasetConfig
from hpcgnn.data.files import (
    load_files,
    load_typed_files,
    typed_files_source,
)
from hpcgnn.data.graph import Graph
from hpcgnn.data.link import LinkData, split_edges
from hpcgnn.data.ogb import LINK_NAMES as OGB_LINK_NAMES
from hpcgnn.data.ogb import NAMES as OGB_NAMES
from hpcgnn.data.ogb import (
    load_ogb,
    load_ogb_link,
    load_ogb_typed,
    ogb_typed_source,
)
from hpcgnn.data.pyg import load_pyg, load_pyg_typed, pyg_typed_source
from hpcgnn.data.synthetic import (
    make_synthetic,
    make_synthetic_typed,
    synthetic_typed_source,
)
from hpcgnn.data.typed import (
    TypedGraph,
    TypedSource,
)

# name -> builder(cfg, allow_download)
LOADERS: dict[str, Callable[[DatasetConfig, bool], Graph]] = {
    "synthetic": lambda cfg, allow_download: make_synthetic(cfg),
    "files": load_files,
    "pyg": load_pyg,
    **{name: load_ogb for name in OGB_NAMES},
    # typed sources with dataset.erase_types=true: the homogeneous view
    "synthetic_hetero": lambda cfg, allow_download: make_synthetic_typed(cfg).homogeneous(),
    "ogbn-mag": lambda cfg, allow_download: load_ogb_typed(cfg, allow_download).homogeneous(),
    "pyg_hetero": lambda cfg, allow_download: load_pyg_typed(cfg, allow_download).homogeneous(),
}


# name -> typed-graph builder(cfg, allow_download)
TYPED_LOADERS: dict[str, Callable[[DatasetConfig, bool], TypedGraph]] = {
    "synthetic_hetero": lambda cfg, allow_download: make_synthetic_typed(cfg),
    "ogbn-mag": load_ogb_typed,
    "files": load_typed_files,  # a folder laid out with nodes/ and edges/
    "pyg_hetero": load_pyg_typed,  # a PyG HeteroData (dataset._target_)
}


# name -> the typed source as prepare streams it (types erased or not: the view comes from the same stream)
TYPED_SOURCES: dict[str, Callable[[DatasetConfig, bool], TypedSource]] = {
    "synthetic_hetero": lambda cfg, allow_download: synthetic_typed_source(cfg),
    "ogbn-mag": ogb_typed_source,
    "files": lambda cfg, allow_download: typed_files_source(cfg),
    "pyg_hetero": pyg_typed_source,
}


def _split(build: Callable[[DatasetConfig, bool], Graph]) -> Callable[[DatasetConfig, bool], LinkData]:
    """A link dataset from a graph source: a seeded split of its edges (``dataset.edge_split``)."""
    return lambda cfg, allow_download: split_edges(build(cfg, allow_download), tuple(cfg.edge_split), cfg.seed)


# name -> link-dataset builder(cfg, allow_download)
LINK_LOADERS: dict[str, Callable[[DatasetConfig, bool], LinkData]] = {
    "synthetic": _split(LOADERS["synthetic"]),
    "files": _split(load_files),
    "pyg": _split(load_pyg),
    **{name: load_ogb_link for name in OGB_LINK_NAMES},
}


def build_graph(cfg: DatasetConfig, allow_download: bool = False) -> Graph:
    """The graph from its source, in memory, without touching the cache."""
    check_dataset_config(cfg)
    return LOADERS[cfg.name](cfg, allow_download)


def build_link(cfg: DatasetConfig, allow_download: bool = False) -> LinkData:
    """The link dataset from its source, in memory, without touching the cache."""
    check_dataset_config(cfg)
    return LINK_LOADERS[cfg.name](cfg, allow_download)
