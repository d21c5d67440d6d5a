"""hpcgnn's sampling kernels in C (``native.c``), called through ctypes.

The host sampler's hops and its numbering of new nodes are loops that torch ops express only in
many passes over memory (a Floyd step per sampled slot, a sort or a scan per hop). ``native.c``
runs them in one pass each. It includes no torch header: ``pip install`` builds it into the package, or the C
compiler on first use into a cache (:mod:`hpcgnn.sampling.build`, which also checks a library before it is
called).

The kernels take the same key (drawn by torch from the batch's generator, once per hop), make the
same uniform numbers of it (``rng.counter_uniform``) and the same batch, bit for bit, as the
torch ops of :mod:`hpcgnn.sampling.neighbor`: a machine with no C compiler (or ``HPCGNN_NATIVE=0``)
samples the same batches, only slower, and a run resumed on either kind of machine goes on as it
would have. The GIL is released while a kernel runs.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import threading
from collections.abc import Callable

import torch
from torch import Tensor

from hpcgnn import env, rng

log = logging.getLogger(__name__)
CHUNK = 4096  # items per chunk of work (at most MAX_CHUNKS chunks), which the kernels' threads take in turn
MAX_CHUNKS = 256


_budget = threading.local()


def threads() -> int:
    """Threads a kernel called from this thread runs on: this thread's budget (:func:`thread_budget`), else
    torch's thread count."""
    return getattr(_budget, "threads", None) or torch.get_num_threads()


def thread_budget(n: int | None) -> None:
    """The kernels called from this thread from now on run on ``n`` threads (None: torch's count). Two
    loader stages running at once (sampling, gathering) split the rank's threads this way instead of each
    starting a team of all of them."""
    _budget.threads = n


class GatherShare:
    """Row gathers that another thread may help with: the gathering thread of a two-stage loader hands each of
    its row gathers here while it runs (:func:`share_gathers`), and the sampling thread, its next batch made
    and waiting for room, takes chunks of it (:meth:`help`). The stages then meet where their times differ
    (a typed batch's gather takes longer than its sampling), with no thread more than the cores."""

    def __init__(self) -> None:
        self.job: Tensor | None = None  # the running gather's job buffer (C's struct job), or None
        self.changed = threading.Condition()  # notified when a gather starts, and by the caller when room opens

    def help(self) -> int:
        """Chunks of the running gather until none is left; how many this thread did (0: none was left, or
        no gather is running)."""
        job = self.job  # held here: the buffer lives while this thread may still read it
        return 0 if job is None else int(kernels().hpcgnn_job_help(_ptr(job)))

    def _run(self, job: Tensor, fn, *args) -> int:
        with self.changed:
            self.job = job
            self.changed.notify_all()
        try:
            return fn(*args, _ptr(job))
        finally:
            self.job = None


def share_gathers(share: GatherShare | None) -> None:
    """Row gathers called from this thread from now on are handed to ``share`` while they run (None: not)."""
    _budget.share = share


@functools.lru_cache(maxsize=1)
def kernels() -> ctypes.CDLL | None:
    """The loaded kernels, checked (:func:`hpcgnn.sampling.build.find`), or None (``HPCGNN_NATIVE=0``, or none
    here is usable: logged once, with the fix)."""
    if env.read("native") == "0":
        return None
    from hpcgnn.sampling.build import find

    return find()


def usable(*tensors: Tensor) -> bool:
    """Whether the kernels can run on these tensors (host memory) and are available."""
    return all(t.device.type == "cpu" for t in tensors) and kernels() is not None


def _ptr(t: Tensor) -> int:
    return t.data_ptr()


def _chunks(n: int) -> int:
    return max(1, min(MAX_CHUNKS, n // CHUNK))


def sample_neighbors(rowptr: Tensor, col: Tensor, nodes: Tensor, fanout: int,
                     generator: torch.Generator | None = None, row_start: int = 0,
                     out: Callable[[int], tuple[Tensor, Tensor]] | None = None) -> tuple[Tensor, Tensor]:
    """:func:`hpcgnn.sampling.neighbor.sample_neighbors` with Floyd's draws, in two passes of C (``out``: there)."""
    lib = kernels()
    rowptr, col, nodes = rowptr.contiguous(), col.contiguous(), nodes.long().contiguous()
    m, chunks = nodes.numel(), _chunks(nodes.numel())
    chunk_slot, chunk_big = torch.empty(chunks + 1, dtype=torch.long), torch.empty(chunks + 1, dtype=torch.long)
    slots = lib.hpcgnn_hop_plan(_ptr(rowptr), rowptr.numel() - 1, _ptr(nodes), m, fanout, chunks, _ptr(chunk_slot),
                                _ptr(chunk_big), threads())
    if slots < 0:
        raise IndexError(f"node {int(nodes[-1 - slots])} is out of range for a graph of {rowptr.numel() - 1} nodes")
    nbig = int(chunk_big[chunks])
    # The key the torch path draws (floyd_sample), when a row draws: the kernel makes the uniform numbers of it.
    key = int(rng.draw_key(generator, rowptr.device)) if nbig else 0
    row, nbr = out(slots) if out is not None else (torch.empty(slots, dtype=torch.long), torch.empty(slots, dtype=torch.long))
    if out is not None and not all(t.dtype == torch.long and t.is_contiguous() and t.shape == (slots,) for t in (row, nbr)):
        raise ValueError(f"out must give two contiguous int64 tensors of {slots} entries")
    lib.hpcgnn_hop_fill(_ptr(rowptr), _ptr(col), int(col.dtype == torch.int32), _ptr(nodes), m, fanout, chunks,
                        _ptr(chunk_slot), _ptr(chunk_big), key, nbig, row_start, _ptr(row), _ptr(nbr),
                        threads())
    return row, nbr


def number_new(table: Tensor, state: Tensor, candidates: list[Tensor], total: int) -> Tensor:
    """The distinct candidates not in ``table`` (-1 there), sorted, entered as ``total``, ``total + 1``, ...
    (``DenseIdMap.fresh`` then ``put``). ``state``: uint8 over the table, 2 where an id is in it, else 0; so
    left, the new ids' 2 included (a byte per id: far more of it stays in the caches than of the table)."""
    lib, n_threads = kernels(), threads()
    found = torch.empty(sum(c.numel() for c in candidates), dtype=torch.long)
    per_chunk = torch.empty(MAX_CHUNKS + 1, dtype=torch.long)
    count = 0
    for c in candidates:
        c = c.long().contiguous()
        count = lib.hpcgnn_mark_new(_ptr(state), state.numel(), _ptr(c), c.numel(), _ptr(found), count,
                                    _chunks(c.numel()), _ptr(per_chunk), n_threads)
        if count < 0:
            state.masked_fill_(state == 1, 0)  # this round's marks; the map's ids keep theirs
            raise IndexError(f"id {int(c[-1 - count])} is out of range for a map of {table.numel()} ids")
    count = lib.hpcgnn_number_found(_ptr(table), _ptr(state), table.numel(), _ptr(found), count, total,
                                    _chunks(max(count, table.numel() // 16)), _ptr(per_chunk), n_threads)
    return found[:count]


def dense_get(table: Tensor, state: Tensor, ids: Tensor, out: Tensor | None = None) -> Tensor:
    """A dense map's lookups (``DenseIdMap.get`` once :func:`number_new` keeps its state): ``table[ids]`` where
    an id is in the map (its state 2), else -1, whatever the table holds there (it is not cleared between
    batches: the state is). ``out``: int64, contiguous, as long as ``ids``, written in place (it may be ``ids`` itself)."""
    ids = ids.long().contiguous()
    if out is None:
        out = torch.empty_like(ids)
    elif out.dtype != torch.long or not out.is_contiguous() or out.shape != ids.shape:
        raise ValueError(f"out must be a contiguous int64 tensor of shape {tuple(ids.shape)}")
    chunks = _chunks(ids.numel())
    scratch = torch.empty(chunks, dtype=torch.long)
    bad = kernels().hpcgnn_dense_get(_ptr(table), _ptr(state), table.numel(), _ptr(ids), ids.numel(), _ptr(out),
                                     chunks, _ptr(scratch), threads())
    if bad < 0:
        raise IndexError(f"id {int(ids[-1 - bad])} is out of range for a map of {table.numel()} ids")
    return out


class HashTable:
    """A batch's global -> batch-local ids in a hash table of ``native.c`` (open addressing): memory in
    proportion to the batch (a partitioned rank's map, where an array over every id would be the graph's
    size), a lookup in a probe or two. Grown before each insert to at least twice the ids it may hold."""

    MIN_CAPACITY = 1 << 12

    def __init__(self):
        self.keys = torch.full((self.MIN_CAPACITY,), -1, dtype=torch.long)
        self.values = torch.empty(self.MIN_CAPACITY, dtype=torch.long)
        self.count = 0  # ids held

    def __len__(self) -> int:
        return self.count

    @property
    def capacity(self) -> int:
        return self.keys.numel()

    def reserve(self, more: int) -> None:
        """Room for ``more`` ids beside those held, the table at most half full."""
        need = 2 * (self.count + more)
        if need <= self.capacity:
            return
        held = self.keys >= 0
        ids, values = self.keys[held], self.values[held]
        capacity = 1 << (need - 1).bit_length()
        self.keys = torch.full((capacity,), -1, dtype=torch.long)
        self.values = torch.empty(capacity, dtype=torch.long)
        self.count = 0
        self.put(ids, values)

    def _insert(self, ids: Tensor, values: Tensor | None, found: Tensor | None, count: int) -> int:
        ids = ids.long().contiguous()
        chunks = _chunks(ids.numel())
        scratch = torch.empty(chunks, dtype=torch.long)
        out = kernels().hpcgnn_hash_insert(_ptr(self.keys), _ptr(self.values), self.capacity, _ptr(ids),
                                           _ptr(values) if values is not None else None, ids.numel(),
                                           _ptr(found) if found is not None else None, count, chunks, _ptr(scratch),
                                           threads())
        if out < 0:
            raise IndexError(f"id {int(ids[-1 - out])} is not a node id (ids are 0 or more)")
        return out

    def put(self, ids: Tensor, values: Tensor) -> None:
        """Add ``ids`` (distinct, not held yet) as ``values``."""
        self.reserve(ids.numel())
        try:
            self.count += self._insert(ids, values.long().contiguous(), None, 0)
        except IndexError:
            self.clear()  # some ids went in, uncounted: the map is unusable until cleared
            raise

    def get(self, ids: Tensor) -> Tensor:
        """The values of ``ids``, -1 where an id is not held."""
        ids = ids.long().contiguous()
        out = torch.empty_like(ids)
        kernels().hpcgnn_hash_get(_ptr(self.keys), _ptr(self.values), self.capacity, _ptr(ids), ids.numel(), _ptr(out),
                                  _chunks(ids.numel()), threads())
        return out

    def add_new(self, candidates: list[Tensor], total: int) -> Tensor:
        """The distinct candidates not held, sorted, added as ``total``, ``total + 1``, ..."""
        n = sum(c.numel() for c in candidates)
        self.reserve(n)
        found, count = torch.empty(n, dtype=torch.long), 0
        try:
            for c in candidates:
                count = self._insert(c, None, found, count)
        except IndexError:
            self.clear()  # ids inserted with no value yet: the map is unusable until cleared
            raise
        kernels().hpcgnn_hash_number(_ptr(self.keys), _ptr(self.values), self.capacity, _ptr(found), count, total,
                                     _chunks(count), threads())
        self.count += count
        return found[:count]

    def clear(self, ids: Tensor | None = None) -> None:
        """Forget every id (``ids``, those put since the last clear, are not needed: one fill)."""
        self.keys.fill_(-1)
        self.count = 0


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
    of their copy; else by torch."""
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
        if at is not None:
            return out.index_copy_(0, at, src.index_select(0, index).to(out.dtype))
        if out.dtype == src.dtype:
            return torch.index_select(src, 0, index, out=out)
        return out.copy_(src.index_select(0, index))
    index = index.long().contiguous()
    chunks = _chunks(index.numel())
    scratch = torch.empty(chunks, dtype=torch.long)
    row = src[0].numel() if src.size(0) else 0
    places = _ptr(at) if at is not None else None
    lib = kernels()
    if widen:
        fn, args = lib.hpcgnn_gather_rows_wide, (_ptr(src), src.size(0), row, int(src.dtype == torch.float16))
    else:
        fn, args = lib.hpcgnn_gather_rows, (_ptr(src), src.size(0), row * src.element_size())
    args = (*args, _ptr(index), index.numel(), _ptr(out), places, chunks, _ptr(scratch), threads())
    share = getattr(_budget, "share", None)
    if share is None or chunks < 2:
        bad = fn(*args, None)
    else:  # a job buffer of its own (zeroed: no chunk in it until the gather publishes them)
        bad = share._run(torch.zeros(lib.hpcgnn_job_bytes(), dtype=torch.uint8), fn, *args)
    if bad < 0:
        raise IndexError(f"index {int(index[-1 - bad])} is out of range for {src.size(0)} rows")
    return out
