"""Every dataset hpcgnn serves, declared once (:data:`SPECS`): its name, the tasks it serves, where its graph comes
from (its builders, by dotted name, imported when first used), the ``dataset.*`` fields in its prepared graph's
cache key, how it is prepared, and what must exist before a job reads it.

Who reads it: :mod:`hpcgnn.checks` (the names a config may use, per task), :mod:`hpcgnn.data.sources` (the
builders), :mod:`hpcgnn.data.prepared` (the cache key; streamed or built whole), the submit-time check of what
must be on disk (:mod:`hpcgnn.submit.launch`). Each spec has its defaults in ``conf/dataset/<name>.yaml`` and is
named in docs/datasets.md: ``tests/test_dataset_specs.py`` fails when either is missing, or when a yaml names no spec.

Adding a dataset: one :class:`DatasetSpec` here, its builders (``fn(cfg, allow_download)``: a Graph, a TypedGraph,
a TypedSource, a LinkData) in :mod:`hpcgnn.data`, its yaml and its line in docs/datasets.md. Torch-free: the checks import this module.
"""

from __future__ import annotations

from dataclasses import dataclass

_SYNTHETIC_KEY = ("num_nodes", "num_classes", "num_features", "avg_degree", "degree_exponent",
                  "communities_per_class", "homophily", "locality", "feature_noise", "centroids", "train_fraction",
                  "val_fraction", "seed")
_EDGES = "hpcgnn.data.edges"
_PYG_KEY = ("_target_", "kwargs", "train_fraction", "val_fraction", "split_index", "seed", "to_undirected")


@dataclass(frozen=True)
class DatasetSpec:
    """One dataset: what the code that checks, builds and caches it needs to know, in one place."""

    name: str
    tasks: tuple[str, ...]  # the tasks it serves: "node", "link"
    source: str  # the family its builders come from: "synthetic", "ogb", "files", "pyg"
    key: tuple[str, ...]  # dataset.* fields in its prepared graph's cache key (hpcgnn.data.prepared.cache_folder)
    graph: str | None = None  # builder of the homogeneous graph, "module:function" (None: a typed one's view)
    typed_graph: str | None = None  # builder of the typed graph (None: never typed)
    typed_source: str | None = None  # the typed graph as preparing it streams it
    link: str | None = None  # builder of the link dataset with its own official split
    split_edges: bool = False  # task=link: hpcgnn splits its edges itself (dataset.edge_split, in the key)
    streamed: bool = False  # prepared a chunk at a time, never whole in memory (a typed graph: always)
    on_disk: bool = False  # read from files that must be there before a job starts (synthetic ones are made)
    needs_target: bool = False  # dataset._target_ names the class or function that makes it (PyG's)
    edge_features: bool = False  # its edges carry features (dataset.node_features_from_edges may average them)
    node_features: bool = True  # its nodes carry features of their own (else node_features_from_edges must make them)
    edge_targets: str | None = None  # task=edge: builder of the targets on its edges, "module:function" (None: none)
    typed_edge_targets: str | None = None  # ... on a relation of its typed graph

    @property
    def typed(self) -> bool:
        """Whether it can be a typed graph (``files``: when its folder is laid out by type)."""
        return self.typed_graph is not None


_OGB_NODE = tuple(DatasetSpec(name, ("node",), "ogb", ("to_undirected",), graph="hpcgnn.data.ogb:load_ogb",
                              streamed=True, on_disk=True)
                  for name in ("ogbn-arxiv", "ogbn-products", "ogbn-papers100M"))
_OGB_PROTEINS = DatasetSpec("ogbn-proteins", ("node",), "ogb", ("to_undirected", "node_features_from_edges"),
                            graph="hpcgnn.data.ogb:load_ogb", streamed=True, on_disk=True, edge_features=True,
                            node_features=False)
_OGB_LINK = tuple(DatasetSpec(name, ("link",), "ogb", ("to_undirected",), link="hpcgnn.data.ogb:load_ogb_link",
                              streamed=True, on_disk=True)
                  for name in ("ogbl-collab", "ogbl-citation2"))

SPECS: dict[str, DatasetSpec] = {s.name: s for s in (
    DatasetSpec("synthetic", ("node", "link"), "synthetic", _SYNTHETIC_KEY, graph="hpcgnn.data.synthetic:make_synthetic",
                split_edges=True, streamed=True, edge_targets=f"{_EDGES}:synthetic_targets"),
    DatasetSpec("files", ("node", "link"), "files", ("path", "to_undirected"), graph="hpcgnn.data.files:load_files",
                typed_graph="hpcgnn.data.files:load_typed_files", typed_source="hpcgnn.data.files:typed_files_source",
                split_edges=True, on_disk=True, edge_targets=f"{_EDGES}:files_targets",
                typed_edge_targets=f"{_EDGES}:typed_files_targets"),
    DatasetSpec("pyg", ("node", "link"), "pyg", _PYG_KEY, graph="hpcgnn.data.pyg:load_pyg", split_edges=True,
                needs_target=True, edge_targets=f"{_EDGES}:pyg_targets"),
    *_OGB_NODE,
    _OGB_PROTEINS,
    *_OGB_LINK,
    DatasetSpec("synthetic_hetero", ("node",), "synthetic",
                ("num_nodes", "num_classes", "num_features", "avg_degree", "communities_per_class", "homophily",
                 "feature_noise", "train_fraction", "val_fraction", "seed", "erase_types"),
                typed_graph="hpcgnn.data.synthetic:make_synthetic_typed", typed_source="hpcgnn.data.synthetic:synthetic_typed_source"),
    DatasetSpec("ogbn-mag", ("node",), "ogb", ("erase_types",), typed_graph="hpcgnn.data.ogb:load_ogb_typed",
                typed_source="hpcgnn.data.ogb:ogb_typed_source", on_disk=True),
    DatasetSpec("pyg_hetero", ("node",), "pyg", (*_PYG_KEY, "target_type", "erase_types"),
                typed_graph="hpcgnn.data.pyg:load_pyg_typed", typed_source="hpcgnn.data.pyg:pyg_typed_source",
                needs_target=True, typed_edge_targets=f"{_EDGES}:typed_pyg_targets"),
)}


def spec(name: str) -> DatasetSpec:
    """The dataset ``name``'s spec (KeyError: no such dataset; :func:`hpcgnn.checks.check_dataset_config` names
    the known ones first)."""
    return SPECS[name]


def names(*, task: str | None = None, source: str | None = None, typed: bool | None = None,
          **flags: bool) -> tuple[str, ...]:
    """The names of the specs that serve ``task``, come from ``source``, are (not) ``typed``, and whose other
    fields equal ``flags`` (e.g. ``on_disk=True``), in declaration order."""
    return tuple(s.name for s in SPECS.values()
                 if (task is None or task in s.tasks) and (source is None or s.source == source)
                 and (typed is None or s.typed == typed) and all(getattr(s, k) == v for k, v in flags.items()))


def with_edge_targets() -> tuple[str, ...]:
    """The datasets whose edges can carry an edge task's targets (on the graph, or on a relation of the typed one)."""
    return tuple(s.name for s in SPECS.values() if s.edge_targets or s.typed_edge_targets)
