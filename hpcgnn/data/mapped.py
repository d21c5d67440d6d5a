"""A prepared dataset memory-mapped: the ranks of a node share its pages (a graph, a typed graph, a link dataset or its
splits alone).
"""

from __future__ import annotations

from torch import Tensor

import hpcgnn.data.cache as cache
from hpcgnn.config import DatasetConfig
from hpcgnn.data.graph import Graph, Timeline
from hpcgnn.data.link import LinkData, from_arrays
from hpcgnn.data.ogb import (
    DatasetMissing,
    prepare_command,
)
from hpcgnn.data.ooc import rows_as_stored
from hpcgnn.data.prepared import cache_folder
from hpcgnn.data.sources import TYPED_SOURCES
from hpcgnn.data.typed import (
    TIMELINE_ARRAYS,
    TypedGraph,
    TypedSchema,
    expand_relations,
    relation_key,
)


def open_graph(cfg: DatasetConfig) -> Graph:
    """Memory-map the prepared graph; fails if :func:`prepare` has not run."""
    folder = cache_folder(cfg)
    if not cache.is_complete(folder):
        raise DatasetMissing(f"{cfg.name} is not prepared in {folder}. HINT: {prepare_command(cfg)}")
    return cache.load(folder)


def typed_shape(cfg: DatasetConfig) -> tuple[TypedSchema, int, int] | None:
    """A typed dataset's (schema, feature width, classes) where they are known without building the graph: from a
    prepared graph's meta.json, or from a source that tells its sizes before it is read (pyg_hetero builds its
    graph whole: None until it is prepared). What a user's model is checked against at submit."""
    folder = cache_folder(cfg)
    if cache.is_complete(folder):
        meta = cache.GraphMeta.read(folder)
        return TypedSchema.from_meta(meta.more["typed"]), meta.num_features, meta.num_classes
    if cfg.name == "pyg_hetero":
        return None
    src = TYPED_SOURCES[cfg.name](cfg, False)
    return (TypedSchema(src.num_nodes, tuple(expand_relations(src.relations, src.reverse)), src.target,
                        src.edge_dims()), src.num_features, src.num_classes)


def open_typed(cfg: DatasetConfig) -> TypedGraph:
    """Memory-map a prepared typed graph: each type's features and labels are slices of the stored
    homogeneous view (no copy), each relation's CSR its own arrays."""
    h = open_graph(cfg)
    arrays, meta = cache.load_extra(cache_folder(cfg))
    s = TypedSchema.from_meta(meta.more["typed"])
    off = s.offsets()
    t0, n0 = off[s.target], s.num_nodes[s.target]
    return TypedGraph(s.num_nodes, {r: arrays[f"rowptr__{relation_key(r)}"] for r in s.relations},
                      {r: arrays[f"col__{relation_key(r)}"] for r in s.relations},
                      {k: h.x[off[k]:off[k] + n] for k, n in s.num_nodes.items()}, s.target, h.y[t0:t0 + n0],
                      h.train_idx - t0, h.val_idx - t0, h.test_idx - t0, h.num_classes, meta.more["typed"]["feature_rule"],
                      h.labels, _typed_edge_attr(arrays, s, meta.feature_dtype), *_typed_times(arrays, s, meta.more["typed"]))


def _typed_times(arrays: dict, schema: TypedSchema, typed: dict) -> tuple[dict | None, Tensor | None]:
    """Each relation's timeline and the target type's seed times, where the graph's edges have times."""
    if "times" not in typed:
        return None, None
    timelines = {r: Timeline(*(arrays[f"{name}__{relation_key(r)}"] for name in TIMELINE_ARRAYS[:3]), None,
                             arrays[f"time_given__{relation_key(r)}"]) for r in schema.relations}
    return timelines, arrays.get("seed_time") if typed["times"]["seed_time"] else None


def _typed_edge_attr(arrays: dict, schema: TypedSchema, feature_dtype: str) -> dict | None:
    """Each relation's edge features where it has some, in the stored feature dtype (bfloat16 from its bits)."""
    out = {}
    for rel in schema.relations:
        if schema.edge_dim(rel):
            rows = arrays[f"edge_attr__{relation_key(rel)}"]
            out[rel] = rows_as_stored(rows, feature_dtype)
    return out or None


def open_link(cfg: DatasetConfig) -> LinkData:
    """Memory-map a prepared link dataset: the graph of its training edges and its splits."""
    graph = open_graph(cfg)
    arrays, meta = cache.load_extra(cache_folder(cfg))
    return from_arrays(graph, arrays, meta)


def open_link_splits(cfg: DatasetConfig) -> LinkData:
    """A prepared link dataset's splits alone (``graph`` is None): what a rank of a partitioned graph reads."""
    folder = cache_folder(cfg)
    if not cache.is_complete(folder):
        raise DatasetMissing(f"{cfg.name} is not prepared in {folder}. HINT: {prepare_command(cfg)}")
    arrays, meta = cache.load_extra(folder)
    return from_arrays(None, arrays, meta)

