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
  seeded negative per validation and test positive (a node that is no neighbour of the
  source anywhere in the graph);
- ``ogbl-collab``, ``ogbl-citation2``: OGB's raw files through ``ogb.io``'s readers and the
  official split files (see :mod:`hpcgnn.data.ogb`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from hpcgnn.checks import check_fractions
from hpcgnn.data.graph import Graph
from hpcgnn.errors import ConfigError
from hpcgnn.rng import generator

SPLITS = ("train", "val", "test")


@dataclass(frozen=True)
class LinkSplit:
    pos: Tensor  # int64 [2, E]: (source, target) edges to predict
    neg: Tensor | None = None  # int64 [2, M] ("pairs") or [E, K] ("targets"); None for training
    neg_kind: str = "none"  # pairs | targets | none


@dataclass(frozen=True)
class LinkData:
    graph: Graph  # message passing: the training edges only
    train: LinkSplit
    val: LinkSplit
    test: LinkSplit
    metric: str  # what selects the best epoch: auc | hits@K | mrr

    def split(self, name: str) -> LinkSplit:
        return getattr(self, name)


def message_passing_graph(edge_index: Tensor, num_nodes: int, x: Tensor) -> Graph:
    """A Graph of ``edge_index`` and features only: no labels, no node splits (a link task's graph)."""
    empty = torch.empty(0, dtype=torch.long)
    return Graph.from_edge_index(edge_index, num_nodes, x, empty, empty, empty, empty, 0)


def edge_keys(graph: Graph) -> Tensor:
    """Sorted int64 keys ``target * n + source`` of every edge (the CSR's own order)."""
    n = graph.num_nodes
    return torch.repeat_interleave(torch.arange(n), graph.degree()) * n + graph.col


def has_edge(keys: Tensor, num_nodes: int, src: Tensor, dst: Tensor) -> Tensor:
    """bool: is ``src -> dst`` in the graph whose :func:`edge_keys` are ``keys``."""
    k = dst * num_nodes + src
    pos = torch.searchsorted(keys, k).clamp(max=max(keys.numel() - 1, 0))
    return keys[pos] == k if keys.numel() else torch.zeros_like(k, dtype=torch.bool)


def seeded_negatives(src: Tensor, keys: Tensor, num_nodes: int, gen: torch.Generator, rounds: int = 100) -> Tensor:
    """One target per source, uniform among nodes that are neither the source nor a neighbour of it
    (in either direction, in the whole graph). Raises when a source has (almost) no non-neighbour."""
    dst = torch.randint(num_nodes, (src.numel(),), generator=gen)
    for _ in range(rounds):
        bad = (dst == src) | has_edge(keys, num_nodes, src, dst) | has_edge(keys, num_nodes, dst, src)
        if not bool(bad.any()):
            return dst
        dst[bad] = torch.randint(num_nodes, (int(bad.sum()),), generator=gen)
    raise ConfigError(f"could not draw negatives for {int(bad.sum())} sources in {rounds} rounds: the graph is "
                      "too dense for link prediction with sampled negatives")


def split_edges(graph: Graph, fractions: tuple[float, ...], seed: int) -> LinkData:
    """A seeded random train/val/test split of ``graph``'s edges for link prediction.

    Edges are split as unordered pairs, so both directions of an undirected edge land on the
    same side; the message-passing graph keeps every training edge in the directions the
    graph has it. Self-loops stay in message passing and are never predicted. One negative
    per validation and test positive, drawn once with the seed.
    """
    check_fractions(fractions)
    n = graph.num_nodes
    ei = graph.edge_index()
    src, dst = ei
    loops = src == dst
    lo, hi = torch.minimum(src, dst), torch.maximum(src, dst)
    pair, inverse = torch.unique(lo * n + hi, return_inverse=True)
    first = torch.full((pair.numel(),), ei.size(1), dtype=torch.long).scatter_reduce_(
        0, inverse, torch.arange(ei.size(1)), "amin")  # one directed edge of every pair
    gen = generator(seed, "edge_split")
    order = torch.randperm(pair.numel(), generator=gen)
    side = torch.zeros(pair.numel(), dtype=torch.long)
    cut = torch.tensor([0.0, *fractions]).cumsum(0)[1:3] * pair.numel()
    n_train, n_val = int(cut[0]), int(cut[1]) - int(cut[0])
    side[order[n_train:n_train + n_val]] = 1
    side[order[n_train + n_val:]] = 2
    is_loop_pair = torch.zeros(pair.numel(), dtype=torch.bool)
    is_loop_pair[inverse[loops]] = True
    side[is_loop_pair] = 0  # self-loops: message passing only
    in_train = side[inverse] == 0
    mp = message_passing_graph(ei[:, in_train], n, graph.x)
    keys = edge_keys(graph)
    splits = {}
    for k, name in enumerate(SPLITS):
        mine = (side == k) & ~is_loop_pair
        pos = ei[:, first[mine]]
        if name == "train":
            splits[name] = LinkSplit(pos)
        else:
            neg_dst = seeded_negatives(pos[0], keys, n, generator(seed, "edge_split_negatives", name))
            splits[name] = LinkSplit(pos, torch.stack([pos[0], neg_dst]), "pairs")
    return LinkData(mp, splits["train"], splits["val"], splits["test"], metric="auc")


def without_edges(graph: Graph, pairs: Tensor) -> Graph:
    """``graph`` without the edges ``pairs`` [2, P] in either direction (kept out of message passing)."""
    n = graph.num_nodes
    if pairs.numel() == 0:
        return graph
    drop = torch.cat([pairs[1] * n + pairs[0], pairs[0] * n + pairs[1]])
    keys = edge_keys(graph)
    keep = ~torch.isin(keys, drop)
    if bool(keep.all()):
        return graph
    ei = graph.edge_index()[:, keep]
    return message_passing_graph(ei, n, graph.x)


# ---------------------------------------------------------------------------------- the cache


def link_arrays(data: LinkData) -> tuple[dict[str, Tensor], dict]:
    """The splits as named arrays and meta fields, to keep beside the prepared graph."""
    arrays, kinds = {}, {}
    for name in SPLITS:
        s = data.split(name)
        arrays[f"{name}_pos"] = s.pos.contiguous()
        if s.neg is not None:
            arrays[f"{name}_neg"] = s.neg.contiguous()
        kinds[name] = s.neg_kind
    return arrays, {"link": {"metric": data.metric, "neg_kind": kinds}}


def from_arrays(graph: Graph, arrays: dict[str, Tensor], meta: dict) -> LinkData:
    link = meta["link"]
    splits = {name: LinkSplit(arrays[f"{name}_pos"], arrays.get(f"{name}_neg"), link["neg_kind"][name])
              for name in SPLITS}
    return LinkData(graph, splits["train"], splits["val"], splits["test"], link["metric"])
