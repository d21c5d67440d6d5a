"""Samplers beside per-node neighbour sampling: GraphSAINT, Cluster-GCN, LADIES, and edge budgets.

Subgraph samplers (GraphSAINT's node, edge and random-walk samplers, Cluster-GCN) draw
one node set per step and train on the subgraph it induces, every layer on every
node. Their batches put the subgraph's *training* nodes first (``batch_size`` of them,
the loss targets) and carry no per-hop counts, so the model runs its full forward.

GraphSAINT's loss normalisation: node ``v`` lands in a subgraph with probability
``lambda_v``; weighting its loss by ``1 / (lambda_v * num_train)`` makes the sum over a
subgraph's training nodes an unbiased estimate of the mean training loss (GraphSAINT,
Zeng et al., ICLR 2020). ``lambda`` is exact for the node and edge samplers (draws are
independent) and counted in a pre-sampling pass for random walks.

LADIES (Zou et al., NeurIPS 2019) samples a fixed number of nodes per layer among the
neighbours of the layer above, with probability proportional to the squared column norm
of the row-normalised adjacency restricted to that layer; it reuses the neighbour
sampler's bookkeeping, so its batches are layered like neighbour-sampled ones.

Nothing here allocates per-edge arrays of the whole graph: per-node arrays (8 bytes a
node) and per-batch temporaries only, so ranks sharing a node's mapped graph stay lean.
"""

from __future__ import annotations

import abc
import math

import torch
from torch import Tensor

from hpcgnn.sampling.neighbor import CSRNeighborSampler, OneBatchAtATime, SampledSubgraph, sample_neighbors

ALL = 2**62  # a fanout that keeps every neighbour


def _targets_of_edges(rowptr: Tensor, lo: int, hi: int) -> Tensor:
    """Row (target) of every edge of rows ``lo..hi``, as global ids."""
    return torch.repeat_interleave(torch.arange(lo, hi), rowptr[lo + 1:hi + 1] - rowptr[lo:hi])


def neighbour_sum(rowptr: Tensor, col: Tensor, values: Tensor, chunk: int = 1 << 20) -> Tensor:
    """``out[v] = sum of values[u]`` over in-neighbours ``u`` of ``v`` (float64), in row chunks.

    ``col`` may hold ids of a larger graph than ``rowptr``'s rows (a rank's parts):
    ``values`` is indexed by those ids.
    """
    n = rowptr.numel() - 1
    out = torch.zeros(n, dtype=torch.float64)
    for lo in range(0, n, chunk):
        hi = min(lo + chunk, n)
        out.index_add_(0, _targets_of_edges(rowptr, lo, hi), values.double().index_select(0, col[rowptr[lo]:rowptr[hi]]))
    return out


def scatter_to_sources(rowptr: Tensor, col: Tensor, per_edge, chunk: int = 1 << 20) -> Tensor:
    """``out[u] = sum over edges (u -> v) of per_edge(v_targets, u_sources)``, in row chunks (float64)."""
    n = rowptr.numel() - 1
    out = torch.zeros(n, dtype=torch.float64)
    for lo in range(0, n, chunk):
        hi = min(lo + chunk, n)
        dst = _targets_of_edges(rowptr, lo, hi)
        src = col[rowptr[lo]:rowptr[hi]].long()
        out.index_add_(0, src, per_edge(dst, src))
    return out


def induced_subgraph(rowptr: Tensor, col: Tensor, nodes: Tensor, local: Tensor,
                     eid: bool = False) -> tuple[Tensor, Tensor | None]:
    """Edges among ``nodes`` as ``[2, E]`` (source, target) in positions of ``nodes``, and (``eid``) each one's
    position in the CSR (where its features are; else None).

    ``local``: a ``-1``-filled scratch map of the graph's size, left as it was found.
    """
    row, nbr, *e = sample_neighbors(rowptr, col, nodes, ALL, eid=eid)
    local[nodes] = torch.arange(nodes.numel())
    try:
        src = local.index_select(0, nbr)
    finally:
        local[nodes] = -1
    keep = src >= 0
    return torch.stack([src[keep], row[keep]]), e[0][keep] if eid else None


class SubgraphSampler(abc.ABC):
    """Base of the samplers that train on an induced subgraph: training nodes first, weighted loss.

    ``sample(items, generator)``: ``items`` is this step's share of the epoch schedule
    (walk roots, cluster ids; ignored by the node and edge samplers, which draw afresh).
    """

    normalized = True  # the batch's loss is the weighted sum over its training nodes
    edge_ids = False  # each batch says which CSR edges it holds (e_id: where their features are)

    def __init__(self, rowptr: Tensor, col: Tensor, train_idx: Tensor):
        self.rowptr, self.col = rowptr, col
        n = rowptr.numel() - 1
        self.is_train = torch.zeros(n, dtype=torch.bool)
        self.is_train[train_idx] = True
        self.num_train = train_idx.numel()
        self._local = torch.full((n,), -1, dtype=torch.long)
        self.inclusion: Tensor | None = None  # lambda_v: probability that v is in a step's subgraph
        self._guard = OneBatchAtATime()

    @property
    def device(self) -> torch.device:  # (hpcgnn.sampling.protocol)
        return self.rowptr.device

    @abc.abstractmethod
    def nodes(self, items: Tensor, generator: torch.Generator | None) -> Tensor:
        """Global ids of the step's node set (repeats allowed)."""

    def sample(self, items: Tensor, generator: torch.Generator | None = None) -> SampledSubgraph:
        """The step's induced subgraph, one at a time (:class:`OneBatchAtATime`)."""
        with self._guard:
            return self._walk(items, generator)

    def _walk(self, items: Tensor, generator: torch.Generator | None) -> SampledSubgraph:
        nodes = torch.unique(self.nodes(items, generator))
        train = self.is_train[nodes]
        nodes = torch.cat([nodes[train], nodes[~train]])  # loss targets first
        num_targets = int(train.sum())
        edge_index, e_id = induced_subgraph(self.rowptr, self.col, nodes, self._local, self.edge_ids)
        weight = None
        if self.normalized:
            weight = 1.0 / (self.inclusion[nodes[:num_targets]].clamp(min=1e-12) * self.num_train)
            weight = weight.float()
        return SampledSubgraph(nodes, edge_index, num_targets, node_weight=weight, e_id=e_id)


def _draw(cdf: Tensor, count: int, generator: torch.Generator | None) -> Tensor:
    """``count`` independent draws of indices with probability proportional to the steps of ``cdf``."""
    u = torch.rand(count, generator=generator, dtype=torch.float64) * cdf[-1]
    return torch.searchsorted(cdf, u, right=True).clamp(max=cdf.numel() - 1)


class SaintNodeSampler(SubgraphSampler):
    """GraphSAINT's node sampler: ``draws`` nodes with replacement, P(v) ~ ||A[:, v]||^2 (A row-normalised)."""

    def __init__(self, rowptr: Tensor, col: Tensor, train_idx: Tensor, draws: int):
        super().__init__(rowptr, col, train_idx)
        deg = (rowptr[1:] - rowptr[:-1]).double().clamp(min=1)
        # A[v, u] = 1 / deg(v) for u an in-neighbour of v: column u's squared norm sums 1/deg(v)^2.
        weight = scatter_to_sources(rowptr, col, lambda dst, src: deg.index_select(0, dst).pow(-2))
        weight += 1e-12 * float(weight.max()) if weight.numel() else 0.0  # nodes without out-edges: rarely drawn
        self.draws = draws
        self.cdf = torch.cumsum(weight, 0)
        p = weight / self.cdf[-1]
        self.inclusion = -torch.expm1(draws * torch.log1p(-p.clamp(max=1 - 1e-12)))  # 1 - (1 - p)^draws

    def nodes(self, items: Tensor, generator: torch.Generator | None) -> Tensor:
        return _draw(self.cdf, self.draws, generator)


class SaintEdgeSampler(SubgraphSampler):
    """GraphSAINT's edge sampler: ``draws`` edges with replacement, P(u -> v) ~ 1/deg(u) + 1/deg(v).

    Drawn in two stages, target ``v`` by its row's total weight, then the source within
    the row, so no per-edge table of the whole graph is ever built.
    """

    def __init__(self, rowptr: Tensor, col: Tensor, train_idx: Tensor, draws: int):
        super().__init__(rowptr, col, train_idx)
        deg = (rowptr[1:] - rowptr[:-1]).double()
        self.inv_deg = inv = 1.0 / deg.clamp(min=1)
        # Row weight of v: sum over its in-edges of 1/deg(v) + 1/deg(u) = [deg(v) > 0] + sum_u 1/deg(u).
        row_weight = (deg > 0).double() + neighbour_sum(rowptr, col, inv)
        self.draws = draws
        self.cdf = torch.cumsum(row_weight, 0)
        total = self.cdf[-1]
        # P(a draw touches v) = P(v is the target) + P(v is the source).
        as_source = scatter_to_sources(rowptr, col, lambda dst, src: inv.index_select(0, dst) + inv.index_select(0, src))
        q = ((row_weight + as_source) / total).clamp(max=1 - 1e-12)
        self.inclusion = -torch.expm1(draws * torch.log1p(-q))

    def nodes(self, items: Tensor, generator: torch.Generator | None) -> Tensor:
        v = _draw(self.cdf, self.draws, generator)
        deg = self.rowptr.index_select(0, v + 1) - self.rowptr.index_select(0, v)
        v, deg = v[deg > 0], deg[deg > 0]
        row, nbr = sample_neighbors(self.rowptr, self.col, v, ALL)
        # Inverse CDF inside each drawn row, over one running sum of all their edges' weights.
        w = self.inv_deg.index_select(0, nbr) + self.inv_deg.index_select(0, v).index_select(0, row)
        cs = torch.cumsum(w, 0)
        end = torch.cumsum(deg, 0)
        before = torch.cat([cs.new_zeros(1), cs])[end - deg]
        u = torch.rand(v.numel(), generator=generator, dtype=torch.float64)
        pick = torch.minimum(torch.searchsorted(cs, before + u * (cs[end - 1] - before), right=True), end - 1)
        return torch.cat([v, nbr.index_select(0, pick)])


class SaintWalkSampler(SubgraphSampler):
    """GraphSAINT's random-walk sampler: one walk of ``walk_length`` steps from every root."""

    def __init__(self, rowptr: Tensor, col: Tensor, train_idx: Tensor, walk_length: int):
        super().__init__(rowptr, col, train_idx)
        self.walk_length = walk_length

    def nodes(self, items: Tensor, generator: torch.Generator | None) -> Tensor:
        return self.walk(items.long(), generator).reshape(-1)

    def walk(self, roots: Tensor, generator: torch.Generator | None) -> Tensor:
        """``[walk_length + 1, len(roots)]`` visited nodes; a node without in-neighbours stays put."""
        steps = [roots]
        cur = roots
        for _ in range(self.walk_length):
            start = self.rowptr.index_select(0, cur)
            deg = self.rowptr.index_select(0, cur + 1) - start
            u = torch.rand(cur.numel(), generator=generator, dtype=torch.float64)
            off = (u * deg.double()).long().clamp(max=(deg - 1).clamp(min=0))
            nxt = self.col.index_select(0, (start + off).clamp(max=max(self.col.numel() - 1, 0))).long()
            cur = torch.where(deg > 0, nxt, cur)
            steps.append(cur)
        return torch.stack(steps)

    def count_inclusion(self, roots_per_step: int, num_steps: int, generator: torch.Generator) -> Tensor:
        """How many of ``num_steps`` simulated steps (``roots_per_step`` distinct training nodes as
        roots, as in training) hold each node: summed over ranks and divided by the steps, it
        estimates lambda."""
        n = self.rowptr.numel() - 1
        counts = torch.zeros(n, dtype=torch.float64)
        train = self.is_train.nonzero().flatten()
        roots_per_step = min(roots_per_step, train.numel())
        chunk = max(1, min(64, 2**22 // max(train.numel(), 1)))
        for lo in range(0, num_steps, chunk):
            k = min(chunk, num_steps - lo)
            pick = torch.rand(k, train.numel(), generator=generator).argsort(1)[:, :roots_per_step]
            roots = train[pick.reshape(-1)]
            visited = self.walk(roots, generator)  # [L + 1, k * r]
            step = torch.arange(k).repeat_interleave(roots_per_step).expand_as(visited)
            present = torch.unique(step.reshape(-1) * n + visited.reshape(-1)) % n  # once per step and node
            counts.index_add_(0, present, torch.ones(present.numel(), dtype=torch.float64))
        return counts


class ClusterSampler(SubgraphSampler):
    """Cluster-GCN: a step trains on the subgraph induced by a few METIS clusters.

    ``cluster``: int [num_nodes], each node's cluster. Items are cluster ids. The loss is
    the plain mean over the subgraph's training nodes (clusters are balanced in them).
    """

    normalized = False

    def __init__(self, rowptr: Tensor, col: Tensor, train_idx: Tensor, cluster: Tensor):
        super().__init__(rowptr, col, train_idx)
        cluster = cluster.long()
        self.num_clusters = int(cluster.max()) + 1 if cluster.numel() else 0
        self.order = torch.argsort(cluster, stable=True)
        self.ptr = torch.zeros(self.num_clusters + 1, dtype=torch.long)
        self.ptr[1:] = torch.cumsum(torch.bincount(cluster, minlength=self.num_clusters), 0)

    def nodes(self, items: Tensor, generator: torch.Generator | None) -> Tensor:
        # ptr/order are a CSR from clusters to their nodes: a cluster's "neighbours" are its members.
        return sample_neighbors(self.ptr, self.order, items.long(), ALL)[1]


class LadiesSampler(CSRNeighborSampler):
    """LADIES: per layer, ``fanout x seeds`` nodes drawn without replacement among the neighbours
    of the layer above, with probability ~ sum over its targets t of 1/deg(t)^2.

    Layers are the neighbour sampler's hops (new nodes are expanded next), so PyG's
    ``trim_to_layer`` applies. Aggregation is the model's own (a mean for GraphSAGE) over
    the neighbours that were drawn.
    """

    def begin_batch(self) -> None:
        self._num_seeds = None  # the first hop's frontier: the seeds (set inside the sampler's guard)

    def hop(self, frontier: Tensor, fanout: int, generator: torch.Generator | None, eid: bool = False) -> tuple:
        if self._num_seeds is None:
            self._num_seeds = frontier.numel()
        row, nbr, *e = drawn = sample_neighbors(self.rowptr, self.col, frontier, ALL, eid=eid)
        if nbr.numel() == 0:
            return drawn
        cand, inverse = torch.unique(nbr, return_inverse=True)
        size = fanout * self._num_seeds
        if size >= cand.numel():
            return drawn
        deg = (self.rowptr.index_select(0, frontier + 1) - self.rowptr.index_select(0, frontier)).double()
        importance = torch.zeros(cand.numel(), dtype=torch.float64).index_add_(
            0, inverse, deg.index_select(0, row).pow(-2))
        # Gumbel top-k: `size` distinct candidates, each step's draw proportional to importance.
        u = torch.rand(cand.numel(), generator=generator, dtype=torch.float64).clamp(min=1e-300)
        keys = importance.log() - torch.log(-torch.log(u))
        chosen = torch.zeros(cand.numel(), dtype=torch.bool)
        chosen[torch.topk(keys, size).indices] = True
        keep = chosen.index_select(0, inverse)
        return (row[keep], nbr[keep], e[0][keep]) if eid else (row[keep], nbr[keep])


# --------------------------------------------------------------------------- edge budgets


def expected_edges(rowptr: Tensor, col: Tensor, fanouts: tuple[int, ...]) -> Tensor:
    """float32 [num_nodes]: edges neighbour sampling is expected to draw for a seed, all hops.

    ``e_L = 0``; ``e_h(v) = min(deg v, f_h) * (1 + mean over in-neighbours u of e_{h+1}(u))``:
    exact without repeated nodes, an upper estimate with them.
    """
    deg = (rowptr[1:] - rowptr[:-1]).double()
    cost = torch.zeros(deg.numel(), dtype=torch.float64)
    for fanout in reversed(fanouts):
        cost = deg.clamp(max=fanout) * (1 + neighbour_sum(rowptr, col, cost) / deg.clamp(min=1))
    return cost.float()


def expected_edges_of_rows(rowptr: Tensor, col: Tensor, degree: Tensor, fanouts: tuple[int, ...]) -> Tensor:
    """float32 [rows]: :func:`expected_edges` for the rows a rank holds (a partitioned graph).

    ``col`` holds global ids and ``degree`` every node's in-degree; the rank does not hold
    its neighbours' neighbours, so hops beyond the second use the degree-weighted mean of
    the cost (a neighbour is reached in proportion to its degree). Exact for two hops.
    """
    deg = degree.double()
    mean_deeper = 0.0
    for fanout in reversed(fanouts[2:]):
        cost = deg.clamp(max=fanout) * (1 + mean_deeper)
        mean_deeper = float((deg * cost).sum() / deg.sum().clamp(min=1))
    hop1 = deg.clamp(max=fanouts[1]) * (1 + mean_deeper) if len(fanouts) > 1 else torch.zeros_like(deg)
    row_deg = (rowptr[1:] - rowptr[:-1]).double()
    return (row_deg.clamp(max=fanouts[0]) * (1 + neighbour_sum(rowptr, col, hop1) / row_deg.clamp(min=1))).float()


def split_by_cost(seeds: Tensor, cost: Tensor, num_batches: int) -> list[Tensor]:
    """``seeds`` cut in order into ``num_batches`` non-empty batches of about equal total ``cost``."""
    n = seeds.numel()
    if not 1 <= num_batches <= n:
        raise ValueError(f"cannot cut {n} seeds into {num_batches} non-empty batches")
    cs = torch.cumsum(cost.double(), 0)
    targets = cs[-1] * torch.arange(1, num_batches, dtype=torch.float64) / num_batches
    ends = torch.searchsorted(cs, targets, right=True) + 1  # batch i ends after the seed crossing its share
    # Strictly increasing and leaving one seed for every later batch.
    i = torch.arange(1, num_batches)
    ends = torch.cummax(ends - i, 0).values + i
    ends = torch.minimum(ends, n - num_batches + i)
    sizes = torch.diff(torch.cat([torch.zeros(1, dtype=torch.long), ends, torch.tensor([n])]))
    return list(seeds.split(sizes.tolist()))


def batches_for_budget(total_cost: float, world_size: int, budget: int, seeds_per_rank: int) -> int:
    """Steps per epoch so that a rank's batch costs about ``budget`` edges (at most one per seed)."""
    return max(1, min(seeds_per_rank, math.ceil(total_cost / (world_size * budget))))
