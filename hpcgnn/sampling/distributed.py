"""Sampling and feature fetch over a partitioned graph, with torch.distributed collectives.

Each rank owns some parts: their nodes' full in-adjacency (global ids), features and
labels. A batch is sampled hop by hop exactly as in replicated mode; per hop, the
frontier nodes owned elsewhere are sent to their owners (one ``all_to_all``), which
sample their neighbours and send them back. Features of the batch's non-owned nodes
come from a per-rank cache of hot remote nodes or, again, from their owners. Every
rank runs every exchange of every hop of every batch, so all ranks must walk the same
number of batches: loaders pad with empty batches (``BatchLoader(num_batches=...)``).

The output is the replicated sampler's: the same :class:`SampledSubgraph`, global ids.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, fields, replace

import torch
import torch.distributed as dist
from torch import Tensor

import hpcgnn.kernels.ops as ops
from hpcgnn.partition.parts import Parts
from hpcgnn.sampling.neighbor import CSRNeighborSampler, sample_neighbors


@dataclass
class CommStats:
    """Running counters of a rank's exchanges; callers take :meth:`snapshot` s and subtract them."""

    batches: int = 0
    sample_requests: int = 0  # frontier nodes sent to their owners for sampling
    remote_rows: int = 0  # feature rows of nodes this rank does not own
    cache_hits: int = 0  # ... of which the cache held
    bytes_sent: int = 0
    bytes_received: int = 0
    comm_s: float = 0.0  # time inside collectives (includes waiting for slower ranks)

    def snapshot(self) -> CommStats:
        return replace(self)

    def add(self, other: CommStats) -> None:
        """Count ``other``'s (a sampler process's batch) here too."""
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def __sub__(self, other: CommStats) -> CommStats:
        return CommStats(**{f.name: getattr(self, f.name) - getattr(other, f.name) for f in fields(self)})

    def per_batch(self) -> dict:
        n = max(self.batches, 1)
        return {"remote_rows_per_batch": self.remote_rows / n,
                "fetched_rows_per_batch": (self.remote_rows - self.cache_hits) / n,
                "cache_hit_rate": self.cache_hits / self.remote_rows if self.remote_rows else 0.0,
                "sample_requests_per_batch": self.sample_requests / n,
                "bytes_sent_per_batch": self.bytes_sent / n, "bytes_received_per_batch": self.bytes_received / n,
                "comm_s_per_batch": self.comm_s / n}


_process_group = None  # a sampler process's own group over every rank's sampler k (sampling/procs.py)


def use_group(group) -> None:
    """The group an Exchange that travelled to this process (a sampler process) exchanges on."""
    global _process_group
    _process_group = group


def _exchange_here(rank: int, world_size: int, stats: CommStats) -> Exchange:
    if world_size > 1 and _process_group is None:
        raise RuntimeError("an Exchange reached a process without a group of its own (call use_group first)")
    return Exchange(_process_group, rank, world_size, torch.device("cpu"), stats)


class Exchange:
    """``all_to_all_single`` on one process group, with byte and time accounting.

    Inputs are grouped by destination rank; ``send_counts[r]`` rows go to rank r. Under
    nccl the buffers travel through the rank's GPU; the results come back to the host.
    Pickled (to a sampler process), an Exchange becomes one on that process's own gloo group
    (:func:`use_group`), counting into the CommStats that travelled with it.
    """

    def __init__(self, group, rank: int, world_size: int, comm_device: torch.device, stats: CommStats):
        self.group, self.rank, self.world_size = group, rank, world_size
        self.comm_device, self.stats = comm_device, stats

    def __reduce__(self):
        return _exchange_here, (self.rank, self.world_size, self.stats)

    def counts(self, send_counts: Tensor) -> Tensor:
        """How many rows every rank will send here, given what this rank sends everyone."""
        if self.world_size == 1:
            return send_counts.clone()
        return self(send_counts, [1] * self.world_size, [1] * self.world_size)

    def __call__(self, send: Tensor, send_counts: list[int], recv_counts: list[int]) -> Tensor:
        if self.world_size == 1:
            return send.clone()
        t0 = time.perf_counter()
        buf = send.contiguous().to(self.comm_device)
        out = torch.empty((sum(recv_counts), *send.shape[1:]), dtype=send.dtype, device=self.comm_device)
        dist.all_to_all_single(out, buf, output_split_sizes=recv_counts, input_split_sizes=send_counts,
                               group=self.group)
        row = math.prod(send.shape[1:]) * send.element_size()
        mine_out, mine_in = send_counts[self.rank], recv_counts[self.rank]
        self.stats.bytes_sent += (sum(send_counts) - mine_out) * row
        self.stats.bytes_received += (sum(recv_counts) - mine_in) * row
        out = out.cpu()
        self.stats.comm_s += time.perf_counter() - t0
        return out

    def request(self, keys: Tensor, owner: Tensor) -> tuple[Tensor, Tensor, list[int], list[int]]:
        """Send ``keys`` to ``owner``; returns (keys asked of this rank, order of keys by owner, counts)."""
        order = torch.argsort(owner, stable=True)
        send_counts = torch.bincount(owner, minlength=self.world_size)
        recv_counts = self.counts(send_counts)
        sc, rc = send_counts.tolist(), recv_counts.tolist()
        return self(keys[order], sc, rc), order, sc, rc


def segment_sums(values: Tensor, counts: list[int]) -> list[int]:
    ends = torch.tensor(counts).cumsum(0)
    cs = torch.cat([torch.zeros(1, dtype=torch.long), values.long().cumsum(0)])
    return (cs[ends] - cs[ends - torch.tensor(counts)]).tolist()


class PartitionView:
    """Where a global node id lives: which rank owns it, and its row on the owner."""

    def __init__(self, parts: Parts, rank: int, parts_per_rank: int):
        self.parts, self.rank, self.parts_per_rank = parts, rank, parts_per_rank

    def owner(self, ids: Tensor) -> Tensor:
        return self.parts.node_part.index_select(0, ids).long() // self.parts_per_rank

    def row(self, ids: Tensor) -> Tensor:
        """Rows in this rank's CSR and features (ids must be owned here)."""
        part = self.parts.node_part.index_select(0, ids).long()
        return self.parts.part_offset.index_select(0, part) + self.parts.node_local.index_select(0, ids).long()

    # An edge's global id: its part's first (``parts.edge_base``: the parts' edges counted in part order) plus its
    # place in that part's CSR. A rank's parts are consecutive, so its edges are one range of ids, in its CSR order.

    def edge_ids(self, positions: Tensor) -> Tensor:
        """Global ids of edges at ``positions`` of this rank's CSR."""
        return positions + int(self.parts.edge_base[self.rank * self.parts_per_rank])

    def edge_owner(self, ids: Tensor) -> Tensor:
        """The rank that holds each edge (its target's owner)."""
        part = torch.searchsorted(self.parts.edge_base, ids, right=True) - 1
        return part // self.parts_per_rank

    def edge_row(self, ids: Tensor) -> Tensor:
        """Rows of this rank's edges (global ``ids``, held here) in its CSR and edge features."""
        return ids - int(self.parts.edge_base[self.rank * self.parts_per_rank])


class PartitionedNeighborSampler(CSRNeighborSampler):
    """The replicated sampler's walk, with non-owned frontier nodes sampled by their owners.

    ``boundary_fraction`` < 1 keeps each sampled edge to a non-owned node with that
    probability (BNS-GCN's boundary-node sampling): fewer remote rows, noisier neighbourhoods;
    mean aggregation renormalises over the edges kept.
    """

    def __init__(self, view: PartitionView, fanouts, exchange: Exchange, boundary_fraction: float = 1.0,
                 edge_ids: bool = False):
        super().__init__(view.parts.rowptr, view.parts.col, fanouts, num_nodes=view.parts.num_nodes, id_map="batch",
                         edge_ids=edge_ids)
        self.view, self.exchange, self.boundary_fraction = view, exchange, boundary_fraction

    def begin_batch(self) -> None:
        self.exchange.stats.batches += 1

    def global_ids(self, n_id: Tensor) -> Tensor:
        """A batch's nodes in the partition's id space: already so (a typed sampler maps its per-type ids)."""
        return n_id

    def hop(self, frontier: Tensor, fanout: int, generator: torch.Generator | None, eid: bool = False) -> tuple:
        """The frontier's sampled in-edges (``eid``: and their global edge ids, which come back with a remote
        node's neighbours from its owner: :meth:`PartitionView.edge_ids`)."""
        row, nbr, e, _ = self.across(frontier, None, fanout, generator, eid)
        return (row, nbr, e) if eid else (row, nbr)

    def draw(self, rows: Tensor, at: Tensor | None, fanout: int, generator: torch.Generator | None, eid: bool) -> tuple:
        """``(row, source[, position])`` of up to ``fanout`` in-edges of each of this rank's ``rows`` (as of its time
        in ``at``, where a subclass samples by time); a position :meth:`edge_of` makes a place in the rank's CSR."""
        return sample_neighbors(self.rowptr, self.col, rows, fanout, generator, eid=eid)

    def edge_of(self, pos: Tensor) -> Tensor:
        """Places in the rank's CSR of the edges :meth:`draw` drew at ``pos``."""
        return pos

    def across(self, nodes: Tensor, at: Tensor | None, fanout: int, generator: torch.Generator | None,
               eid: bool) -> tuple:
        """``(row, source, global edge ids or None, edge times or None)`` of the sampled in-edges of ``nodes``, rows
        in their order: the rank's own drawn here, the others' by their owners, to whom they travel (with their
        times in ``at``: each drawn as of its own, and the drawn edges' times, a timed subclass's ``time_of(pos)``,
        sent back; None: untimed)."""
        view, ex = self.view, self.exchange
        timed = at is not None
        owner = view.owner(nodes)
        mine = owner == view.rank
        idx_mine, idx_remote = mine.nonzero().flatten(), (~mine).nonzero().flatten()
        row_l, nbr_l, *p_l = self.draw(view.row(nodes.index_select(0, idx_mine)),
                                       at.index_select(0, idx_mine) if timed else None, fanout, generator, eid)

        asked, order, sent, received = ex.request(nodes.index_select(0, idx_remote), owner.index_select(0, idx_remote))
        ex.stats.sample_requests += idx_remote.numel()
        asked_at = ex(at.index_select(0, idx_remote.index_select(0, order)), sent, received) if timed else None
        row_a, nbr_a, *p_a = self.draw(view.row(asked), asked_at, fanout, generator, eid)
        per_asked = torch.bincount(row_a, minlength=asked.numel())
        per_sent = ex(per_asked, received, sent)  # neighbours per node this rank asked for
        counts = segment_sums(per_asked, received), segment_sums(per_sent, sent)
        nbr_r = ex(nbr_a, *counts)

        row = torch.cat([idx_mine.index_select(0, row_l), torch.repeat_interleave(idx_remote[order], per_sent)])
        nbr = torch.cat([nbr_l, nbr_r])
        by_row = torch.argsort(row, stable=True)  # rows in frontier order, as the replicated sampler
        row, nbr = row[by_row], nbr[by_row]
        e = torch.cat([view.edge_ids(self.edge_of(p_l[0])), ex(view.edge_ids(self.edge_of(p_a[0])), *counts)]
                      )[by_row] if eid else None
        when = torch.cat([self.time_of(p_l[0]), ex(self.time_of(p_a[0]), *counts)])[by_row] if timed else None
        if self.boundary_fraction < 1.0 and nbr.numel():
            keep = (view.owner(nbr) == view.rank) | (
                torch.rand(nbr.numel(), generator=generator) < self.boundary_fraction)
            row, nbr = row[keep], nbr[keep]
            e = e[keep] if eid else None
            when = when[keep] if timed else None
        return row, nbr, e, when


def fetch_rows(ex: Exchange, view: PartitionView, table: Tensor, ids: Tensor, owner: Tensor, row_of=None) -> Tensor:
    """Rows of ``ids`` (owned by ``owner``) of a per-rank ``table`` whose rows follow each rank's own nodes
    (its features, or a layer's outputs); collective: every rank calls it, with nothing to ask or not.
    ``row_of(ids)``: the owner's rows of its nodes in ``table`` (default: its CSR's, ``view.row``)."""
    asked, order, sent, received = ex.request(ids, owner)
    got = ex(table.index_select(0, (row_of or view.row)(asked)), received, sent)
    out = torch.empty_like(got)
    out[order] = got
    return out


class PartitionedFeatures:
    """Features of any node: owned rows, cached hot rows, or rows fetched from their owners."""

    def __init__(self, view: PartitionView, exchange: Exchange, labels: bool = True):
        self.view, self.exchange, self.labels = view, exchange, labels
        x = view.parts.x
        self.cache_ids = torch.empty(0, dtype=torch.long)  # sorted global ids
        self.cache_x = x.new_empty((0, x.size(1)))

    def fetch(self, ids: Tensor, owner: Tensor) -> Tensor:
        """Rows of ``ids`` (all owned elsewhere) from their owners; collective."""
        return fetch_rows(self.exchange, self.view, self.view.parts.x, ids, owner)

    def gather(self, n_id: Tensor, batch_size: int) -> tuple[Tensor, Tensor]:
        view, stats = self.view, self.exchange.stats
        parts = view.parts
        owner = view.owner(n_id)
        mine = owner == view.rank
        if self.labels and not bool(mine[:batch_size].all()):
            raise ValueError("seeds must be owned by the sampling rank")
        # Batches are float32; rows are stored, cached and sent in the stored dtype (float16/bfloat16: half the
        # bytes), and each is widened as it is written to its place in the batch, once (ops.gather_rows).
        x = torch.empty((n_id.numel(), parts.x.size(1)))
        idx_mine = mine.nonzero().flatten()
        ops.gather_rows(parts.x, view.row(n_id.index_select(0, idx_mine)), x, at=idx_mine)
        remote = (~mine).nonzero().flatten()
        stats.remote_rows += remote.numel()
        if self.cache_ids.numel() and remote.numel():
            ids = n_id.index_select(0, remote)
            pos = torch.searchsorted(self.cache_ids, ids).clamp_(max=self.cache_ids.numel() - 1)
            hit = self.cache_ids.index_select(0, pos) == ids
            ops.gather_rows(self.cache_x, pos[hit], x, at=remote[hit])
            stats.cache_hits += int(hit.sum())
            remote = remote[~hit]
        ids = n_id.index_select(0, remote)
        fetched = self.fetch(ids, owner.index_select(0, remote))
        ops.gather_rows(fetched, torch.arange(fetched.size(0)), x, at=remote)
        y = parts.y.index_select(0, view.row(n_id[:batch_size])) if self.labels else parts.y[:0]
        return x, y

    def gather_edges(self, e_id: Tensor, pin_memory: bool = False, alloc=None) -> Tensor:
        """Rows ``e_id`` (global edge ids) of the edges' features as float32: this rank's edges' from its parts, the
        others' from the ranks that hold them; collective (every rank calls it for every batch, empty or not)."""
        view, parts = self.view, self.view.parts
        owner = view.edge_owner(e_id)
        mine = owner == view.rank
        out = torch.empty((e_id.numel(), parts.edge_attr.size(1)))
        idx_mine, remote = mine.nonzero().flatten(), (~mine).nonzero().flatten()
        ops.gather_rows(parts.edge_attr, view.edge_row(e_id.index_select(0, idx_mine)), out, at=idx_mine)
        fetched = fetch_rows(self.exchange, view, parts.edge_attr, e_id.index_select(0, remote),
                             owner.index_select(0, remote), view.edge_row)
        ops.gather_rows(fetched, torch.arange(fetched.size(0)), out, at=remote)
        return out.pin_memory() if pin_memory else out

    def fill_cache(self, ids: Tensor) -> None:
        """Cache the features of ``ids`` (non-owned); collective: every rank calls it once."""
        ids = torch.unique(ids)
        self.cache_x = self.fetch(ids, self.view.owner(ids))
        self.cache_ids = ids

    def cache_bytes(self) -> int:
        return self.cache_x.numel() * self.cache_x.element_size() + self.cache_ids.numel() * 8


def hot_nodes(view: PartitionView, budget_rows: int, policy: str, sampler: PartitionedNeighborSampler | None = None,
              warmup_seeds: list[Tensor] | None = None, generator: torch.Generator | None = None) -> Tensor:
    """The ``budget_rows`` non-owned nodes to cache: highest degree, or most often sampled in a warm-up.

    The warm-up samples ``warmup_seeds`` batches (collective: all ranks pass the same count) with ``sampler`` (the
    neighbour sampler, or a task's items' sampler: its seeds are items); ties in frequency go to the higher degree.
    """
    parts = view.parts
    degree = parts.degree.double()
    if policy == "frequency":
        seen = []
        for seeds in warmup_seeds or []:
            out = sampler.sample(seeds, generator)
            n_id = sampler.global_ids(out.n_id) if hasattr(sampler, "global_ids") else out.n_id
            seen.append(n_id[view.owner(n_id) != view.rank])
        ids, counts = torch.unique(torch.cat(seen) if seen else torch.empty(0, dtype=torch.long),
                                   return_counts=True)
        score = counts.double() + degree.index_select(0, ids) / (float(degree.max()) + 1.0)
    elif policy == "degree":
        return _top_degree(view, budget_rows)
    else:
        raise ValueError(f"unknown cache policy {policy!r}")
    if budget_rows <= 0 or ids.numel() == 0:
        return ids[:0]
    top = torch.topk(score, min(budget_rows, ids.numel()), sorted=False).indices
    return ids.index_select(0, top)


def _top_degree(view: PartitionView, budget_rows: int, chunk: int = 1 << 22) -> Tensor:
    """The ``budget_rows`` non-owned nodes of highest in-degree (ties: the lower id), a chunk of ids at a
    time: nothing of the graph's size is held."""
    parts = view.parts
    best = torch.empty(0, dtype=torch.long)
    if budget_rows <= 0:
        return best
    for a in range(0, parts.num_nodes, chunk):
        ids = torch.arange(a, min(a + chunk, parts.num_nodes))
        ids = torch.cat([best, ids[view.owner(ids) != view.rank]])
        # higher degree first, then lower id: one sort key
        key = parts.degree.index_select(0, ids).long() * parts.num_nodes + (parts.num_nodes - 1 - ids)
        best = ids.index_select(0, torch.topk(key, min(budget_rows, ids.numel())).indices)
    return best
