"""Time-respecting neighbour sampling: each seed asked as of a time, and its tree holding no edge from after it.

A timed graph keeps, beside its CSR, a :class:`~hpcgnn.data.graph.Timeline`: each node's in-edges sorted by time (their sources, their
times, and each one's place in the CSR, where its features are). A hop of a node asked as of time t draws only from
the part of its list at or before t (before t when ``strict``: an edge task's own target edges), optionally only the
last ``window`` of time, and either uniformly among those (Floyd's draws, as every hop) or the most recent ``fanout``
(``strategy="last"``, PyG's ``last``). The part is found by a binary search in C (:func:`hpcgnn.kernels.ops.time_bounds`)
and drawn from as rows of a CSR by the one hop kernel every sampler uses, so a machine without the kernels draws
the same edges by their torch twins.

Seeds with different times have different pasts: every seed grows a tree of its own (pyg-lib's disjoint sampling).
A node reached in two trees is two nodes of the batch; within a tree it is one. Batch-local ids follow the keys
``tree * num_nodes + node``, numbered as the neighbour sampler numbers nodes (the seeds first, then each hop's new
keys, sorted): the neighbour sampler's own walk over the keys, each hop drawn as of its trees' times. Each sampled
edge carries its age: its tree's time minus the edge's time (``edge_age``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import torch
from torch import Tensor

import hpcgnn.kernels.ops as ops
from hpcgnn.data.graph import Timeline
from hpcgnn.sampling.neighbor import CSRNeighborSampler, SampledSubgraph, sample_neighbors

STRATEGIES = ("uniform", "last")


class TemporalSampler(CSRNeighborSampler):
    """Samples ``fanouts[h]`` neighbours per node at hop ``h`` as of each seed's time, a tree per seed.

    ``sample(seeds, generator, times)``: ``times`` (one per seed, the timeline's dtype) default to ``seed_time[seeds]``
    (a node task's time each node's label is asked). ``window``: only edges not older than this (None: any);
    ``strict``: only edges strictly before the seed's time. Holds only references to the graph. The walk is the
    neighbour sampler's (:meth:`CSRNeighborSampler._walk`) over the keys ``tree * num_nodes + node``, in a map the
    size of the batch; :meth:`hop` draws as of each key's tree's time.
    """

    def __init__(self, rowptr: Tensor, timeline: Timeline, fanouts: tuple[int, ...] | list[int],
                 strategy: str = "uniform", window: float | int | None = None, strict: bool = False,
                 edge_ids: bool = False):
        if strategy not in STRATEGIES:
            raise ValueError(f"strategy {strategy!r}: use uniform or last")
        super().__init__(rowptr, timeline.col, fanouts, id_map="batch", edge_ids=edge_ids)
        self.timeline, self.seed_time = timeline, timeline.seed_time
        self.strategy, self.strict = strategy, strict
        self.window = None if window is None else torch.tensor(window, dtype=timeline.time.dtype)
        self.num_nodes = rowptr.numel() - 1
        self._times: Tensor | None = None  # the batch's seeds' times (one batch at a time: the guard's)
        self._ages: list[Tensor] = []

    def sample(self, seeds: Tensor, generator: torch.Generator | None = None,
               times: Tensor | None = None) -> SampledSubgraph:
        if times is None:
            if self.seed_time is None:
                raise ValueError("a timed graph's seeds need their times: pass times, or give the graph seed times")
            times = self.seed_time.index_select(0, seeds.long())
        if times.numel() != seeds.numel():
            raise ValueError(f"{times.numel()} times for {seeds.numel()} seeds: one each")
        n, dev = self.num_nodes, self.device
        keys = torch.arange(seeds.numel(), device=dev).mul_(n).add_(seeds.long().to(dev))  # tree * n + node
        with self._guard:
            self._times, self._ages = times.to(dev, self.timeline.time.dtype), []
            try:
                out = self._walk(keys, generator)
                ages = torch.cat(self._ages)
            finally:
                self._times, self._ages = None, []
        tree = torch.div(out.n_id, n, rounding_mode="floor")
        return replace(out, n_id=out.n_id - tree * n, edge_age=ages, tree=tree)

    def hop(self, frontier: Tensor, fanout: int, generator: torch.Generator | None,
            out: Callable[[int], tuple[Tensor, Tensor]] | None = None, eid: bool = False) -> tuple:
        """``(row, neighbour keys[, edge ids])`` of the frontier's keys, each drawn as of its tree's time; the
        edges' ages kept for the batch."""
        n, tl = self.num_nodes, self.timeline
        tree = torch.div(frontier, n, rounding_mode="floor")
        at = self._times.index_select(0, tree)
        bounds = ops.time_bounds(self.rowptr, tl.time, frontier - tree * n, at, self.strict, self.window,
                                 fanout if self.strategy == "last" else 0)
        rows = torch.arange(0, bounds.numel(), 2, device=self.device)
        row, nbr, pos = sample_neighbors(bounds, tl.col, rows, fanout, generator, out=out, eid=True)
        nbr.add_(tree.index_select(0, row).mul_(n))  # (in place: where ``out`` put them)
        self._ages.append(at.index_select(0, row) - tl.time.index_select(0, pos))
        return (row, nbr, tl.edge.index_select(0, pos)) if eid else (row, nbr)


class TableSampler:
    """Batches of a table's entries (by id; ``table``: :class:`hpcgnn.data.tables.NodeTable`): each entry's node a
    seed of its own, sampled as of the entry's time by a temporal ``node_sampler`` (a node asked at two times: two
    trees, two seeds), and the entries' labels as the batch's (``y``: the seeds' targets, not the graph's labels)."""

    def __init__(self, node_sampler: TemporalSampler, table):
        self.node_sampler, self.table = node_sampler, table

    @property
    def device(self) -> torch.device:  # (hpcgnn.sampling.protocol)
        return self.node_sampler.device

    def sample(self, items: Tensor, generator: torch.Generator | None = None) -> SampledSubgraph:
        items, t = items.long(), self.table
        out = self.node_sampler.sample(t.node.index_select(0, items), generator, t.time.index_select(0, items))
        return replace(out, targets={"y": t.label.index_select(0, items)})
