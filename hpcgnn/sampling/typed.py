"""Neighbour sampling on typed graphs: hop by hop, relation by relation, into PyG ``HeteroData``.

At each hop, every relation whose target type has frontier nodes samples up to its fanout of
in-neighbours per frontier node (:func:`hpcgnn.sampling.neighbor.sample_neighbors` on that
relation's CSR: vectorised, the same uniform subsets as the homogeneous sampler). New nodes are
numbered per type in the order they are first reached, sorted within a hop: the target type's
seeds first, then each hop's new nodes. Edges are grouped by hop within each relation, and the
batch carries per-type node counts and per-relation edge counts per hop, so PyG's
heterogeneous ``trim_to_layer`` can drop the outer hops layer by layer.

Randomness: relations are walked in the graph's order with one generator per batch, so a batch
is the same for the same (seed, epoch, rank, step) however it is re-made.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

import torch
from torch import Tensor

from hpcgnn.data.typed import Relation
from hpcgnn.sampling.neighbor import (
    BatchIdMap,
    DenseIdMap,
    LastHop,
    OneBatchAtATime,
    sample_neighbors,
    takes_out,
)


@dataclass(frozen=True)
class TypedSubgraph:
    """One sampled typed mini-batch, in per-type local ids."""

    n_id: dict[str, Tensor]  # node type -> type-local ids of the batch's nodes of that type; target seeds first
    edge_index: dict[Relation, Tensor]  # relation -> [2, E] (source, target) in the types' batch-local ids
    batch_size: int  # the first batch_size target-type nodes are the seeds
    num_sampled_nodes: dict[str, list[int]]  # node type -> nodes added per hop (hop 0: the seeds)
    num_sampled_edges: dict[Relation, list[int]]  # relation -> edges added per hop, hop 1 first
    e_id: dict[Relation, Tensor] | None = None  # relation -> each edge's place in its CSR (its features' row), if asked
    targets: dict | None = None  # what an edge task scores (its pairs, labels), set on the batch as they are
    edge_age: dict[Relation, Tensor] | None = None  # a timed graph's: each edge's age as of its tree's time
    tree: dict[str, Tensor] | None = None  # a timed graph's: each node's tree (its seed's place in the batch)


def relation_fanouts(relations: Sequence[Relation], fanouts: Sequence[int] | Mapping) -> dict[Relation, tuple]:
    """Per relation, the fanout of each hop: one list for every relation, or a mapping from relation
    (or its ``src__name__dst`` key) to its own list; every list has one entry per hop."""
    if not isinstance(fanouts, Mapping):
        return {r: tuple(int(f) for f in fanouts) for r in relations}
    out = {}
    for r in relations:
        value = fanouts.get(r, fanouts.get("__".join(r)))
        if value is None:
            raise ValueError(f"no fanouts for relation {'__'.join(r)}: give every relation its list")
        out[r] = tuple(int(f) for f in value)
    if len({len(v) for v in out.values()}) != 1:
        raise ValueError("every relation needs the same number of hops (one entry per GNN layer)")
    return out


class TypedNeighborSampler:
    """Samples ``fanouts[rel][h]`` in-neighbours per node along each relation at hop ``h``.

    ``graph``: a :class:`TypedGraph` (or, for a subclass that draws elsewhere, anything with its
    ``num_nodes``, ``relations`` and ``target``). The walk is here; :meth:`draw` samples one hop.
    ``edge_ids``: each batch says which edges of each relation it holds (``e_id``: where their features are).
    """

    def __init__(self, graph, fanouts: Sequence[int] | Mapping, device: torch.device | None = None,
                 id_map: str = "dense", edge_ids: bool = False):
        self.graph, self.edge_ids = graph, edge_ids
        self.fanouts = relation_fanouts(graph.relations, fanouts)
        self.num_hops = len(next(iter(self.fanouts.values()))) if self.fanouts else 0
        self.device = device = device if device is not None else graph.rowptr[graph.relations[0]].device
        # Type-local -> batch-local scratch maps, reset after every batch (one batch at a time: see self._guard).
        # (``id_map="batch"``: maps the size of the batch, for partitioned ranks; see CSRNeighborSampler)
        self._local = {t: DenseIdMap(n, device) if id_map == "dense" else BatchIdMap(device)
                       for t, n in graph.num_nodes.items()}
        self._guard = OneBatchAtATime()

    def begin_batch(self) -> None:
        """Called once per batch, before its first hop."""

    def draw(self, hop: int, frontier: dict[str, tuple[Tensor, int]], generator: torch.Generator | None,
             out: Callable[[Relation], Callable] | None = None) -> list[tuple[Relation, Tensor, Tensor]]:
        """One hop: per relation into a frontier type, (relation, targets' batch-local ids, sources' type-local
        ids[, the edges' places in the relation's CSR, with ``edge_ids``]), one entry per sampled edge.
        ``frontier``: type -> (type-local ids, the batch-local id of the first: a frontier's batch-local ids are
        one range). ``out(rel)``: :func:`sample_neighbors`' ``out`` for a relation's edges (the last hop's: views
        of its edge index)."""
        g, drawn = self.graph, []
        for rel in g.relations:
            if rel[2] not in frontier or self.fanouts[rel][hop] < 1:
                continue
            nodes, first = frontier[rel[2]]
            drawn.append((rel, *sample_neighbors(g.rowptr[rel], g.col[rel], nodes, self.fanouts[rel][hop], generator,
                                                 row_start=first, out=out(rel) if out is not None else None,
                                                 eid=self.edge_ids)))
        return drawn

    def sample(self, seeds: Tensor | dict[str, Tensor], generator: torch.Generator | None = None) -> TypedSubgraph:
        """The typed subgraph around ``seeds`` (target-type ids; or type -> that type's ids, an edge task's two
        ends), one batch at a time (:class:`OneBatchAtATime`)."""
        with self._guard:
            return self._walk(seeds, generator)

    def _walk(self, seeds: Tensor | dict[str, Tensor], generator: torch.Generator | None) -> TypedSubgraph:
        g, local = self.graph, self._local
        by_type = dict(seeds) if isinstance(seeds, dict) else {g.target: seeds}
        if any(torch.unique(s).numel() != s.numel() for s in by_type.values()):
            raise ValueError("seeds must be distinct")
        self.begin_batch()
        device = self.device
        by_type = {t: s.long().to(device) for t, s in by_type.items()}
        node_types = tuple(g.num_nodes)
        n_ids: dict[str, list[Tensor]] = {t: [] for t in node_types}
        counts = {t: [0] * (self.num_hops + 1) for t in node_types}
        total = dict.fromkeys(node_types, 0)
        sources: dict[Relation, list[Tensor]] = {r: [] for r in g.relations}
        targets: dict[Relation, list[Tensor]] = {r: [] for r in g.relations}
        e_ids: dict[Relation, list[Tensor]] = {r: [] for r in g.relations}
        num_edges = {r: [0] * self.num_hops for r in g.relations}
        frontier = {}
        for t, s in by_type.items():  # each type's seeds lead its nodes
            local[t].put(s, torch.arange(s.numel(), device=device))
            n_ids[t].append(s)
            counts[t][0] = total[t] = s.numel()
            frontier[t] = (s, 0)
        n_id: dict[str, Tensor] = {}
        lasts = {r: LastHop(device) for r in g.relations}  # each relation's last hop, sampled into its edge index
        try:
            for hop in range(self.num_hops):
                into = {"out": lambda rel: lasts[rel].out(sum(num_edges[rel]))} \
                    if hop == self.num_hops - 1 and takes_out(type(self).draw) else {}
                drawn = self.draw(hop, frontier, generator, **into)
                frontier = {}
                for t in node_types:  # number the new nodes of each type (sorted: a deterministic order)
                    found = [d[2] for d in drawn if d[0][0] == t]
                    if not found:
                        continue
                    new = local[t].add_new(found, total[t])  # sorted
                    if new.numel():
                        frontier[t] = (new, total[t])
                    total[t] += new.numel()
                    counts[t][hop + 1] = new.numel()
                    n_ids[t].append(new)
                for rel, dst_local, nbr, *e in drawn:
                    sources[rel].append(nbr)  # type-local ids: looked up once the walk is done
                    targets[rel].append(dst_local)
                    e_ids[rel].extend(e)
                    num_edges[rel][hop] += nbr.numel()
            n_id = {t: torch.cat(v) if v else torch.empty(0, dtype=torch.long, device=device) for t, v in n_ids.items()}
            edge_index = {rel: lasts[rel].edge_index(targets[rel], sources[rel], local[rel[0]]) for rel in g.relations}
        finally:  # the ids put since the last clear: the batch's (one concatenation of them, not two)
            for t, parts in n_ids.items():
                if parts:
                    local[t].clear(n_id[t] if t in n_id else torch.cat(parts))
        e_id = {r: torch.cat(v) if v else torch.empty(0, dtype=torch.long, device=device) for r, v in e_ids.items()} \
            if self.edge_ids else None
        return TypedSubgraph(n_id, edge_index, by_type[g.target].numel() if g.target in by_type else 0, counts, num_edges,
                             e_id)


def to_hetero_data(features, out: TypedSubgraph, pin_memory: bool = False):
    """The sampled subgraph as PyG's ``HeteroData``: per type ``x`` and ``n_id`` (target: ``y`` of the
    seeds and ``batch_size``), per relation ``edge_index`` (and ``edge_attr``, each sampled edge's features, where
    the batch says which edges it holds and the relation has features: ``features.gather_edges``);
    ``num_sampled_nodes_dict`` and ``num_sampled_edges_dict`` for PyG's heterogeneous ``trim_to_layer``. ``features``: a
    :class:`TypedGraph`, or anything with its ``target`` and ``gather_types`` (a partitioned rank's);
    one with ``remote_rows`` adds the batch's remote feature rows per type (``remote_rows_by_type``).
    ``pin_memory``: the rows in page-locked buffers (a batch bound for a GPU), as a homogeneous batch's."""
    from torch_geometric.data import HeteroData

    if getattr(features, "gathers_pinned", False):  # (gathered straight into them: a whole typed graph's rows)
        x, y = features.gather_types(out.n_id, out.batch_size, pin_memory)
    else:
        x, y = features.gather_types(out.n_id, out.batch_size)
        if pin_memory:
            x, y = {t: v.pin_memory() for t, v in x.items()}, y.pin_memory()
    data = HeteroData()
    for t, ids in out.n_id.items():
        data[t].n_id = ids
        data[t].x = x[t].float()  # stored as float16/bfloat16: upcast per batch
        data[t].num_nodes = ids.numel()
    target = data[features.target]
    target.y = y
    if hasattr(features, "remote_rows"):
        data.remote_rows_by_type = features.remote_rows(out.n_id)
    target.batch_size = data.batch_size = out.batch_size  # the seeds' count, on the type and the batch
    for rel, ei in out.edge_index.items():
        data[rel].edge_index = ei
        if out.edge_age is not None:  # (a timed graph's: each edge's age, for a model that reads it)
            data[rel].edge_age = out.edge_age[rel]
        if out.e_id is not None and rel in getattr(features, "edge_relations", ()):
            data[rel].edge_attr = features.gather_edges(rel, out.e_id[rel], pin_memory)
    data.num_sampled_nodes_dict = out.num_sampled_nodes
    data.num_sampled_edges_dict = out.num_sampled_edges
    for key, value in (out.targets or {}).items():
        data[key] = value
    return data


class TypedEdgeTargetSampler:
    """An edge task's batches on a typed graph, its targets a relation's edges (by id; ``targets``:
    :class:`hpcgnn.data.edges.EdgeTargets` with a ``relation``): the neighbourhood of both ends of each (its
    source's type and its target's, each type's seeds first), the targets' labels, and (``drop_targets``) the
    batch's target pairs left out of its message passing, in the relation and its reverse (``back``), so that no
    label leaks through its own edge. The pairs to score are ``edge_label_index`` [2, B] (row 0: local ids of the
    source type's nodes, row 1: of the target type's), their labels ``edge_label``; ``positives``: B;
    ``pair_features(items)``: the targets' own edge features where the decoder reads them (``edge_label_attr``)."""

    def __init__(self, node_sampler: TypedNeighborSampler, targets, back: Relation | None, drop_targets: bool = True,
                 pair_features: Callable[[Tensor], Tensor] | None = None):
        self.node_sampler, self.targets, self.back = node_sampler, targets, back
        self.relation, self.pair_features = targets.relation, pair_features
        # targets with times, around a temporal node sampler: each end a tree of its own, as of its target's time
        # (strictly before it: its own edge unseen, nothing left out by hand)
        self.times = targets.time if getattr(node_sampler, "timelines", None) is not None else None
        self.drop_targets = drop_targets and self.times is None

    @property
    def device(self) -> torch.device:  # (hpcgnn.sampling.protocol)
        return self.node_sampler.device

    def sample(self, items: Tensor, generator: torch.Generator | None = None) -> TypedSubgraph:
        items, (s_type, _, d_type) = items.long(), self.relation
        pairs = self.targets.index[:, items]
        if self.times is not None:  # each end a seed of its own, at its target's time (in order: its local id)
            at, b = self.times.index_select(0, items), items.numel()
            if s_type == d_type:
                out = self.node_sampler.sample({s_type: pairs.reshape(-1)}, generator, {s_type: torch.cat([at, at])})
                s, d = torch.arange(b), torch.arange(b, 2 * b)
            else:
                out = self.node_sampler.sample({s_type: pairs[0], d_type: pairs[1]}, generator, {s_type: at, d_type: at})
                s = d = torch.arange(b)
        else:
            if s_type == d_type:  # both ends of one type: one set of seeds
                seeds = {s_type: torch.unique(pairs.reshape(-1))}
            else:
                seeds = {s_type: torch.unique(pairs[0]), d_type: torch.unique(pairs[1])}
            out = self.node_sampler.sample(seeds, generator)
            s, d = torch.searchsorted(seeds[s_type], pairs[0]), torch.searchsorted(seeds[d_type], pairs[1])
        if self.drop_targets and items.numel():
            out = self._without_targets(out, s, d, seeds[s_type].numel(), seeds[d_type].numel())
        targets = {"edge_label_index": torch.stack([s, d]), "edge_label": self.targets.label.index_select(0, items),
                   "positives": items.numel()}
        if self.pair_features is not None:
            targets["edge_label_attr"] = self.pair_features(items)
        return replace(out, targets=targets)

    def _without_targets(self, out: TypedSubgraph, s: Tensor, d: Tensor, ns: int, nd: int) -> TypedSubgraph:
        """``out`` without the edges of the target pairs (local ``s`` -> ``d``, among the seeds: the first ``ns``
        and ``nd`` nodes of the two types) in the relation, and their reverses in ``back``."""
        edge_index, num_edges = dict(out.edge_index), {r: list(c) for r, c in out.num_sampled_edges.items()}
        e_id = dict(out.e_id) if out.e_id is not None else None
        drops = [(self.relation, s, d, ns, nd)]
        if self.back is not None:
            drops.append((self.back, d, s, nd, ns))
        if self.back == self.relation:  # (inside one type: either direction in the relation itself)
            drops = [(self.relation, torch.cat([s, d]), torch.cat([d, s]), ns, nd)]
        for rel, a, b, na, nb in drops:
            src, dst = edge_index[rel]
            among = torch.logical_and(src < na, dst < nb).nonzero().squeeze(1)
            drop = among[torch.isin(src.index_select(0, among) * nb + dst.index_select(0, among), a * nb + b)]
            if drop.numel() == 0:
                continue
            keep = torch.ones(src.numel(), dtype=torch.bool, device=src.device)
            keep[drop] = False
            per_hop = torch.tensor(num_edges[rel])  # per-hop counts of what is kept, for trim_to_layer
            hop = torch.searchsorted(per_hop.cumsum(0), drop.cpu(), right=True)
            num_edges[rel] = (per_hop - torch.bincount(hop, minlength=per_hop.numel())).tolist()
            edge_index[rel] = edge_index[rel][:, keep]
            if e_id is not None:
                e_id[rel] = e_id[rel][keep]
        return replace(out, edge_index=edge_index, num_sampled_edges=num_edges, e_id=e_id)


# ---------------------------------------------------------------------------------------------
# Partitioned typed graphs: the same walk, with frontier nodes owned elsewhere sampled by their owners


class PartitionedTypedSampler(TypedNeighborSampler):
    """The typed walk over a rank's parts (:class:`hpcgnn.partition.TypedParts`).

    Per hop, owned frontier nodes are sampled here, relation by relation; the others go to their
    owners as (global id, relation) requests, every relation's in one exchange (three collectives
    per hop whatever the number of relations, run by every rank on every hop, also with nothing
    to ask). ``boundary_fraction`` < 1 keeps each sampled edge from a non-owned node with that
    probability, as in the homogeneous sampler. ``edge_ids``: each relation's sampled edges' global ids (a
    part's first plus the edge's place in the part's CSR; a remote node's owner sends them back with its
    neighbours), for the relations whose edges have features.
    """

    def __init__(self, view, fanouts: Sequence[int] | Mapping, exchange, boundary_fraction: float = 1.0,
                 edge_ids: bool = False):
        typed = view.parts.typed
        super().__init__(typed.schema, fanouts, device=torch.device("cpu"), id_map="batch", edge_ids=edge_ids)
        self.view, self.typed, self.exchange, self.boundary_fraction = view, typed, exchange, boundary_fraction
        self.offsets = typed.schema.offsets()
        self.relation_ids = {rel: i for i, rel in enumerate(self.graph.relations)}

    def begin_batch(self) -> None:
        self.exchange.stats.batches += 1

    def type_order(self, n_id: dict[str, Tensor]) -> list[str]:
        """The batch's node types, the target first (its seeds lead the batch)."""
        return [self.graph.target, *(t for t in n_id if t != self.graph.target)]

    def global_ids(self, n_id: dict[str, Tensor]) -> Tensor:
        """A batch's nodes in the homogeneous id space (the partition's), in :meth:`type_order`."""
        return torch.cat([n_id[t] + self.offsets[t] for t in self.type_order(n_id)])

    def _sample(self, rel: Relation, gid: Tensor, hop: int, generator, at: Tensor | None = None) -> tuple:
        """(rows, sources, the edges' global ids: -1 for a relation without features or without ``edge_ids``, and
        their times: None, where a timed subclass draws as of ``at``)."""
        row, nbr, *e = sample_neighbors(self.typed.rowptr[rel], self.typed.col[rel],
                                        self.view.parts.typed_rows(rel[2], gid), self.fanouts[rel][hop], generator,
                                        eid=self.edge_ids and rel in self.typed.edge_base)
        eid = e[0] + self.edge_base(rel) if e else torch.full_like(nbr, -1)
        return row, nbr, eid, None

    def frontier_ids(self, node_type: str, nodes: Tensor, first: int) -> tuple[Tensor, Tensor | None]:
        """A frontier's type-local node ids and their times (None: untimed; a timed subclass's frontier holds keys;
        ``first``: the batch-local id of ``nodes[0]``)."""
        return nodes, None

    def drawn_keys(self, rel: Relation, dst: Tensor, nbr: Tensor, when: Tensor | None) -> Tensor:
        """The sources' ids the walk numbers (a timed subclass: keys in their targets' trees, ages kept)."""
        return nbr

    def edge_base(self, rel: Relation) -> int:
        """The global id of this rank's first edge of ``rel`` (its parts' edges in order)."""
        return int(self.typed.edge_base[rel][self.view.rank * self.view.parts_per_rank])

    def draw(self, hop, frontier, generator):
        from hpcgnn.sampling.distributed import segment_sums

        view, ex, rels = self.view, self.exchange, self.graph.relations
        timed = self.timed
        local: dict[Relation, tuple] = {}
        ask_ids, ask_rel, ask_dst, ask_owner, ask_at = [], [], [], [], []
        for rel in rels:
            if rel[2] not in frontier or self.fanouts[rel][hop] < 1:
                continue
            nodes, first = frontier[rel[2]]
            nodes_local = torch.arange(first, first + nodes.numel())
            ids, at = self.frontier_ids(rel[2], nodes, first)  # (a timed walk's keys: their nodes, their times)
            gid = ids + self.offsets[rel[2]]
            owner = view.owner(gid)
            mine = owner == view.rank
            row, nbr, eid, when = self._sample(rel, gid[mine], hop, generator, at[mine] if timed else None)
            local[rel] = (nodes_local[mine].index_select(0, row), nbr, eid, when)
            remote = ~mine
            ask_ids.append(gid[remote])
            ask_rel.append(torch.full((int(remote.sum()),), self.relation_ids[rel], dtype=torch.long))
            ask_dst.append(nodes_local[remote])
            ask_owner.append(owner[remote])
            if timed:
                ask_at.append(at[remote])
        empty = torch.empty(0, dtype=torch.long)
        keys = torch.stack([torch.cat(ask_ids or [empty]), torch.cat(ask_rel or [empty])], 1)
        dst = torch.cat(ask_dst or [empty])
        asked, order, sent, received = ex.request(keys, torch.cat(ask_owner or [empty]))
        ex.stats.sample_requests += keys.size(0)
        asked_at = ex(torch.cat(ask_at or [self.no_times]).index_select(0, order), sent, received) if timed else None
        row_a, nbr_a, eid_a, when_a = self._serve(asked, hop, generator, asked_at)
        per_asked = torch.bincount(row_a, minlength=asked.size(0))
        per_sent = ex(per_asked, received, sent)  # neighbours per node this rank asked for
        back, forth = segment_sums(per_asked, received), segment_sums(per_sent, sent)
        nbr_r = ex(nbr_a, back, forth)
        eid_r = ex(eid_a, back, forth) if self.edge_ids else torch.full_like(nbr_r, -1)  # (with the neighbours)
        when_r = ex(when_a, back, forth) if timed else None
        rel_r = torch.repeat_interleave(keys[order, 1], per_sent)
        dst_r = torch.repeat_interleave(dst[order], per_sent)
        drawn = []
        for rel in rels:
            if rel not in local:
                continue
            got = rel_r == self.relation_ids[rel]
            dst_l, nbr = torch.cat([local[rel][0], dst_r[got]]), torch.cat([local[rel][1], nbr_r[got]])
            eid = torch.cat([local[rel][2], eid_r[got]])
            when = torch.cat([local[rel][3], when_r[got]]) if timed else None
            if self.boundary_fraction < 1.0 and nbr.numel():
                keep = (view.owner(nbr + self.offsets[rel[0]]) == view.rank) | (
                    torch.rand(nbr.numel(), generator=generator) < self.boundary_fraction)
                dst_l, nbr, eid = dst_l[keep], nbr[keep], eid[keep]
                when = when[keep] if timed else None
            by_target = torch.argsort(dst_l, stable=True)  # grouped by target, as the replicated walk's
            dst_l, nbr, eid = dst_l[by_target], nbr[by_target], eid[by_target]
            nbr = self.drawn_keys(rel, dst_l, nbr, when[by_target] if timed else None)
            drawn.append((rel, dst_l, nbr, *([eid] if self.edge_ids else [])))
        return drawn

    timed = False  # (a timed subclass's draws carry their frontier's times: PartitionedTypedTemporalSampler)
    no_times = torch.empty(0, dtype=torch.long)

    def _serve(self, asked: Tensor, hop: int, generator, at: Tensor | None = None) -> tuple:
        """Sample for the others' requests (global id, relation; each as of its time in ``at``, where timed): (request
        index per edge, source ids, the edges' global ids, their times or None), grouped by request in the order
        they came."""
        rows, nbrs, eids, whens = [], [], [], []
        for rel in self.graph.relations:
            sel = (asked[:, 1] == self.relation_ids[rel]).nonzero().flatten()
            if sel.numel() == 0:
                continue
            row, nbr, eid, when = self._sample(rel, asked[sel, 0], hop, generator,
                                               at.index_select(0, sel) if at is not None else None)
            rows.append(sel.index_select(0, row))
            nbrs.append(nbr)
            eids.append(eid)
            whens.append(when)
        if not rows:
            empty = torch.empty(0, dtype=torch.long)
            return empty, empty, empty, (self.no_times if at is not None else None)
        row, nbr, eid = torch.cat(rows), torch.cat(nbrs), torch.cat(eids)
        by_row = torch.argsort(row, stable=True)
        when = torch.cat(whens)[by_row] if at is not None else None
        return row[by_row], nbr[by_row], eid[by_row], when


class PartitionedTypedFeatures:
    """A partitioned rank's typed features: one fetch for every type's rows (owned, cached, or from their
    owners: :class:`hpcgnn.sampling.distributed.PartitionedFeatures` over the homogeneous ids), split back
    per type; the seeds' labels from the rank's own rows."""

    def __init__(self, features, sampler: PartitionedTypedSampler):
        self.features, self.sampler = features, sampler
        self.target = sampler.graph.target
        # the relations whose sampled edges carry features (the sampler says which edges: edge_ids)
        self.edge_relations = tuple(sampler.typed.edge_attr) if sampler.edge_ids else ()

    def gather_edges(self, rel: Relation, e_id: Tensor, pin_memory: bool = False) -> Tensor:
        """Rows ``e_id`` (global edge ids of ``rel``) of its edges' features as float32: this rank's from its parts,
        the others' from the ranks that hold them (their targets' owners); collective (every rank calls it for each
        such relation of every batch, empty or not)."""
        from hpcgnn.kernels import ops
        from hpcgnn.sampling.distributed import fetch_rows

        s = self.sampler
        view, rows, base = s.view, s.typed.edge_attr[rel], s.typed.edge_base[rel]
        first = s.edge_base(rel)
        owner = (torch.searchsorted(base, e_id, right=True) - 1) // view.parts_per_rank
        mine = owner == view.rank
        out = torch.empty((e_id.numel(), rows.size(1)))
        idx_mine, remote = mine.nonzero().flatten(), (~mine).nonzero().flatten()
        ops.gather_rows(rows, e_id.index_select(0, idx_mine) - first, out, at=idx_mine)
        fetched = fetch_rows(s.exchange, view, rows, e_id.index_select(0, remote), owner.index_select(0, remote),
                             lambda ids: ids - first)  # (on the owner: its own first edge id)
        ops.gather_rows(fetched, torch.arange(fetched.size(0)), out, at=remote)
        return out.pin_memory() if pin_memory else out

    def gather_types(self, n_id: dict[str, Tensor], batch_size: int) -> tuple[dict[str, Tensor], Tensor]:
        order = self.sampler.type_order(n_id)
        x, y = self.features.gather(self.sampler.global_ids(n_id), batch_size)
        return dict(zip(order, x.split([n_id[t].numel() for t in order]), strict=True)), y

    def remote_rows(self, n_id: dict[str, Tensor]) -> dict[str, int]:
        """Feature rows of the batch's nodes owned by other ranks, per type (cached ones included)."""
        view, off = self.sampler.view, self.sampler.offsets
        return {t: int((view.owner(ids + off[t]) != view.rank).sum()) for t, ids in n_id.items()}
