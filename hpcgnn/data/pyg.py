"""A graph a user already has in PyG (``dataset=pyg dataset._target_=...``): a ``torch_geometric.datasets`` class,
or any callable returning a ``Data`` (or a dataset of one), prepared once into hpcgnn's memory-mapped format;
a ``HeteroData`` is ``dataset=pyg_hetero`` (a typed graph: below).

- ``dataset._target_``: the class or function, ``pkg.module.Name``; ``dataset.kwargs``: its keyword arguments.
  A class that takes ``root`` and is not given one gets ``<dataset.root>/pyg/<Name>`` (where PyG's datasets keep
  their raw and processed files). Built under ``torch.manual_seed(dataset.seed)``, so a generated graph
  (``FakeDataset``) is the same every time it is prepared.
- A dataset of several graphs serves its first (node tasks train on one graph).
- Splits: the graph's ``train_mask``/``val_mask``/``test_mask`` where it has them (a mask with one column per
  split, as WikiCS has: column ``dataset.split_index``), else a seeded split of the nodes by
  ``dataset.train_fraction`` and ``dataset.val_fraction`` (the rest is test).
- Labels: ``y``, one class per node (integers, [N] or [N, 1]), or several binary labels ([N, C]; unknown: NaN or
  -1), or values (floats, [N] or [N, D]; unknown: NaN): :mod:`hpcgnn.labels`; ``x``: the features (none: a
  constant 1). A typed graph's labelled type takes the same.

The prepared graph's key covers the target, its arguments, the split settings and the seed: change any and it
is prepared again. The graph then serves every mode (replicated, partitioned, sampler processes and servers).

Typed (``dataset=pyg_hetero``, a ``HeteroData``): the node type whose labels are predicted is the one type with
``y`` (or ``dataset.target_type``); its masks or the seeded split as above. Each type's features keep their
columns, zero-padded on the right to the widest type's width (hpcgnn's typed graphs have one width: a model's
first layer is a linear map per type or relation, on which zero columns change nothing); a type without ``x``
takes the mean of its in-neighbours' features along the first relation into it from a type that has them.
Relations are the graph's edge types as given; ``dataset.to_undirected=true`` adds their reverses
(``rev_<name>`` between two types, undirected inside one), as for ``synthetic_hetero`` and ogbn-mag. A
relation's ``edge_attr`` is kept as its edges' features (a reverse has its edge's).
"""

from __future__ import annotations

import contextlib
import logging
import re

import torch

from hpcgnn.checks import locate
from hpcgnn.config import DatasetConfig
from hpcgnn.data.graph import Graph, report_merged
from hpcgnn.data.times import events_csr, pyg_times, timeline_of
from hpcgnn.data.typed import Relation, TypedGraph, TypedSource, expand_relations
from hpcgnn.errors import DatasetError
from hpcgnn.rng import rng_state, set_rng_state

log = logging.getLogger(__name__)


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


@contextlib.contextmanager
def _pyg_unsafe_loads(cfg: DatasetConfig):
    """PyG's warnings that it read a processed file with torch's full unpickler, the safe loader having refused it
    (two lines and a source line each, ten lines for a dataset), said in one line: the file is one of a data root
    checked as yours (:func:`hpcgnn.data.prepared.check_root`), or one you said you trust. Other warnings pass."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        yield
    unsafe = [w for w in caught if "Weights only load failed" in str(w.message)]
    for w in caught:
        if w not in unsafe:
            warnings.showwarning(w.message, w.category, w.filename, w.lineno)
    if unsafe:
        allow = sorted({m.group() for w in unsafe for m in [re.search(r"add_safe_globals\(.*?\)", str(w.message))]
                        if m is not None})
        log.warning("dataset._target_=%s: PyG read %d processed file(s) with torch's full unpickler, the safe loader "
                    "having refused %s: they are files of a data root checked as yours (or trusted); PyG's own "
                    "warnings are left out", cfg._target_, len(unsafe), ", ".join(allow) or "them")


def pyg_made(cfg: DatasetConfig):
    """What the target makes, called with ``dataset.kwargs`` (``root`` under ``<dataset.root>/pyg/`` unless given) and
    seeded by ``dataset.seed``: a ``Data``, a dataset of them, or a list (a dataset of many graphs)."""
    import inspect

    obj = target_object(cfg)
    kwargs = dict(cfg.kwargs)
    try:
        takes = inspect.signature(obj).parameters
    except (TypeError, ValueError):
        takes = {}
    if "root" in takes and "root" not in kwargs:
        from pathlib import Path

        kwargs["root"] = str(Path(cfg.root).expanduser() / "pyg" / cfg._target_.rpartition(".")[2])
    with _seeded(cfg.seed), _pyg_unsafe_loads(cfg):
        try:
            made = obj(**kwargs)
        except Exception as exc:
            raise DatasetError(f"dataset._target_={cfg._target_}({', '.join(f'{k}={v!r}' for k, v in kwargs.items())}) "
                               f"failed: {type(exc).__name__}: {exc}. HINT: its arguments go in dataset.kwargs "
                               "('+dataset.kwargs.NAME=VALUE'); a dataset that downloads must find its files under "
                               "root (prepare it once where there is internet)") from None
    return made


def pyg_data(cfg: DatasetConfig, allow_download: bool = False):
    """The ``Data`` the target makes (the first graph of a dataset); ``dataset=pyg_hetero``: the ``HeteroData``."""
    from torch_geometric.data import Data, HeteroData, TemporalData

    made = pyg_made(cfg)
    data = made if isinstance(made, (Data, HeteroData, TemporalData)) else (made[0] if len(made) else None)
    typed = cfg.name == "pyg_hetero"
    if isinstance(data, TemporalData) and not typed:
        data = from_temporal(data)
    if isinstance(data, HeteroData) and not typed:
        raise DatasetError(f"dataset._target_={cfg._target_} gives a HeteroData, a typed graph. HINT: "
                           "dataset=pyg_hetero (add dataset.erase_types=true for its homogeneous view)")
    if isinstance(data, Data) and typed:
        raise DatasetError(f"dataset._target_={cfg._target_} gives a Data, one node and edge type. HINT: dataset=pyg")
    if not isinstance(data, HeteroData if typed else Data):
        raise DatasetError(f"dataset._target_={cfg._target_} gave {type(made).__name__}, not a torch_geometric "
                           f"{'HeteroData' if typed else 'Data'} or a dataset of them")
    if typed:
        timed = [str(key) for key, store in data.to_dict().items() if isinstance(store, dict)
                 and ("edge_time" in store or "seed_time" in store or "time" in store)]
        if timed:  # (never silently: a model trained on them as if untimed would see the future)
            raise DatasetError(f"dataset._target_={cfg._target_} gives times on a HeteroData ({', '.join(timed[:3])}), "
                               "and sampling as of a time runs on homogeneous graphs today. HINT: its homogeneous "
                               "view as a Data with edge_time (dataset=pyg), or delete the times to train on every edge")
    return data


def from_temporal(data):
    """A PyG ``TemporalData`` (a stream of events: ``src``, ``dst``, ``t``, and ``msg`` each event's features; JODIE's
    datasets) as the ``Data`` of its graph: each event an edge ``src -> dst`` at its time ``t`` (``edge_time``), its
    ``msg`` the edge's features (``edge_attr``). The events' own labels (JODIE's state changes) are no node's."""
    from torch_geometric.data import Data

    msg = getattr(data, "msg", None)
    edge_attr = msg.float() if msg is not None and msg.dim() == 2 and msg.size(1) > 0 else None
    n = int(torch.maximum(data.src.max(), data.dst.max())) + 1 if data.src.numel() else 0
    return Data(edge_index=torch.stack([data.src.long(), data.dst.long()]), edge_time=data.t, edge_attr=edge_attr,
                num_nodes=n)


def _labels(cfg: DatasetConfig, data) -> tuple[torch.Tensor, int]:
    """``data.y`` (a ``Data``, or a ``HeteroData``'s node type) in its stored form (:func:`hpcgnn.labels.stored`),
    and the model's outputs: the classes of class ids, else one per column."""
    from hpcgnn.labels import stored

    y = getattr(data, "y", None)
    if y is None:
        raise DatasetError(f"dataset._target_={cfg._target_}: its graph has no labels (y): node tasks need "
                           "them. HINT: task=link trains on the edges alone; task=edge on labels of edges (edge_label)")
    if y.dim() == 2 and y.size(1) == 1 and not y.is_floating_point():
        y = y.view(-1)
    if y.dim() not in (1, 2) or y.size(0) != data.num_nodes:
        raise DatasetError(f"dataset._target_={cfg._target_}: y has shape {tuple(y.shape)} ({y.dtype}); hpcgnn's node "
                           f"task takes one class per node (integers, shape [{data.num_nodes}]), binary labels or "
                           f"values ([{data.num_nodes}, C])")
    y = torch.from_numpy(stored(y.numpy(), f"dataset._target_={cfg._target_}'s y"))
    if y.is_floating_point():
        return y, (y.size(1) if y.dim() == 2 else 1)
    return y, int(y.max()) + 1 if y.numel() else 0


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
    x = as_values(cfg, data.x, "x") if getattr(data, "x", None) is not None else torch.ones(n, 1)
    unlabelled = cfg.prepared_for == "edge" and getattr(data, "y", None) is None  # (an edge task's targets are edges)
    if cfg.prepared_for == "link":
        y, classes = torch.zeros(n, dtype=torch.long), 1
    elif unlabelled:  # its nodes get none (-1) and no splits, as a files folder's without y
        y, classes = torch.full((n,), -1, dtype=torch.long), 0
    else:
        y, classes = _labels(cfg, data)
    edge_index, edges = data.edge_index, edge_features(cfg, data)
    if getattr(data, "edge_weight", None) is not None:  # (PyG's GCN would read it: hpcgnn reads edge_attr alone)
        log.info("dataset=pyg: the edge_weight of %s is not read (hpcgnn reads edges' features from edge_attr)%s",
                 cfg._target_, "" if edges is not None else "; data.edge_attr = data.edge_weight.view(-1, 1) gives "
                 "them to a model that reads edge features")
    given, distinct = edge_index.size(1), None  # (distinct: where reverses are added; else the graph's own count)
    edge_time, seed_time = pyg_times(f"dataset._target_={cfg._target_}", data, given, n)
    if cfg.to_undirected:
        distinct = int(torch.unique(edge_index[0].long() * n + edge_index[1].long()).numel()) if given else 0
        edge_index = torch.cat([edge_index, edge_index.flip(0)], dim=1)
        edges = torch.cat([edges, edges]) if edges is not None else None
        edge_time = torch.cat([edge_time, edge_time]) if edge_time is not None else None
    train, val, test = [torch.zeros(0, dtype=torch.long)] * 3 if unlabelled else _splits(cfg, data, n)
    if edge_time is not None:  # events: every edge kept, with its own time and features, each row's in time order
        rowptr, col, order = events_csr(edge_index, n)
        timeline = timeline_of(rowptr, col, edge_time.index_select(0, order), seed_time, order < given)
        y = y.float() if y.is_floating_point() else y.long()
        return Graph(rowptr, col, x.float().contiguous(), y, train.long(), val.long(), test.long(), classes,
                     edge_attr=edges.float().index_select(0, order) if edges is not None else None, timeline=timeline)
    graph = Graph.from_edge_index(edge_index, n, x, y, train, val, test, num_classes=classes, edge_attr=edges)
    report_merged(cfg, given, graph.num_edges if distinct is None else distinct)  # (the reverses added repeat nothing)
    return graph


def as_values(cfg: DatasetConfig, t: torch.Tensor, what: str) -> torch.Tensor:
    """``t`` (features: ``x``, ``edge_attr``) as float32 values. Integers or booleans are widened, and the log says
    so: PyG keeps category codes (a molecule's atom or bond types) that way, which as values are a wrong feature;
    a files folder refuses them, naming its file."""
    if not t.is_floating_point():
        log.warning("dataset=%s: %s of %s holds %s: read as float values; where they are category codes (atom or "
                    "bond types), one-hot them in what dataset._target_ returns", cfg.name, what, cfg._target_,
                    str(t.dtype).removeprefix("torch."))
    return t.float()


def edge_features(cfg: DatasetConfig, data, rel=None) -> torch.Tensor | None:
    """``data.edge_attr`` (``rel``: a HeteroData relation's) as [E, D] floats (a vector of one per edge: D = 1),
    checked; None where it has none."""
    store = data if rel is None else data[rel]
    edges = getattr(store, "edge_attr", None)
    if edges is None:
        return None
    what = "edge_attr" if rel is None else f"the edge_attr of {'__'.join(rel)}"
    edges = edges.view(-1, 1) if edges.dim() == 1 else edges
    if edges.dim() != 2 or edges.size(0) != store.edge_index.size(1):
        raise DatasetError(f"dataset._target_={cfg._target_}: {what} has shape {tuple(edges.shape)}; edge "
                           f"features are a row per edge ([{store.edge_index.size(1)}, D])")
    edges = as_values(cfg, edges, what)
    if not torch.isfinite(edges).all():
        raise DatasetError(f"dataset._target_={cfg._target_}: {what} holds NaN or inf (edge "
                           f"{int((~torch.isfinite(edges)).any(1).nonzero()[0])})")
    return edges


# ------------------------------------------------------------------------------ typed: dataset=pyg_hetero


def _target_type(cfg: DatasetConfig, data) -> str:
    """The node type whose labels are predicted: ``dataset.target_type``, else the one type with ``y``."""
    with_y = [t for t in data.node_types if getattr(data[t], "y", None) is not None]
    if cfg.target_type is not None:
        if cfg.target_type not in with_y:
            raise DatasetError(f"dataset.target_type={cfg.target_type}: the graph's node types with labels (y) are "
                               f"{with_y or 'none'} (its types: {', '.join(data.node_types)})")
        return cfg.target_type
    if len(with_y) != 1:
        raise DatasetError(f"dataset._target_={cfg._target_}: {len(with_y)} node types have labels (y) "
                           f"({', '.join(with_y) or 'none'}). HINT: name the one to predict with dataset.target_type=TYPE")
    return with_y[0]


def _feature_rules(data, relations: list[Relation]) -> dict[str, Relation]:
    """Each type without ``x``: the first relation into it from a type that has features (given, or ruled first)."""
    have = {t for t in data.node_types if getattr(data[t], "x", None) is not None}
    rules: dict[str, Relation] = {}
    while True:
        new = {r[2]: r for r in reversed(relations) if r[2] not in have and r[0] in have}
        if not new:
            break
        rules.update(new)
        have |= set(new)
    missing = [t for t in data.node_types if t not in have]
    if missing:
        raise DatasetError(f"node types {', '.join(missing)} have no features (x) and no relation into them from a "
                           "type that has some. HINT: dataset.to_undirected=true adds every relation's reverse")
    return rules


def labelled_relation(cfg: DatasetConfig, data) -> tuple[str, str, str]:
    """The one relation of a ``HeteroData`` whose edges carry ``edge_label`` (an edge task's targets)."""
    found = [tuple(r) for r in data.edge_types if getattr(data[r], "edge_label", None) is not None]
    if len(found) != 1:
        raise DatasetError(f"dataset._target_={cfg._target_}: task=edge on a HeteroData takes one relation's edges as "
                           f"its targets: exactly one relation has edge_label; found "
                           f"{['__'.join(r) for r in found] or 'none'}")
    return found[0]


def _typed_parts(cfg: DatasetConfig, data) -> dict:
    """What a typed graph is built from: sizes, relations, edges, padded features, rules, labels and splits (an
    edge task's graph whose nodes have no labels: none, on its labelled relation's target type)."""
    with_y = any(getattr(data[t], "y", None) is not None for t in data.node_types)
    if cfg.prepared_for == "edge" and not with_y and cfg.target_type is None:
        target = labelled_relation(cfg, data)[2]
        n = data[target].num_nodes
        y, classes, splits = torch.full((n,), -1, dtype=torch.long), 0, [torch.empty(0, dtype=torch.long)] * 3
    else:
        target = _target_type(cfg, data)
        y, classes = _labels(cfg, data[target])
        splits = _splits(cfg, data[target], data[target].num_nodes)
    edges = {tuple(rel): data[rel].edge_index.long() for rel in data.edge_types}
    features = {tuple(rel): edge_features(cfg, data, rel) for rel in data.edge_types}
    relations = list(edges)
    stored = expand_relations(relations, cfg.to_undirected)
    rules = _feature_rules(data, stored)
    given = {t: data[t].x for t in data.node_types if getattr(data[t], "x", None) is not None}
    for t, x in given.items():
        if x.dim() != 2 or x.size(0) != data[t].num_nodes:
            raise DatasetError(f"node type {t}: x has shape {tuple(x.shape)}; features are one row per node "
                               f"([{data[t].num_nodes}, width])")
    width = max(x.size(1) for x in given.values())
    x = {t: torch.nn.functional.pad(as_values(cfg, v, f"the x of {t}"), (0, width - v.size(1))) for t, v in given.items()}
    return {"num_nodes": {t: int(data[t].num_nodes) for t in data.node_types}, "relations": relations,
            "edges": edges, "x": x, "width": width, "rules": rules, "target": target, "y": y, "classes": classes,
            "splits": splits,
            "edge_attr": {r: v for r, v in features.items() if v is not None}}


def pyg_typed_source(cfg: DatasetConfig, allow_download: bool = False) -> TypedSource:
    """The ``HeteroData`` as preparing streams a typed graph (its arrays are in memory already: PyG's are)."""
    p = _typed_parts(cfg, pyg_data(cfg, allow_download))
    chunk = 1 << 20

    def feed(writer):
        for rel, ei in p["edges"].items():
            for a in range(0, ei.size(1), chunk):
                ids = torch.arange(a, min(a + chunk, ei.size(1))) if rel in p["edge_attr"] else None
                writer.add(rel, ei[0, a:a + chunk], ei[1, a:a + chunk], ids=ids)
        for t, x in p["x"].items():
            for a in range(0, x.size(0), chunk // 16):
                writer.write_features(t, a, x[a:a + chunk // 16])
        return (p["y"], *p["splits"])

    return TypedSource(p["num_nodes"], p["relations"], {r: ei.size(1) for r, ei in p["edges"].items()}, p["width"],
                       p["target"], p["classes"], p["rules"], feed, reverse=cfg.to_undirected,
                       edge_attr={r: v.numpy() for r, v in p["edge_attr"].items()})


def load_pyg_typed(cfg: DatasetConfig, allow_download: bool = False) -> TypedGraph:
    """The ``HeteroData`` as hpcgnn's :class:`TypedGraph`, in memory (duplicate edges removed, as preparing does)."""
    p = _typed_parts(cfg, pyg_data(cfg, allow_download))
    return TypedGraph.from_edges(p["num_nodes"], p["edges"], p["x"], p["target"], p["y"], *p["splits"], p["classes"],
                                 reverse=cfg.to_undirected, feature_from=p["rules"], edge_attr=p["edge_attr"])
