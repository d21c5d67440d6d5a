"""The torch twins of the C kernels' operations (:mod:`hpcgnn.kernels.ops`): each of the same signature, and
the same result, bit for bit (tests/test_native.py checks both), where the kernels cannot run (no compiler,
``HPCGNN_NATIVE=0``, tensors on a GPU). ``ops`` calls them itself there, so either module may be called anywhere.

Besides the twins: :func:`hop`, the torch hop with a choice of draws (``keys``: one sort, for a GPU's first hops),
and the draws themselves, :func:`floyd_sample` (what ``hops.c`` draws, from the same uniform numbers) and
:func:`key_sample`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from hpcgnn import rng

KEYS_PER_SLOT = 4  # on a GPU: keys while the big rows' degrees sum to at most this many per sampled slot


def sample_neighbors(rowptr: Tensor, col: Tensor, nodes: Tensor, fanout: int,
                     generator: torch.Generator | None = None, row_start: int = 0,
                     out: Callable[[int], tuple[Tensor, Tensor]] | None = None, eid: bool = False) -> tuple:
    """:func:`hpcgnn.sampling.neighbor.sample_neighbors` by torch ops (Floyd's draws on the host)."""
    return hop(rowptr, col, nodes, fanout, generator, row_start, out, eid=eid)


def hop(rowptr: Tensor, col: Tensor, nodes: Tensor, fanout: int, generator: torch.Generator | None = None,
        row_start: int = 0, out: Callable[[int], tuple[Tensor, Tensor]] | None = None,
        method: str | None = None, eid: bool = False) -> tuple:
    """One hop by torch ops, ``method``'s draws (see :func:`hpcgnn.sampling.neighbor.sample_neighbors`);
    ``eid``: the edges' positions in col too (their ids: where their features are)."""
    device = rowptr.device
    start = rowptr.index_select(0, nodes)
    deg = rowptr.index_select(0, nodes + 1).sub_(start)
    take = deg.clamp(max=fanout)
    first = torch.cumsum(take, 0).sub_(take)  # where each row's output slots begin
    row = torch.repeat_interleave(torch.arange(nodes.numel(), device=device), take)
    # Where in col each output slot reads: a row's slots read its neighbour list from its start, in order...
    pos = torch.arange(row.numel(), device=device).add_((start - first).index_select(0, row))
    big = (deg > fanout).nonzero().squeeze(1)  # rows that draw a subset (one host-device sync)
    if big.numel():
        n = deg.index_select(0, big)
        if method is None:  # the host: Floyd; a GPU: keys while they cost about what Floyd's steps do
            method = "keys" if device.type == "cuda" and int(n.sum()) <= KEYS_PER_SLOT * n.numel() * fanout \
                else "floyd"
        sample = floyd_sample if method == "floyd" else key_sample
        offsets = sample(n, fanout, generator)  # [rows with deg > fanout, fanout]
        # ...but big rows own exactly `fanout` consecutive slots each, which read their drawn offsets.
        slots = (first.index_select(0, big).unsqueeze(1) + torch.arange(fanout, device=device)).view(-1)
        pos[slots] = offsets.add_(start.index_select(0, big).unsqueeze(1)).view(-1)
    row, nbr = row.add_(row_start) if row_start else row, col.index_select(0, pos).long()  # col may be int32
    if out is not None:
        row_out, nbr_out = out(row.numel())
        row, nbr = row_out.copy_(row), nbr_out.copy_(nbr)
    return (row, nbr, pos) if eid else (row, nbr)


def key_sample(n: Tensor, k: int, generator: torch.Generator | None = None) -> Tensor:
    """For each row i, ``k`` distinct integers drawn uniformly from ``[0, n[i])`` (needs n >= k).

    Each of row i's ``n[i]`` offsets gets the key ``i + u`` (u uniform in [0, 1)); sorting the keys
    keeps rows in order and shuffles every row uniformly, and the first ``k`` of a row are a uniform
    k-subset. Work and memory grow with ``n.sum()``, in a constant number of kernels.
    """
    m, device = n.numel(), n.device
    total = int(n.sum())
    row = torch.repeat_interleave(torch.arange(m, device=device), n, output_size=total)
    keys = torch.rand(total, generator=generator, dtype=torch.float64, device=device).add_(row)
    order = torch.sort(keys).indices  # row blocks stay in place; inside a block, a random permutation
    first = torch.cumsum(n, 0) - n  # where each row's block starts
    kept = (first.unsqueeze(1) + torch.arange(k, device=device)).view(-1)  # each block's first k positions
    return (order.index_select(0, kept) - first.repeat_interleave(k, output_size=m * k)).view(m, k)


def floyd_sample(n: Tensor, k: int, generator: torch.Generator | None = None) -> Tensor:
    """For each row i, ``k`` distinct integers drawn uniformly from ``[0, n[i])`` (needs n >= k).

    Floyd's algorithm: at step j, draw t from [0, n - k + j]; if t was drawn before,
    take n - k + j itself. Every k-subset comes out with equal probability. All steps'
    draws are made at once (row j of one [k, m] block of :func:`hpcgnn.rng.counter_uniform`);
    only the check against the earlier steps runs step by step.
    """
    m, device = n.numel(), n.device
    u = rng.counter_uniform(rng.draw_key(generator, device), k * m, device).view(k, m)
    top = (n - k).unsqueeze(0) + torch.arange(k, device=device).unsqueeze(1)  # [k, m]: step j's inclusive bound
    t = torch.minimum((u * (top + 1)).long(), top)
    out = torch.empty(m, k, dtype=torch.long, device=device)
    if k:
        out[:, 0] = t[0]
    for j in range(1, k):
        seen = (out[:, :j] == t[j].unsqueeze(1)).any(1)
        out[:, j] = torch.where(seen, top[j], t[j])
    return out


def time_bounds(rowptr: Tensor, times: Tensor, nodes: Tensor, at: Tensor, strict: bool = False,
                window: Tensor | None = None, last: int = 0) -> Tensor:
    """:func:`hpcgnn.kernels.ops.time_bounds` by torch ops: the same binary searches, all nodes' steps at once."""
    nodes = nodes.long()
    bad = ((nodes < 0) | (nodes >= rowptr.numel() - 1)).nonzero()
    if bad.numel():
        raise IndexError(f"node {int(nodes[bad[0, 0]])} is out of range for a graph of {rowptr.numel() - 1} nodes")
    at = at.to(times.dtype)
    lo, hi = rowptr.index_select(0, nodes), rowptr.index_select(0, nodes + 1)
    stop = _first_after(times, lo, hi, at, strict)
    start = lo if window is None else _first_after(times, lo, stop, at - window.to(times.dtype), True)
    if last > 0:
        start = torch.maximum(start, stop - last)
    return torch.stack([start, stop], 1).view(-1)


def _first_after(times: Tensor, lo: Tensor, hi: Tensor, t: Tensor, from_t: bool) -> Tensor:
    """For each i, the first position in ``[lo[i], hi[i])`` whose time is after ``t[i]`` (at or after it: ``from_t``),
    ``hi[i]`` if none (times sorted within the range): times.c's binary search, step for step."""
    lo, hi = lo.clone(), hi.clone()
    width = int((hi - lo).max()) if lo.numel() else 0
    last = max(times.numel() - 1, 0)
    for _ in range(width.bit_length()):
        active = lo < hi
        mid = lo + (hi - lo) // 2
        value = times.index_select(0, mid.clamp(max=last)) if times.numel() else t
        after = (value >= t) if from_t else (value > t)
        hi = torch.where(active & after, mid, hi)
        lo = torch.where(active & ~after, mid + 1, lo)
    return lo


def number_new(table: Tensor, state: Tensor, candidates: list[Tensor], total: int) -> Tensor:
    """:func:`hpcgnn.kernels.ops.number_new` by torch ops: the distinct candidates not in the map (state
    2), sorted, entered as ``total``, ``total + 1``, ...; an id out of range changes nothing."""
    ids = torch.cat([c.long().reshape(-1) for c in candidates]) if candidates else torch.empty(0, dtype=torch.long)
    _check_ids(ids, table.numel())
    new = torch.unique(ids[state.index_select(0, ids) != 2])
    table[new] = torch.arange(total, total + new.numel(), dtype=torch.long)
    state[new] = 2
    return new


def dense_get(table: Tensor, state: Tensor, ids: Tensor, out: Tensor | None = None) -> Tensor:
    """:func:`hpcgnn.kernels.ops.dense_get` by torch ops: ``table[ids]`` where the state says an id is in
    the map, else -1."""
    ids = ids.long()
    _check_ids(ids, table.numel())
    found = torch.where(state.index_select(0, ids) == 2, table.index_select(0, ids), -1)
    return found if out is None else out.copy_(found)


def gather_rows(src: Tensor, index: Tensor, out: Tensor, at: Tensor | None = None) -> Tensor:
    """:func:`hpcgnn.kernels.ops.gather_rows` by torch ops: ``out[at] = src[index]`` (``at`` None: all of
    ``out``, in order), in ``out``'s dtype."""
    if at is not None:
        return out.index_copy_(0, at.long(), src.index_select(0, index).to(out.dtype))
    if out.dtype == src.dtype:
        return torch.index_select(src, 0, index, out=out)
    return out.copy_(src.index_select(0, index))


def _check_ids(ids: Tensor, size: int) -> None:
    """The first id outside ``[0, size)`` refused, as the kernels refuse it."""
    bad = ((ids < 0) | (ids >= size)).nonzero()
    if bad.numel():
        raise IndexError(f"id {int(ids[bad[0, 0]])} is out of range for a map of {size} ids")


def aggregate_rows(rowptr: Tensor, col: Tensor, x: Tensor, lo: int, hi: int, *, mean: bool = False,
                   dinv: Tensor | None = None, self_loop: bool = False, edge_weight: Tensor | None = None,
                   self_weight: Tensor | None = None) -> Tensor:
    """:func:`hpcgnn.kernels.ops.aggregate_rows` by torch ops: every edge's source row gathered (and
    weighed), then added into its target row in the edges' order (``index_add_``), on ``x``'s device."""
    device = x.device
    start, end = rowptr[lo:hi + 1].to(device).long(), rowptr[lo + 1:hi + 1].to(device).long()
    deg = end - start[:-1]
    first = int(start[0]) if hi > lo else 0
    src = col[first:int(start[-1]) if hi > lo else 0].to(device).long()
    bad = ((src < 0) | (src >= x.size(0))).nonzero()
    if bad.numel():
        e = first + int(bad[0, 0])
        raise IndexError(f"edge {e}'s source {int(col[e])} is outside the table's {x.size(0)} rows")
    dst = torch.repeat_interleave(torch.arange(hi - lo, device=device), deg)
    targets = torch.arange(lo, hi, device=device)
    weight = edge_weight
    if self_loop:  # each row's self-loop after its edges: the edges ordered by row, then by place in the row
        order = torch.argsort(torch.cat([dst * 2, torch.arange(hi - lo, device=device) * 2 + 1]), stable=True)
        src, dst = torch.cat([src, targets])[order], torch.cat([dst, targets - lo])[order]
        if edge_weight is not None:
            weight = torch.cat([edge_weight, self_weight])[order]
    rows = x.index_select(0, src).float()
    if weight is not None:  # a weight per head, over its slice of the row
        heads = weight.size(1)
        rows = (rows.view(rows.size(0), heads, -1) * weight.to(device).unsqueeze(2)).view(rows.size(0), -1)
    elif dinv is not None:
        d = dinv.to(device, torch.float64)
        rows = rows * (d.index_select(0, src) * d.index_select(0, dst + lo)).float().unsqueeze(1)
    out = torch.zeros(hi - lo, x.size(1), device=device).index_add_(0, dst, rows)
    if mean:
        out = out / (deg + int(self_loop)).clamp(min=1).float().unsqueeze(1)
    return out


def assemble_graphs(x: Tensor, edges: Tensor, edge_attr: Tensor | None, node_ptr: Tensor, edge_ptr: Tensor,
                    ids: Tensor, out_ptr: Tensor, out_eptr: Tensor, pin_memory: bool = False) -> tuple:
    """:func:`hpcgnn.kernels.ops.assemble_graphs` by torch ops (``out_ptr``, ``out_eptr``: the batch's running
    node and edge counts, its caller's)."""
    sizes, edge_sizes = out_ptr[1:] - out_ptr[:-1], out_eptr[1:] - out_eptr[:-1]
    rows, total = int(out_ptr[-1]), int(out_eptr[-1])
    node_rows = (torch.repeat_interleave(node_ptr.index_select(0, ids) - out_ptr[:-1], sizes, output_size=rows)
                 + torch.arange(rows))
    edge_rows = (torch.repeat_interleave(edge_ptr.index_select(0, ids) - out_eptr[:-1], edge_sizes, output_size=total)
                 + torch.arange(total))
    shift = torch.repeat_interleave(out_ptr[:-1], edge_sizes, output_size=total)
    edge_index = edges.index_select(0, edge_rows.to(edges.device)).long().t().cpu() + shift
    out = (x.index_select(0, node_rows.to(x.device)).cpu(), edge_index.contiguous(),
           None if edge_attr is None else edge_attr.index_select(0, edge_rows.to(edge_attr.device)).cpu(),
           torch.repeat_interleave(torch.arange(ids.numel()), sizes, output_size=rows), out_ptr)
    if pin_memory:
        return tuple(t.pin_memory() if t is not None else None for t in out)
    return out
