"""``graph.method=lp``: a multilevel partitioner that reads the memory-mapped CSR in chunks.

Why this scheme: multilevel partitioning with size-constrained label propagation (Meyerhenke,
Sanders and Schulz, "Partitioning complex networks via size-constrained clustering", 2014; the
scheme of KaHIP's and KaMinPar's large-graph modes) keeps METIS's quality on graphs with
communities, while its passes read the edges chunk by chunk, in order, and keep O(nodes) state.
Streaming greedy methods (LDG, Fennel, restreamed) are simpler, but each decision sees only the
nodes placed before it and their cut is far from METIS's on community graphs; METIS itself needs
about 110 bytes per edge in one process.

1. **Coarsen.** Label propagation clusters the nodes: each node joins the cluster most of its
   (weighted) neighbours are in, unless that cluster would outgrow ``max_cluster`` original
   nodes (1% of a part). Rows are taken in chunks of about ``chunk_edges`` edges; a chunk's
   moves are decided together from the labels before it, then applied, so the work is a few
   vectorised torch ops per chunk. Clusters become the nodes of a coarser weighted graph
   (edge weights: edges between the clusters, both directions); repeat until it is small.
2. **Partition the coarsest graph** with METIS (pymetis, fixed seed), one balance constraint
   per column of the node weights (nodes of each type, training seeds).
3. **Uncoarsen.** Project the parts back level by level; at each level, label propagation over
   the K parts moves a node to the part holding most of its neighbours when that part has room
   under every column's cap, which keeps the balance METIS reached and lowers the cut.

Deterministic: every step is a pure function of the graph, K and the seed (ties between equally
good clusters are broken by a seeded hash, not by thread timing), so the parts are byte-identical.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from hpcgnn.data.ooc import EdgeBuckets, chunks, drop_pages, trim_heap
from hpcgnn.rng import derive_seed
from hpcgnn.writers import sweep_leftovers, writer_tag

log = logging.getLogger(__name__)

CHUNK_EDGES = 1 << 21  # edges per chunk: about 60 B of temporaries each, ~125 MB in all
BUCKET_BYTES = 256 << 20  # sorting one bucket of a coarse level's edges
CLUSTER_PASSES = 4  # label-propagation passes per coarsening level
REFINE_PASSES = 3  # label-propagation passes per level on the way back
COARSEST_NODES = 40_000  # stop coarsening below this many clusters ...
COARSEST_EDGES = 4_000_000  # ... and edges (METIS on the coarsest level: about 110 B an edge, on task 0) ...
MIN_SHRINK = 1.5  # ... or when a level removes fewer than a third of the nodes
MAX_LEVELS = 8
SCRATCH_PREFIX = "hpcgnn-lp-"  # the coarse levels' folder: <prefix><task 0's writer tag>


class Comm:
    """The tasks of one partitioning job (``python -m hpcgnn.partition ... +cluster=NAME cluster.nodes=N``):
    each reads only its share of every level's rows and the tasks agree on every move through
    collectives, so every task holds the same labels, loads and parts. One task: no collectives."""

    def __init__(self, rank: int = 0, size: int = 1, group=None):
        self.rank, self.size, self.group = rank, size, group

    def gather(self, tensors: list[Tensor]) -> list[Tensor]:
        """Each tensor concatenated along dim 0 over the tasks, in task order (any lengths)."""
        if self.size == 1:
            return tensors
        import torch.distributed as dist

        n = torch.tensor([tensors[0].size(0)])
        counts = [torch.zeros_like(n) for _ in range(self.size)]
        dist.all_gather(counts, n, group=self.group)
        counts = [int(c) for c in counts]
        out = []
        for t in tensors:
            pad = t.new_zeros((max(counts), *t.shape[1:]))
            pad[:t.size(0)] = t
            parts = [torch.empty_like(pad) for _ in range(self.size)]
            dist.all_gather(parts, pad, group=self.group)
            out.append(torch.cat([q[:c] for q, c in zip(parts, counts, strict=True)]))
        return out

    def gather_objects(self, obj) -> list:
        """Every other task's ``obj`` (JSON: nothing unpickled from the wire), in task order; [] for one task."""
        if self.size == 1:
            return []
        from hpcgnn.dist import gather_json

        return [o for r, o in enumerate(gather_json(obj, self.group)) if r != self.rank]

    def broadcast_object(self, obj):
        """Task 0's ``obj`` (JSON), on every task."""
        if self.size == 1:
            return obj
        from hpcgnn.dist import gather_json

        return gather_json(obj, self.group)[0]

    def broadcast(self, t: Tensor) -> Tensor:
        """Task 0's ``t`` (every task passes a tensor of the same shape and dtype)."""
        if self.size > 1:
            import torch.distributed as dist

            dist.broadcast(t, 0, group=self.group)
        return t

    def all_reduce(self, t: Tensor, op: str = "sum") -> Tensor:
        if self.size > 1:
            import torch.distributed as dist

            dist.all_reduce(t, dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX, group=self.group)
        return t

    def barrier(self) -> None:
        if self.size > 1:
            import torch.distributed as dist

            dist.barrier(group=self.group)


LOCAL = Comm()


def task_spans(rowptr: Tensor, comm: Comm, chunk_edges: int, max_rows: int) -> list[list[tuple[int, int]]]:
    """Every task's chunks of rows: task t takes the t-th share of the edges, cut into chunks of about
    ``chunk_edges / tasks`` edges; all tasks compute the same lists (rounds are taken together)."""
    n, m = rowptr.numel() - 1, int(rowptr[-1])
    cuts = [0, *(int(torch.searchsorted(rowptr, torch.tensor(m * t // comm.size))) for t in range(1, comm.size)), n]
    per_task = max(chunk_edges // comm.size, 1)
    out = []
    for t in range(comm.size):
        lo, hi = cuts[t], max(cuts[t + 1], cuts[t])
        spans = chunks(rowptr[lo:hi + 1] - rowptr[lo], per_task, max_rows=max(max_rows // comm.size, 1))
        out.append([(a + lo, b + lo) for a, b in spans])
    return out


def rounds(spans: list[list[tuple[int, int]]], rank: int):
    """Round j: this task's j-th chunk, or None when it has fewer chunks than another task."""
    for j in range(max((len(s) for s in spans), default=0)):
        yield spans[rank][j] if j < len(spans[rank]) else None


@dataclass
class Level:
    """One level of the hierarchy: a CSR of in-edges with optional edge weights, and node weights."""

    rowptr: Tensor  # int64 [n + 1] (level 0: the memory-mapped graph's)
    col: Tensor  # int32/int64 [m]
    weight: Tensor | None  # int64 [m] edge weights (None: all 1)
    size: Tensor  # int32 [n]: original nodes in each node of this level
    vw: Tensor  # int32 (int64 when a column's total needs it) [n, C]: balance columns of each node

    @property
    def n(self) -> int:
        return self.rowptr.numel() - 1


def _chunk_edges(level: Level, a: int, b: int) -> tuple[Tensor, Tensor, Tensor | None]:
    """(local row, neighbour, weight or None: all 1) of rows [a, b); self-loops dropped."""
    e0, e1 = int(level.rowptr[a]), int(level.rowptr[b])
    nbr = level.col[e0:e1].to(torch.long, copy=True)  # (copies: the mapped pages are handed back below)
    deg = level.rowptr[a + 1:b + 1] - level.rowptr[a:b]
    row = torch.repeat_interleave(torch.arange(b - a), deg, output_size=e1 - e0)
    w = level.weight[e0:e1].to(torch.long, copy=True) if level.weight is not None else None
    for mapped in (level.col[e0:e1], level.weight[e0:e1] if level.weight is not None else None):
        if mapped is not None:  # read: out of this process's RSS (a pass touches the whole graph)
            drop_pages(mapped)
    loop = nbr == row + a
    if not bool(loop.any()):  # (the common case, and every coarse level's: no copies)
        return row, nbr, w
    idx = (~loop).nonzero().flatten()  # (found once for the three arrays)
    return row.index_select(0, idx), nbr.index_select(0, idx), w.index_select(0, idx) if w is not None else None


# (node int64, its target cluster or part int32, gain int64): what a task without rows this round sends
NO_MOVES = (torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.int32), torch.zeros(0, dtype=torch.long))


def _tiebreak(labels: Tensor, salt: int) -> Tensor:
    """A seeded hash in [0, 2^20) of each label: equal scores go to the label with the larger hash."""
    return ((labels * 0x9E3779B1 + salt) % 1_000_003) % (1 << 20)


def _pair_counts(key: Tensor, weight: Tensor | None) -> tuple[Tensor, Tensor]:
    """(distinct keys, sorted; the summed weight of each): 1 per key when ``weight`` is None, counted
    after numpy's sort (twice as fast as torch's here), else summed in torch's sort order."""
    if weight is None:
        ks = torch.from_numpy(np.sort(key.numpy()))
        first = torch.ones(ks.numel(), dtype=torch.bool)
        first[1:] = ks[1:] != ks[:-1]
        starts = first.nonzero().flatten()
        return ks.index_select(0, starts), torch.diff(starts, append=torch.tensor([ks.numel()]))
    uk, inv = torch.unique(key, return_inverse=True)
    return uk, torch.zeros(uk.numel(), dtype=torch.long).index_add_(0, inv, weight)


def _accept(target: Tensor, amount: Tensor, room: Tensor, order_key: Tensor) -> Tensor:
    """Bool [movers]: which movers fit, taking them by ``order_key`` (higher first) within each target.

    ``amount`` [movers, C], ``room`` [movers, C] (the room of each mover's target): a mover fits if the
    cumulative amount of the movers before it into the same target, plus its own, stays within the
    target's room in every column."""
    if target.numel() == 0:
        return torch.zeros(0, dtype=torch.bool)
    target = target.long()
    order = torch.argsort(target * (int(order_key.max()) + 1) + (int(order_key.max()) - order_key), stable=True)
    t, amt = target[order], amount[order]
    cum = torch.cumsum(amt, 0)
    first = torch.ones_like(t, dtype=torch.bool)
    first[1:] = t[1:] != t[:-1]
    start = torch.cummax(torch.where(first, torch.arange(t.numel()), 0), 0).values
    prev = (start - 1).clamp(min=0)
    has_prev = (start > 0).unsqueeze(1)
    within = cum - torch.where(has_prev, cum.index_select(0, prev), 0)  # inclusive, within the run
    fits = (within <= room.index_select(0, order)).all(1)
    # After a run's first misfit, stop: the cumulative sums would count the movers left out.
    bad = torch.cumsum((~fits).long(), 0)
    run_bad = bad - torch.where(has_prev.squeeze(1), bad.index_select(0, prev), 0)
    ok = fits & (run_bad == 0)
    out = torch.zeros_like(ok)
    out[order] = ok
    return out


def cluster(level: Level, max_cluster: int, seed: int, chunk_edges: int, passes: int = CLUSTER_PASSES,
            comm: Comm = LOCAL) -> Tensor:
    """int64 [n]: a size-constrained label-propagation clustering of the level (labels are node ids).
    Each round, every task proposes the moves of its chunk from the labels before the round; the moves
    are gathered and accepted in task order, the same on every task."""
    n = level.n
    label = torch.arange(n, dtype=torch.int32)  # (O(nodes) state in 4 bytes a node: it is every task's)
    csize = level.size.clone()
    spans = task_spans(level.rowptr, comm, chunk_edges, max_rows=max(n // 64, 1))  # small: labels cascade
    for p in range(passes):
        salt = derive_seed("lp-cluster", seed, p) % 1_000_003
        moved, t0 = 0, time.perf_counter()
        for span in rounds(spans, comm.rank):
            mv, target, gain = _cluster_moves(level, label, csize, max_cluster, salt, span) if span else NO_MOVES
            mv, target, gain = comm.gather([mv, target, gain])
            if mv.numel() == 0:
                continue
            room = (max_cluster - csize.index_select(0, target)).clamp(min=0).unsqueeze(1)
            sizes = level.size.index_select(0, mv)
            ok = _accept(target, sizes.unsqueeze(1), room, gain)
            mv, target, sizes = mv[ok], target[ok], sizes[ok]
            csize.index_add_(0, label.index_select(0, mv), -sizes)
            csize.index_add_(0, target, sizes)
            label[mv] = target
            moved += mv.numel()
        log.info("lp clustering %d nodes, pass %d/%d: %d moves (%.0f s)", n, p + 1, passes, moved,
                 time.perf_counter() - t0)
        trim_heap()
        if moved < n // 100:
            break
    return label


def _cluster_moves(level: Level, label: Tensor, csize: Tensor, max_cluster: int, salt: int,
                   span: tuple[int, int]) -> tuple[Tensor, Tensor, Tensor]:
    """The moves rows [a, b) propose: (node, cluster it joins, connection gained)."""
    a, b = span
    n = level.n
    row, nbr, w = _chunk_edges(level, a, b)
    if row.numel() == 0:
        return NO_MOVES
    key, score = _pair_counts(row * n + label.index_select(0, nbr), w)
    r, c = key // n, key % n
    v = r + a
    own = label.index_select(0, v).long()
    own_score = torch.zeros(b - a, dtype=torch.long).index_add_(0, r[c == own], score[c == own])
    size_c = csize.index_select(0, c).long()
    fits = (c != own) & (size_c + level.size.index_select(0, v) <= max_cluster)
    # Most connection first; between equals the larger cluster (clusters grow instead of
    # stalling as many small stars), then a seeded hash.
    packed = torch.where(fits, (score.clamp(max=(1 << 22) - 1) << 40)
                         + (size_c.clamp(max=(1 << 20) - 1) << 20) + _tiebreak(c, salt), -1)
    best = torch.full((b - a,), -1, dtype=torch.long).scatter_reduce_(0, r, packed, "amax")
    win = fits & (packed == best.index_select(0, r)) & (score.clamp(max=(1 << 22) - 1) > own_score.index_select(0, r))
    mv, target = v[win], c[win].int()  # sorted by row; two labels of one row tie only on a hash clash
    if mv.numel() > 1:
        first = torch.ones_like(mv, dtype=torch.bool)
        first[1:] = mv[1:] != mv[:-1]
        mv, target = mv[first], target[first]
    gain = (best.index_select(0, mv - a) >> 40) - own_score.index_select(0, mv - a)
    return mv, target, gain


def contract(level: Level, label: Tensor, chunk_edges: int, scratch: Path, mem_bytes: int,
             comm: Comm = LOCAL) -> tuple[Level, Tensor]:
    """The coarser level whose nodes are the clusters, and each node's cluster (dense ids). Its edges (the
    fine edges between two clusters, summed into weights, in-edge orientation as the fine graph's) are
    bucketed on disk and memory-mapped (:class:`EdgeBuckets`): memory stays bounded however many there are.
    Several tasks: each buckets its rows' edges in its own folder, each sorts its share of the buckets
    (reading every task's files of them: ``scratch`` is on a shared file system), task 0 joins the pieces."""
    n = level.n
    used = torch.zeros(n, dtype=torch.bool)
    used[label] = True
    dense = torch.cumsum(used, 0) - 1
    nc = int(dense[-1]) + 1 if n else 0
    cl = dense.index_select(0, label).int()
    del used, dense
    size = torch.zeros(nc, dtype=level.size.dtype).index_add_(0, cl, level.size)
    vw = torch.zeros(nc, level.vw.size(1), dtype=level.vw.dtype).index_add_(0, cl, level.vw)
    per_task = max(mem_bytes // comm.size, 1 << 20)
    # A cluster gets at most its members' in-edges: buckets of about equal edges, whatever the cluster sizes.
    row_edges = torch.zeros(nc, dtype=torch.long)
    for a in range(0, n, 1 << 18):  # (small slices: no O(nodes) int64 temporary)
        b = min(a + (1 << 18), n)
        row_edges.index_add_(0, cl[a:b].long(), level.rowptr[a + 1:b + 1] - level.rowptr[a:b])
    buckets = [EdgeBuckets(nc, int(level.rowptr[-1]), scratch / f"buckets{t}", per_task, weighted=True,
                           row_edges=row_edges) for t in range(comm.size)]  # the same layout in every task's folder
    del row_edges
    for span in task_spans(level.rowptr, comm, chunk_edges, max_rows=level.n)[comm.rank]:
        row, nbr, w = _chunk_edges(level, *span)
        cu, cv = cl.index_select(0, row + span[0]).long(), cl.index_select(0, nbr).long()
        cross = cu != cv
        buckets[comm.rank].add(cu[cross], cv[cross], w[cross] if w is not None else None)
    if comm.size == 1:
        buckets[0].write_csr(scratch)
    else:
        comm.barrier()
        mine = [b for b in range(buckets[0].num_buckets) if b % comm.size == comm.rank]
        buckets[comm.rank].write_pieces(scratch, mine, buckets)
        comm.barrier()
        if comm.rank == 0:
            buckets[0].join_pieces(scratch)
        comm.barrier()
    trim_heap()

    def load(name: str) -> Tensor:
        return torch.from_numpy(np.load(scratch / f"{name}.npy", mmap_mode="c"))

    return Level(load("rowptr"), load("col"), load("weight"), size, vw), cl


def symmetric(level: Level) -> Level:
    """The level with every edge in both directions (weights summed), in memory: what METIS needs (the
    coarsest level, small; a directed graph's coarse levels hold only in-edges)."""
    n = level.n
    dst = torch.repeat_interleave(torch.arange(n), level.rowptr[1:] - level.rowptr[:-1])
    src = level.col.long()
    w = level.weight.long() if level.weight is not None else torch.ones(src.numel(), dtype=torch.long)
    keep = src != dst
    key, inv = torch.unique(torch.cat([dst[keep] * n + src[keep], src[keep] * n + dst[keep]]), return_inverse=True)
    weight = torch.zeros(key.numel(), dtype=torch.long).index_add_(0, inv, torch.cat([w[keep], w[keep]]))
    rowptr = torch.zeros(n + 1, dtype=torch.long)
    rowptr[1:] = torch.cumsum(torch.bincount(key // n, minlength=n), 0)
    return Level(rowptr, key % n, weight, level.size, level.vw)


def refine(level: Level, part: Tensor, num_parts: int, caps: Tensor, seed: int, chunk_edges: int,
           passes: int = REFINE_PASSES, comm: Comm = LOCAL) -> Tensor:
    """Label propagation over the parts: a node moves to the part most of its neighbours are in when
    that part stays within ``caps`` [C] in every column; returns the new int64 part of each node.
    Rounds as in :func:`cluster`: moves proposed per task, gathered, accepted the same everywhere."""
    k = num_parts
    part = part.clone()
    load = torch.zeros(k, level.vw.size(1), dtype=level.vw.dtype).index_add_(0, part, level.vw).long()
    spans = task_spans(level.rowptr, comm, chunk_edges, max_rows=max(level.n // 8, 1))
    for p in range(passes):
        salt = derive_seed("lp-refine", seed, p) % 1_000_003
        moved, t0 = 0, time.perf_counter()
        for span in rounds(spans, comm.rank):
            idx, target, gain = _refine_moves(level, part, load, caps, k, salt, span) if span else NO_MOVES
            idx, target, gain = comm.gather([idx, target, gain])
            if idx.numel() == 0:
                continue
            vw = level.vw.index_select(0, idx).long()
            ok = _accept(target, vw, (caps.unsqueeze(0) - load).clamp(min=0).index_select(0, target), gain)
            idx, target, vw = idx[ok], target[ok], vw[ok]
            load.index_add_(0, part.index_select(0, idx), -vw)
            load.index_add_(0, target, vw)
            part[idx] = target
            moved += idx.numel()
        log.info("lp refining %d nodes into %d parts, pass %d/%d: %d moves (%.0f s)", level.n, k, p + 1, passes,
                 moved, time.perf_counter() - t0)
        if moved < level.n // 2000:
            break
    return part


def _refine_moves(level: Level, part: Tensor, load: Tensor, caps: Tensor, k: int, salt: int,
                  span: tuple[int, int]) -> tuple[Tensor, Tensor, Tensor]:
    """The moves rows [a, b) propose: (node, part it joins, connection gained)."""
    a, b = span
    row, nbr, w = _chunk_edges(level, a, b)
    rows = b - a
    slot = row * k + part.index_select(0, nbr)
    conn = (torch.bincount(slot, minlength=rows * k) if w is None else
            torch.zeros(rows * k, dtype=torch.long).index_add_(0, slot, w)).view(rows, k)
    own = part[a:b].long()
    own_conn = conn.gather(1, own.unsqueeze(1)).squeeze(1)
    vw = level.vw[a:b].long()
    room = (caps.unsqueeze(0) - load).unsqueeze(0) - vw.unsqueeze(1)  # [rows, k, C]
    fits = ((room >= 0) | (vw == 0).unsqueeze(1)).all(2)  # only the columns the node adds to
    fits[torch.arange(rows), own] = False
    packed = torch.where(fits, conn * (1 << 20) + _tiebreak(torch.arange(k), salt + a).unsqueeze(0), -1)
    best = packed.argmax(1)
    gain = conn.gather(1, best.unsqueeze(1)).squeeze(1) - own_conn
    win = (packed.gather(1, best.unsqueeze(1)).squeeze(1) >= 0) & (gain > 0)
    idx = win.nonzero().flatten()
    return idx + a, best[idx].int(), gain[idx]


def metis_initial(level: Level, num_parts: int, seed: int) -> Tensor:
    """METIS on the coarsest level, with edge weights and the original node count as the one vertex
    weight. (METIS's multi-constraint mode left parts 2x apart on such coarse graphs, whose vertices
    weigh up to thousands: the other columns are balanced by refinement and the final fix-up pass.)"""
    import pymetis

    result = pymetis.part_graph(num_parts, pymetis.CSRAdjacency(level.rowptr.numpy(), level.col.numpy()),
                                vweights=level.size.numpy().astype(np.int64), eweights=level.weight.numpy(),
                                options=pymetis.Options(seed=seed))
    return torch.from_numpy(np.asarray(result.vertex_part, dtype=np.int32))


def lp_parts(rowptr: Tensor, col: Tensor, num_parts: int, seed: int, vw: Tensor, tolerance: float = 0.03,
             chunk_edges: int = CHUNK_EDGES, coarsest_nodes: int = COARSEST_NODES, scratch: Path | None = None,
             mem_bytes: int = BUCKET_BYTES, comm: Comm = LOCAL) -> Tensor:
    """int32 [n]: the part of every node. ``vw`` int32/int64 [n, C]: the balance columns (each kept within
    ``(1 + tolerance)`` of its mean per part, up to one coarse node's weight). ``scratch``: where the coarse
    levels' edges go (a temporary folder inside it; default: the system's), removed at the end; with several
    tasks (``comm``) a folder they share, and the result is the same on every task."""
    n = rowptr.numel() - 1
    size = torch.ones(n, dtype=torch.int32)
    levels = [Level(rowptr, col, None, size, vw)]
    maps: list[Tensor] = []
    max_cluster = max(1, int(0.01 * n / num_parts))
    # One folder for the job, named by task 0 (a killed job's is removed by the next one on that host).
    folder = Path(scratch or tempfile.gettempdir()) / f"{SCRATCH_PREFIX}{comm.broadcast_object(writer_tag())}"
    if comm.rank == 0:
        sweep_leftovers(folder.parent, SCRATCH_PREFIX, keep=folder)
        folder.mkdir(parents=True)
    comm.barrier()
    try:
        while ((levels[-1].n > coarsest_nodes or levels[-1].col.numel() > COARSEST_EDGES)
               and len(levels) <= MAX_LEVELS):
            top = levels[-1]
            label = cluster(top, max_cluster, derive_seed(seed, len(levels)), chunk_edges, comm=comm)
            coarse, cl = contract(top, label, chunk_edges, folder / f"level{len(levels)}", mem_bytes, comm)
            del label
            log.info("lp level %d: %d nodes -> %d clusters, %d coarse edges", len(levels) - 1, top.n, coarse.n,
                     coarse.col.numel())
            if top.n < MIN_SHRINK * coarse.n and len(levels) > 1:
                break
            levels.append(coarse)
            maps.append(cl)
            if top.n < MIN_SHRINK * coarse.n:
                break
        part = (metis_initial(symmetric(levels[-1]), num_parts, seed) if comm.rank == 0
                else torch.zeros(levels[-1].n, dtype=torch.int32))
        part = comm.broadcast(part)
        trim_heap()
        total = vw.sum(0, dtype=torch.long)
        caps = torch.ceil((1 + tolerance) * total.double() / num_parts).long()
        for depth in range(len(levels) - 1, -1, -1):
            part = refine(levels[depth], part, num_parts, caps, derive_seed(seed, "refine", depth), chunk_edges,
                          comm=comm)
            if depth > 0:
                part = part.index_select(0, maps[depth - 1])
        return part
    finally:
        del levels
        if comm.rank == 0:  # (after the last refinement's collectives: every task is done with the folder)
            shutil.rmtree(folder, ignore_errors=True)


def memory_estimate(num_nodes: int, num_edges: int, chunk_edges: int = CHUNK_EDGES) -> int:
    """Peak bytes beyond the mapped graph: about 100 B per node (labels, sizes, maps, balance columns),
    60 B per edge of a chunk, and one bucket of a coarse level's edges being sorted (the levels are on disk)."""
    return 100 * num_nodes + 60 * chunk_edges + BUCKET_BYTES


def balance_groups(types: Tensor, is_train: Tensor, balance_train: bool) -> Tensor:
    """int64 [n]: each node's balance group, (node type, training or not): what the partitioners balance."""
    return types.long() * 2 + (is_train.long() if balance_train else 0)


def balance_columns(group: Tensor, weight: Tensor | None, balance_train: bool) -> Tensor:
    """int32 [n, C] (int64 if a column's total needs it): one column per balance group present
    (:func:`balance_groups`), plus the training seeds' weight when it is not 0/1 (link prediction: edges
    per source). Every task holds it: 4 bytes per node and column, no int64 one-hot."""
    n = group.numel()
    present = torch.bincount(group, minlength=1) > 0
    column = torch.cumsum(present, 0) - 1  # group -> its column
    extra = balance_train and weight is not None and bool((weight > 1).any())
    wide = extra and int(weight.sum(dtype=torch.long)) >= 2**31
    cols = torch.zeros(n, int(present.sum()) + extra, dtype=torch.long if wide else torch.int32)
    cols.scatter_(1, column.index_select(0, group).unsqueeze(1), 1)
    if extra:
        cols[:, -1] = weight
    return cols


__all__ = ["balance_columns", "balance_groups", "chunks", "lp_parts"]
