"""The node -> part map: METIS (pymetis, fixed seed: byte-identical across runs), the lp partitioner or random,
balancing training nodes (and a typed graph's node types) as well as nodes; what it costs in memory.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from hpcgnn.data import cache
from hpcgnn.data.graph import Graph
from hpcgnn.errors import ConfigError, PartitionError
from hpcgnn.partition.multilevel import LOCAL, Comm, balance_groups
from hpcgnn.rng import generator

log = logging.getLogger(__name__)

# Peak memory of partitioning beyond the mapped graph, per directed edge: METIS itself (pymetis,
# about 66 B) plus our symmetry check; benchmarks/partition.py measured 105 B at 25M edges.
METIS_BYTES_PER_EDGE = 110


METIS_BYTES_PER_NODE = 64


# ---------------------------------------------------------------------------------------------
# Computing the node -> part map


def partition_memory(method: str, num_nodes: int, num_edges: int) -> int:
    """Estimated peak bytes partitioning needs beyond the mapped graph."""
    if method == "random":
        return 16 * num_nodes
    if method == "lp":  # O(nodes) state, one chunk of edges, and the first coarse level
        from hpcgnn.partition.multilevel import memory_estimate

        return memory_estimate(num_nodes, num_edges)
    return METIS_BYTES_PER_EDGE * num_edges + METIS_BYTES_PER_NODE * num_nodes


def check_partition_memory(method: str, num_nodes: int, num_edges: int, available: int) -> None:
    need = partition_memory(method, num_nodes, num_edges)
    if need > available:
        raise PartitionError(
            f"partitioning with graph.method={method} needs about {cache.human_bytes(need)} of memory "
            f"for {num_nodes} nodes and {num_edges} directed edges, but only {cache.human_bytes(available)} "
            "are available here. HINT: use graph.method=lp (multilevel, O(nodes) memory, close to METIS's cut) or "
            "graph.method=random (no extra memory, more cut edges), or run "
            "`python -m hpcgnn.partition` on a node with more memory (e.g. +cluster=NAME cluster.mem_gb=...); "
            "set graph.partition_mem_gb if the detected amount is wrong")


def metis_adjacency(rowptr: Tensor, col: Tensor) -> tuple[np.ndarray, np.ndarray]:
    """METIS wants a symmetric adjacency without self-loops; symmetrise only when needed."""
    n = rowptr.numel() - 1
    dst = torch.repeat_interleave(torch.arange(n), rowptr[1:] - rowptr[:-1])
    src = col.long()  # (stored as int32: src * n would overflow)
    loops = src == dst
    key = dst * n + src  # sorted already: CSR rows by target, columns sorted
    rev = src * n + dst
    if not bool(loops.any()) and torch.equal(key, torch.sort(rev).values):
        return rowptr.numpy(), col.numpy()
    keep = ~loops
    both = torch.unique(torch.cat([key[keep], rev[keep]]))
    d, s = both // n, both % n
    xadj = torch.zeros(n + 1, dtype=torch.long)
    xadj[1:] = torch.cumsum(torch.bincount(d, minlength=n), 0)
    return xadj.numpy(), s.contiguous().numpy()


def seed_weight(graph: Graph, train_edges: Tensor | None = None) -> Tensor:
    """int32 [num_nodes] (a partitioning task holds it throughout): the training seeds each node brings: 1
    for a training node, or (link prediction) the training edges it is the source of. Partitions balance
    these as well as nodes."""
    if train_edges is not None:
        return torch.bincount(train_edges[0], minlength=graph.num_nodes).int()  # (a node's edges: < 2^31)
    weight = torch.zeros(graph.num_nodes, dtype=torch.int32)
    weight[graph.train_idx] = 1
    return weight


def compute_parts(graph: Graph, num_parts: int, method: str, seed: int, balance_train: bool = True,
                  weight: Tensor | None = None, node_type: Tensor | None = None, scratch: Path | None = None,
                  comm: Comm = LOCAL) -> Tensor:
    """int32 [num_nodes]: the part of every node; a pure function of its inputs.

    ``weight``: the training seeds of each node (:func:`seed_weight`; default: the training nodes).
    ``node_type``: a typed graph's type of every node (:meth:`TypedSchema.type_of`): each type is
    balanced across parts too (METIS: one constraint per type instead of one for all nodes).
    ``scratch``: where ``lp`` keeps its coarse levels (default: the system's temporary folder); ``comm``:
    the tasks ``lp`` shares its work with (their scratch folder must be one they all see).
    """
    n = graph.num_nodes
    if num_parts == 1:
        return torch.zeros(n, dtype=torch.int32)
    weight = seed_weight(graph) if weight is None else weight
    is_train = weight > 0
    if method == "lp":  # multilevel label propagation over the mapped CSR, chunk by chunk
        from hpcgnn.partition.multilevel import balance_columns, lp_parts

        group = balance_groups(node_type if node_type is not None else torch.zeros(n, dtype=torch.int8), is_train,
                               balance_train)
        part = lp_parts(graph.rowptr, graph.col, num_parts, seed, balance_columns(group, weight, balance_train),
                        scratch=scratch, comm=comm)
        log.debug("lp: parts computed; rebalancing")
        return rebalance(graph, part, group, num_parts)
    types = node_type.long() if node_type is not None else torch.zeros(n, dtype=torch.long)
    num_types = int(types.max()) + 1 if n else 1
    if method == "random":
        gen = generator(seed, "random_parts")
        part = torch.empty(n, dtype=torch.int32)
        group_of = types * 2 + is_train.long()
        for g in range(2 * num_types):  # balanced in every (type, training or not) group
            order = (group_of == g).nonzero().flatten()
            order = order[torch.randperm(order.numel(), generator=gen)]
            part[order] = (torch.arange(order.numel()) % num_parts).int()
        return part
    if method != "metis":
        raise ConfigError(f"graph.method={method!r} is unknown: use metis, lp or random")
    import pymetis

    xadj, adjncy = metis_adjacency(graph.rowptr, graph.col)
    vweights = None
    columns = [torch.nn.functional.one_hot(types, num_types)] if num_types > 1 else []  # one per node type
    if balance_train:  # a constraint per node (1: nodes, or one per type), and its training seeds
        columns = (columns or [torch.ones(n, 1, dtype=torch.long)]) + [weight.long().unsqueeze(1)]
    if columns:
        vweights = torch.cat(columns, 1).numpy().astype(np.int64).reshape(-1)
    opts = pymetis.Options(seed=seed)
    result = pymetis.part_graph(num_parts, pymetis.CSRAdjacency(xadj, adjncy), vweights=vweights, options=opts)
    part = torch.from_numpy(np.asarray(result.vertex_part, dtype=np.int32))
    if num_types > 1:  # METIS meets several constraints only loosely (14% over on a small typed graph): fix it up
        part = rebalance(graph, part, balance_groups(types, is_train, balance_train), num_parts)
    return part


def rebalance(graph: Graph, part: Tensor, group: Tensor, num_parts: int, tolerance: float = 0.03) -> Tensor:
    """Move the fewest nodes so that every group (e.g. a node type's training nodes) has at most
    ``ceil((1 + tolerance) x its mean)`` nodes in any part: from each overfull part, the group's nodes with
    the fewest neighbours at home, each to the part with room where it has the most neighbours. Deterministic."""
    part = part.clone()
    deg = graph.degree()
    for g in torch.unique(group).tolist():
        members = (group == g).nonzero().flatten()
        counts = torch.bincount(part[members].long(), minlength=num_parts)
        cap = math.ceil((1 + tolerance) * members.numel() / num_parts)
        if int(counts.max()) <= cap:
            continue
        room = (cap - counts).clamp(min=0)
        movers = []
        for p in (counts > cap).nonzero().flatten().tolist():
            here = members[part[members] == p]
            nbr_part = part.index_select(0, graph.col[csr_rows(graph.rowptr, here)[1]]).long()
            owner = torch.repeat_interleave(torch.arange(here.numel()), deg.index_select(0, here))
            home = torch.bincount(owner[nbr_part == p], minlength=here.numel())
            movers.append(here[torch.argsort(home, stable=True)[: int(counts[p]) - cap]])
        movers = torch.cat(movers)
        _rp, pos = csr_rows(graph.rowptr, movers)
        owner = torch.repeat_interleave(torch.arange(movers.numel()), deg.index_select(0, movers))
        affinity = torch.zeros(movers.numel() * num_parts, dtype=torch.long)  # neighbours in each part
        affinity.index_add_(0, owner * num_parts + part.index_select(0, graph.col[pos]).long(),
                            torch.ones_like(owner))
        affinity = affinity.view(movers.numel(), num_parts)
        left = torch.ones(movers.numel(), dtype=torch.bool)
        while bool(left.any()):  # each round fills a part with room from the movers that like it best
            open_ = room > 0
            score = affinity.masked_fill(~open_, -1).masked_fill(~left.unsqueeze(1), -1)
            best = score.argmax(1)
            p = int(torch.bincount(best[left], minlength=num_parts).argmax())
            want = (left & (best == p)).nonzero().flatten()
            want = want[torch.argsort(-affinity[want, p], stable=True)][: int(room[p])]
            part[movers[want]] = p
            room[p] -= want.numel()
            left[want] = False
    return part


def csr_rows(rowptr: Tensor, nodes: Tensor) -> tuple[Tensor, Tensor]:
    """(rowptr, positions in col) of the CSR restricted to ``nodes``."""
    start, deg = rowptr.index_select(0, nodes), rowptr.index_select(0, nodes + 1) - rowptr.index_select(0, nodes)
    sub = torch.zeros(nodes.numel() + 1, dtype=torch.long)
    sub[1:] = torch.cumsum(deg, 0)
    pos = torch.arange(int(sub[-1])) + torch.repeat_interleave(start - sub[:-1], deg)
    return sub, pos
