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

from dataclasses import dataclass, field
from typing import Any, Literal

from hpcgnn.errors import ConfigError

_SYNTHETIC_KEY = ("num_nodes", "num_classes", "num_features", "avg_degree", "degree_exponent",
                  "communities_per_class", "homophily", "locality", "feature_noise", "centroids", "train_fraction",
                  "val_fraction", "seed")
_EDGES = "hpcgnn.data.edges"
_GRAPHS = "hpcgnn.data.graphs"
_PYG_KEY = ("_target_", "kwargs", "train_fraction", "val_fraction", "split_index", "seed", "to_undirected")


@dataclass(frozen=True)
class DatasetSpec:
    """One dataset: what the code that checks, builds and caches it needs to know, in one place."""

    name: str
    tasks: tuple[str, ...]  # the tasks it serves: "node", "link"
    source: str  # the family its builders come from, and its settings' class: one of SOURCES
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
    graphs: str | None = None  # task=graph: its writer of many graphs, "module:function" (cfg, tmp, source,
    # allow_download) into a prepared graph set (hpcgnn.data.graphs; None: it is one graph)

    @property
    def user_folder(self) -> bool:
        """Read from a folder of the user's files (``dataset.path``: ``files``, ``graph_files``)."""
        return "path" in self.key

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
    # datasets of many graphs (task=graph): prepared into one graph set (hpcgnn.data.graphs)
    DatasetSpec("synthetic_graphs", ("graph",), "synthetic_graphs", ("num_graphs", "avg_nodes", "num_classes",
                "label_kind", "train_fraction", "val_fraction", "seed"), graphs=f"{_GRAPHS}:synthetic_molecules",
                streamed=True),
    DatasetSpec("graph_files", ("graph",), "graph_files", ("path", "train_fraction", "val_fraction", "seed"),
                graphs=f"{_GRAPHS}:files_graphs", on_disk=True),
    DatasetSpec("pyg_graphs", ("graph",), "pyg_graphs", ("_target_", "kwargs", "train_fraction", "val_fraction", "seed"),
                graphs=f"{_GRAPHS}:pyg_graphs", needs_target=True),
    *(DatasetSpec(name, ("graph",), "ogbg", (), graphs=f"{_GRAPHS}:ogb_graphs", streamed=True, on_disk=True)
      for name in ("ogbg-molhiv", "ogbg-molpcba", "ogbg-ppa")),
    DatasetSpec("pcqm4mv2", ("graph",), "ogbg", (), graphs=f"{_GRAPHS}:pcqm4mv2", streamed=True, on_disk=True),
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


# ---------------------------------------------------------------- each source's settings (conf/dataset/<name>.yaml)
# A dataset's settings are its source's class (DatasetSpec.source: SOURCES), the schema of its yaml
# (base_dataset_<source>); a field's choices are its Literal's. hpcgnn.config builds and checks them.


def single_class(where: str) -> str:
    """Why node classification with one class is refused (every prediction is right: accuracy 1.0, whatever the
    model learned)."""
    return (f"{where}: node classification with a single class predicts it for every node, and scores accuracy "
            "1.0 whatever the model learned. HINT: give the labels two classes or more (dataset.num_classes), or "
            "train task=link")


def empty_validation(what: str) -> str:
    """Why a run without validation nodes is refused (unless it reports its last epoch)."""
    return (f"{what}: no epoch can be chosen by a validation metric. HINT: give the dataset a validation split, or "
            "set train.select=last to report the last epoch's metrics")


@dataclass(frozen=True)
class DatasetConfig:
    """What every dataset's settings hold, whatever its source (``dataset=NAME`` picks the group's option, and with
    it its source's class)."""

    name: str = "synthetic"  # one of SPECS: synthetic, ogbn-arxiv, files, pyg, ... (docs/datasets.md)
    root: str = "~/.cache/hpcgnn"  # downloads (ogb/) and prepared, memory-mappable graphs (prepared/)
    to_undirected: bool = False  # add the reverse of every edge (customary for ogbn-arxiv)
    seed: int = 0  # seed of the generator and of the splits hpcgnn makes
    prepared_for: str = "node"  # node | link | edge | graph: what the prepared graph serves (follows task.name; not set by hand)
    feature_dtype: Literal["float32", "float16", "bfloat16"] = "float32"  # how features are stored (half the bytes);
    # batches are upcast to float32
    prepare_mem_gb: float | None = None  # memory preparing may use (edges are sorted on disk in buckets of this
    # size); None = a quarter of what is free, at most 0.25
    trust_root: bool = False  # a dataset.root other users may write (a lab's shared folder): read it anyway (its pyg/
    # processed files are unpickled, its prepared graphs trained on)
    erase_types: bool = False  # typed datasets (synthetic_hetero, ogbn-mag, typed files, pyg_hetero): serve the
    # homogeneous view, types erased (a baseline)

    @classmethod
    def variant(cls, name: str | None) -> type | None:
        """The settings class of dataset ``name``: its source's (None: no such dataset)."""
        return SOURCES[SPECS[name].source] if name in SPECS else None

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(SPECS)

    @classmethod
    def schemas(cls) -> dict[str, type]:
        """The group's schemas (``base_dataset_<source>``, which conf/dataset/<name>.yaml names in its defaults)."""
        return dict(SOURCES)

    def check(self, task: str, select: str) -> None:
        """Its values, and what the task (and ``train.select``) asks of its splits and classes."""
        if self.prepared_for != task:
            raise ConfigError(f"dataset.prepared_for={self.prepared_for} follows task.name={task}: leave it unset")
        if self.prepare_mem_gb is not None and self.prepare_mem_gb <= 0:
            raise ConfigError(f"dataset.prepare_mem_gb={self.prepare_mem_gb} must be above 0 (or null: a quarter "
                              "of the free memory, at most 0.25 GB)")


@dataclass(frozen=True)
class EdgeSplitConfig(DatasetConfig):
    """A source whose edges hpcgnn splits itself for task=link (and an edge task's targets without splits)."""

    edge_split: tuple[float, ...] = (0.85, 0.05, 0.1)  # task=link (and task=edge's targets): train/val/test
    # fractions of the edges

    def check(self, task: str, select: str) -> None:
        super().check(task, select)
        check_fractions(self.edge_split)


def check_fractions(f: tuple[float, ...]) -> None:
    """``dataset.edge_split``: three fractions above 0 that sum to 1."""
    if len(f) != 3 or any(not x > 0 for x in f) or abs(sum(f) - 1) > 1e-6:
        raise ConfigError(f"dataset.edge_split={list(f)} must be three fractions (train, val, test) above 0 "
                          "that sum to 1 (the training edges carry the messages and are the training positives), "
                          "e.g. dataset.edge_split=[0.85,0.05,0.1]")


@dataclass(frozen=True)
class NodeSplitConfig(EdgeSplitConfig):
    """A source whose nodes hpcgnn splits itself where the graph gives no split."""

    train_fraction: float = 0.3  # fraction of nodes in the training split
    val_fraction: float = 0.1  # fraction of nodes in the validation split (the rest is test)

    def check(self, task: str, select: str) -> None:
        super().check(task, select)
        check_split_fractions(self.train_fraction, self.val_fraction)


def check_split_fractions(train: float, val: float) -> None:
    """``dataset.train_fraction`` and ``val_fraction`` (of nodes, or of graphs): the rest is the test split."""
    if train <= 0 or val < 0 or train + val >= 1:
        raise ConfigError(f"dataset.train_fraction={train} and dataset.val_fraction={val} must be positive and sum to "
                          "less than 1 (the rest is the test split)")


@dataclass(frozen=True)
class SyntheticConfig(NodeSplitConfig):
    """dataset=synthetic, synthetic_hetero: a seeded graph with communities, homophilous edges and noisy
    class-correlated features."""

    num_nodes: int = 100_000  # nodes in the graph
    num_classes: int = 8  # label classes
    num_features: int = 32  # feature dimensions
    avg_degree: float = 12.0  # mean undirected degree
    degree_exponent: float = 0.0  # 0 = moderate log-normal tail; >2 = power-law exponent (hubs)
    communities_per_class: int = 4  # communities (dense clusters) per class
    homophily: float = 0.5  # fraction of edges drawn inside the source's community
    locality: float = 0.8  # fraction of the other edges kept in the source's region (0 = any node)
    feature_noise: float = 3.0  # noise std relative to the unit class signal
    centroids: Literal["class", "community"] = "class"  # features around a centroid per class or per community

    def check(self, task: str, select: str) -> None:
        super().check(task, select)
        if self.num_nodes < 1 or self.num_classes < 1:
            raise ConfigError(f"dataset.num_nodes={self.num_nodes} and dataset.num_classes={self.num_classes} must "
                              "be at least 1")
        if self.num_classes == 1 and task == "node":
            raise ConfigError(single_class("dataset.num_classes=1"))
        if self.degree_exponent != 0 and self.degree_exponent <= 2:
            raise ConfigError(f"dataset.degree_exponent={self.degree_exponent} must be 0 (log-normal tail) or above "
                              "2 (a power law with a finite mean degree), e.g. 2.5")
        for key, value in (("dataset.homophily", self.homophily), ("dataset.locality", self.locality)):
            if not 0 <= value <= 1:
                raise ConfigError(f"{key}={value} must be in [0, 1]")
        if self.name == "synthetic" and task == "node":
            self._check_splits(select)

    def _check_splits(self, select: str) -> None:
        """The node splits (``int(fraction x num_nodes)`` nodes each, the rest test) all hold a node."""
        def fewest(n: int) -> int:
            n_train, n_val = int(self.train_fraction * n), int(self.val_fraction * n)
            return min(n_train, n_val if self.val_fraction > 0 else 1, n - n_train - n_val)

        n = self.num_nodes
        n_train, n_val = int(self.train_fraction * n), int(self.val_fraction * n)
        if self.val_fraction == 0 and select == "val":
            raise ConfigError(empty_validation(f"dataset.val_fraction=0 leaves the validation split of dataset "
                                               f"{self.name} empty"))
        if fewest(n) < 1:
            need = n + 1
            while fewest(need) < 1:
                need += 1
            raise ConfigError(f"dataset.num_nodes={n} leaves a split without nodes ({n_train} train, {n_val} "
                              f"validation, {n - n_train - n_val} test with dataset.train_fraction="
                              f"{self.train_fraction} and dataset.val_fraction={self.val_fraction}). HINT: "
                              f"dataset.num_nodes={need} or more")


@dataclass(frozen=True)
class FilesConfig(EdgeSplitConfig):
    """dataset=files: a folder of your own (docs/datasets.md)."""

    name: str = "files"
    path: str | None = None  # folder with edge_index, x, y, train_idx, val_idx, test_idx (.npy/.pt), or typed:
    # nodes/<type>/, edges/<src>__<name>__<dst>/
    num_classes: int = 0  # the model's classes (0 = the labels', which must be 0..K-1, each in use)
    time_split: tuple[float, ...] | None = None  # [t_val, t_test]: nodes split by seed_time (train before t_val, val
    # before t_test, test from it), instead of the folder's train_idx, val_idx, test_idx; task=link: the edges by
    # their times, instead of dataset.edge_split's fractions of them; task=edge: the targets by edge_label_time
    # (docs/temporal.md)

    def check(self, task: str, select: str) -> None:
        super().check(task, select)
        if self.time_split is not None and (len(self.time_split) != 2 or not self.time_split[0] < self.time_split[1]):
            raise ConfigError(f"dataset.time_split={list(self.time_split)} must be two cut times, the first before the "
                              "second: [t_val, t_test] (training labels asked before t_val, validation before "
                              "t_test, test from it), in seed_time's unit")
        if self.num_classes < 0:
            raise ConfigError(f"dataset.num_classes={self.num_classes} must be at least 1 (or 0: the classes of the "
                              "labels)")
        if self.num_classes == 1 and task == "node":
            raise ConfigError(single_class("dataset.num_classes=1"))


@dataclass(frozen=True)
class PygConfig(NodeSplitConfig):
    """dataset=pyg, pyg_hetero: a graph of PyG's, by the class or function that makes it."""

    name: str = "pyg"
    _target_: str | None = None  # a torch_geometric.datasets class or a callable returning a Data (pyg_hetero: a
    # HeteroData), pkg.module.Name
    kwargs: dict[str, Any] = field(default_factory=dict)  # its keyword arguments (root: <dataset.root>/pyg/<Name>
    # unless given)
    split_index: int = 0  # which split of masks that hold several (one column each, as WikiCS's)
    target_type: str | None = None  # pyg_hetero: the node type whose labels are predicted (None: the one type
    # with y)

    def check(self, task: str, select: str) -> None:
        super().check(task, select)
        if not self._target_:
            raise ConfigError(f"dataset={self.name} needs dataset._target_: a PyG dataset class or a function "
                              "returning a Data (a HeteroData: dataset=pyg_hetero). HINT: dataset=pyg "
                              "dataset._target_=torch_geometric.datasets.NAME")
        if self.target_type is not None and self.name != "pyg_hetero":
            raise ConfigError(f"dataset.target_type={self.target_type} names the labelled node type of a PyG "
                              f"HeteroData (dataset=pyg_hetero); got dataset={self.name}. HINT: drop it")


@dataclass(frozen=True)
class OgbConfig(DatasetConfig):
    """dataset=ogbn-*, ogbl-*: OGB's datasets, read from their raw files with their official splits."""

    name: str = "ogbn-arxiv"
    node_features_from_edges: Literal["none", "mean", "sum"] = "none"  # each node's features from its edges'
    # (ogbn-proteins: mean, the usual baseline)

    def check(self, task: str, select: str) -> None:
        super().check(task, select)
        spec, rule = SPECS[self.name], self.node_features_from_edges
        if rule != "none" and not spec.edge_features:
            with_edges = ", ".join(names(edge_features=True))
            raise ConfigError(f"dataset.node_features_from_edges={rule}: the edges of dataset={self.name} carry no "
                              f"features ({with_edges} do). HINT: drop the option")
        if rule == "none" and not spec.node_features:
            raise ConfigError(f"dataset={self.name} has no node features: dataset.node_features_from_edges=mean (or "
                              "sum) makes each node's from its edges'")


@dataclass(frozen=True)
class GraphSplitConfig(DatasetConfig):
    """A dataset of many graphs whose graphs hpcgnn splits itself where the source gives no split."""

    train_fraction: float = 0.8  # fraction of graphs in the training split
    val_fraction: float = 0.1  # fraction of graphs in the validation split (the rest is test)

    def check(self, task: str, select: str) -> None:
        super().check(task, select)
        check_split_fractions(self.train_fraction, self.val_fraction)
        if self.val_fraction == 0 and select == "val":
            raise ConfigError(empty_validation(f"dataset.val_fraction=0 leaves the validation split of dataset "
                                               f"{self.name} empty"))


@dataclass(frozen=True)
class SyntheticGraphsConfig(GraphSplitConfig):
    """dataset=synthetic_graphs: a seeded molecule-like dataset of many graphs (categorical atom and bond features in
    OGB's ranges), labelled by a noisy rule over each graph's make-up."""

    name: str = "synthetic_graphs"
    num_graphs: int = 4000  # graphs in the dataset
    avg_nodes: float = 25.0  # mean atoms per graph (bonds: about 1.08 per atom, each both ways)
    num_classes: int = 2  # classification: classes (by quantile of the rule's score); multilabel: binary labels
    label_kind: Literal["classification", "multilabel", "regression"] = "classification"  # what each graph's label is

    def check(self, task: str, select: str) -> None:
        super().check(task, select)
        if self.num_graphs < 10 or self.avg_nodes < 3:
            raise ConfigError(f"dataset.num_graphs={self.num_graphs} and dataset.avg_nodes={self.avg_nodes} must be "
                              "at least 10 and 3")
        if self.num_classes < 2 and self.label_kind == "classification":
            raise ConfigError(single_class(f"dataset.num_classes={self.num_classes}"))


@dataclass(frozen=True)
class GraphFilesConfig(GraphSplitConfig):
    """dataset=graph_files: a folder of many graphs of your own (docs/graph-tasks.md)."""

    name: str = "graph_files"
    path: str | None = None  # folder with edge_index, graph_ptr, y (and x, edge_attr, train_idx, val_idx, test_idx)

    def check(self, task: str, select: str) -> None:
        super().check(task, select)
        if not self.path:
            raise ConfigError("dataset=graph_files needs the folder of your graphs: set dataset.path=/path/to/folder")


@dataclass(frozen=True)
class PygGraphsConfig(GraphSplitConfig):
    """dataset=pyg_graphs: a PyG dataset of many graphs (TUDataset, MoleculeNet, an InMemoryDataset of yours), or a
    callable returning a list of Data, by ``dataset._target_``."""

    name: str = "pyg_graphs"
    _target_: str | None = None  # pkg.module.Name: a dataset class of torch_geometric.datasets or yours, or a function
    kwargs: dict[str, Any] = field(default_factory=dict)  # its keyword arguments (root: <dataset.root>/pyg/<Name>
    # unless given)

    def check(self, task: str, select: str) -> None:
        super().check(task, select)
        if not self._target_:
            raise ConfigError("dataset=pyg_graphs needs dataset._target_: a PyG dataset of many graphs or a function "
                              "returning a list of Data. HINT: dataset._target_=torch_geometric.datasets.TUDataset "
                              "+dataset.kwargs.name=PROTEINS")


@dataclass(frozen=True)
class OgbGraphsConfig(DatasetConfig):
    """dataset=ogbg-*: OGB's graph property datasets, read from their raw files with their official splits."""

    name: str = "ogbg-molhiv"


SOURCES: dict[str, type] = {"synthetic": SyntheticConfig, "ogb": OgbConfig, "files": FilesConfig, "pyg": PygConfig,
                            "synthetic_graphs": SyntheticGraphsConfig, "graph_files": GraphFilesConfig,
                            "pyg_graphs": PygGraphsConfig, "ogbg": OgbGraphsConfig}
# The sources whose graphs may carry edge times, and where (docs/temporal.md): a files folder says so before it is
# read; a PyG graph once it is made (its ranks know).
TIMES: dict[str, str] = {"files": "edge_time.npy, with seed_time.npy", "pyg": "data.edge_time, with data.seed_time"}
