"""Time on the graph: the bounds each node may draw from as of its time (C and its torch twin, against a brute force),
the temporal sampler's batches (no edge after its seed's time, in any strategy or window; the same batch on both
paths), a files folder's times prepared into the timeline, the settings a timed graph refuses, and the leak detector:
a graph whose labels only future edges tell, at chance when time is respected and learnt when it is not."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import needs_cc, run_cli

from hpcgnn.config import dataset_config
from hpcgnn.data import cache_folder, open_graph, prepare
from hpcgnn.data.times import timeline_of
from hpcgnn.errors import ConfigError, DatasetError
from hpcgnn.kernels import ops
from hpcgnn.sampling.temporal import TemporalSampler


def timed_csr(n: int, e: int, seed: int, dtype=torch.int64):
    """A random in-edge CSR (distinct pairs) whose edges have times, and a time per node."""
    g = torch.Generator().manual_seed(seed)
    key = torch.unique(torch.randint(0, n, (e,), generator=g) * n + torch.randint(0, n, (e,), generator=g))
    dst, src = key // n, key % n
    rowptr = torch.zeros(n + 1, dtype=torch.long)
    rowptr[1:] = torch.bincount(dst, minlength=n).cumsum(0)
    time = torch.randint(0, 1000, (src.numel(),), generator=g).to(dtype)
    seed_time = torch.randint(0, 1000, (n,), generator=g).to(dtype)
    return rowptr, src, dst, time, seed_time


@pytest.mark.parametrize("dtype", [torch.int64, torch.float64])
@needs_cc
def test_each_nodes_bounds_hold_exactly_the_edges_it_may_draw_on_both_paths(switch, dtype):
    """At or before its time (before it: strict), not older than the window, the last k: the brute force's edges."""
    rowptr, src, _, time, _ = timed_csr(300, 6000, 1, dtype)
    tl = timeline_of(rowptr, src, time)
    g = torch.Generator().manual_seed(2)
    nodes = torch.randint(0, 300, (2000,), generator=g)
    at = torch.randint(-5, 1010, (2000,), generator=g).to(dtype)
    for strict in (False, True):
        for window in (None, torch.tensor(50, dtype=dtype)):
            for last in (0, 3):
                switch(True)
                native = ops.time_bounds(rowptr, tl.time, nodes, at, strict, window, last)
                switch(False)
                assert torch.equal(native, ops.time_bounds(rowptr, tl.time, nodes, at, strict, window, last))
                for i in range(0, 2000, 37):
                    lo, hi = int(rowptr[nodes[i]]), int(rowptr[nodes[i] + 1])
                    ts = tl.time[lo:hi]
                    ok = ts < at[i] if strict else ts <= at[i]
                    if window is not None:
                        ok &= ts >= at[i] - window
                    want = (ok.nonzero().squeeze(1) + lo).tolist()
                    want = want[-last:] if last else want
                    assert list(range(int(native[2 * i]), int(native[2 * i + 1]))) == want


@needs_cc
def test_bounds_refuse_a_node_outside_the_graph(switch):
    rowptr, src, _, time, _ = timed_csr(50, 400, 3)
    for on in (True, False):
        switch(on)
        with pytest.raises(IndexError, match="node 50 is out of range for a graph of 50 nodes"):
            ops.time_bounds(rowptr, time, torch.tensor([3, 50]), torch.tensor([5, 5]))


@needs_cc
@pytest.mark.parametrize("strategy", ["uniform", "last"])
@pytest.mark.parametrize("window", [None, 150])
@pytest.mark.parametrize("strict", [False, True])
def test_no_sampled_edge_is_later_than_its_seeds_time_and_both_paths_draw_the_same(switch, strategy, window, strict):
    """The leak property, over every strategy and window: each edge of a seed's tree is at or before the seed's time
    (strictly before: strict), not older than the window; it is an edge of the graph; its age is the seed's time
    minus its time; a node's tree is its edges' tree. The kernels and the torch ops draw the same batch."""
    rowptr, src, dst, time, seed_time = timed_csr(2000, 30000, 4)
    tl = timeline_of(rowptr, src, time, seed_time)

    def batches():
        s = TemporalSampler(rowptr, tl, [10, 5, 3], strategy, window, strict, edge_ids=True)
        gen = torch.Generator().manual_seed(5)
        return [s.sample(seeds, gen) for seeds in (torch.randperm(2000, generator=gen)[:300],
                                                  torch.tensor([7, 7, 7]))]  # (one node asked three times)

    switch(True)
    native = batches()
    switch(False)
    for a, b in zip(native, batches(), strict=True):
        for field in ("n_id", "edge_index", "e_id", "edge_age", "tree"):
            assert torch.equal(getattr(a, field), getattr(b, field)), field
        assert a.num_sampled_nodes == b.num_sampled_nodes
    for out in native:
        seeds = out.n_id[:out.batch_size]
        tree = out.tree[out.edge_index[1]]
        assert torch.equal(tree, out.tree[out.edge_index[0]])
        t, et = seed_time.index_select(0, seeds)[tree], time[out.e_id]
        assert bool((et < t).all() if strict else (et <= t).all())
        if window is not None:
            assert bool((et >= t - window).all())
        assert torch.equal(src[out.e_id], out.n_id[out.edge_index[0]])
        assert torch.equal(dst[out.e_id], out.n_id[out.edge_index[1]])
        assert torch.equal(out.edge_age, (t - et).to(out.edge_age.dtype))
    assert native[1].n_id[:3].tolist() == [7, 7, 7] and native[1].tree[:3].tolist() == [0, 1, 2]


def test_the_last_strategy_takes_each_nodes_most_recent_edges():
    rowptr, src, _, time, seed_time = timed_csr(500, 8000, 6)
    tl = timeline_of(rowptr, src, time, seed_time)
    out = TemporalSampler(rowptr, tl, [4], "last", edge_ids=True).sample(torch.arange(500))
    for v in range(0, 500, 7):
        lo, hi = int(rowptr[v]), int(rowptr[v + 1])
        allowed = tl.edge[lo:hi][tl.time[lo:hi] <= seed_time[v]]
        mine = out.e_id[out.edge_index[1] == v]
        assert sorted(mine.tolist()) == sorted(allowed[-4:].tolist())


def save_folder(folder, rng, **arrays) -> None:
    """A files folder of ``arrays`` (each ``name.npy``) and a seeded split of its nodes: half training, a quarter
    validation, a quarter test."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, a in arrays.items():
        np.save(folder / f"{name}.npy", a)
    n = arrays["x"].shape[0]
    perm = rng.permutation(n)
    for name, part in zip(("train_idx", "val_idx", "test_idx"), np.split(perm, [n // 2, 3 * n // 4]), strict=True):
        np.save(folder / f"{name}.npy", part)


def write_timed_folder(folder, n=3000, seed=0, to_float=False, repeats=True):
    """A files folder whose edges have times and whose nodes have seed times (a pair given twice: two events)."""
    rng = np.random.default_rng(seed)
    e = 8 * n
    ei = np.stack([rng.integers(0, n, e), rng.integers(0, n, e)])
    t = rng.integers(0, 1000, e)
    if repeats:
        ei[:, 1] = ei[:, 0]  # edge 1 repeats edge 0's pair: two events, each with its own time
    cast = (lambda a: a.astype(np.float64) + 0.5) if to_float else (lambda a: a.astype(np.int64))
    save_folder(folder, rng, edge_index=ei, edge_time=cast(t), seed_time=cast(rng.integers(0, 1000, n)),
                x=rng.normal(size=(n, 8)).astype(np.float32), y=rng.integers(0, 3, n))
    return ei, cast(t)


@pytest.mark.parametrize("undirected", [False, True])
@pytest.mark.parametrize("to_float", [False, True])
def test_a_folders_times_are_prepared_into_each_rows_edges_in_time_order(tmp_path, undirected, to_float):
    """Prepared out of core, in chunks of rows: every edge given is an event of its own (a pair given twice, twice; a
    reverse ``dataset.to_undirected`` adds, too, with its edge's time, marked not given), each row's edges sorted by
    time, ties by their place in the CSR (by source, then as given); the seed times kept in their dtype."""
    import hpcgnn.data.times as times

    ei, t = write_timed_folder(tmp_path / "g", to_float=to_float)
    cfg = dataset_config(name="files", path=str(tmp_path / "g"), root=str(tmp_path / "root"),
                         to_undirected=undirected)
    old = times.CHUNK_EDGES
    times.CHUNK_EDGES = 5000  # several chunks of rows
    try:
        prepare(cfg)
    finally:
        times.CHUNK_EDGES = old
    g = open_graph(cfg)
    tl = g.timeline
    assert tl is not None and tl.time.dtype == (torch.float64 if to_float else torch.int64)
    e = ei.shape[1]
    src, dst, tt, ids = ei[0], ei[1], t, np.arange(e)
    if undirected:
        src, dst, tt, ids = (np.concatenate([ei[0], ei[1]]), np.concatenate([ei[1], ei[0]]), np.concatenate([t, t]),
                             np.arange(2 * e))
    assert g.num_edges == src.size  # (none merged: the repeated pair is two events)
    csr = np.lexsort((ids, src, dst))  # the CSR's order: by target, then source, then as given
    assert np.array_equal(g.col.numpy(), src[csr])
    place = np.empty(src.size, dtype=np.int64)
    place[csr] = np.arange(src.size)
    want = np.lexsort((place, tt, dst))  # each row by time, ties by CSR place
    assert np.array_equal(tl.col.numpy(), src[want]) and np.array_equal(tl.time.numpy(), tt[want])
    assert np.array_equal(tl.edge.numpy(), place[want]) and np.array_equal(tl.given.numpy(), ids[want] < e)
    assert torch.equal(tl.seed_time, torch.from_numpy(np.load(tmp_path / "g" / "seed_time.npy")))
    meta = json.loads((cache_folder(cfg) / "meta.json").read_text())
    assert meta["times"] == {"dtype": "float64" if to_float else "int64", "seed_time": True, "given": True}


def test_a_folders_times_are_checked_naming_the_file_and_the_fix(tmp_path):
    write_timed_folder(tmp_path / "g", repeats=False)
    cfg = dataset_config(name="files", path=str(tmp_path / "g"), root=str(tmp_path / "root"))
    t = np.load(tmp_path / "g" / "edge_time.npy")
    cases = [
        ("edge_time.npy", t[:-1], r"edge_time.npy: shape \(23999,\), expected \[24000\]: one time per edge"),
        ("edge_time.npy", np.where(np.arange(t.size) == 5, np.nan, t.astype(np.float64)),
         r"edge_time.npy: entry 5 is nan: every time must be a finite number"),
        ("edge_time.npy", t.astype(bool), r"edge_time.npy: times must be integers or floats, found bool"),
        ("seed_time.npy", np.zeros(3000, dtype=np.float64),
         r"seed_time.npy: seed times are float64 but the edges' times int64: give both as integers or both as floats"),
    ]
    for name, value, message in cases:
        saved = np.load(tmp_path / "g" / name)
        np.save(tmp_path / "g" / name, value)
        with pytest.raises(DatasetError, match=message):
            prepare(cfg)
        np.save(tmp_path / "g" / name, saved)
    (tmp_path / "g" / "edge_time.npy").unlink()
    with pytest.raises(DatasetError, match=r"seed_time gives when each node's label is asked, but the edges have no "
                                           r"times\. HINT: add edge_time.npy"):
        prepare(cfg)


def test_a_timed_graph_refuses_what_does_not_sample_as_of_a_time_naming_the_way_out(tmp_path):
    from hpcgnn.checks import check_task_config, eval_mode
    from hpcgnn.submit.compose import compose

    def checked(overrides):
        cfg = compose([*overrides, f"run_dir={tmp_path / 'run'}"]).cfg
        check_task_config(cfg)
        return cfg

    write_timed_folder(tmp_path / "g", repeats=False)
    base = ["dataset=files", f"dataset.path={tmp_path / 'g'}"]
    assert eval_mode(checked(base)) == "sampled"  # (exact inference would read every edge)
    assert eval_mode(checked([*base, "time.respect=false"])) == "full"
    for extra, why in ((["train.sampler=ladies"], "train.sampler=ladies"),
                       (["train.eval_mode=full"], r"train.eval_mode=full \(exact inference would read every edge\)"),
                       (["train.edge_budget=100"], "train.sampler=neighbor with train.edge_budget=100")):
        with pytest.raises(ConfigError, match=rf"the edges of dataset.path=\S+ have times: sampling as of each seed's "
                                              rf"time runs for task=node, link or edge, .*; got {why}\. HINT: drop that setting, or "
                                              r"time.respect=false to train on every edge"):
            checked([*base, *extra])
        checked([*base, *extra, "time.respect=false"])
    with pytest.raises(ConfigError, match=r"time.window=-1.0 must be positive \(in the edge times' unit\)"):
        checked([*base, "time.window=-1"])
    link = [*base, "task=link"]  # links as of their times: no seed times needed; what would leak refused
    assert eval_mode(checked(link)) == "sampled"
    checked([*link, "task.negatives=historical"])
    checked([*base, "graph=partitioned"])  # (over parts too)
    checked([*link, "graph=partitioned"])
    with pytest.raises(ConfigError, match=r"time runs for task=node, link or edge, .*; got task.negatives=strict \(no edge "
                                          r"between the pair at any time, later ones too\)\. HINT: drop that setting"):
        checked([*link, "task.negatives=strict"])
    with pytest.raises(ConfigError, match=r"task=link splits them in time order and keeps every edge in message "
                                          r"passing, the validation and test edges too, .* HINT: drop time.respect=false"):
        checked([*link, "time.respect=false"])
    with pytest.raises(ConfigError, match=r"task.negatives=historical draws destinations each source met before a "
                                          r"link's time, but the edges of dataset=synthetic have no times\. HINT: "
                                          r"task.negatives=uniform"):
        checked(["task=link", "task.negatives=historical"])
    (tmp_path / "g" / "seed_time.npy").unlink()
    with pytest.raises(ConfigError, match=r"its nodes do not say when each label is asked\. HINT: add seed_time.npy"):
        checked(base)


def leak_graph(folder, n=3000, seed=0):
    """The leak detector: a node's label is told only by edges after its seed time (from sources whose first
    feature says the label); the edges before it are noise."""
    rng = np.random.default_rng(seed)
    cls = rng.integers(0, 2, n)
    x = rng.normal(size=(n, 8)).astype(np.float32)
    x[:, 0] = np.where(cls == 1, 1.0, -1.0)
    y, seed_time = rng.integers(0, 2, n), rng.integers(100, 200, n)
    k = 8
    dst = np.repeat(np.arange(n), k)
    past_src = rng.integers(0, n, n * k)
    by_cls = [np.flatnonzero(cls == c) for c in (0, 1)]
    future_src = np.where(y[dst] == 1, rng.choice(by_cls[1], n * k), rng.choice(by_cls[0], n * k))
    ei = np.stack([np.concatenate([past_src, future_src]), np.concatenate([dst, dst])])
    t = np.concatenate([seed_time[dst] - rng.integers(1, 100, n * k), seed_time[dst] + rng.integers(1, 100, n * k)])
    save_folder(folder, rng, edge_index=ei, edge_time=t.astype(np.int64), seed_time=seed_time.astype(np.int64), x=x,
                y=y)


@pytest.mark.slow
def test_the_leak_detector_scores_at_chance_with_time_and_learns_the_leak_without(tmp_path):
    """Labels told only by edges after each seed's time: respected (the default), a model scores at chance, in the
    rank and from a sampler process alike (the same batches: the same metrics); with
    time.respect=false it learns them from the future edges, which proves the leak is learnable, and the log says
    future edges are seen. predict samples each node as of its time (the run's metric) and refuses exact outputs."""
    leak_graph(tmp_path / "g", n=2000)
    common = ["dataset=files", f"dataset.path={tmp_path / 'g'}", "train.epochs=6", "model.hidden_channels=32",
              "train.batch_size=256", "launch.procs=1", "metrics.tensorboard=false"]
    results = {}
    for name, extra in (("respected", []), ("procs", ["train.sampler_procs=1"]), ("ignored", ["time.respect=false"])):
        res = run_cli(*common, *extra, cwd=tmp_path / name)
        assert res.returncode == 0, res.stderr[-3000:]
        results[name] = json.loads((tmp_path / name / "run" / "summary.json").read_text())
        if name == "ignored":
            assert "time.respect=false: each seed's neighbourhood takes every edge, those after" in res.stdout + res.stderr
        else:
            assert "each seed's neighbourhood as of its own time (uniform among them" in res.stdout + res.stderr
    respected, ignored = results["respected"]["test"], results["ignored"]["test"]
    assert respected < 0.6 and ignored > 0.85, (respected, ignored)
    # the same batches from a sampler process: the same metrics (a sampler server's: tests/test_temporal_link.py's
    # link and table runs, built by the same builder)
    assert results["procs"]["test"] == respected and results["procs"]["best_val"] == results["respected"]["best_val"]
    # predict samples each node as of its time, as the run evaluated: the same test metric; exact outputs refused
    run = tmp_path / "respected" / "run"
    predicted = subprocess.run([sys.executable, "-m", "hpcgnn", "predict", str(run)], capture_output=True, text=True,
                               timeout=300, cwd=run.parent)
    assert predicted.returncode == 0, predicted.stderr[-3000:]
    assert f"test accuracy {respected:.4f}" in predicted.stdout and "sampled" in predicted.stdout, predicted.stdout
    exact = subprocess.run([sys.executable, "-m", "hpcgnn", "predict", str(run), "mode=full"], capture_output=True,
                           text=True, timeout=300, cwd=run.parent)
    assert exact.returncode == 2 and "the graph's edges have times, and exact outputs would read every edge, those " \
        "after each node's time too. HINT: mode=sampled" in exact.stderr, exact.stderr[-2000:]



@pytest.mark.slow
@pytest.mark.parametrize("sampling", [[], ["time.strategy=last", "time.window=40"]], ids=["uniform", "last-window"])
def test_a_preempted_timed_run_resumes_bitwise(tmp_path, sampling):
    """Preempted mid-epoch and resumed: the same parameters and losses as the run left alone (a tree per seed,
    drawn from the batch's generator as every sampler's)."""
    from conftest import preempted_and_resumed

    leak_graph(tmp_path / "g", n=2000)
    whole, again = preempted_and_resumed("dataset=files", f"dataset.path={tmp_path / 'g'}",
                                         f"dataset.root={tmp_path / 'root'}", "train.epochs=3", "train.batch_size=128",
                                         "model.hidden_channels=16", "metrics.tensorboard=false", *sampling, step=10,
                                         folder=tmp_path)
    assert again["resumes"] == 1 and whole["resumes"] == 0
    assert again["param_checksums"] == whole["param_checksums"]
    assert [r["loss"] for r in again["history"]] == [r["loss"] for r in whole["history"]]
    if sampling:  # a window of integer times is a whole number of their unit
        from conftest import train_here

        with pytest.raises(ConfigError, match=r"time.window=40.5: the graph's edge times are integers\. HINT: a whole "
                                              r"number of their unit, e.g. time.window=40"):
            train_here("dataset=files", f"dataset.path={tmp_path / 'g'}", f"dataset.root={tmp_path / 'root'}",
                       "time.window=40.5", run_dir=tmp_path / "half")


def recency_graph(folder, n=3000, seed=0):
    """Labels told only by edge ages: a node of class 1 met a neighbour within 5 time units before its seed time,
    one of class 0 none within 20; every node has 8 edges before its time and features of noise."""
    rng = np.random.default_rng(seed)
    k = 8
    y, seed_time = rng.integers(0, 2, n), rng.integers(1000, 2000, n)
    dst = np.repeat(np.arange(n), k)
    age = rng.integers(20, 100, n * k)
    age[np.arange(n) * k] = np.where(y == 1, rng.integers(0, 5, n), age[np.arange(n) * k])
    save_folder(folder, rng, edge_index=np.stack([rng.integers(0, n, n * k), dst]),
                edge_time=(seed_time[dst] - age).astype(np.int64), seed_time=seed_time.astype(np.int64),
                x=rng.normal(size=(n, 8)).astype(np.float32), y=y)


@pytest.mark.slow
def test_the_temporal_encoder_reads_edge_ages_that_other_models_cannot_see(tmp_path):
    """model=tgat reads each sampled edge's age (``data.edge_age``, encoded): on a graph whose labels only the ages
    tell it is right on nearly every node, where GraphSAGE, blind to them, stays at chance. On a graph without
    times it is refused, naming the fix."""
    from conftest import train_here

    recency_graph(tmp_path / "g")
    common = ["dataset=files", f"dataset.path={tmp_path / 'g'}", f"dataset.root={tmp_path / 'root'}",
              "train.epochs=10", "model.hidden_channels=32", "train.batch_size=256", "metrics.tensorboard=false"]
    tgat = train_here(*common, "model=tgat", run_dir=tmp_path / "tgat")
    sage = train_here(*common, "model=sage", run_dir=tmp_path / "sage")
    assert tgat["test"] > 0.9 and sage["test"] < 0.6, (tgat["test"], sage["test"])
    from hpcgnn.checks import check_task_config
    from hpcgnn.submit.compose import compose

    with pytest.raises(ConfigError, match=r"model=tgat reads each sampled edge's age: it trains on a graph whose edges "
                                          r"have times, sampled as of each seed's time\. HINT: give the edges' times"):
        check_task_config(compose(["model=tgat", f"run_dir={tmp_path / 'run'}"]).cfg)


def pyg_timed_graph(use_time: bool = False):
    """The leak detector as a PyG ``Data`` (``dataset._target_=test_temporal.pyg_timed_graph``): its edges' times as
    ``edge_time`` (``time`` with ``use_time``), its nodes' label times as ``seed_time``."""
    import tempfile

    from torch_geometric.data import Data

    folder = Path(tempfile.mkdtemp()) / "g"
    leak_graph(folder)
    a = {name: torch.from_numpy(np.load(folder / f"{name}.npy")) for name in
         ("edge_index", "edge_time", "seed_time", "x", "y", "train_idx", "val_idx", "test_idx")}
    shutil.rmtree(folder.parent)
    n = a["x"].size(0)
    masks = {f"{s}_mask": torch.zeros(n, dtype=torch.bool).index_fill_(0, a[f"{s}_idx"], True)
             for s in ("train", "val", "test")}
    times = {"time" if use_time else "edge_time": a["edge_time"]}
    return Data(x=a["x"], edge_index=a["edge_index"], y=a["y"], seed_time=a["seed_time"], **times, **masks)


@pytest.mark.slow
def test_a_pyg_graphs_edge_times_are_respected_as_a_folders_are(tmp_path):
    """``Data.edge_time`` (or ``Data.time``, one per edge) and ``Data.seed_time``: prepared into the same timeline as
    the same arrays in a files folder; trained at chance on the leak detector with time respected (evaluation sampled
    as of each node's time), learnt with time.respect=false (exact evaluation); its parts carry its timeline."""
    from conftest import make_config, train_here

    common = ["dataset=pyg", f"dataset.root={tmp_path / 'root'}", "train.epochs=8", "model.hidden_channels=32",
              "train.batch_size=256", "metrics.tensorboard=false"]
    leak_graph(tmp_path / "g")
    files = dataset_config(name="files", path=str(tmp_path / "g"), root=str(tmp_path / "root"))
    prepare(files)
    for target in ("test_temporal.pyg_timed_graph", "test_temporal.pyg_timed_graph_by_time"):
        cfg = make_config(*common, f"dataset._target_={target}").dataset
        prepare(cfg)
        a, b = open_graph(files).timeline, open_graph(cfg).timeline
        assert all(torch.equal(getattr(a, f).long(), getattr(b, f).long()) for f in ("col", "time", "edge", "seed_time"))
    pyg = [*common, "dataset._target_=test_temporal.pyg_timed_graph"]
    respected = train_here(*pyg, run_dir=tmp_path / "respected")
    ignored = train_here(*pyg, "time.respect=false", run_dir=tmp_path / "ignored")
    assert respected["eval_mode"] == "sampled" and ignored["eval_mode"] == "full"
    assert respected["test"] < 0.6 and ignored["test"] > 0.85, (respected["test"], ignored["test"])
    from hpcgnn.partition import ensure_parts
    from hpcgnn.partition.parts import open_parts

    parted = make_config(*pyg, "graph=partitioned", "graph.num_parts=1", "launch.procs=1")  # (its parts carry its times as a folder's)
    ensure_parts(parted.dataset, parted.graph, 1)
    whole, part = open_graph(parted.dataset).timeline, open_parts(parted.dataset, parted.graph, 1, [0]).timeline
    assert all(torch.equal(getattr(whole, f), getattr(part, f)) for f in ("col", "time", "edge", "seed_time"))


def pyg_timed_graph_by_time():
    return pyg_timed_graph(use_time=True)


def test_nodes_split_by_their_label_times_train_on_the_past(tmp_path):
    """``dataset.time_split=[t_val, t_test]``: the labelled nodes by seed_time (training before t_val, validation
    before t_test, the rest test), the folder's own split files not needed; a cut that is no pair in order refused."""
    from hpcgnn.checks import check_dataset_config

    write_timed_folder(tmp_path / "g", repeats=False)
    for name in ("train_idx", "val_idx", "test_idx"):
        (tmp_path / "g" / f"{name}.npy").unlink()
    y = np.load(tmp_path / "g" / "y.npy")
    y[:10] = -1  # (unlabelled: in no split)
    np.save(tmp_path / "g" / "y.npy", y)
    cfg = dataset_config(name="files", path=str(tmp_path / "g"), root=str(tmp_path / "root"), time_split=(300, 700))
    prepare(cfg)
    g, when = open_graph(cfg), np.load(tmp_path / "g" / "seed_time.npy")
    labelled = np.arange(3000) >= 10
    for split, want in (("train", (when < 300) & labelled), ("val", (when >= 300) & (when < 700) & labelled),
                        ("test", (when >= 700) & labelled)):
        assert np.array_equal(np.sort(getattr(g, f"{split}_idx").numpy()), np.flatnonzero(want)), split
    assert cache_folder(cfg) != cache_folder(dataset_config(name="files", path=str(tmp_path / "g"),
                                                            root=str(tmp_path / "root")))
    for bad in ((700, 300), (300,)):
        with pytest.raises(ConfigError, match=r"dataset.time_split=\[.*\] must be two cut times, the first before the "
                                              r"second: \[t_val, t_test\]"):
            check_dataset_config(dataset_config(name="files", path=str(tmp_path / "g"), time_split=bad))


def hetero_with_times():
    """A HeteroData whose relation's edges have times (a target for dataset=pyg_hetero)."""
    from torch_geometric.data import HeteroData

    data = HeteroData()
    data["a"].x, data["a"].y = torch.zeros(4, 2), torch.zeros(4, dtype=torch.long)
    data["a", "r", "a"].edge_index, data["a", "r", "a"].edge_time = torch.tensor([[0, 1], [1, 2]]), torch.tensor([5, 6])
    return data


def typed_leak_folder(folder, n=2000, a=500, seed=0):
    """The leak detector, typed: a paper's label is told only by the authors who write it after its seed time (an
    author's first feature says its class); its earlier authors and its citations are noise."""
    rng = np.random.default_rng(seed)
    cls = rng.integers(0, 2, a)
    xa = rng.normal(size=(a, 8)).astype(np.float32)
    xa[:, 0] = np.where(cls == 1, 1.0, -1.0)
    y, seed_time = rng.integers(0, 2, n), rng.integers(100, 200, n)
    k = 8
    dst = np.repeat(np.arange(n), k)
    by_cls = [np.flatnonzero(cls == c) for c in (0, 1)]
    future = np.where(y[dst] == 1, rng.choice(by_cls[1], n * k), rng.choice(by_cls[0], n * k))
    writes = np.stack([np.concatenate([rng.integers(0, a, n * k), future]), np.concatenate([dst, dst])])
    t = np.concatenate([seed_time[dst] - rng.integers(1, 100, n * k), seed_time[dst] + rng.integers(1, 100, n * k)])
    cites = np.stack([rng.integers(0, n, n * 4), rng.integers(0, n, n * 4)])
    arrays = {"nodes/paper": {"x": rng.normal(size=(n, 8)).astype(np.float32), "y": y, "seed_time": seed_time},
              "nodes/author": {"x": xa},
              "edges/author__writes__paper": {"edge_index": writes, "edge_time": t},
              "edges/paper__cites__paper": {"edge_index": cites, "edge_time": rng.integers(0, 300, n * 4)}}
    arrays["nodes/paper"].update(zip(("train_idx", "val_idx", "test_idx"),
                                     np.split(rng.permutation(n), [n // 2, 3 * n // 4]), strict=True))
    for sub, named in arrays.items():
        (folder / sub).mkdir(parents=True, exist_ok=True)
        for name, arr in named.items():
            np.save(folder / sub / f"{name}.npy", arr)
    return writes, t


@needs_cc
def test_a_typed_graphs_relations_are_sampled_as_of_each_seeds_time(tmp_path, switch):
    """A typed folder's times, every relation's (edges/<relation>/edge_time) and the target type's seed times: each
    relation's timeline prepared beside its CSR (its reverse's too, a pair given twice two events), and the typed
    sampler's trees holding no edge of any relation after their seed's time, each edge with its age, the same on
    the C kernels and their torch twins; the homogeneous view refused naming the way out (it keeps no times), and a
    HeteroData's times refused rather than read as if its edges had none."""
    from conftest import make_config
    from test_typed import write_typed_folder

    from hpcgnn.checks import check_task_config
    from hpcgnn.data import open_typed
    from hpcgnn.data.pyg import pyg_data
    from hpcgnn.data.synthetic import make_synthetic_typed
    from hpcgnn.sampling.temporal import TypedTemporalSampler

    writes, t = typed_leak_folder(tmp_path / "g", n=600, a=200)
    over = ["dataset=files", f"dataset.path={tmp_path / 'g'}", f"dataset.root={tmp_path / 'root'}"]
    cfg = make_config(*over)
    check_task_config(cfg)
    prepare(cfg.dataset)
    g = open_typed(cfg.dataset)
    rel, rev = ("author", "writes", "paper"), ("paper", "rev_writes", "author")
    assert set(g.timelines) == set(g.relations) and g.seed_time.dtype == torch.int64
    for r, (src, dst) in ((rel, (writes[0], writes[1])), (rev, (writes[1], writes[0]))):
        tl, rowptr = g.timelines[r], g.rowptr[r]
        assert tl.time.numel() == writes.shape[1]  # (every event kept)
        got = sorted(zip(np.repeat(np.arange(rowptr.numel() - 1), np.diff(rowptr.numpy())).tolist(),
                         tl.col.tolist(), tl.time.tolist(), strict=True))
        assert got == sorted(zip(dst.tolist(), src.tolist(), t.tolist(), strict=True)), r
        assert bool((np.diff(tl.time.numpy())[np.diff(np.repeat(np.arange(rowptr.numel() - 1),
                                                                np.diff(rowptr.numpy()))) == 0] >= 0).all())
    seeds = g.train_idx[:60]
    batches = []
    for native in (True, False):
        switch(native)
        sampler = TypedTemporalSampler(g, [6, 4], edge_ids=True)
        batches.append(sampler.sample(seeds, torch.Generator().manual_seed(0)))
    out, twin = batches
    for r in g.relations:
        assert torch.equal(out.edge_index[r], twin.edge_index[r]) and torch.equal(out.edge_age[r], twin.edge_age[r])
        src, dst = out.edge_index[r]
        at = g.seed_time[seeds][out.tree[r[2]][dst]]
        when = torch.empty_like(g.timelines[r].time)
        when[g.timelines[r].edge] = g.timelines[r].time
        assert torch.equal(out.edge_age[r], at - when[out.e_id[r]]) and bool((out.edge_age[r] >= 0).all()), r
        assert torch.equal(out.tree[r[0]][src], out.tree[r[2]][dst])  # (an edge inside its tree)
    assert out.edge_index[rel].size(1) > 0 and torch.equal(out.n_id["paper"][:60], seeds)
    from hpcgnn.data.times import typed_as_of

    then = typed_as_of(g, 150)  # (predict at=T's graph: each relation's edges strictly before T)
    assert then.timelines is None and then.edge_index(rel).size(1) == int((t < 150).sum())
    assert sorted(zip(*then.edge_index(rel).tolist(), strict=True)) == \
        sorted(zip(writes[0][t < 150].tolist(), writes[1][t < 150].tolist(), strict=True))
    check_task_config(make_config(*over, "graph=partitioned"))  # (over parts too)
    with pytest.raises(ConfigError, match=r"have times: sampling as of each seed's time runs for .*\(a typed graph: "
                                          r"task=node or edge\); got dataset.erase_types=true \(the homogeneous view "
                                          r"of a typed graph keeps no times\)\. HINT"):
        check_task_config(make_config(*over, "dataset.erase_types=true"))
    (tmp_path / "g" / "nodes" / "paper" / "seed_time.npy").unlink()
    with pytest.raises(ConfigError, match=r"its nodes do not say when each label is asked\. HINT: add "
                                          r"nodes/<target type>/seed_time.npy"):
        check_task_config(make_config(*over))
    write_typed_folder(tmp_path / "h", make_synthetic_typed(dataset_config(num_nodes=600, avg_degree=6, seed=5)))
    np.save(tmp_path / "h" / "edges" / "paper__cites__paper" / "edge_time.npy", np.arange(3))
    with pytest.raises(DatasetError, match=r"some relations' edges have times, and author__writes__paper.* not: every "
                                           r"relation's edges need theirs"):
        prepare(dataset_config(name="files", path=str(tmp_path / "h"), root=str(tmp_path / "root")))
    hetero = make_config("dataset=pyg_hetero", "dataset._target_=test_temporal.hetero_with_times",
                         f"dataset.root={tmp_path / 'root'}")
    with pytest.raises(DatasetError, match=r"gives times on a HeteroData \(\('a', 'r', 'a'\)\), and sampling as of a "
                                           r"time runs on homogeneous graphs today\. HINT: its homogeneous view as a "
                                           r"Data with edge_time \(dataset=pyg\)"):
        pyg_data(hetero.dataset)


@pytest.mark.slow
def test_the_typed_leak_detector_scores_at_chance_with_time_and_learns_the_leak_without(tmp_path):
    """A typed graph whose papers' labels only their later authors tell: at chance with time respected (evaluation
    sampled as of each paper's time, though the model runs layer by layer); learnt with time.respect=false (the typed
    sampler's producers build it by the one builder, stores/typed.py's typed_samplers, and are tested untimed). predict at=T: every paper's output
    from each relation's edges before T. An edge task over one relation's edges at their times trains."""
    typed_leak_folder(tmp_path / "g")
    common = ["dataset=files", f"dataset.path={tmp_path / 'g'}", "train.epochs=8", "model=rgcn",
              "model.hidden_channels=32", "train.batch_size=256", "launch.procs=1", "metrics.tensorboard=false"]
    results = {}
    for name, extra in (("respected", []), ("ignored", ["time.respect=false"])):
        res = run_cli(*common, *extra, cwd=tmp_path / name)
        assert res.returncode == 0, res.stderr[-3000:]
        results[name] = json.loads((tmp_path / name / "run" / "summary.json").read_text())
    respected, ignored = results["respected"]["test"], results["ignored"]["test"]
    assert respected < 0.6 and ignored > 0.85, (respected, ignored)
    assert results["respected"]["eval_mode"] == "sampled"
    run = tmp_path / "respected" / "run"
    done = subprocess.run([sys.executable, "-m", "hpcgnn", "predict", str(run), "at=150", "split=all"],
                          capture_output=True, text=True, timeout=300, cwd=run.parent)
    assert done.returncode == 0 and "over 2000 nodes" in done.stdout and "full inference as of 150" in done.stdout, \
        done.stdout + done.stderr[-2000:]
    writes = tmp_path / "g" / "edges" / "author__writes__paper"  # (then its edges an edge task's targets, at times)
    np.save(writes / "edge_label.npy", (np.load(writes / "edge_time.npy") % 2).astype(np.int64))
    np.save(writes / "edge_label_time.npy", np.load(writes / "edge_time.npy"))
    edge = run_cli(*common[:2], "task=edge", "model=rgcn", "train.epochs=2", "launch.procs=1",
                   "metrics.tensorboard=false", cwd=tmp_path / "edge")
    assert edge.returncode == 0 and "each asked as of its time" in edge.stdout + edge.stderr, edge.stderr[-3000:]


def test_a_typed_edge_tasks_targets_are_each_asked_strictly_before_their_times(tmp_path):
    """A typed folder's target relation with edge_label_time: both ends of each target a tree of its own (a user
    rating twice: two trees), every relation drawn strictly before the target's time (its own edge unseen: nothing
    left out by hand), the pairs naming their ends; targets without times refused naming the relation's file."""
    from conftest import make_config
    from test_edge_tasks import RATES, write_rated_edges

    from hpcgnn.checks import check_task_config
    from hpcgnn.env import RankEnv
    from hpcgnn.sampling.temporal import TypedTemporalSampler
    from hpcgnn.sampling.typed import TypedEdgeTargetSampler
    from hpcgnn.tasks import open_store

    given = write_rated_edges(tmp_path / "g", users=100, items=150)
    rel = tmp_path / "g" / "edges" / "__".join(RATES)
    when = np.random.default_rng(3).integers(0, 1000, given["index"].shape[1])
    np.save(rel / "edge_time.npy", when)
    over = ["task=edge", "dataset=files", f"dataset.path={tmp_path / 'g'}", f"dataset.root={tmp_path / 'root'}",
            "model=rgcn", "train.fanouts=[25,10]"]
    with pytest.raises(ConfigError, match=r"its edge targets do not say when each is asked\. HINT: add "
                                          r"edges/user__rates__item/edge_label_time.npy"):
        check_task_config(make_config(*over))
    np.save(rel / "edge_label_time.npy", when)
    store = open_store(make_config(*over), RankEnv.from_environ({}))
    sampler = store.train_sampler
    assert isinstance(sampler, TypedEdgeTargetSampler) and isinstance(sampler.node_sampler, TypedTemporalSampler)
    assert sampler.node_sampler.strict and not sampler.drop_targets
    items = store.items.train_ids()[:64]
    out = sampler.sample(items, torch.Generator().manual_seed(0))
    at = torch.from_numpy(when)[items]
    pairs = out.targets["edge_label_index"]
    assert torch.equal(out.n_id["user"][pairs[0]], torch.from_numpy(given["index"][0])[items])
    assert torch.equal(out.n_id["item"][pairs[1]], torch.from_numpy(given["index"][1])[items])
    trees = torch.cat([at, at])  # (the users' trees first, then the items')
    events = {}
    for u, i, t in zip(*given["index"].tolist(), when.tolist(), strict=True):
        events.setdefault((u, i), set()).add(t)
    for r, ei in out.edge_index.items():  # each edge an event of its pair, at its tree's time less its age
        src, dst = out.n_id[r[0]][ei[0]].tolist(), out.n_id[r[2]][ei[1]].tolist()
        edge_time = (trees[out.tree[r[2]][ei[1]]] - out.edge_age[r]).tolist()
        for a, b, t in zip(src, dst, edge_time, strict=True):
            assert t in events[(a, b) if r == RATES else (b, a)], (r, a, b, t)
        assert bool((out.edge_age[r] > 0).all()), r  # (strictly before: a target's own edge never seen)
        assert ei.size(1) > 0, r
