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
keys, sorted). Each sampled edge carries its age: its tree's time minus the edge's time (``edge_age``).
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import Tensor

import hpcgnn.kernels.ops as ops
from hpcgnn.data.graph import Timeline
from hpcgnn.sampling.neighbor import BatchIdMap, LastHop, OneBatchAtATime, SampledSubgraph, sample_neighbors

STRATEGIES = ("uniform", "last")


class TemporalSampler:
    """Samples ``fanouts[h]`` neighbours per node at hop ``h`` as of each seed's time, a tree per seed.

    ``sample(seeds, generator, times)``: ``times`` (one per seed, the timeline's dtype) default to ``seed_time[seeds]``
    (a node task's time each node's label is asked). ``window``: only edges not older than this (None: any);
    ``strict``: only edges strictly before the seed's time. Holds only references to the graph.
    """

    def __init__(self, rowptr: Tensor, timeline: Timeline, fanouts: tuple[int, ...] | list[int],
                 strategy: str = "uniform", window: float | int | None = None, strict: bool = False,
                 edge_ids: bool = False):
        if strategy not in STRATEGIES:
            raise ValueError(f"strategy {strategy!r}: use uniform or last")
        self.rowptr, self.timeline, self.fanouts = rowptr, timeline, tuple(int(f) for f in fanouts)
        self.strategy, self.strict, self.edge_ids = strategy, strict, edge_ids
        self.seed_time = timeline.seed_time
        self.window = None if window is None else torch.tensor(window, dtype=timeline.time.dtype)
        self.num_nodes = rowptr.numel() - 1
        self._local = BatchIdMap(rowptr.device)
        self._guard = OneBatchAtATime()

    @property
    def device(self) -> torch.device:  # (hpcgnn.sampling.protocol)
        return self.rowptr.device

    def sample(self, seeds: Tensor, generator: torch.Generator | None = None,
               times: Tensor | None = None) -> SampledSubgraph:
        if times is None:
            if self.seed_time is None:
                raise ValueError("a timed graph's seeds need their times: pass times, or give the graph seed times")
            times = self.seed_time.index_select(0, seeds.long())
        if times.numel() != seeds.numel():
            raise ValueError(f"{times.numel()} times for {seeds.numel()} seeds: one each")
        with self._guard:
            return self._walk(seeds.long().to(self.device), times.to(self.device, self.timeline.time.dtype),
                              generator)

    def _walk(self, seeds: Tensor, times: Tensor, generator: torch.Generator | None) -> SampledSubgraph:
        dev, n, b = self.device, self.num_nodes, seeds.numel()
        keys = torch.arange(b, device=dev).mul_(n).add_(seeds)  # a tree per seed: its key tree * n + node
        local, tl = self._local, self.timeline
        local.put(keys, torch.arange(b, device=dev))
        all_keys, sources, targets, ages, e_ids = [keys], [], [], [], []
        num_nodes, num_edges = [b], []
        frontier, first, total = keys, 0, b
        placed = LastHop(dev)
        try:
            for h, fanout in enumerate(self.fanouts):
                tree = torch.div(frontier, n, rounding_mode="floor")
                at = times.index_select(0, tree)
                bounds = ops.time_bounds(self.rowptr, tl.time, frontier - tree * n, at, self.strict, self.window,
                                         fanout if self.strategy == "last" else 0)
                rows = torch.arange(0, bounds.numel(), 2, device=dev)
                into = {"out": placed.out(sum(num_edges))} if h == len(self.fanouts) - 1 else {}
                row, nbr, pos = sample_neighbors(bounds, tl.col, rows, fanout, generator, eid=True, **into)
                nbr_keys = tree.index_select(0, row).mul_(n).add_(nbr)
                ages.append(at.index_select(0, row) - tl.time.index_select(0, pos))
                if self.edge_ids:
                    e_ids.append(tl.edge.index_select(0, pos))
                new = local.add_new([nbr_keys], total)  # sorted: deterministic local order
                sources.append(nbr_keys)
                targets.append(row.add_(first) if first else row)
                num_edges.append(nbr_keys.numel())
                num_nodes.append(new.numel())
                all_keys.append(new)
                frontier, first, total = new, total, total + new.numel()
            keys = torch.cat(all_keys)
            edge_index = placed.edge_index(targets, sources, local)
        finally:
            local.clear(None)
        tree = torch.div(keys, n, rounding_mode="floor")
        out = SampledSubgraph(keys - tree * n, edge_index, b, tuple(num_nodes), tuple(num_edges),
                              e_id=torch.cat(e_ids) if self.edge_ids else None)
        return replace(out, edge_age=torch.cat(ages), tree=tree)
