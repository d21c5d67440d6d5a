"""Edge-level targets (``task=edge``): labels or values on given edges, with their own train/val/test splits.

An edge task trains on the whole prepared graph (the node task's: every edge carries messages) and, beside it,
*targets*: pairs of nodes to classify or regress, kept in a folder of their own inside the prepared graph's
(``edge-targets-<key>/``):

- ``index`` int64 [2, M]: each target's (source, target) nodes, in the graph's ids (an edge of the graph or not);
- ``label``: the targets' labels in the stored form of node labels (:func:`hpcgnn.labels.stored`): int64 [M]
  class ids (-1: none), or float32 [M] / [M, C] (NaN: unknown), whose kind the task infers as a node task does;
- ``train_idx``, ``val_idx``, ``test_idx``: int64 ids of targets (rows of ``index``);
- ``place`` int64 [M]: each target's edge ``source -> target`` in the graph as its place among the target node's
  in-edges (-1: the pair is no edge), and ``reverse`` bool [M]: whether ``target -> source`` is one; what a batch
  leaving its targets out counts, and where a target's own features are, whatever the graph's layout
  (replicated: the row's start plus the place; partitioned: the same in the part that holds the row);
- ``time`` [M] (a timed graph's, where given): when each target is asked; its ends are sampled strictly before it
  (``edge_label_time``: a files folder's file, a PyG ``Data``'s attribute; in the graph's times' kind and unit);
- ``meta.json``: the count and the labels' profile (:func:`hpcgnn.labels.profile`), written last.

A prediction of the pairs of a file (``hpcgnn predict RUN_DIR pairs=FILE.npy``) takes them in the targets' place
(:func:`pairs_as_targets`): every store then makes their batches, and reads their own edges' features, as it does
the targets'.

Sources:

- ``files``: ``edge_label_index`` [2, M] int, ``edge_label`` [M] or [M, C], and ``edge_train_idx``,
  ``edge_val_idx``, ``edge_test_idx`` (when absent, a seeded split of the targets by ``dataset.edge_split``),
  ``.npy`` or ``.pt`` (read with ``weights_only=True``), beside the graph's own files;
- ``synthetic``: a seeded tenth of the graph's edges (one direction of each pair), labelled 1 where both ends
  share a class and 0 otherwise, split by ``dataset.edge_split``;
- ``pyg``: a ``Data`` with ``edge_label_index`` and ``edge_label`` (splits from ``edge_train_mask`` ... or
  ``edge_train_idx`` ..., else seeded), or with ``edge_label`` alone, one per edge of ``edge_index`` (the
  graph's edges are the targets);
- a typed ``files`` folder: one relation's edges (``edges/<src>__<name>__<dst>/edge_index``), labelled by
  ``edge_label`` in the same folder (a row per edge), split by ``edge_train_idx`` ... there or seeded; the
  targets' ends are then in their two types' own ids, and ``relation`` names the relation (its reverse, where
  the graph adds one, is where a target's reverse is looked for);
- ``pyg_hetero``: the one relation of a ``HeteroData`` with ``edge_label`` (and ``edge_label_index``, or one per
  edge of its ``edge_index``), splits from its ``edge_train_mask`` ... (or ``edge_*_idx``), else seeded.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from hpcgnn.config import DatasetConfig
from hpcgnn.errors import DatasetError, PredictError
from hpcgnn.labels import SPLITS, profile, stored
from hpcgnn.specs import datasets, load

log = logging.getLogger(__name__)

TARGETS_VERSION = 3  # in the key: how the targets are drawn (synthetic) and stored (3: own.npy)
SYNTHETIC_FRACTION = 0.1  # of a synthetic graph's edge pairs, drawn as targets
SOURCES = datasets.with_edge_targets()  # the datasets whose edges can carry targets (task=edge)


@dataclass(frozen=True)
class EdgeTargets:
    """The targets of an edge task (see the module)."""

    index: Tensor  # int64 [2, M]
    label: Tensor  # int64 [M] or float32 [M] / [M, C]
    splits: dict  # split name -> int64 ids into the M targets
    labels: dict  # the labels' profile (hpcgnn.labels.profile)
    place: Tensor  # int64 [M]: the pair's edge's place among its target node's in-edges (-1: no edge)
    reverse: Tensor  # bool [M]: the reverse pair is an edge of the graph
    relation: tuple[str, str, str] | None = None  # a typed graph's: the relation whose edges the targets are
    own: Tensor | None = None  # float32 [M, D]: each target's own edge features, where the targets are edges given
    # with features and some repeat a pair (the graph holds one edge per pair, with its first's); None: the graph's
    time: Tensor | None = None  # [M] when each target is asked (a timed graph's; the times' dtype); None: not given

    def own_features(self, items: Tensor) -> Tensor | None:
        """Targets ``items``' own edge features (float32), where they are kept apart from the graph's (``own``);
        None where a target's are its pair's edge's in the graph."""
        return None if self.own is None else self.own.index_select(0, items)

    @property
    def count(self) -> int:
        return int(self.index.size(1))

    def split(self, name: str) -> Tensor:
        """A split's target ids (``all``: every target's)."""
        return torch.arange(self.count) if name == "all" else self.splits[name]

    def edge_ids(self, items: Tensor, row_start) -> Tensor:
        """Targets ``items``' own edges' ids: ``row_start(target nodes)`` (where the graph's layout puts each
        target node's in-edges) plus the pair's place among them; -1 where the pair is no edge."""
        place = self.place.index_select(0, items)
        return torch.where(place >= 0, row_start(self.index[1].index_select(0, items)) + place, -1)


def where_targets(cfg: DatasetConfig) -> str:
    """Where an edge task's labels are, as errors name them."""
    if cfg.name == "files" and cfg.path:
        from hpcgnn.checks import is_typed

        return f"{cfg.path.rstrip('/')}/{'edges/<relation>/' if is_typed(cfg) else ''}edge_label"
    return f"the edge labels (edge_label) of dataset={cfg.name}"


def targets_folder(cfg: DatasetConfig) -> Path:
    """``<prepared graph>/edge-targets-<key>``: the key covers how the targets are drawn and split."""
    from hpcgnn.data.prepared import cache_folder

    fields = {"version": TARGETS_VERSION, "seed": cfg.seed, "edge_split": list(cfg.edge_split),
              "split_index": getattr(cfg, "split_index", 0)}  # (pyg's: which column of its masks; one split elsewhere)
    if getattr(cfg, "time_split", None) is not None:  # (None keeps the keys as they were)
        fields["time_split"] = list(cfg.time_split)
    key = hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:12]
    return cache_folder(cfg) / f"edge-targets-{key}"


def prepare_targets(cfg: DatasetConfig) -> Path:
    """The edge task's targets written beside the prepared graph (which must be there) unless they are."""
    from hpcgnn.checks import is_typed
    from hpcgnn.data.files import files_folder
    from hpcgnn.data.mapped import open_graph, open_typed
    from hpcgnn.io import atomic_folder, write_npy

    folder = targets_folder(cfg)
    if (folder / "meta.json").is_file():
        return folder
    if cfg.name not in SOURCES:
        raise DatasetError(f"task=edge takes its targets from dataset {', '.join(SOURCES)}; dataset={cfg.name} has "
                           "none. HINT: a files folder with edge_label_index and edge_label, or a PyG Data with them")
    relation = None
    spec = datasets.spec(cfg.name)
    if is_typed(cfg):  # a typed folder: one relation's edges
        graph = open_typed(cfg)
        index, label, splits, relation, own = load(spec.typed_edge_targets)(cfg, graph)
        sizes = (graph.num_nodes[relation[0]], graph.num_nodes[relation[2]])
    else:
        graph = open_graph(cfg)
        index, label, splits, own = load(spec.edge_targets)(cfg, graph)
        sizes = (graph.num_nodes, graph.num_nodes)
    where = where_targets(cfg)
    if relation is None:
        at = where.replace("edge_label", "edge_label_index")
    else:
        at = f"{files_folder(cfg)}/edges/{'__'.join(relation)}/edge_index" if cfg.name == "files" else \
            f"dataset=pyg_hetero ({cfg._target_}, {'__'.join(relation)})"
    _check_index(index, sizes, at, relation)
    label = stored(label, where)
    if label.shape[0] != index.shape[1]:
        raise DatasetError(f"{where}: {label.shape[0]} labels for {index.shape[1]} target edges "
                           "(edge_label_index): one row per target edge")
    splits = {s: _check_split(np.asarray(splits[s]), index.shape[1], f"{where} ({s} split)") for s in SPLITS}
    time = target_times(cfg, graph, index.shape[1], relation)
    if time is not None and getattr(cfg, "time_split", None) is not None:  # (by the times they are asked)
        from hpcgnn.data.times import time_parts

        splits = {s: np.flatnonzero(m) for s, m in zip(SPLITS, time_parts(time, cfg.time_split), strict=True)}
    rows = graph.edge_attr if relation is None else (graph.edge_attr or {}).get(relation)  # (the graph's, if any)
    repeats = 0 if rows is None else index.shape[1] - np.unique(index[0].astype(np.int64) * sizes[1] + index[1]).size
    own = _kept_apart(own, rows, repeats)
    with atomic_folder(folder) as tmp:  # (nodes racing on a shared file system: the first one's stays, read)
        np.save(tmp / "index.npy", index.astype(np.int64, copy=False))
        np.save(tmp / "label.npy", label)
        for s in SPLITS:
            np.save(tmp / f"{s}_idx.npy", splits[s])
        place, reverse = target_edges_in(graph, index) if relation is None else \
            typed_target_edges_in(graph, relation, index)
        np.save(tmp / "place.npy", place)
        np.save(tmp / "reverse.npy", reverse)
        if own is not None:
            np.save(tmp / "own.npy", own)
        if time is not None:
            write_npy(tmp / "time.npy", time)
        meta = {"count": int(index.shape[1]), "labels": profile(label, splits),
                "relation": list(relation) if relation else None, "own": own is not None, "time": time is not None}
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1))
    log.info("edge targets of %s: %d (%s train/val/test) into %s", cfg.name, index.shape[1],
             "/".join(str(len(splits[s])) for s in SPLITS), folder)
    if repeats:  # (a multigraph's parallel edges: one edge of the graph, the first's features)
        log.info("edge targets of %s: %d of the %d repeat an earlier target's (source, target) pair, which the graph "
                 "holds as one edge; %s", cfg.name, repeats, index.shape[1],
                 "each target's own edge features are kept with the targets, for a decoder that reads them" if own
                 is not None else "a decoder reading a target's own edge features (concat) reads that edge's, the "
                 "first given's, for each (targets given as pairs, edge_label_index, have none of their own)")
    return folder


def _kept_apart(own: np.ndarray | None, stored: Tensor | None, repeats: int) -> np.ndarray | None:
    """The targets' own edge features to keep beside them (float32, rounded through the graph's stored dtype: the
    same floats a target reads from its edge in the graph), where the targets are edges given with features and
    some repeat a pair (parallel edges, one edge in the graph); else None (each target's are its edge's)."""
    if own is None or stored is None or not repeats:
        return None
    return torch.from_numpy(np.array(own, dtype=np.float32)).to(stored.dtype).float().numpy()  # (a copy: writable)


def open_targets(cfg: DatasetConfig) -> EdgeTargets:
    """The prepared targets, memory-mapped (:func:`prepare_targets` first)."""
    folder = targets_folder(cfg)
    meta = json.loads((folder / "meta.json").read_text())

    def load(name: str) -> Tensor:
        return torch.from_numpy(np.load(folder / f"{name}.npy", mmap_mode="c"))

    relation = meta.get("relation")
    return EdgeTargets(load("index"), load("label"), {s: load(f"{s}_idx") for s in SPLITS}, meta["labels"],
                       load("place"), load("reverse"), tuple(relation) if relation else None,
                       load("own") if meta.get("own") else None, load("time") if meta.get("time") else None)


def target_times(cfg: DatasetConfig, graph, count: int, relation=None) -> np.ndarray | None:
    """When each of ``count`` targets is asked (``edge_label_time``: a files folder's file, its target relation's in a
    typed folder; a PyG ``Data``'s attribute), checked against the graph's edge times (the same kind; none without
    them); None where not given."""
    from hpcgnn.data.times import _check, kind_of

    if cfg.name == "files":
        from hpcgnn.checks import gives
        from hpcgnn.data.files import files_folder, read_array

        folder = files_folder(cfg) if relation is None else files_folder(cfg) / "edges" / "__".join(relation)
        if not gives(folder, "edge_label_time"):
            return None
        where, time = read_array(folder, "edge_label_time")
    elif cfg.name == "pyg" and relation is None:
        from hpcgnn.data.pyg import pyg_data

        time = getattr(pyg_data(cfg), "edge_label_time", None)
        if time is None:
            return None
        where, time = f"dataset=pyg ({cfg._target_}): data.edge_label_time", time.numpy()
    else:
        return None
    time = np.asarray(time)
    _check(where, time, count, "target edges")
    tl = graph.timeline if relation is None else next(iter((graph.timelines or {}).values()), None)
    if tl is None:
        raise DatasetError(f"{where}: the targets have times, but the graph's edges do not. HINT: give the edges' "
                           "times too (edge_time), or remove edge_label_time")
    kind = tl.time.numpy().dtype
    if kind_of(where, time) != kind:
        raise DatasetError(f"{where}: the targets' times are {time.dtype} but the edges' {kind}: give both as "
                           "integers or both as floats, in the same unit")
    return time.astype(kind)


def read_pairs(path: str | None, sizes: tuple[int, int], relation=None) -> np.ndarray:
    """The node pairs of a ``.npy`` file (``predict.pairs``) as [2, P] (given as [P, 2] or [2, P]), memory-mapped;
    refused, naming the fix, when it is not one, holds none, or names a node the graph does not have (``sizes``: the
    sources' and the targets' counts; a typed ``relation``'s: its two types', each end in its type's own ids)."""
    if not path or not Path(path).is_file():
        raise PredictError(f"pairs={path}: no such file. HINT: a .npy file of node id pairs, shape [P, 2] or [2, P]")
    try:
        pairs = np.load(path, mmap_mode="r")
    except Exception as exc:
        raise PredictError(f"pairs={path} is not a .npy file numpy can read ({type(exc).__name__}: {exc})") from None
    if pairs.ndim != 2 or 2 not in pairs.shape or pairs.dtype.kind not in "iu":
        raise PredictError(f"pairs={path} holds {pairs.dtype} of shape {list(pairs.shape)}: want integer node ids, "
                           "shape [P, 2] or [2, P]")
    if pairs.shape == (2, 2):
        raise PredictError(f"pairs={path} is 2 x 2, as [2, P] and as [P, 2] alike: which are its pairs cannot be told. "
                           "HINT: add a third pair (a repeat of one), or score the two one at a time")
    pairs = pairs if pairs.shape[0] == 2 else pairs.T
    if not pairs.size:
        raise PredictError(f"pairs={path} holds no pairs. HINT: a .npy file of node id pairs, shape [P, 2] or [2, P]")
    for k, end in enumerate(("source", "target")):
        lo, hi = int(pairs[k].min()), int(pairs[k].max())
        if lo < 0 or hi >= sizes[k]:
            nodes = "the graph's nodes" if relation is None else f"the {relation[2 * k]} nodes ({end}s of {relation[1]})"
            raise PredictError(f"pairs={path} names node {lo if lo < 0 else hi}, but {nodes} are 0..{sizes[k] - 1}")
    return pairs


def pairs_as_targets(targets: EdgeTargets, folder: Path) -> EdgeTargets:
    """The node pairs of a file (``predict.pairs``: an edge model's prediction of them) as an edge task's targets, in
    the place of the prepared ``targets``: of their relation (a typed graph's: each end in its type's own ids), each
    pair's own edge found in the graph as theirs are (its features for a decoder that reads them; left out of its
    batch's message passing as a target's is), their labels unknown (-1, or NaN: the targets' kind and width, no
    memory), and every split all of them (read as ``all``). Memory-mapped from ``folder`` (:func:`prepare_pairs`:
    once per node, however many ranks read them)."""
    def load(name: str) -> Tensor:
        return torch.from_numpy(np.load(folder / f"{name}.npy", mmap_mode="c"))

    index, every = load("index"), load("every")
    like = targets.label
    unknown = float("nan") if like.is_floating_point() else -1
    label = torch.full((1, *like.shape[1:]), unknown, dtype=like.dtype).expand(index.size(1), *like.shape[1:])
    return EdgeTargets(index, label, {s: every for s in SPLITS}, targets.labels, load("place"), load("reverse"),
                       targets.relation)


def prepare_pairs(cfg: DatasetConfig, targets: EdgeTargets, path: str, folder: Path) -> Path:
    """The pairs of a file, as :func:`pairs_as_targets` reads them, written into ``folder`` unless they are there
    (``index`` [2, P], each pair's ``place`` and ``reverse`` in the graph, ``every`` target id)."""
    from hpcgnn.data.mapped import open_graph, open_typed
    from hpcgnn.io import atomic_folder

    if (folder / "meta.json").is_file():
        return folder
    rel = targets.relation
    graph = open_graph(cfg) if rel is None else open_typed(cfg)
    sizes = (graph.num_nodes, graph.num_nodes) if rel is None else (graph.num_nodes[rel[0]], graph.num_nodes[rel[2]])
    index = read_pairs(path, sizes, rel)
    with atomic_folder(folder) as tmp:  # (the nodes of a job on a shared file system: the first one's stays)
        out = np.lib.format.open_memmap(tmp / "index.npy", mode="w+", dtype=np.int64, shape=index.shape)
        for a in range(0, index.shape[1], 1 << 22):  # (a chunk at a time: a file of [P, 2] is read across)
            out[:, a:a + (1 << 22)] = index[:, a:a + (1 << 22)]
        out.flush()
        place, reverse = target_edges_in(graph, out) if rel is None else typed_target_edges_in(graph, rel, out)
        del out
        np.save(tmp / "place.npy", place)
        np.save(tmp / "reverse.npy", reverse)
        np.save(tmp / "every.npy", np.arange(index.shape[1], dtype=np.int64))
        (tmp / "meta.json").write_text(json.dumps({"count": int(index.shape[1]), "pairs": str(path)}))
    return folder


def target_edges_in(graph, index: np.ndarray, chunk: int = 1 << 22) -> tuple[np.ndarray, np.ndarray]:
    """Each target pair's edge as its place among the target node's in-edges (-1: none), and whether the reverse
    pair is an edge, from the prepared graph's CSR, ``chunk`` pairs at a time."""
    from hpcgnn.data.graph import csr_edge_id

    edge_id = csr_edge_id(graph.rowptr, graph.col)
    place, reverse = np.empty(index.shape[1], dtype=np.int64), np.empty(index.shape[1], dtype=bool)
    for a in range(0, index.shape[1], chunk):
        src, dst = (torch.from_numpy(np.ascontiguousarray(index[k, a:a + chunk])).long() for k in (0, 1))
        e = edge_id(src, dst)
        place[a:a + chunk] = torch.where(e >= 0, e - graph.rowptr.index_select(0, dst), -1).numpy()
        reverse[a:a + chunk] = (edge_id(dst, src) >= 0).numpy()
    return place, reverse


def reverse_relation(graph, rel: tuple[str, str, str]) -> tuple[str, str, str] | None:
    """Where a typed graph keeps the reverse of ``rel``'s edges: ``rel`` itself inside one type (made undirected),
    its ``rev_<name>`` between two (None where the graph added none)."""
    from hpcgnn.data.typed import expand_relations

    back = rel if rel[0] == rel[2] else expand_relations([rel], True)[-1]
    return back if back in graph.rowptr else None


def typed_target_edges_in(graph, rel: tuple[str, str, str], index: np.ndarray,
                          chunk: int = 1 << 22) -> tuple[np.ndarray, np.ndarray]:
    """:func:`target_edges_in` on a typed graph: each target's place among its target node's in-edges of ``rel``,
    and whether its reverse is an edge (of ``rel``'s reverse relation)."""
    from hpcgnn.data.graph import csr_edge_id

    back = reverse_relation(graph, rel)
    edge_id = csr_edge_id(graph.rowptr[rel], graph.col[rel])
    back_id = csr_edge_id(graph.rowptr[back], graph.col[back]) if back is not None else None
    place, reverse = np.empty(index.shape[1], dtype=np.int64), np.zeros(index.shape[1], dtype=bool)
    for a in range(0, index.shape[1], chunk):
        src, dst = (torch.from_numpy(np.ascontiguousarray(index[k, a:a + chunk])).long() for k in (0, 1))
        e = edge_id(src, dst)
        place[a:a + chunk] = torch.where(e >= 0, e - graph.rowptr[rel].index_select(0, dst), -1).numpy()
        if back_id is not None:
            reverse[a:a + chunk] = (back_id(dst, src) >= 0).numpy()
    return place, reverse


def read_profile(cfg: DatasetConfig) -> dict | None:
    """The prepared targets' label profile, or None when they are not prepared yet (the launcher's check)."""
    path = targets_folder(cfg) / "meta.json"
    return json.loads(path.read_text())["labels"] if path.is_file() else None


def check_target(cfg: DatasetConfig, task):
    """An edge task's kind (``task.kind``) against its prepared targets' labels, refused with the fix; the resolved
    target, or None where they are not prepared yet."""
    from hpcgnn.labels import resolve

    labels = read_profile(cfg)
    return resolve(labels, task.kind, task.loss, 0, where_targets(cfg)) if labels is not None else None


# ---------------------------------------------------------------------- sources


def seeded_split(src: np.ndarray, dst: np.ndarray, num_nodes: int, cfg: DatasetConfig) -> dict[str, np.ndarray]:
    """Targets split by ``dataset.edge_split`` with a seeded hash of each unordered pair (both directions of a
    pair on one side)."""
    from hpcgnn.data.link import edge_sides

    side = edge_sides(torch.from_numpy(src), torch.from_numpy(dst), num_nodes, tuple(cfg.edge_split), cfg.seed)
    side[torch.from_numpy(src == dst)] = 0  # (edge_sides keeps self-loops out of the held-out splits)
    return {s: (side == k).nonzero().flatten().numpy() for k, s in enumerate(SPLITS)}


def synthetic_targets(cfg: DatasetConfig, graph) -> tuple[np.ndarray, np.ndarray, dict]:
    """A seeded tenth of the graph's edge pairs (the edge into the larger id), labelled by whether both ends share
    a class."""
    from hpcgnn.rng import derive_seed, mix64, shift_right

    n = graph.num_nodes
    dst = torch.repeat_interleave(torch.arange(n), graph.degree())
    src = graph.col.long()
    keep = src < dst
    src, dst = src[keep], dst[keep]
    u = shift_right(mix64(src * n + dst + derive_seed("edge_targets", cfg.seed) % (1 << 62)), 11).double() / 2.0**53
    pick = u < SYNTHETIC_FRACTION
    src, dst = src[pick].numpy(), dst[pick].numpy()
    y = graph.y.numpy()
    label = (y[src] == y[dst]).astype(np.int64)
    return np.stack([src, dst]), label, seeded_split(src, dst, n, cfg), None


def files_targets(cfg: DatasetConfig, graph) -> tuple[np.ndarray, np.ndarray, dict, None]:
    from hpcgnn.data.files import DatasetFileError, files_folder, read_array

    folder = files_folder(cfg)
    try:
        _, index = read_array(folder, "edge_label_index")
        _, label = read_array(folder, "edge_label")
    except DatasetFileError as exc:
        raise DatasetFileError(f"{exc} (task=edge reads its targets from edge_label_index [2, M] and edge_label [M] "
                               "or [M, C])") from None
    index = _index_array(index, f"{folder}/edge_label_index")
    return index, np.asarray(label), _folder_splits(cfg, folder, index, graph.num_nodes), None  # (pairs: no own)


def _folder_splits(cfg: DatasetConfig, folder, index: np.ndarray, num_nodes: int) -> dict[str, np.ndarray]:
    """The targets' splits a folder gives (``edge_train_idx``, ``edge_val_idx``, ``edge_test_idx``: all or none),
    else a seeded split of ``index`` (``num_nodes``: what it hashes pairs by)."""
    from hpcgnn.data.files import read_array

    names = [f"edge_{s}_idx" for s in SPLITS]
    given = [any((folder / f"{name}{suffix}").is_file() for suffix in (".npy", ".pt")) for name in names]
    if any(given) and not all(given):
        missing = [name for name, g in zip(names, given, strict=True) if not g]
        raise DatasetError(f"{folder}: give all of {', '.join(names)} or none (a seeded split by dataset.edge_split); "
                           f"{', '.join(missing)} missing")
    if all(given):
        return {s: np.asarray(read_array(folder, f"edge_{s}_idx")[1]) for s in SPLITS}
    return seeded_split(index[0], index[1], num_nodes, cfg)


def typed_files_targets(cfg: DatasetConfig, graph) -> tuple[np.ndarray, np.ndarray, dict, tuple[str, str, str],
                                                      np.ndarray | None]:
    """A typed folder's targets: the edges of its one relation whose folder holds ``edge_label`` (and their own
    features, where the relation's edges have some)."""
    from hpcgnn.data.files import files_folder, has_edge_features, labelled_relation, read_array

    edges_dir = files_folder(cfg) / "edges"
    rel = labelled_relation(edges_dir, sorted(p.name for p in edges_dir.iterdir() if p.is_dir()))
    folder = edges_dir / "__".join(rel)
    index = _index_array(read_array(folder, "edge_index")[1], f"{folder}/edge_index")
    label = np.asarray(read_array(folder, "edge_label")[1])
    own = read_array(folder, "edge_attr", mmap=True)[1] if has_edge_features(folder) else None
    n = max(graph.num_nodes[rel[0]], graph.num_nodes[rel[2]])
    return index, label, _folder_splits(cfg, folder, index, n), rel, own


def typed_pyg_targets(cfg: DatasetConfig, graph) -> tuple[np.ndarray, np.ndarray, dict, tuple[str, str, str],
                                                    np.ndarray | None]:
    """A ``HeteroData``'s targets: its one relation with ``edge_label`` (:func:`pyg_targets` on that relation's store)."""
    from hpcgnn.data.pyg import labelled_relation, pyg_data

    data = pyg_data(cfg)
    rel = labelled_relation(cfg, data)
    n = max(graph.num_nodes[rel[0]], graph.num_nodes[rel[2]])
    index, label, splits, own = pyg_targets(cfg, graph, data[rel], f"dataset=pyg_hetero ({cfg._target_}, {'__'.join(rel)})", n)
    return index, label, splits, rel, own


def pyg_targets(cfg: DatasetConfig, graph, data=None, where: str | None = None,
         num_nodes: int | None = None) -> tuple[np.ndarray, np.ndarray, dict, np.ndarray | None]:
    """A ``Data``'s targets (``data``: a store of one, a ``HeteroData`` relation's; ``num_nodes``: what the
    seeded split hashes pairs by), and their own edge features where they are its edges (``edge_label`` one per
    edge of ``edge_index``, which has ``edge_attr``)."""
    from hpcgnn.data.pyg import edge_features, pyg_data

    data = pyg_data(cfg) if data is None else data
    where = where or f"dataset=pyg ({cfg._target_})"
    label = getattr(data, "edge_label", None)
    if label is None:
        raise DatasetError(f"{where}: task=edge needs data.edge_label (with data.edge_label_index, or one per edge of "
                           "data.edge_index). HINT: a Data with edge labels, or task=node / task=link")
    index = getattr(data, "edge_label_index", None)
    own = edge_features(cfg, data) if index is None else None  # (its edges: their own features, if any)
    index = _index_array((index if index is not None else data.edge_index).numpy(), f"{where}: edge_label_index")
    splits = {}
    for s in SPLITS:
        mask, ids = getattr(data, f"edge_{s}_mask", None), getattr(data, f"edge_{s}_idx", None)
        if mask is not None:
            mask = mask.numpy()
            splits[s] = (mask[:, cfg.split_index] if mask.ndim == 2 else mask).nonzero()[0]
        elif ids is not None:
            splits[s] = ids.numpy()
    if len(splits) not in (0, len(SPLITS)):
        raise DatasetError(f"{where}: give every split of the edge labels (edge_train_mask, edge_val_mask, "
                           "edge_test_mask, or edge_*_idx) or none (a seeded split by dataset.edge_split)")
    if not splits:
        splits = seeded_split(index[0], index[1], graph.num_nodes if num_nodes is None else num_nodes, cfg)
    return index, label.numpy(), splits, None if own is None else own.numpy()


def _index_array(index: np.ndarray, where: str) -> np.ndarray:
    index = np.asarray(index)
    if index.ndim != 2 or index.shape[0] != 2 or not np.issubdtype(index.dtype, np.integer):
        raise DatasetError(f"{where}: target edges must be integers of shape [2, M] (source, target), got "
                           f"{index.dtype} {tuple(index.shape)}")
    return index.astype(np.int64, copy=False)


def _check_index(index: np.ndarray, sizes: tuple[int, int], where: str, relation=None) -> None:
    """Target ends within the graph's nodes (``sizes``: the sources' and the targets' counts; a typed ``relation``'s:
    its two types')."""
    if index.shape[1] == 0:
        raise DatasetError(f"{where}: no target edges. HINT: give the edges to classify or regress")
    rows = [(index, sizes[0], "the graph's nodes")] if relation is None else \
        [(index[k], sizes[k], f"the {relation[2 * k]} nodes, its {end}s") for k, end in enumerate(("source", "target"))]
    for ids, n, what in rows:
        if ids.min() < 0 or ids.max() >= n:
            raise DatasetError(f"{where}: node ids must be in [0, {n}) ({what}), got [{ids.min()}, {ids.max()}]")


def _check_split(ids: np.ndarray, count: int, where: str) -> np.ndarray:
    if ids.dtype == np.bool_ or not (ids.ndim == 1 and (ids.size == 0 or np.issubdtype(ids.dtype, np.integer))):
        raise DatasetError(f"{where}: a split must be a 1-D array of target ids, got {ids.dtype} {tuple(ids.shape)}")
    ids = ids.astype(np.int64, copy=False)
    if ids.size and (ids.min() < 0 or ids.max() >= count):
        raise DatasetError(f"{where}: target ids must be in [0, {count}) (rows of edge_label_index), got "
                           f"[{ids.min()}, {ids.max()}]")
    return ids
