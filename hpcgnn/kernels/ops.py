"""hpcgnn's sampling kernels in C (the C kernels), called through ctypes.

The host sampler's hops and its numbering of new nodes are loops that torch ops express only in
many passes over memory (a Floyd step per sampled slot, a sort or a scan per hop). the C kernels
runs them in one pass each. It includes no torch header: ``pip install`` builds it into the package, or the C
compiler on first use into a cache (:mod:`hpcgnn.kernels.build`, which also checks a library before it is
called).

The kernels take the same key (drawn by torch from the batch's generator, once per hop), make the
same uniform numbers of it (``rng.counter_uniform``) and the same batch, bit for bit, as the
torch ops of :mod:`hpcgnn.sampling.neighbor`: a machine with no C compiler (or ``HPCGNN_NATIVE=0``)
samples the same batches, only slower, and a run resumed on either kind of machine goes on as it
would have. The GIL is released while a kernel runs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
from torch import Tensor

import hpcgnn.kernels.twins as twins
from hpcgnn import rng
from hpcgnn.kernels.binding import kernels, ptr, usable
from hpcgnn.kernels.scheduler import MAX_CHUNKS, chunks_for, shared_gather, threads

log = logging.getLogger(__name__)

def sample_neighbors(rowptr: Tensor, col: Tensor, nodes: Tensor, fanout: int,
                     generator: torch.Generator | None = None, row_start: int = 0,
                     out: Callable[[int], tuple[Tensor, Tensor]] | None = None, eid: bool = False) -> tuple:
    """:func:`hpcgnn.sampling.neighbor.sample_neighbors` with Floyd's draws, in two passes of C (``out``: there;
    ``eid``: the edges' positions in col too, a third tensor)."""
    if not usable(rowptr, col, nodes):
        return twins.sample_neighbors(rowptr, col, nodes, fanout, generator, row_start, out, eid)
    lib = kernels()
    rowptr, col, nodes = rowptr.contiguous(), col.contiguous(), nodes.long().contiguous()
    m, chunks = nodes.numel(), chunks_for(nodes.numel())
    chunk_slot, chunk_big = torch.empty(chunks + 1, dtype=torch.long), torch.empty(chunks + 1, dtype=torch.long)
    slots = lib.hpcgnn_hop_plan(ptr(rowptr), rowptr.numel() - 1, ptr(nodes), m, fanout, chunks, ptr(chunk_slot),
                                ptr(chunk_big), threads())
    if slots < 0:
        raise IndexError(f"node {int(nodes[-1 - slots])} is out of range for a graph of {rowptr.numel() - 1} nodes")
    nbig = int(chunk_big[chunks])
    # The key the torch path draws (floyd_sample), when a row draws: the kernel makes the uniform numbers of it.
    key = int(rng.draw_key(generator, rowptr.device)) if nbig else 0
    row, nbr = out(slots) if out is not None else (torch.empty(slots, dtype=torch.long), torch.empty(slots, dtype=torch.long))
    if out is not None and not all(t.dtype == torch.long and t.is_contiguous() and t.shape == (slots,) for t in (row, nbr)):
        raise ValueError(f"out must give two contiguous int64 tensors of {slots} entries")
    ids = torch.empty(slots, dtype=torch.long) if eid else None
    lib.hpcgnn_hop_fill(ptr(rowptr), ptr(col), int(col.dtype == torch.int32), ptr(nodes), m, fanout, chunks,
                        ptr(chunk_slot), ptr(chunk_big), key, nbig, row_start, ptr(row), ptr(nbr),
                        ptr(ids) if eid else None, threads())
    return (row, nbr, ids) if eid else (row, nbr)


def time_bounds(rowptr: Tensor, times: Tensor, nodes: Tensor, at: Tensor, strict: bool = False,
                window: Tensor | None = None, last: int = 0) -> Tensor:
    """For each of ``nodes``, asked as of ``at`` (one time each): the range of its list in ``(rowptr, times)`` (each
    row's times sorted) it may draw from: the edges at or before its time (before it: ``strict``), not older than
    ``window`` (a 0-d tensor of the times' dtype; None: any age), the last ``last`` of them (0: all). int64 [2m],
    each node's start and end interleaved: a CSR's rowptr over the rows ``0, 2, 4, ...``, which a hop draws from as
    from any rows (:func:`sample_neighbors`). In C where it can; else :func:`hpcgnn.kernels.twins.time_bounds`."""
    if not usable(rowptr, times, nodes, at) or times.dtype not in (torch.int64, torch.float64):
        return twins.time_bounds(rowptr, times, nodes, at, strict, window, last)
    rowptr, times, nodes = rowptr.contiguous(), times.contiguous(), nodes.long().contiguous()
    at = at.to(times.dtype).contiguous()
    window = None if window is None else window.to(times.dtype).reshape(1).contiguous()
    m, chunks = nodes.numel(), chunks_for(nodes.numel())
    out, bad = torch.empty(2 * m, dtype=torch.long), torch.empty(chunks, dtype=torch.long)
    code = kernels().hpcgnn_time_bounds(ptr(rowptr), rowptr.numel() - 1, ptr(times),
                                        int(times.dtype == torch.float64), ptr(nodes), ptr(at), m, int(strict),
                                        None if window is None else ptr(window), last, chunks, ptr(bad), ptr(out),
                                        threads())
    if code < 0:
        raise IndexError(f"node {int(nodes[-1 - code])} is out of range for a graph of {rowptr.numel() - 1} nodes")
    return out


def number_new(table: Tensor, state: Tensor, candidates: list[Tensor], total: int) -> Tensor:
    """The distinct candidates not in ``table`` (-1 there), sorted, entered as ``total``, ``total + 1``, ...
    (``DenseIdMap.fresh`` then ``put``). ``state``: uint8 over the table, 2 where an id is in it, else 0; so
    left, the new ids' 2 included (a byte per id: far more of it stays in the caches than of the table)."""
    if not usable(table, state, *candidates):
        return twins.number_new(table, state, candidates, total)
    lib, n_threads = kernels(), threads()
    found = torch.empty(sum(c.numel() for c in candidates), dtype=torch.long)
    per_chunk = torch.empty(MAX_CHUNKS + 1, dtype=torch.long)
    count = 0
    for c in candidates:
        c = c.long().contiguous()
        count = lib.hpcgnn_mark_new(ptr(state), state.numel(), ptr(c), c.numel(), ptr(found), count,
                                    chunks_for(c.numel()), ptr(per_chunk), n_threads)
        if count < 0:
            state.masked_fill_(state == 1, 0)  # this round's marks; the map's ids keep theirs
            raise IndexError(f"id {int(c[-1 - count])} is out of range for a map of {table.numel()} ids")
    count = lib.hpcgnn_number_found(ptr(table), ptr(state), table.numel(), ptr(found), count, total,
                                    chunks_for(max(count, table.numel() // 16)), ptr(per_chunk), n_threads)
    return found[:count]


def dense_get(table: Tensor, state: Tensor, ids: Tensor, out: Tensor | None = None) -> Tensor:
    """A dense map's lookups (``DenseIdMap.get`` once :func:`number_new` keeps its state): ``table[ids]`` where
    an id is in the map (its state 2), else -1, whatever the table holds there (it is not cleared between
    batches: the state is). ``out``: int64, contiguous, as long as ``ids``, written in place (it may be ``ids`` itself)."""
    if not usable(table, state, ids):
        return twins.dense_get(table, state, ids, out)
    ids = ids.long().contiguous()
    if out is None:
        out = torch.empty_like(ids)
    elif out.dtype != torch.long or not out.is_contiguous() or out.shape != ids.shape:
        raise ValueError(f"out must be a contiguous int64 tensor of shape {tuple(ids.shape)}")
    chunks = chunks_for(ids.numel())
    scratch = torch.empty(chunks, dtype=torch.long)
    bad = kernels().hpcgnn_dense_get(ptr(table), ptr(state), table.numel(), ptr(ids), ids.numel(), ptr(out),
                                     chunks, ptr(scratch), threads())
    if bad < 0:
        raise IndexError(f"id {int(ids[-1 - bad])} is out of range for a map of {table.numel()} ids")
    return out


def f16c() -> bool:
    """Whether the kernels can widen float16 rows by the CPU's own conversion (x86's F16C)."""
    lib = kernels()
    return lib is not None and bool(lib.hpcgnn_f16c())


def stream_bytes() -> int:
    """The size of a gather's output from which :func:`gather_rows` writes it past the caches (0: never here)."""
    lib = kernels()
    return 0 if lib is None else int(lib.hpcgnn_stream_bytes())


def gather_rows(src: Tensor, index: Tensor, out: Tensor, at: Tensor | None = None) -> Tensor:
    """``torch.index_select(src, 0, index, out=out)``, into ``out``'s dtype (``src``'s, or float32 from rows stored
    as bfloat16, or float16 where the CPU converts it (:func:`f16c`), widened on the way, bit for bit as
    ``.float()``: one pass instead of a gather and an upcast). ``at``: the rows of ``out`` they go to
    (``out[at] = src[index]``; default: all of ``out``, in order). In C where it can (host tensors, ``src`` and
    ``out`` contiguous, the kernels here), on this thread's budget of threads, the rows asked for from memory ahead
    of their copy; else by its torch twin."""
    if at is not None:
        at = at.long().contiguous()
        if at.numel() != index.numel():
            raise ValueError(f"{at.numel()} places for {index.numel()} rows")
        low, high = torch.aminmax(at) if at.numel() else (0, 0)  # one pass over the places
        if at.numel() and (int(low) < 0 or int(high) >= out.size(0)):
            raise IndexError(f"a place in rows 0..{out.size(0) - 1} of out is outside them")
    widen = out.dtype == torch.float32 and (src.dtype == torch.bfloat16 or src.dtype == torch.float16 and f16c())
    rows = index.numel() if at is None else out.size(0)
    if not (src.is_contiguous() and out.is_contiguous() and src.dim() >= 1 and (out.dtype == src.dtype or widen)
            and usable(src, index, out)) or out.shape != (rows, *src.shape[1:]):
        return twins.gather_rows(src, index, out, at)
    index = index.long().contiguous()
    chunks = chunks_for(index.numel())
    scratch = torch.empty(chunks, dtype=torch.long)
    row = src[0].numel() if src.size(0) else 0
    places = ptr(at) if at is not None else None
    lib = kernels()
    if widen:
        fn, args = lib.hpcgnn_gather_rows_wide, (ptr(src), src.size(0), row, int(src.dtype == torch.float16))
    else:
        fn, args = lib.hpcgnn_gather_rows, (ptr(src), src.size(0), row * src.element_size())
    args = (*args, ptr(index), index.numel(), ptr(out), places, chunks, ptr(scratch), threads())
    share = shared_gather()
    if share is None or chunks < 2:
        bad = fn(*args, None)
    else:  # a job buffer of its own (zeroed: no chunk in it until the gather publishes them)
        bad = share._run(torch.zeros(lib.hpcgnn_job_bytes(), dtype=torch.uint8), fn, *args)
    if bad < 0:
        raise IndexError(f"index {int(index[-1 - bad])} is out of range for {src.size(0)} rows")
    return out



KINDS = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}  # aggregate_rows's row kinds


def aggregate_rows(rowptr: Tensor, col: Tensor, x: Tensor, lo: int, hi: int, *, mean: bool = False,
                   dinv: Tensor | None = None, self_loop: bool = False, edge_weight: Tensor | None = None,
                   self_weight: Tensor | None = None) -> Tensor:
    """For target rows ``lo .. hi`` of a CSR (``rowptr``, ``col``: sources as rows of ``x``), the sum of their
    in-neighbours' rows of ``x``, float32 ``[hi - lo, width]``: each row read once per edge into an accumulator,
    no message per edge in memory; rows stored as bfloat16 or float16 widened on the way. ``dinv``: GCN's inverse
    square-root degrees by row of ``x`` (float64), an edge ``s -> r`` weighing ``float(dinv[s] * dinv[r])``;
    ``self_loop``: row ``r`` itself added after its edges (GCN's); ``mean``: divided by the count (a row with
    none stays 0). ``edge_weight``: float32 ``[edges of rows lo..hi, heads]``, each edge's weight per head, for
    ``heads`` equal slices of a row (GAT's attention; ``self_weight`` ``[hi - lo, heads]`` its self-loops'), in
    place of ``dinv``. In C on this thread's budget of threads, rows split among them; the same floats on any
    number of threads (and by its torch twin, where the kernels cannot run)."""
    if not (0 <= lo <= hi <= rowptr.numel() - 1):
        raise IndexError(f"rows {lo}..{hi} are outside the CSR's {rowptr.numel() - 1}")
    if self_loop and hi > x.size(0):
        raise IndexError(f"self-loops of rows up to {hi} on a table of {x.size(0)} rows")
    heads = 1 if edge_weight is None else edge_weight.size(1)
    if edge_weight is not None and (x.size(1) % heads or edge_weight.size(0) != int(rowptr[hi] - rowptr[lo])
                                    or (self_loop and (self_weight is None or self_weight.shape != (hi - lo, heads)))):
        raise ValueError(f"edge weights {tuple(edge_weight.shape)} (self-loops: "
                         f"{None if self_weight is None else tuple(self_weight.shape)}) do not fit rows {lo}..{hi} "
                         f"of width {x.size(1)}")
    extra = [t for t in (dinv, edge_weight, self_weight) if t is not None]
    if (x.dtype not in KINDS or x.dim() != 2 or not x.is_contiguous() or rowptr.dtype != torch.long
            or col.dtype not in (torch.int32, torch.long) or not usable(rowptr, col, x, *extra)
            or (dinv is not None and dinv.dtype != torch.float64)
            or any(t.dtype != torch.float32 for t in (edge_weight, self_weight) if t is not None)):
        return twins.aggregate_rows(rowptr, col, x, lo, hi, mean=mean, dinv=dinv, self_loop=self_loop,
                                    edge_weight=edge_weight, self_weight=self_weight)
    rowptr, col = rowptr.contiguous(), col.contiguous()
    dinv = dinv.contiguous() if dinv is not None else None
    edge_weight = edge_weight.contiguous() if edge_weight is not None else None
    self_weight = self_weight.contiguous() if self_weight is not None else None
    out = torch.empty(hi - lo, x.size(1))
    chunks = chunks_for(int(rowptr[hi] - rowptr[lo]) if hi > lo else 0)
    chunks = max(1, min(chunks, hi - lo))
    scratch = torch.empty(chunks, dtype=torch.long)
    bad = kernels().hpcgnn_aggregate_rows(ptr(rowptr), ptr(col), int(col.dtype == torch.int32), ptr(x),
                                          KINDS[x.dtype], x.size(0), x.size(1), lo, hi,
                                          *(ptr(t) if t is not None else None for t in (dinv, edge_weight, self_weight)),
                                          heads, int(self_loop), int(mean), ptr(out), chunks, ptr(scratch), threads())
    if bad < 0:
        raise IndexError(f"edge {-1 - bad}'s source {int(col[-1 - bad])} is outside the table's {x.size(0)} rows")
    return out


def take_next(counter: Tensor) -> int | None:
    """``counter[0]`` before adding 1 to it, atomically, also between processes that map the same memory (int64,
    host): the ranks of a node take chunks of work in turn from it. None where the kernels cannot run (no atomic
    add from torch: the caller shares the work out in fixed ranges instead)."""
    if counter.dtype != torch.long or not usable(counter):
        return None
    return int(kernels().hpcgnn_take_next(ptr(counter)))


def assemble_graphs(x: Tensor, edges: Tensor, edge_attr: Tensor | None, node_ptr: Tensor, edge_ptr: Tensor,
                    ids: Tensor, pin_memory: bool = False) -> tuple[Tensor, Tensor, Tensor | None, Tensor, Tensor]:
    """Graphs ``ids`` of a store of many (:mod:`hpcgnn.data.graphs`: rows ``node_ptr[g]:node_ptr[g+1]`` of ``x``,
    ``edge_ptr[g]:edge_ptr[g+1]`` of ``edges``, int32 ends within the graph, and of ``edge_attr``) as one batch in
    PyG's form: ``x``, ``edge_index`` (int64 [2, E], each end shifted by its graph's first row in the batch),
    ``edge_attr``, ``batch`` (each node's graph in the batch) and ``ptr`` (each graph's first row, then the total).
    One pass of C over the graphs' rows (``pin_memory``: the outputs pinned), else its torch twin."""
    ids = ids.long().contiguous()
    sizes = node_ptr.index_select(0, ids + 1) - node_ptr.index_select(0, ids)
    edge_sizes = edge_ptr.index_select(0, ids + 1) - edge_ptr.index_select(0, ids)
    n = ids.numel()
    out_ptr, out_eptr = torch.zeros(n + 1, dtype=torch.long), torch.zeros(n + 1, dtype=torch.long)
    torch.cumsum(sizes, 0, out=out_ptr[1:])
    torch.cumsum(edge_sizes, 0, out=out_eptr[1:])
    rows, total = int(out_ptr[-1]), int(out_eptr[-1])
    tensors = (x, edges, node_ptr, edge_ptr) + ((edge_attr,) if edge_attr is not None else ())
    if not (usable(*tensors) and all(t.is_contiguous() for t in tensors) and edges.dtype == torch.int32):
        return twins.assemble_graphs(x, edges, edge_attr, node_ptr, edge_ptr, ids, out_ptr, out_eptr, pin_memory)
    out_x = torch.empty((rows, *x.shape[1:]), dtype=x.dtype, pin_memory=pin_memory)
    edge_index = torch.empty((2, total), dtype=torch.long, pin_memory=pin_memory)
    out_attr = None if edge_attr is None else torch.empty((total, *edge_attr.shape[1:]), dtype=edge_attr.dtype,
                                                          pin_memory=pin_memory)
    batch = torch.empty(rows, dtype=torch.long, pin_memory=pin_memory)
    x_bytes = x[0].numel() * x.element_size() if x.size(0) else 0
    attr_bytes = edge_attr[0].numel() * edge_attr.element_size() if edge_attr is not None and edge_attr.size(0) else 0
    chunks = max(1, min(n, MAX_CHUNKS, (rows + total) // 2048))
    kernels().hpcgnn_assemble_graphs(ptr(x), x_bytes, ptr(edges), ptr(edge_attr) if attr_bytes else None, attr_bytes,
                                     ptr(node_ptr), ptr(edge_ptr), ptr(ids), n, ptr(out_ptr), ptr(out_eptr), total,
                                     ptr(out_x), ptr(edge_index), ptr(out_attr) if attr_bytes else None, ptr(batch),
                                     chunks, threads())
    return out_x, edge_index, out_attr, batch, out_ptr
