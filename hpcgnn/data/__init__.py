"""Datasets: each source builds a Graph once; the prepared graph is cached and memory-mapped.

- :func:`build_graph`: the graph from its source, in memory (synthetic, OGB, files);
- :func:`build_link`: a link-prediction dataset (the graph of its training edges, and the edge splits);
- :func:`prepare`: build it into the cache unless it is there (``python -m hpcgnn.data prepare``);
- :func:`open_graph`: memory-map the cached graph; ranks of a node share its pages;
  :func:`open_link`: the same for a link dataset, with its splits.

The files, in the order a graph travels: the sources (``synthetic.py``, ``ogb.py``, ``files.py``, ``pyg.py``;
``typed.py`` and ``link.py`` for typed graphs and edge splits) and their registry (``sources.py``); ``prepared.py``:
the cache key and the preparation, whole or out of core (``ooc.py``) into ``cache.py``'s folder; ``mapped.py``:
the prepared graph memory-mapped; ``graph.py``: the Graph and its shape.

``dataset.prepared_for`` (it follows ``task.name``) says which of the two a config prepares: a
link task's graph holds only the training edges, so it is a graph of its own in the cache.
"""

from hpcgnn.checks import check_dataset_config
from hpcgnn.data.graph import Graph
from hpcgnn.data.link import LinkData
from hpcgnn.data.mapped import open_graph, open_link, open_link_splits, open_typed, typed_shape
from hpcgnn.data.prepared import (
           cache_folder,
           check_available,
           check_target,
           edge_width,
           prepare,
           prepare_mem_bytes,
)
from hpcgnn.data.sources import LINK_LOADERS, LOADERS, TYPED_LOADERS, TYPED_SOURCES, build_graph, build_link
from hpcgnn.data.typed import TypedGraph

__all__ = ["LINK_LOADERS", "LOADERS", "TYPED_LOADERS", "TYPED_SOURCES", "Graph", "LinkData", "TypedGraph", "build_graph",
           "build_link", "cache_folder", "check_available", "check_dataset_config", "check_target", "edge_width", "open_graph",
           "open_link", "open_link_splits", "open_typed", "prepare", "prepare_mem_bytes", "typed_shape"]
