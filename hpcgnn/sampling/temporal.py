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
from hpcgnn.data.typed import Relation
from hpcgnn.sampling.distributed import PartitionedNeighborSampler
from hpcgnn.sampling.neighbor import CSRNeighborSampler, SampledSubgraph, sample_neighbors
from hpcgnn.sampling.typed import PartitionedTypedSampler, TypedNeighborSampler

STRATEGIES = ("uniform", "last")


class TreeWalk:
    """The walk as of each seed's time, a tree per seed, over keys ``tree * num_nodes + node`` (in a map the size of the
    batch): :meth:`sample` and the draw of one hop's edges as of their trees' times (:meth:`draw_as_of`); a sampler
    over a whole graph (:class:`TemporalSampler`) and one across parts (:class:`PartitionedTemporalSampler`) mix it
    into their neighbour sampler, whose walk (:meth:`CSRNeighborSampler._walk`) calls their ``hop``; each says when
    its seeds' labels are asked (``seed_times(seeds)``: None where the graph does not say)."""

    def _as_of(self, timeline: Timeline, strategy: str, window, strict: bool, num_nodes: int) -> None:
        if strategy not in STRATEGIES:
            raise ValueError(f"strategy {strategy!r}: use uniform or last")
        self.timeline, self.strategy, self.strict, self.num_nodes = timeline, strategy, strict, num_nodes
        self.window = None if window is None else torch.tensor(window, dtype=timeline.time.dtype)
        self._times: Tensor | None = None  # the batch's seeds' times (one batch at a time: the guard's)
        self._ages: list[Tensor] = []

    def sample(self, seeds: Tensor, generator: torch.Generator | None = None,
               times: Tensor | None = None) -> SampledSubgraph:
        times = times_of(seeds.long(), times, self.seed_times)
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

    def trees(self, frontier: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Each frontier key's tree, node, and time (its tree's)."""
        tree = torch.div(frontier, self.num_nodes, rounding_mode="floor")
        return tree, frontier - tree * self.num_nodes, self._times.index_select(0, tree)

    def draw_as_of(self, rowptr: Tensor, rows: Tensor, at: Tensor, fanout: int, generator: torch.Generator | None,
                   out: Callable[[int], tuple[Tensor, Tensor]] | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """:func:`draw_as_of` from the sampler's timeline, as its strategy, window and strictness say."""
        return draw_as_of(rowptr, self.timeline, rows, at, fanout, generator, self, out=out)


def times_of(seeds: Tensor, times: Tensor | None, own: Callable[[Tensor], Tensor | None]) -> Tensor:
    """The seeds' times: ``times`` as given, else their own (``own(seeds)``: when each one's label is asked), one
    per seed."""
    if times is None:
        times = own(seeds)
        if times is None:
            raise ValueError("a timed graph's seeds need their times: pass times, or give the graph seed times")
    if times.numel() != seeds.numel():
        raise ValueError(f"{times.numel()} times for {seeds.numel()} seeds: one each")
    return times


def draw_as_of(rowptr: Tensor, timeline: Timeline, rows: Tensor, at: Tensor, fanout: int,
               generator: torch.Generator | None, how, row_start: int = 0,
               out: Callable[[int], tuple[Tensor, Tensor]] | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """``(row, source, timeline position)`` of up to ``fanout`` in-edges of each of ``rows`` (of ``rowptr``, the
    timeline's rows) as of its time in ``at``: the part of its list the time bounds allow (``how``: a sampler's
    ``strategy``, ``window`` and ``strict``), drawn from as rows of a CSR by the one hop kernel (``row_start``: the
    batch-local id of ``rows[0]``, as :func:`sample_neighbors` takes it)."""
    bounds = ops.time_bounds(rowptr, timeline.time, rows, at, how.strict, how.window,
                             fanout if how.strategy == "last" else 0)
    return sample_neighbors(bounds, timeline.col, torch.arange(0, bounds.numel(), 2, device=rowptr.device), fanout,
                            generator, row_start=row_start, out=out, eid=True)


class TemporalSampler(TreeWalk, CSRNeighborSampler):
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
        super().__init__(rowptr, timeline.col, fanouts, id_map="batch", edge_ids=edge_ids)
        self._as_of(timeline, strategy, window, strict, rowptr.numel() - 1)
        self.seed_time = timeline.seed_time

    def seed_times(self, seeds: Tensor) -> Tensor | None:
        return None if self.seed_time is None else self.seed_time.index_select(0, seeds)

    def hop(self, frontier: Tensor, fanout: int, generator: torch.Generator | None,
            out: Callable[[int], tuple[Tensor, Tensor]] | None = None, eid: bool = False) -> tuple:
        """``(row, neighbour keys[, edge ids])`` of the frontier's keys, each drawn as of its tree's time; the
        edges' ages kept for the batch."""
        tl = self.timeline
        tree, node, at = self.trees(frontier)
        row, nbr, pos = self.draw_as_of(self.rowptr, node, at, fanout, generator, out)
        nbr.add_(tree.index_select(0, row).mul_(self.num_nodes))  # (in place: where ``out`` put them)
        self._ages.append(at.index_select(0, row) - tl.time.index_select(0, pos))
        return (row, nbr, tl.edge.index_select(0, pos)) if eid else (row, nbr)


class PartitionedTemporalSampler(TreeWalk, PartitionedNeighborSampler):
    """The temporal sampler across parts (``view.parts.timeline``: the rank's rows in time): a frontier key whose node
    another rank owns travels to it with its tree's time, and its owner draws as of that time from its own rows,
    sending back the edges' sources, times and ids (:meth:`PartitionedNeighborSampler.across`). Seeds are the rank's
    own nodes (their seed times are its rows'), or come with their times."""

    def __init__(self, view, fanouts, exchange, boundary_fraction: float = 1.0, edge_ids: bool = False,
                 strategy: str = "uniform", window: float | int | None = None, strict: bool = False):
        super().__init__(view, fanouts, exchange, boundary_fraction, edge_ids)
        self._as_of(view.parts.timeline, strategy, window, strict, view.parts.num_nodes)

    def seed_times(self, seeds: Tensor) -> Tensor | None:
        st = self.timeline.seed_time
        return None if st is None else st.index_select(0, self.view.row(seeds))

    def draw(self, rows: Tensor, at: Tensor | None, fanout: int, generator: torch.Generator | None, eid: bool) -> tuple:
        return self.draw_as_of(self.rowptr, rows, at, fanout, generator)

    def edge_of(self, pos: Tensor) -> Tensor:
        return self.timeline.edge.index_select(0, pos)

    def time_of(self, pos: Tensor) -> Tensor:
        return self.timeline.time.index_select(0, pos)

    def hop(self, frontier: Tensor, fanout: int, generator: torch.Generator | None, eid: bool = False) -> tuple:
        tree, node, at = self.trees(frontier)
        row, nbr, e, when = self.across(node, at, fanout, generator, eid)
        nbr.add_(tree.index_select(0, row).mul_(self.num_nodes))
        self._ages.append(at.index_select(0, row) - when)
        return (row, nbr, e) if eid else (row, nbr)


class TypedTrees:
    """The typed walk as of each seed's time, a tree per seed, over each type's keys ``tree * num_nodes[type] + node``
    (in maps the size of the batch): :meth:`sample`; a typed graph's sampler (:class:`TypedTemporalSampler`) and one
    across typed parts (:class:`PartitionedTypedTemporalSampler`) mix it into their typed walk, whose ``draw`` draws
    each relation as of its keys' trees' times (:meth:`frontier_times`, :meth:`keys_of`); each says when its target-type
    seeds' labels are asked (``seed_times(seeds)``: None where the graph does not say)."""

    def _typed_as_of(self, timelines: dict, strategy: str, window, strict: bool, num_nodes: dict[str, int]) -> None:
        if strategy not in STRATEGIES:
            raise ValueError(f"strategy {strategy!r}: use uniform or last")
        self.timelines, self.strategy, self.strict, self.num_nodes = timelines, strategy, strict, dict(num_nodes)
        self.time_dtype = next(iter(timelines.values())).time.dtype
        self.window = None if window is None else torch.tensor(window, dtype=self.time_dtype)
        self._times: Tensor | None = None  # the batch's seeds' times (one batch at a time: the guard's)
        self._ages: dict = {}

    def sample(self, seeds: Tensor | dict[str, Tensor], generator: torch.Generator | None = None,
               times: Tensor | dict[str, Tensor] | None = None):
        """The trees of ``seeds``: the target type's ids at ``times`` (default: their seed times), or type -> that
        type's ids with ``times`` type -> theirs (an edge task's two ends, each end a tree of its own: a node may be
        a seed twice, at two times); trees are numbered in the seeds' order, type after type."""
        g, dev = self.graph, self.device
        if not isinstance(seeds, dict):
            seeds = seeds.long()
            times, seeds = {g.target: times_of(seeds, times, self.seed_times)}, {g.target: seeds}
        elif not isinstance(times, dict) or set(times) != set(seeds):
            raise ValueError("seeds of several types need their times, type by type")
        keys, first = {}, 0
        for t, ids in seeds.items():
            times_of(ids, times[t], lambda _: None)
            keys[t] = torch.arange(first, first + ids.numel(), device=dev).mul_(self.num_nodes[t]).add_(
                ids.long().to(dev))
            first += ids.numel()
        with self._guard:
            self._times = torch.cat([times[t].to(dev, self.time_dtype) for t in seeds])
            self._ages = {r: [] for r in g.relations}
            try:
                out = self._walk(keys, generator)
                ages = {r: torch.cat(v) if v else self._times[:0] for r, v in self._ages.items()}
            finally:
                self._times, self._ages = None, {}
        tree = {t: torch.div(ids, self.num_nodes[t], rounding_mode="floor") for t, ids in out.n_id.items()}
        n_id = {t: ids - tree[t] * self.num_nodes[t] for t, ids in out.n_id.items()}
        return replace(out, n_id=n_id, edge_age=ages, tree=tree)

    def frontier_times(self, node_type: str, keys: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """A frontier's keys of ``node_type``: their trees, their nodes, their trees' times."""
        tree = torch.div(keys, self.num_nodes[node_type], rounding_mode="floor")
        return tree, keys - tree * self.num_nodes[node_type], self._times.index_select(0, tree)

    def keys_of(self, rel: Relation, tree: Tensor, at: Tensor, nbr: Tensor, when: Tensor) -> Tensor:
        """Sources drawn along ``rel`` into targets of trees ``tree`` at ``at`` (one each), at times ``when``: their
        keys in those trees (in place), each edge's age kept for the batch."""
        self._ages[rel].append(at - when)
        return nbr.add_(tree.mul(self.num_nodes[rel[0]]))


class TypedTemporalSampler(TypedTrees, TypedNeighborSampler):
    """The typed walk as of each seed's time (``graph.timelines``: every relation's in-edges in time), a tree per seed:
    a relation's hop draws each target key's edges as of its tree's time from the relation's timeline
    (:func:`draw_as_of`), each with its age (``edge_age``, per relation). Seeds are the target type's, at ``times``
    (default: ``graph.seed_time``), or an edge task's ends with theirs; ``strict``: edges strictly before each tree's
    time (an edge task's targets)."""

    def __init__(self, graph, fanouts, strategy: str = "uniform", window: float | int | None = None,
                 strict: bool = False, edge_ids: bool = False):
        super().__init__(graph, fanouts, id_map="batch", edge_ids=edge_ids)
        self._typed_as_of(graph.timelines, strategy, window, strict, graph.num_nodes)
        self.seed_time = graph.seed_time

    def seed_times(self, seeds: Tensor) -> Tensor | None:
        return None if self.seed_time is None else self.seed_time.index_select(0, seeds)

    def draw(self, hop: int, frontier: dict[str, tuple[Tensor, int]],
             generator: torch.Generator | None) -> list[tuple]:
        """:meth:`TypedNeighborSampler.draw` as of each frontier key's tree's time, relation by relation."""
        g, drawn = self.graph, []
        for rel in g.relations:
            fanout = self.fanouts[rel][hop]
            if rel[2] not in frontier or fanout < 1:
                continue
            keys, first = frontier[rel[2]]
            tree, node, at = self.frontier_times(rel[2], keys)
            tl = self.timelines[rel]
            row, nbr, pos = draw_as_of(g.rowptr[rel], tl, node, at, fanout, generator, self, row_start=first)
            mine = row - first
            nbr = self.keys_of(rel, tree.index_select(0, mine), at.index_select(0, mine), nbr,
                               tl.time.index_select(0, pos))
            drawn.append((rel, row, nbr, tl.edge.index_select(0, pos)) if self.edge_ids else (rel, row, nbr))
        return drawn


class PartitionedTypedTemporalSampler(TypedTrees, PartitionedTypedSampler):
    """The typed walk across parts as of each seed's time (``view.parts.typed.timelines``: the rank's rows of every
    relation in time): a frontier key whose node another rank owns travels to it with its tree's time, with its
    relation, and the owner draws as of that time from its rows of the relation, sending back the edges' sources,
    ids and times (:meth:`PartitionedTypedSampler.draw`). Seeds are the rank's own target-type nodes (their seed
    times are its rows'), or come with their times."""

    timed = True

    def __init__(self, view, fanouts, exchange, boundary_fraction: float = 1.0, edge_ids: bool = False,
                 strategy: str = "uniform", window: float | int | None = None, strict: bool = False):
        super().__init__(view, fanouts, exchange, boundary_fraction, edge_ids)
        self._typed_as_of(self.typed.timelines, strategy, window, strict, self.typed.schema.num_nodes)
        self.no_times = torch.empty(0, dtype=self.time_dtype)
        self._trees: dict[str, tuple[int, Tensor, Tensor]] = {}  # a hop's frontier type -> (first, trees, times)

    def seed_times(self, seeds: Tensor) -> Tensor | None:
        st, t = self.typed.seed_time, self.graph.target
        return None if st is None else st.index_select(0, self.view.parts.typed_rows(t, seeds + self.offsets[t]))

    def frontier_ids(self, node_type: str, nodes: Tensor, first: int) -> tuple[Tensor, Tensor]:
        tree, node, at = self.frontier_times(node_type, nodes)
        self._trees[node_type] = (first, tree, at)
        return node, at

    def _sample(self, rel: Relation, gid: Tensor, hop: int, generator, at: Tensor | None = None) -> tuple:
        tl = self.timelines[rel]
        row, nbr, pos = draw_as_of(self.typed.rowptr[rel], tl, self.view.parts.typed_rows(rel[2], gid), at,
                                   self.fanouts[rel][hop], generator, self)
        with_ids = self.edge_ids and rel in self.typed.edge_base
        eid = tl.edge.index_select(0, pos) + self.edge_base(rel) if with_ids else torch.full_like(nbr, -1)
        return row, nbr, eid, tl.time.index_select(0, pos)

    def drawn_keys(self, rel: Relation, dst: Tensor, nbr: Tensor, when: Tensor | None) -> Tensor:
        first, tree, at = self._trees[rel[2]]
        mine = dst - first  # (each edge's target: its place in the frontier)
        return self.keys_of(rel, tree.index_select(0, mine), at.index_select(0, mine), nbr, when)


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
