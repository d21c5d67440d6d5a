"""The C sampling kernels (hpcgnn/kernels/): the same batches as the torch ops, bit for bit; built
once per source and compiler; a machine without a compiler samples on torch ops and says how to mend it."""

from __future__ import annotations

import logging
import os
import pickle
import platform
import shutil
from pathlib import Path

import pytest
import torch
from conftest import needs_cc

from hpcgnn.config import dataset_config
from hpcgnn.data import Graph, build_graph
from hpcgnn.data.synthetic import make_synthetic_typed
from hpcgnn.kernels import binding, build, hashtable, ops, scheduler, sources, twins
from hpcgnn.sampling import CSRNeighborSampler
from hpcgnn.sampling.neighbor import BatchIdMap, DenseIdMap, SortedIdMap, sample_neighbors
from hpcgnn.sampling.typed import TypedNeighborSampler


def both(switch, make):
    """What ``make()`` returns with the kernels, and with torch ops alone."""
    switch(True)
    a = make()
    switch(False)
    return a, make()


@pytest.fixture(scope="module")
def graph() -> Graph:
    """A small graph with two hubs of 598 neighbours (the rows that draw a subset) and many small rows."""
    base = build_graph(dataset_config(num_nodes=3000, avg_degree=8, seed=3))
    spokes = torch.arange(2, 600)
    extra = torch.cat([torch.stack([spokes, torch.zeros_like(spokes)]), torch.stack([spokes, torch.ones_like(spokes)])], 1)
    ei = torch.cat([base.edge_index(), extra, extra.flip(0)], 1)
    return Graph.from_edge_index(ei, base.num_nodes, base.x, base.y, base.train_idx, base.val_idx, base.test_idx,
                                 base.num_classes)


@needs_cc
@pytest.mark.parametrize("col_dtype", [torch.long, torch.int32])
@pytest.mark.parametrize("fanouts", [(7, 4, 3), (25, 10), (1,), (600, 2), (2**62, 2)])
def test_kernels_sample_the_torch_ops_batches(switch, graph, col_dtype, fanouts):
    sampler = CSRNeighborSampler(graph.rowptr, graph.col.to(col_dtype), fanouts)

    def batches():
        gen = torch.Generator().manual_seed(7)
        return [sampler.sample(seeds, gen) for seeds in (torch.tensor([0, 1, 2]), torch.arange(100, 1600, 3),
                                                          torch.randperm(3000, generator=gen)[:900])]

    for a, b in zip(*both(switch, batches), strict=True):
        assert torch.equal(a.n_id, b.n_id) and torch.equal(a.edge_index, b.edge_index)
        assert a.num_sampled_nodes == b.num_sampled_nodes and a.num_sampled_edges == b.num_sampled_edges
    local = sampler._local  # empty between batches (its table's entries are stale: the state says none is held)
    assert bool((local.get(torch.arange(graph.num_nodes)) == -1).all())
    assert not bool(local._mark.any()) and not bool(local._state.any())


@needs_cc
def test_kernels_split_large_hops_into_chunks_and_still_match(switch, graph):
    """A frontier of 60k nodes (repeats allowed in a hop) and 200k candidate ids: many chunks, both threads."""
    torch.set_num_threads(2)
    nodes = torch.randint(0, graph.num_nodes, (60_000,), generator=torch.Generator().manual_seed(1))
    hop = both(switch, lambda: sample_neighbors(graph.rowptr, graph.col, nodes, 5, torch.Generator().manual_seed(2)))
    assert torch.equal(hop[0][0], hop[1][0]) and torch.equal(hop[0][1], hop[1][1])
    assert hop[0][0].numel() > 8 * scheduler.CHUNK

    def numbered(size, n):
        ids_map = DenseIdMap(size)
        ids_map.put(torch.tensor([5, 17, size - 1]), torch.tensor([0, 1, 2]))
        gen = torch.Generator().manual_seed(size + n)
        parts = [torch.randint(0, size, (n,), generator=gen), torch.randint(0, size // 2, (n // 3,), generator=gen)]
        new = ids_map.add_new(parts, 3)
        return new, ids_map.table.clone()

    for size, n in ((1_000_000, 200_000), (1_000_000, 3000), (50, 10)):  # scanned, radix-sorted, scanned
        (new_a, table_a), (new_b, table_b) = both(switch, lambda size=size, n=n: numbered(size, n))
        assert torch.equal(new_a, new_b) and torch.equal(table_a, table_b)
        assert torch.equal(table_a[new_a], torch.arange(3, 3 + new_a.numel()))


@needs_cc
def test_the_batch_sized_map_holds_the_dense_maps_ids(switch):
    """A partitioned rank's map: a hash table in C (grown as a batch grows, filled by both threads at once),
    or sorted arrays on torch ops; both number a round's new ids as the dense map does."""
    torch.set_num_threads(2)
    size = 2_000_000

    def rounds(make):
        ids_map, total, out = make(), 3, []
        ids_map.put(torch.tensor([5, 17, size - 1]), torch.tensor([0, 1, 2]))
        out.append(ids_map.get(torch.tensor([6, 17])))
        gen = torch.Generator().manual_seed(4)
        for n in (10, 3000, 300_000):  # each round larger than the table's room: grown (rehashed) on the way
            parts = [torch.randint(0, size, (n,), generator=gen), torch.randint(0, size // 50, (n // 3,), generator=gen)]
            new = ids_map.add_new(parts, total)
            total += new.numel()
            out += [new, ids_map.get(parts[0])]
        return out

    dense = rounds(lambda: DenseIdMap(size))
    switch(True)
    batch = BatchIdMap()
    assert isinstance(batch.impl, hashtable.HashTable)
    hashed = rounds(BatchIdMap)
    switch(False)
    assert isinstance(BatchIdMap().impl, SortedIdMap)
    for a, b, c in zip(dense, hashed, rounds(BatchIdMap), strict=True):
        assert torch.equal(a, b) and torch.equal(a, c)
    assert hashed[0].tolist() == [-1, 1]  # an id not held, and one held


@needs_cc
def test_the_batch_sized_map_refuses_negative_ids_and_chooses_again_where_it_lands(switch):
    switch(True)
    ids_map = BatchIdMap()
    ids_map.put(torch.tensor([1, 2]), torch.tensor([0, 1]))
    with pytest.raises(IndexError, match="id -3 is not a node id"):
        ids_map.add_new([torch.tensor([7, 8]), torch.tensor([9, -3])], 2)
    assert len(ids_map) == 0 and bool((ids_map.impl.keys == -1).all())  # no id half-entered is left
    with pytest.raises(IndexError, match="id -1 is not a node id"):
        ids_map.put(torch.tensor([3, -1]), torch.tensor([0, 1]))
    assert len(ids_map) == 0 and bool((ids_map.impl.keys == -1).all())
    ids_map.put(torch.tensor([4]), torch.tensor([0]))
    switch(False)  # a sampler pickled to a process where the kernels are not: sorted arrays there
    there = pickle.loads(pickle.dumps(ids_map))
    assert isinstance(there.impl, SortedIdMap) and len(there) == 0


@needs_cc
def test_the_row_gather_copies_what_torch_copies_and_refuses_rows_outside(switch):
    torch.set_num_threads(2)
    gen = torch.Generator().manual_seed(6)
    x = torch.randn(50_000, 24, generator=gen)
    index = torch.randint(0, 50_000, (40_000,), generator=gen)  # repeats allowed, many chunks
    switch(True)
    for src in (x, x.bfloat16(), torch.arange(50_000), x[:, :3].contiguous()):
        for idx in (index, index[:0], index[:7].int()):
            out = torch.empty((idx.numel(), *src.shape[1:]), dtype=src.dtype)
            assert ops.gather_rows(src, idx, out) is out and torch.equal(out, src.index_select(0, idx))
    out = torch.empty(3, 24)
    with pytest.raises(IndexError, match="index 50000 is out of range for 50000 rows"):
        ops.gather_rows(x, torch.tensor([1, 50_000, 2]), out)
    with pytest.raises(IndexError, match="index -1 is out of range for 50000 rows"):
        ops.gather_rows(x, torch.tensor([-1, 0, 2]), out)
    strided = x[:, ::2]  # not contiguous: torch's own gather
    assert torch.equal(ops.gather_rows(strided, index, torch.empty(40_000, 12)), strided.index_select(0, index))


@needs_cc
def test_rows_stored_in_half_precision_are_gathered_as_the_float32_upcast_gives_them(switch):
    """One pass (gather and widen) for bfloat16 and float16 features, bit for bit torch's index_select then .float():
    every one of the 65536 values of each (subnormals, infinities, NaNs), and many rows on two threads."""
    from hpcgnn.data.graph import Graph
    from hpcgnn.sampling.loader import LocalFeatures

    torch.set_num_threads(2)
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(50_000, 24, generator=gen).mul_(1e3)
    x[0, :6] = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0, 1e-40, -1e-39])  # subnormals
    index = torch.cat([torch.tensor([0]), torch.randint(0, 50_000, (40_000,), generator=gen)])
    every_value = torch.arange(-2**15, 2**15, dtype=torch.int32).to(torch.int16)
    by_32, by_5 = every_value.view(2048, 32), every_value[:65535].view(13107, 5)  # rows of 5: a row's last few
    for on in (False, True):
        switch(on)
        for src in (x.bfloat16(), x.half(), *(t.view(dtype) for t in (by_32, by_5)
                                               for dtype in (torch.bfloat16, torch.float16))):
            idx = index if src.size(0) == x.size(0) else torch.randperm(src.size(0), generator=gen)
            out = torch.empty(idx.numel(), src.size(1))
            got = ops.gather_rows(src, idx, out)
            want = src.index_select(0, idx).float()
            assert got is out and torch.equal(got.view(torch.int32), want.view(torch.int32))  # bits, NaN too
    with pytest.raises(IndexError, match="index 50000 is out of range for 50000 rows"):
        ops.gather_rows(x.bfloat16(), torch.tensor([1, 50_000, 2]), torch.empty(3, 24))
    graph = Graph(torch.zeros(50_001, dtype=torch.long), torch.empty(0, dtype=torch.long), x.bfloat16(),
                  torch.arange(50_000), torch.arange(10), torch.arange(0), torch.arange(0), 2)
    slot = []

    def into_slot(shape, dtype):  # what a sampler process's slot hands out
        slot.append(torch.empty(shape, dtype=dtype))
        return slot[-1]

    for batch_x, _ in (LocalFeatures(graph).gather(index, 10), LocalFeatures(graph).gather(index, 10, alloc=into_slot)):
        assert batch_x.dtype == torch.float32 and torch.equal(batch_x.view(torch.int32),
                                                              x.bfloat16()[index].float().view(torch.int32))
    assert batch_x is slot[0]


@needs_cc
def test_rows_gathered_into_given_places_are_those_torch_puts_there(switch):
    """``out[at] = src[index]`` (a partitioned rank's batch: its own rows, cached rows and fetched rows each written
    once where they belong), widened where the rows are stored in half precision; places outside ``out`` refused."""
    gen = torch.Generator().manual_seed(8)
    x = torch.randn(20_000, 24, generator=gen)
    index = torch.randint(0, 20_000, (30_000,), generator=gen)
    at = torch.randperm(50_000, generator=gen)[:30_000]  # distinct places in a batch of 50k rows
    for on in (False, True):
        switch(on)
        for src, dtype in ((x, torch.float32), (x.bfloat16(), torch.float32), (x.half(), torch.float32),
                           (x.bfloat16(), torch.bfloat16)):
            out = torch.zeros(50_000, 24, dtype=dtype)
            want = out.clone()
            want[at] = src[index].to(dtype)
            assert ops.gather_rows(src, index, out, at=at) is out and torch.equal(out, want)
        with pytest.raises(IndexError, match=r"a place in rows 0..49999 of out is outside them"):
            ops.gather_rows(x, index[:2], torch.empty(50_000, 24), at=torch.tensor([3, 50_000]))
        with pytest.raises(ValueError, match="1 places for 2 rows"):
            ops.gather_rows(x, index[:2], torch.empty(50_000, 24), at=torch.tensor([3]))


@needs_cc
def test_batches_larger_than_the_caches_are_written_past_them_and_hold_the_same_rows(switch):
    """A gather's output of ``stream_bytes()`` or more is written with stores that go past the caches: whole
    lines streamed, a row's first and last bytes written the usual way where its row does not start or end on a
    line. The rows are the same, bit for bit: widths that cut lines anywhere, an output that does not start on a
    line, rows widened from half precision, rows put at places."""
    switch(True)
    torch.set_num_threads(2)
    big = ops.stream_bytes()
    if platform.machine() in ("x86_64", "AMD64"):
        assert big > 0  # else this test would not reach the streamed stores
    big = big or 1 << 20
    gen = torch.Generator().manual_seed(9)
    for cols, dtype, out_dtype in ((24, torch.float32, torch.float32), (128, torch.float32, torch.float32),
                                   (3, torch.int64, torch.int64), (40, torch.bfloat16, torch.float32),
                                   (24, torch.float16, torch.float32), (21, torch.bfloat16, torch.float32)):
        n = big // (cols * 4 if out_dtype == torch.float32 else cols * 8) + 1000
        x = torch.randn(n // 2, cols, generator=gen).mul_(100).to(dtype)
        index = torch.randint(0, n // 2, (n,), generator=gen)
        want = x.index_select(0, index).to(out_dtype)
        for shift in (0, 1):  # an output that starts on a line, and one that starts 4 or 8 bytes past it
            out = torch.empty(n * cols + shift, dtype=out_dtype)[shift:].view(n, cols)
            got = ops.gather_rows(x, index, out)
            assert got.element_size() * got.numel() >= big
            assert torch.equal(got.view(torch.int32) if out_dtype == torch.float32 else got,
                               want.view(torch.int32) if out_dtype == torch.float32 else want)
        at = torch.randperm(n + 5, generator=gen)[:n]
        out = torch.zeros(n + 5, cols, dtype=out_dtype)
        expect = out.clone()
        expect[at] = want
        assert torch.equal(ops.gather_rows(x, index, out, at=at), expect)


@needs_cc
def test_a_gather_shared_with_a_helper_thread_writes_the_same_rows(switch):
    """The sampling thread of a two-stage loader, its next batch waiting for room, takes chunks of the running
    gather (GatherShare): the rows are the same whichever thread copied them, a bad index is still reported,
    and a helper with no gather running, or come once its chunks are gone, does nothing."""
    import threading

    switch(True)
    share = scheduler.GatherShare()
    assert share.help() == 0  # no gather running
    gen = torch.Generator().manual_seed(11)
    x = torch.randn(200_000, 32, generator=gen)
    index = torch.randint(0, 200_000, (1_000_000,), generator=gen)  # 244 chunks
    want = x.index_select(0, index)

    def gather_helped(index: torch.Tensor, out: torch.Tensor) -> tuple[int, list]:
        done, helped, seen = threading.Event(), [], []

        def helper():
            while not done.is_set():
                job = share.job
                if job is not None:
                    seen.append(job)
                    helped.append(share.help())

        thread = threading.Thread(target=helper)
        thread.start()
        scheduler.thread_budget(1)
        scheduler.share_gathers(share)
        try:
            ops.gather_rows(x, index, out)
        finally:
            scheduler.share_gathers(None)
            scheduler.thread_budget(None)
            done.set()
            thread.join()
        return sum(helped), seen

    for _ in range(5):  # the helper takes chunks once it sees the gather (on a busy machine, maybe not at once)
        out = torch.empty(index.numel(), 32)
        chunks, seen = gather_helped(index, out)
        assert torch.equal(out, want) and share.job is None
        if chunks:
            break
    assert chunks > 0
    assert binding.kernels().hpcgnn_job_help(binding.ptr(seen[0])) == 0  # late: nothing left in it
    bad = index.clone()
    bad[-5] = 200_000
    with pytest.raises(IndexError, match="index 200000 is out of range for 200000 rows"):
        gather_helped(bad, torch.empty(index.numel(), 32))


@needs_cc
def test_the_kernels_keep_their_helper_threads_and_share_them_with_callers_and_forked_children(switch, tmp_path,
                                                                                              monkeypatch):
    """The kernels' helpers are kept between calls (a pool in threads.c, not a thread started per call); a second
    thread calling while the first holds the pool starts helpers of its own; a child of fork() starts a pool of its
    own (the parent's helpers are not in it), here while another thread is calling the kernels. Every gather is
    torch's, bit for bit, and nothing hangs."""
    import functools
    import os
    import signal
    import threading
    import time

    switch(True)
    lib = build.load(build.build(cache=tmp_path))  # a library of its own: a pool no earlier test started
    monkeypatch.setattr(ops, "kernels", functools.lru_cache(maxsize=1)(lambda: lib))
    gen = torch.Generator().manual_seed(12)
    x = torch.randn(200_000, 32, generator=gen)
    index = torch.randint(0, 200_000, (300_000,), generator=gen)  # 73 chunks
    want = x.index_select(0, index)

    def gathers(times: int, results: list) -> None:
        scheduler.thread_budget(2)
        try:
            for _ in range(times):
                results.append(torch.equal(ops.gather_rows(x, index, torch.empty(index.numel(), 32)), want))
        finally:
            scheduler.thread_budget(None)

    tasks = Path("/proc/self/task")  # this process's threads (Linux)
    threads_now = (lambda: len(list(tasks.iterdir()))) if tasks.exists() else (lambda: 0)
    before, first = threads_now(), []
    gathers(1, first)
    kept = threads_now()
    assert kept == before + (1 if tasks.exists() else 0)  # the call's helper stays, waiting for the next call
    gathers(30, first)
    assert all(first) and len(first) == 31 and threads_now() == kept  # no thread came or went per call
    results: list[bool] = []
    callers = [threading.Thread(target=gathers, args=(20, results)) for _ in range(2)]
    for t in callers:
        t.start()
    out = torch.zeros(index.numel(), 32).share_memory_()
    scheduler.thread_budget(2)
    try:
        pid = os.fork()  # while the two threads call the kernels
        if pid == 0:  # the child: one thread, the kernels only (no torch op that uses OpenMP)
            code = 1
            try:
                ops.gather_rows(x, index, out)
                code = 0 if not tasks.exists() or len(os.listdir(tasks)) == 2 else 3  # itself and its own helper
            finally:
                os._exit(code)
    finally:
        scheduler.thread_budget(None)
    deadline = time.monotonic() + 120
    while (status := os.waitpid(pid, os.WNOHANG))[0] == 0:
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail("the forked child's gather hung")
        time.sleep(0.02)
    for t in callers:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in callers), "two threads calling the kernels at once hung"
    assert os.waitstatus_to_exitcode(status[1]) == 0 and torch.equal(out, want)
    assert len(results) == 40 and all(results)


def test_a_threads_budget_holds_for_its_thread_only():
    import threading

    seen = {}

    def stage():
        scheduler.thread_budget(1)
        seen["stage"] = scheduler.threads()

    t = threading.Thread(target=stage)
    t.start()
    t.join()
    assert seen["stage"] == 1 and scheduler.threads() == torch.get_num_threads()


@needs_cc
def test_kernels_sample_the_torch_ops_typed_batches(switch):
    typed = make_synthetic_typed(dataset_config(num_nodes=3000, avg_degree=10, homophily=0.8, seed=5))
    sampler = TypedNeighborSampler(typed, (6, 4))

    def batches(id_map="dense"):
        gen = torch.Generator().manual_seed(3)
        lean = TypedNeighborSampler(typed, (6, 4), id_map="batch")  # a partitioned rank's maps, chosen now
        return [(sampler if id_map == "dense" else lean).sample(typed.train_idx[i:i + 200], gen) for i in (0, 200, 400)]

    dense, lean = both(switch, batches), both(switch, lambda: batches("batch"))
    for a, *others in zip(*dense, *lean, strict=True):
        for b in others:
            assert a.n_id.keys() == b.n_id.keys() and all(torch.equal(a.n_id[t], b.n_id[t]) for t in a.n_id)
            assert all(torch.equal(a.edge_index[r], b.edge_index[r]) for r in a.edge_index)
            assert a.num_sampled_nodes == b.num_sampled_nodes and a.num_sampled_edges == b.num_sampled_edges


@needs_cc
def test_kernels_refuse_ids_outside_the_graph(switch, graph):
    switch(True)
    with pytest.raises(IndexError, match="node 3000 is out of range for a graph of 3000 nodes"):
        sample_neighbors(graph.rowptr, graph.col, torch.tensor([4, 3000]), 3)
    torch.set_num_threads(2)
    many = torch.randint(0, 3000, (5 * scheduler.CHUNK,), generator=torch.Generator().manual_seed(3))
    many[[2 * scheduler.CHUNK + 7, 4 * scheduler.CHUNK + 1]] = torch.tensor([3001, 3000])  # counted in chunks: the first
    with pytest.raises(IndexError, match="node 3001 is out of range for a graph of 3000 nodes"):
        sample_neighbors(graph.rowptr, graph.col, many, 3)
    ids_map = DenseIdMap(100)
    ids_map.put(torch.tensor([7]), torch.tensor([0]))
    with pytest.raises(IndexError, match="id 100 is out of range for a map of 100 ids"):
        ids_map.add_new([torch.tensor([1, 2]), torch.tensor([3, 100])], 1)
    # the marks the first list made are gone; the id in the map keeps its state
    assert ids_map._state.nonzero().flatten().tolist() == [7] and int(ids_map._state[7]) == 2
    assert ids_map.get(torch.tensor([7, 3, 99])).tolist() == [0, -1, -1]  # looked up in C, by the state
    with pytest.raises(IndexError, match="id 100 is out of range for a map of 100 ids"):
        ids_map.get(torch.tensor([7, 100]))
    with pytest.raises(ValueError, match=r"out must be a contiguous int64 tensor of shape \(2,\)"):
        ops.dense_get(ids_map.table, ids_map._state, torch.tensor([7, 3]), torch.empty(2, dtype=torch.int32))
    # in place (a walk's last hop looks its sources up in the edge index itself), across chunks
    big = DenseIdMap(3000)
    big.add_new([many[many < 3000][:700]], 0)
    ids = torch.randint(0, 3000, (5 * scheduler.CHUNK,), generator=torch.Generator().manual_seed(4))
    want = big.get(ids.clone())
    assert big.get_into(ids, ids).data_ptr() == ids.data_ptr() and torch.equal(ids, want)
    ids = many.clone()  # ...and the id out of range named as it was, not as its chunk left it
    with pytest.raises(IndexError, match="id 3001 is out of range for a map of 3000 ids"):
        big.get_into(ids, ids)


@needs_cc
def test_kernels_are_built_once_per_source_and_compiler(tmp_path):
    lib = build.build(cache=tmp_path)
    assert lib.parent == tmp_path and lib.suffix == ".so" and lib.name.startswith(f"sampling-{build.source_hash()}-")
    built = lib.stat().st_mtime_ns
    assert build.build(cache=tmp_path) == lib and lib.stat().st_mtime_ns == built
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([lib.with_suffix(".json").name, lib.name,
                                                                 f"{lib.name}.sha256"])  # (its record) no temporary
    assert build.load(lib).hpcgnn_hop_plan is not None
    # another compiler answering --version alike (a module's wrapper, another install of one version) builds its own
    other = tmp_path / "bin" / "cc"
    other.parent.mkdir()
    other.symlink_to(shutil.which("cc"))
    assert build.build(cache=tmp_path, compiler=str(other)) != lib


@pytest.fixture
def kernels_from(monkeypatch, tmp_path):
    """``kernels_from(packaged=None, cache=None, cc=None)``: the kernels this process would load with that library
    in the package's place (None: none there), that cache folder and that C compiler; and the warnings logged."""
    def load(packaged=None, cache=None, cc=None, caplog=None):
        monkeypatch.setattr(build, "packaged", lambda: packaged)
        monkeypatch.setenv("HPCGNN_NATIVE_CACHE", str(cache or tmp_path / "cache"))
        monkeypatch.delenv("HPCGNN_NATIVE", raising=False)
        if cc is None:
            monkeypatch.delenv("CC", raising=False)
        else:
            monkeypatch.setenv("CC", cc)
        binding.kernels.cache_clear()
        return binding.kernels()

    yield load
    binding.kernels.cache_clear()


def _same_batches(graph) -> None:
    """The batch the loaded kernels (or torch ops) make is the torch ops' own, bit for bit."""
    def make():
        sampler = CSRNeighborSampler(graph.rowptr, graph.col, (25, 10))
        return sampler.sample(torch.arange(0, 3000, 7), torch.Generator().manual_seed(5))

    a = make()
    os.environ["HPCGNN_NATIVE"] = "0"
    binding.kernels.cache_clear()
    try:
        b = make()
    finally:
        del os.environ["HPCGNN_NATIVE"]
        binding.kernels.cache_clear()
    assert torch.equal(a.edge_index, b.edge_index) and torch.equal(a.n_id, b.n_id)


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and r.name.startswith("hpcgnn")]


def test_without_a_compiler_sampling_runs_on_torch_ops_and_says_how_to_mend_it(kernels_from, caplog, graph):
    with pytest.raises(build.NativeUnavailable, match="no C compiler 'no-such-cc' on PATH"):
        build.build(compiler="no-such-cc")
    with caplog.at_level(logging.WARNING, logger="hpcgnn"):
        assert kernels_from(cc="no-such-cc") is None
        out = CSRNeighborSampler(graph.rowptr, graph.col, (4, 2)).sample(torch.tensor([0, 9]),
                                                                        torch.Generator().manual_seed(0))
        assert binding.kernels() is None
    (said,) = _warnings(caplog)  # said once
    assert "no C compiler 'no-such-cc' on PATH" in said and "sampling runs on torch ops, the same batches, slower. " \
        "Install hpcgnn where a C compiler is (`pip install` builds the kernels into the package)" in said
    assert "HPCGNN_NATIVE=0" in said
    assert out.num_sampled_nodes[0] == 2 and out.edge_index.size(1) == sum(out.num_sampled_edges)


def test_floyds_uniform_numbers_are_uniform_and_differ_per_key():
    """counter_uniform (SplitMix64 of key and index), which both paths compute: in [0, 1), even over 50 bins
    (chi-square, 49 degrees of freedom: 85.4 is the 0.1% critical value; fixed keys, not flaky), a fresh
    stream per key, consecutive numbers uncorrelated."""
    from hpcgnn.rng import counter_uniform

    u = counter_uniform(12345, 200_000)
    assert u.dtype == torch.float64 and bool((u >= 0).all()) and bool((u < 1).all())
    counts = torch.bincount((u * 50).long(), minlength=50).double()
    assert float(((counts - 4000) ** 2 / 4000).sum()) < 85.4
    assert not torch.equal(counter_uniform(12346, 1000), u[:1000])
    assert abs(float(torch.corrcoef(torch.stack([u[:-1], u[1:]]))[0, 1])) < 0.01  # neighbours unrelated


@pytest.mark.slow
@needs_cc
def test_ranks_building_at_once_each_load_one_whole_library(tmp_path):
    """Three processes build into one fresh cache at the same time (a node's ranks at their first batch): each
    gets the library and can load it, and only that library is left (with what it was built for), no
    half-written file or temporary."""
    import subprocess
    import sys

    code = ("import sys; from pathlib import Path; from hpcgnn.kernels import build; "
            "lib = build.build(cache=Path(sys.argv[1])); build.load(lib); print(lib)")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True)
             for _ in range(3)]
    paths = {p.communicate(timeout=120)[0].strip() for p in procs}
    assert all(p.returncode == 0 for p in procs)
    lib = Path(paths.pop())
    assert not paths and sorted(p.name for p in tmp_path.iterdir()) == sorted([lib.with_suffix(".json").name,
                                                                               lib.name, f"{lib.name}.sha256"])


def test_a_cache_folder_that_cannot_be_made_falls_back_to_torch_ops(kernels_from, caplog, tmp_path):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    with caplog.at_level(logging.WARNING, logger="hpcgnn"):
        assert kernels_from(cache=blocker / "native") is None
    (said,) = _warnings(caplog)
    assert "C sampling kernels are not available" in said and "not-a-folder" in said
    assert "Set HPCGNN_NATIVE_CACHE to a folder of your own" in said


@needs_cc
def test_a_compiler_with_flags_of_its_own_builds_its_own_library(tmp_path):
    """CC may carry flags ("cc -O2"): they are passed, and key the library apart from plain cc's."""
    plain, flagged = build.build(cache=tmp_path), build.build(cache=tmp_path, compiler="cc -DHPCGNN_FLAGGED")
    assert plain != flagged and build.load(flagged).hpcgnn_hop_fill is not None


@needs_cc
def test_a_compiler_that_cannot_build_the_f16c_conversion_still_builds_the_kernels(tmp_path, monkeypatch):
    """An older compiler may not know F16C's intrinsics: the kernels are built without them, and float16 rows take
    torch's gather and upcast (bfloat16 rows still one pass). Large batches are still written past the caches,
    by SSE2's stores, the same rows."""
    old = tmp_path / "old-cc"
    old.write_text('#!/bin/sh\ncase " $* " in *" --version "*|*" -DHPCGNN_NO_F16C "*) exec cc "$@";; esac\n'
                   'echo "error: unknown target attribute f16c" >&2\nexit 1\n')
    old.chmod(0o755)
    lib = build.load(build.build(cache=tmp_path / "cache", compiler=str(old)))
    assert lib.hpcgnn_f16c() == 0 and lib.hpcgnn_gather_rows_wide is not None
    cpu = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    has = platform.machine() in ("x86_64", "i686") and " f16c" in cpu and " avx" in cpu
    assert build.load(build.build(cache=tmp_path / "plain")).hpcgnn_f16c() == int(has)
    monkeypatch.setattr(ops, "kernels", lambda: lib)
    gen = torch.Generator().manual_seed(10)
    n = max(ops.stream_bytes(), 1 << 20) // (24 * 4) + 1000
    x = torch.randn(n // 2, 24, generator=gen)
    index = torch.randint(0, n // 2, (n,), generator=gen)
    for src in (x, x.bfloat16(), x.half()):
        out = torch.empty(n * 24 + 1)[1:].view(n, 24)  # rows that start anywhere in a line
        assert torch.equal(ops.gather_rows(src, index, out), src.index_select(0, index).float())


def test_the_ctypes_signatures_are_read_from_the_c_sources_definitions():
    """build.SIGNATURES, by which ctypes calls the kernels, is read from the C sources' own definitions (declared
    once: a drift would be a segfault, not an error): every exported function of every file, its result and each
    argument's type; every function that the files share among themselves is hidden (kernels.h), not exported."""
    import ctypes
    import re

    assert [p.name for p in sources.SOURCES] == ["aggregate.c", "dense.c", "gather.c", "graphs.c", "hash.c", "hops.c",
                                                 "ids.c", "threads.c", "times.c"]
    text = "\n".join(p.read_text() for p in sources.SOURCES)
    exported = set(re.findall(r"^[\w ]+?\*? ?(hpcgnn_\w+)\(", text, re.M))
    assert set(build.SIGNATURES) == exported and len(exported) == 19
    assert build.SIGNATURES["hpcgnn_job_help"] == (ctypes.c_int64, (ctypes.c_void_p,))
    assert build.SIGNATURES["hpcgnn_source_hash"] == (ctypes.c_char_p, ())
    made = sources.signatures("int64_t hpcgnn_f(const int64_t *a, int64_t n,\n  int threads) {\n}\n"
                              "void hpcgnn_g(void) {\n}\nstatic int64_t helper(int64_t x) {\n}\n")
    assert made == {"hpcgnn_f": ("int64", ("ptr", "int64", "int")), "hpcgnn_g": ("void", ())}
    header = (sources.HERE / "kernels.h").read_text()
    shared = re.findall(r"^HIDDEN [\w ]+?\b(\w+)\(", header, re.M)
    assert sorted(shared) == ["checked_chunks", "join_parts", "parallel_chunks", "radix_sort", "shared_chunks"]
    for name in shared:  # defined once, not static (another file calls it), hidden by its declaration
        assert len(re.findall(rf"^(?!static)[\w ]+\b{name}\([^;]*\{{", text, re.M)) == 1, name


@pytest.mark.parametrize("name", ["sample_neighbors", "number_new", "dense_get", "gather_rows", "aggregate_rows"])
def test_every_operation_has_a_torch_twin_of_its_signature_and_its_results(name):
    """kernels.ops and kernels.twins: the same signature, and the same results bit for bit (the C kernels here; the
    twin is what runs where they cannot), errors included."""
    import inspect

    assert inspect.signature(getattr(ops, name)) == inspect.signature(getattr(twins, name))
    if binding.kernels() is None:
        pytest.skip("no C kernels here to compare the twins with")
    gen = torch.Generator().manual_seed(5)
    n = 3000
    if name == "sample_neighbors":
        rowptr = torch.cat([torch.zeros(1, dtype=torch.long), torch.randint(0, 40, (n,), generator=gen).cumsum(0)])
        col = torch.randint(0, n, (int(rowptr[-1]),), generator=gen)
        nodes = torch.randint(0, n, (500,), generator=gen)
        runs = [f(rowptr, col, nodes, 10, torch.Generator().manual_seed(1), 7) for f in (ops.sample_neighbors,
                                                                                          twins.sample_neighbors)]
        assert all(torch.equal(a, b) for a, b in zip(*runs, strict=True))
        return
    if name == "gather_rows":
        x = torch.randn(n, 24, generator=gen)
        index, at = torch.randint(0, n, (800,), generator=gen), torch.randperm(800, generator=gen)
        for src in (x, x.bfloat16()):
            for where in (None, at):
                a, b = (f(src, index, torch.empty(800, 24), where) for f in (ops.gather_rows, twins.gather_rows))
                assert torch.equal(a, b)
        return
    if name == "aggregate_rows":  # every row kind, both column kinds, sums, means, GCN's weights and self-loops
        deg = torch.randint(0, 30, (n,), generator=gen)
        deg[7] = 0  # (a row without edges)
        rowptr = torch.cat([torch.zeros(1, dtype=torch.long), deg.cumsum(0)])
        col = torch.randint(0, n, (int(rowptr[-1]),), generator=gen)
        x, dinv = torch.randn(n, 37, generator=gen), (torch.rand(n, generator=gen, dtype=torch.float64) + 1).rsqrt()
        for src in (x, x.bfloat16(), x.half()):
            for c in (col, col.int()):
                for mean, d, loop in ((False, None, False), (True, None, False), (False, dinv, True), (True, None, True)):
                    a, b = (f(rowptr, c, src, 5, n - 3, mean=mean, dinv=d, self_loop=loop)
                            for f in (ops.aggregate_rows, twins.aggregate_rows))
                    assert torch.equal(a, b) and a.shape == (n - 8, 37) and (loop or not a[2].any())  # (row 7: none)
        edges = int(rowptr[n - 3] - rowptr[5])  # GAT's attention: a weight per edge and head, per self-loop and head
        ew, sw = torch.rand(edges, 1, generator=gen), torch.rand(n - 8, 1, generator=gen)
        x4 = torch.randn(n, 36, generator=gen)
        ew4, sw4 = torch.rand(edges, 4, generator=gen), torch.rand(n - 8, 4, generator=gen)
        for src, w, s in ((x, ew, sw), (x4, ew4, sw4), (x4.bfloat16(), ew4, sw4)):
            for loop in (False, True):
                a, b = (f(rowptr, col, src, 5, n - 3, self_loop=loop, edge_weight=w, self_weight=s if loop else None)
                        for f in (ops.aggregate_rows, twins.aggregate_rows))
                assert torch.equal(a, b)
        wrong = col.clone()
        wrong[int(rowptr[9]) + 1] = n
        for f in (ops.aggregate_rows, twins.aggregate_rows):
            with pytest.raises(IndexError, match=rf"edge {int(rowptr[9]) + 1}'s source {n} is outside the table's "
                                                 rf"{n} rows"):
                f(rowptr, wrong, x, 0, n)
        return
    table, state = torch.full((n,), -1, dtype=torch.long), torch.zeros(n, dtype=torch.uint8)
    maps = [(table.clone(), state.clone()) for _ in range(2)]
    candidates = [torch.randint(0, n, (k,), generator=gen) for k in (50, 400, 2000)]
    for t, st in maps:  # the same map in both: an earlier round's ids already in it
        ops.number_new(t, st, candidates[:1], 0)
    if name == "number_new":
        new = [f(t, st, candidates[1:], 40) for f, (t, st) in zip((ops.number_new, twins.number_new), maps,
                                                                   strict=True)]
        assert torch.equal(new[0], new[1])
        assert torch.equal(maps[0][0][maps[0][1] == 2], maps[1][0][maps[1][1] == 2])
        assert torch.equal(maps[0][1], maps[1][1])
    else:
        ids = torch.randint(0, n, (1000,), generator=gen)
        assert torch.equal(ops.dense_get(*maps[0], ids), twins.dense_get(*maps[1], ids))
    for f, (t, st) in zip((getattr(ops, name), getattr(twins, name)), maps, strict=True):
        bad = torch.tensor([5, n + 3, -1])
        with pytest.raises(IndexError, match=rf"id {n + 3} is out of range for a map of {n} ids"):
            f(t, st, [bad], 0) if name == "number_new" else f(t, st, bad)
