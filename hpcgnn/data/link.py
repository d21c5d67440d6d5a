"""Link-prediction datasets: the message-passing graph of training, and the edges to predict.

A link dataset is a prepared :class:`Graph` whose CSR holds the *training* edges only
(validation and test edges are never in the message-passing graph of training), plus:

- ``train``: the positive edges that seed training steps, ``[2, E]`` (source, target), one
  direction per undirected edge;
- ``val``, ``test``: positives ``[2, E]`` and their negatives, either ``pairs`` ``[2, M]``
  (scored as pairs: ROC-AUC and AP; and ranked all together for Hits@K, OGB's ogbl-collab
  convention) or ``targets`` ``[E, K]`` (K candidate targets for each positive's source,
  ranked per positive for MRR, OGB's ogbl-citation2 convention).

Sources:

- ``synthetic`` and ``files``: a seeded random split of the graph's edges
  (``dataset.edge_split``), both directions of an undirected edge on the same side, and one
  seeded negative per validation and test positive (a random pair of nodes joined by no
  edge anywhere in the graph);
- ``ogbl-collab``, ``ogbl-citation2``: OGB's raw files through ``ogb.io``'s readers and the
  official split files (see :mod:`hpcgnn.data.ogb`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import Tensor

from hpcgnn.data.graph import Graph
from hpcgnn.data.history import ARRAYS as HISTORY_ARRAYS
from hpcgnn.data.history import History, mixed_negatives
from hpcgnn.errors import ConfigError, DatasetError
from hpcgnn.rng import derive_seed, mix64, shift_right
from hpcgnn.specs.datasets import check_fractions

SPLITS = ("train", "val", "test")
SPLIT_VERSION = 3  # in the cache key: 3 draws negative pairs uniformly (2: the positive's source kept; 1: split by a permutation)
SPLIT_CHUNK_EDGES = 1 << 21  # edges per chunk of rows when a prepared graph is split out of core


@dataclass(frozen=True)
class LinkSplit:
    pos: Tensor  # int64 [2, E]: (source, target) edges to predict
    neg: Tensor | None = None  # int64 [2, M] ("pairs") or [E, K] ("targets"); None for training
    neg_kind: str = "none"  # pairs | targets | none
    time: Tensor | None = None  # [E] each positive's time (a timed graph's split: the timeline's dtype); None: none


@dataclass(frozen=True)
class LinkData:
    graph: Graph  # message passing: the training edges only
    train: LinkSplit
    val: LinkSplit
    test: LinkSplit
    metric: str  # what selects the best epoch: auc | hits@K | mrr
    history: History | None = None  # a timed graph's edges by source in time (historical negatives); None: untimed

    @property
    def timed(self) -> bool:
        """Whether the splits are chronological, each positive at its time (:func:`time_split_edges`)."""
        return self.train.time is not None

    def split(self, name: str) -> LinkSplit:
        return getattr(self, name)


def message_passing_graph(edge_index: Tensor, num_nodes: int, x: Tensor, edge_attr: Tensor | None = None) -> Graph:
    """A Graph of ``edge_index`` and features only (``edge_attr``: each edge's, kept in the CSR's order): no labels,
    no node splits (a link task's graph)."""
    empty = torch.empty(0, dtype=torch.long)
    return Graph.from_edge_index(edge_index, num_nodes, x, empty, empty, empty, empty, 0, edge_attr=edge_attr)


def edge_keys(graph: Graph) -> Tensor:
    """Sorted int64 keys ``target * n + source`` of every edge (the CSR's own order)."""
    n = graph.num_nodes
    return torch.repeat_interleave(torch.arange(n), graph.degree()) * n + graph.col


def has_edge(keys: Tensor, num_nodes: int, src: Tensor, dst: Tensor) -> Tensor:
    """bool: is ``src -> dst`` in the graph whose :func:`edge_keys` are ``keys``."""
    k = dst * num_nodes + src
    pos = torch.searchsorted(keys, k).clamp(max=max(keys.numel() - 1, 0))
    return keys[pos] == k if keys.numel() else torch.zeros_like(k, dtype=torch.bool)


def edge_sides(src: Tensor, dst: Tensor, num_nodes: int, fractions: tuple[float, ...], seed: int) -> Tensor:
    """int64: 0 (train), 1 (val) or 2 (test) for each edge, a seeded hash of its unordered pair (both
    directions on the same side); self-loops are 0 (message passing only)."""
    lo, hi = torch.minimum(src, dst), torch.maximum(src, dst)
    u = shift_right(mix64(lo * num_nodes + hi + derive_seed("edge_split", seed) % (1 << 62)), 11).double() / 2.0**53
    side = (u >= fractions[0]).long() + (u >= fractions[0] + fractions[1]).long()
    return side.masked_fill_(src == dst, 0)


def pair_negatives(src: Tensor, dst: Tensor, has_edge, num_nodes: int, salt: int, rounds: int = 100) -> Tensor:
    """One negative pair ``[2, P]`` per positive ``src -> dst``: two nodes drawn uniformly, distinct and joined by no
    edge in either direction (in the whole graph), by a seeded hash of the positive and the attempt (PyG's
    ``RandomLinkSplit`` and OGB's convention: random pairs, not the positive's source with another target, whose
    score would depend on which end of an undirected edge the split names its source). Raises when the graph
    has (almost) no non-edge."""
    key = src * num_nodes + dst + salt

    def draw(h: Tensor) -> Tensor:
        return torch.stack([shift_right(h, 1) % num_nodes, shift_right(mix64(h), 1) % num_nodes])

    neg = draw(mix64(key))
    todo = torch.arange(src.numel())
    for attempt in range(1, rounds + 1):
        a, b = neg[0, todo], neg[1, todo]
        bad = (a == b) | has_edge(a, b) | has_edge(b, a)
        todo = todo[bad]
        if todo.numel() == 0:
            return neg
        neg[:, todo] = draw(mix64(mix64(key[todo]) + attempt))
    raise ConfigError(f"could not draw negative pairs for {todo.numel()} positives in {rounds} rounds: the graph is "
                      "too dense for link prediction with sampled negatives")


def split_rows(rowptr: Tensor, col: Tensor, a: int, b: int, fractions: tuple[float, ...], seed: int,
               has_edge) -> dict[str, Tensor]:
    """The edge split of rows [a, b) of a CSR of in-edges (a chunk: the result does not depend on the
    chunking). ``mp`` [2, E]: the training edges, kept in message passing in the directions the graph has
    them, and ``mp_at`` [E]: their places in the CSR (where their features are; in order, so the message-passing
    CSR's edges are the graph's at ``mp_at`` in the same order); ``<split>_pos`` [2, P]: one direction of each
    pair (the graph's edge into the smaller id, else its only one; never a self-loop); ``val_neg``/``test_neg``
    [2, P]: one negative per positive (``pairs``)."""
    n = rowptr.numel() - 1
    e0, e1 = int(rowptr[a]), int(rowptr[b])
    src = col[e0:e1].to(torch.long, copy=True)
    dst = torch.repeat_interleave(torch.arange(a, b), rowptr[a + 1:b + 1] - rowptr[a:b], output_size=e1 - e0)
    side = edge_sides(src, dst, n, fractions, seed)
    mp = side == 0
    out = {"mp": torch.stack([src[mp], dst[mp]]), "mp_at": e0 + mp.nonzero().flatten()}
    up = dst > src  # its pair's representative only when the reverse edge is missing
    rep = dst < src
    rep[up] = ~has_edge(dst[up], src[up])
    for k, name in enumerate(SPLITS):
        m = rep & (side == k)
        out[f"{name}_pos"] = torch.stack([src[m], dst[m]])
        if name != "train":
            salt = derive_seed("edge_split_negatives", seed, name) % (1 << 62)
            out[f"{name}_neg"] = pair_negatives(src[m], dst[m], has_edge, n, salt)
    return out


def split_edges(graph: Graph, fractions: tuple[float, ...], seed: int) -> LinkData:
    """A seeded random train/val/test split of ``graph``'s edges for link prediction.

    Edges are split as unordered pairs by a seeded hash (:func:`edge_sides`), so both directions of an
    undirected edge land on the same side and the split is the same whether the graph is read whole or a
    chunk of rows at a time (the out-of-core preparation). The message-passing graph keeps every training
    edge in the directions the graph has it. Self-loops stay in message passing and are never predicted.
    One negative per validation and test positive (:func:`pair_negatives`). The training edges keep their
    features (``graph.edge_attr``).
    """
    check_fractions(fractions)
    from hpcgnn.data.graph import csr_has_edge

    parts = split_rows(graph.rowptr, graph.col, 0, graph.num_nodes, tuple(fractions), seed,
                       csr_has_edge(graph.rowptr, graph.col))
    edge_attr = graph.edge_attr.index_select(0, parts["mp_at"]) if graph.edge_attr is not None else None
    mp = message_passing_graph(parts["mp"], graph.num_nodes, graph.x, edge_attr)
    splits = {name: LinkSplit(parts[f"{name}_pos"], parts.get(f"{name}_neg"), "none" if name == "train" else "pairs")
              for name in SPLITS}
    return LinkData(mp, splits["train"], splits["val"], splits["test"], metric="auc")


def time_split_edges(graph: Graph, fractions: tuple[float, ...], cuts: tuple[float, ...] | None = None,
                     what: str = "the graph") -> LinkData:
    """A chronological split of a timed graph's edges for link prediction (TGB's): each positive at its time.

    The positives are the edges the source gave (each event once: not the reverses ``dataset.to_undirected`` adds;
    never a self-loop), in time order; those before ``cuts[0]`` train, those before ``cuts[1]`` validate, the rest
    test; without ``cuts``, the times at the ``fractions`` of the edges. Message passing keeps *every* edge: a query
    at time t is sampled strictly before t (:class:`hpcgnn.sampling.temporal.TemporalSampler`), so training sees only
    training edges, and a validation or test query every edge before it, the earlier validation and test edges too
    (the streaming protocol). Validation and test negatives are drawn at run time (:func:`with_eval_negatives`) from
    the graph's :class:`History`."""
    check_fractions(fractions)
    from hpcgnn.data.ooc import chunks

    tl, deg = graph.timeline, graph.degree()
    if tl.given is None:
        raise DatasetError(f"{what}: its prepared timeline predates link prediction (it does not say which edges were "
                           "given). HINT: delete its prepared folder under dataset.root to prepare it again")
    pairs, times = [], []
    for a, b in chunks(graph.rowptr, SPLIT_CHUNK_EDGES):
        lo, hi = int(graph.rowptr[a]), int(graph.rowptr[b])
        dst = torch.repeat_interleave(torch.arange(a, b), deg[a:b], output_size=hi - lo)
        src = tl.col[lo:hi].long()
        keep = tl.given[lo:hi] & (src != dst)
        pairs.append(torch.stack([src[keep], dst[keep]]))
        times.append(tl.time[lo:hi][keep])
    pos, time = torch.cat(pairs, 1), torch.cat(times)
    order = torch.argsort(time, stable=True)
    pos, time = pos[:, order], time.index_select(0, order)
    if cuts is None:
        at = [min(int(f * time.numel()), max(time.numel() - 1, 0)) for f in (fractions[0], fractions[0] + fractions[1])]
        cuts = tuple(time[at].tolist()) if time.numel() else (0, 0)
    side = (time >= cuts[0]).long() + (time >= cuts[1]).long()
    splits = {}
    for k, name in enumerate(SPLITS):
        m = side == k
        if not bool(m.any()):
            raise ConfigError(f"{what}: its {time.numel()} edges' times leave no {name} edges with the cut times "
                              f"{cuts[0]:g} and {cuts[1]:g}. HINT: dataset.edge_split (fractions of the edges, in "
                              "time order) or dataset.time_split=[t_val,t_test] with edges on each side")
        splits[name] = LinkSplit(pos[:, m].contiguous(), None, "none" if name == "train" else "targets",
                                 time[m].contiguous())
    return LinkData(graph, splits["train"], splits["val"], splits["test"], "mrr", History.of_graph(graph))


def with_eval_negatives(data: LinkData, k: int, seed: int) -> LinkData:
    """A chronological split's validation and test positives each with ``k`` negatives (``[P, k]``, TGB's mix: half
    destinations its source met before, the rest random; :func:`mixed_negatives`), drawn from ``seed`` alone: the
    same for every run, rank and producer of the dataset."""
    out = {}
    for name in SPLITS[1:]:
        s = data.split(name)
        gen = torch.Generator().manual_seed(derive_seed("temporal_negatives", seed, name) % (1 << 62))
        out[name] = replace(s, neg=mixed_negatives(data.history, s.pos[0], s.pos[1], s.time, k, gen))
    return replace(data, **out)


def pair_keys(pairs: Tensor, num_nodes: int) -> Tensor:
    """Keys ``target * n + source`` (:func:`edge_keys`' form) of ``pairs`` [2, P] in both directions."""
    return torch.cat([pairs[1] * num_nodes + pairs[0], pairs[0] * num_nodes + pairs[1]])


def without_edges(graph: Graph, pairs: Tensor) -> Graph:
    """``graph`` without the edges ``pairs`` [2, P] in either direction (kept out of message passing); the others
    keep their features."""
    n = graph.num_nodes
    if pairs.numel() == 0:
        return graph
    keys = edge_keys(graph)
    keep = ~torch.isin(keys, pair_keys(pairs, n))
    if bool(keep.all()):
        return graph
    ei = graph.edge_index()[:, keep]
    return message_passing_graph(ei, n, graph.x, graph.edge_attr[keep] if graph.edge_attr is not None else None)


# ---------------------------------------------------------------------------------- the cache


def link_arrays(data: LinkData) -> tuple[dict[str, Tensor], dict]:
    """The splits as named arrays and meta fields, to keep beside the prepared graph."""
    arrays, kinds = {}, {}
    for name in SPLITS:
        s = data.split(name)
        arrays[f"{name}_pos"] = s.pos.contiguous()
        if s.neg is not None:
            arrays[f"{name}_neg"] = s.neg.contiguous()
        if s.time is not None:
            arrays[f"{name}_time"] = s.time.contiguous()
        kinds[name] = s.neg_kind
    if data.history is not None:
        arrays.update(data.history.arrays())
    return arrays, link_meta(data.metric, kinds)


def link_meta(metric: str, neg_kind: dict[str, str]) -> dict:
    """The ``link`` record of a prepared link dataset's meta.json (:func:`from_arrays` reads it)."""
    return {"link": {"metric": metric, "neg_kind": neg_kind}}


def from_arrays(graph: Graph, arrays: dict[str, Tensor], meta) -> LinkData:
    link = meta.more["link"]
    splits = {name: LinkSplit(arrays[f"{name}_pos"], arrays.get(f"{name}_neg"), link["neg_kind"][name],
                              arrays.get(f"{name}_time")) for name in SPLITS}
    history = History.from_arrays(arrays) if HISTORY_ARRAYS[0] in arrays else None
    return LinkData(graph, splits["train"], splits["val"], splits["test"], link["metric"], history)
