"""Partitions as a checked artifact, and distributed sampling over them (real gloo processes)."""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp
from conftest import (
    DATA_ROOT,
    check_exact_inference,
    dead_pid,
    exact_inference_worker,
    local_rank_env,
    make_config,
    run_cli,
    start_and_stop,
    summary_of,
)

from hpcgnn.config import DatasetConfig, GraphConfig, dataset_config
from hpcgnn.data import open_graph, prepare
from hpcgnn.errors import ConfigError, PartitionError
from hpcgnn.partition import (
    check_partition_memory,
    ensure_parts,
    open_parts,
    partition_memory,
    parts_folder,
)

SMALL = dataset_config(num_nodes=20_000, avg_degree=12, root=str(DATA_ROOT))
METIS, RANDOM = GraphConfig(mode="partitioned", method="metis"), GraphConfig(mode="partitioned", method="random")
LP = GraphConfig(mode="partitioned", method="lp")


def _copy(folder: Path, to: Path) -> Path:
    shutil.copytree(folder, to)
    return to


def _private(tmp_path: Path) -> DatasetConfig:
    """SMALL under this test's own root: tests that damage or delete artifacts never touch shared ones."""
    return dataclasses.replace(SMALL, root=str(tmp_path / "data"))


@pytest.mark.parametrize("method", [METIS, LP], ids=["metis", "lp"])
def test_parts_are_byte_identical_across_runs(tmp_path, method):
    mine = _private(tmp_path)
    folder, meta, reused = ensure_parts(mine, method, 4)
    first = _copy(folder, tmp_path / "first")
    shutil.rmtree(folder)
    folder2, meta2, reused2 = ensure_parts(mine, method, 4)
    assert folder2 == folder and not reused2
    for path in sorted(first.rglob("*.npy")):
        assert path.read_bytes() == (folder / path.relative_to(first)).read_bytes(), path
    assert meta2["files"] == meta["files"]


def test_a_killed_lp_partitions_leftovers_are_removed_by_the_next_on_this_host(tmp_path):
    """A partition killed mid-way leaves its parts' temporary folder and lp's coarse levels beside the parts;
    the next partition on this host removes both (their writer's pid is gone) and leaves only the parts."""
    from hpcgnn.writers import _host

    mine = _private(tmp_path)
    prepare(mine)
    folder = parts_folder(mine, LP, 4)
    folder.parent.mkdir(parents=True)
    gone = f"{_host()}-{dead_pid()}-0badc0de"
    leftovers = [folder.parent / f".{folder.name}.tmp-{gone}", folder.parent / f"hpcgnn-lp-{gone}"]
    for left in leftovers:
        (left / "level1").mkdir(parents=True)
        (left / "level1" / "col.npy").write_bytes(b"\0" * 4096)
    ensure_parts(mine, LP, 4)
    assert [p.name for p in folder.parent.iterdir()] == [folder.name]


@pytest.mark.slow
def test_ctrl_c_while_waiting_on_a_partitioning_job_leaves_it_running(tmp_path):
    """A partitioning job submitted (here through submitit's local executor) goes on when Ctrl-C stops the
    waiting: one line, exit 130, and the job's parts appear after."""
    import signal
    import time

    mine = dataset_config(num_nodes=200_000, root=str(tmp_path / "data"))
    parts = prepare(mine) / "parts"
    waiting = subprocess.Popen([sys.executable, "-m", "hpcgnn.partition", "+cluster=local", "dataset.num_nodes=200000",
                                f"dataset.root={mine.root}", "graph.method=lp", "graph.num_parts=4"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                               start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and waiting.poll() is None and not any(parts.glob("hpcgnn-lp-*/level1/*")):
        time.sleep(0.05)
    os.killpg(waiting.pid, signal.SIGINT)  # the terminal's whole process group
    assert waiting.wait(60) == 130
    stderr = waiting.stderr.read()
    assert re.search(r"stopped waiting; partitioning job \d+ goes on", stderr) and "Traceback" not in stderr, stderr
    while time.monotonic() < deadline and not (parts / "lp-k4-s0").exists():
        time.sleep(0.5)
    assert [p.name for p in parts.iterdir()] == ["lp-k4-s0"]


@pytest.mark.slow
def test_an_lp_partition_stopped_by_sigterm_leaves_nothing_behind(tmp_path):
    """SIGTERM while lp coarsens: the command exits 143 and removes its coarse levels (parts/ is empty)."""
    import signal

    mine = dataset_config(num_nodes=200_000, root=str(tmp_path / "data"))
    parts = prepare(mine) / "parts"
    child = start_and_stop(["-m", "hpcgnn.partition", "dataset.num_nodes=200000", f"dataset.root={mine.root}",
                            "graph.method=lp", "graph.num_parts=4"],
                           lambda: any(parts.glob("hpcgnn-lp-*/level1/buckets0/*")), signal.SIGTERM, cwd=tmp_path)
    assert child.returncode == 143, child.stderr.read()
    assert "hpcgnn: partition stopped by SIGTERM; removing its temporary files" in child.stderr.read()
    assert list(parts.iterdir()) == []


def test_metis_cuts_far_fewer_edges_than_random_and_balances_train_nodes():
    for k in (2, 4):
        metis = ensure_parts(SMALL, METIS, k)[1]["report"]
        rand = ensure_parts(SMALL, RANDOM, k)[1]["report"]
        assert metis["edge_cut_fraction"] <= rand["edge_cut_fraction"] / 3, (k, metis, rand)
        assert metis["balance"]["train_nodes"] < 1.1 and metis["balance"]["nodes"] < 1.1
        assert sum(metis["nodes"]) == SMALL.num_nodes and len(metis["halo_nodes"]) == k


def test_lp_coarsens_and_cuts_about_what_metis_cuts_with_balanced_parts(caplog):
    """The multilevel path for real (coarsening forced on a small graph, chunks of a few rows): cut within
    1.5x of METIS's and far below random's, nodes and training nodes within 3% of the mean."""
    from hpcgnn.partition import partition_report, rebalance, seed_weight
    from hpcgnn.partition.multilevel import balance_columns, balance_groups, lp_parts

    prepare(SMALL)
    graph = open_graph(SMALL)
    weight = seed_weight(graph)
    columns = balance_columns(balance_groups(torch.zeros(graph.num_nodes, dtype=torch.long), weight > 0, True), weight,
                              True)
    for k in (2, 4):
        with caplog.at_level("INFO", logger="hpcgnn.partition.multilevel"):
            part = lp_parts(graph.rowptr, graph.col, k, 0, columns, coarsest_nodes=500, chunk_edges=1 << 14)
        assert "lp level 1:" in caplog.text  # at least two levels of clusters
        part = rebalance(graph, part, (weight > 0).long(), k)
        lp = partition_report(graph, part, k, weight)
        metis = ensure_parts(SMALL, METIS, k)[1]["report"]
        rand = ensure_parts(SMALL, RANDOM, k)[1]["report"]
        assert lp["edge_cut_fraction"] <= 1.5 * metis["edge_cut_fraction"], (k, lp, metis)
        assert lp["edge_cut_fraction"] <= rand["edge_cut_fraction"] / 3
        assert lp["balance"]["nodes"] <= 1.031 and lp["balance"]["train_nodes"] <= 1.031, lp["balance"]


def test_lp_reads_a_chunks_edges_without_its_self_loops():
    """A chunk of rows as the passes see it: (row within the chunk, neighbour, weight), self-loops dropped,
    the rest in CSR order; a chunk without loops comes back as read."""
    from hpcgnn.partition.multilevel import Level, _chunk_edges

    rowptr = torch.tensor([0, 2, 5, 6, 8])  # row 1 and row 3 hold a self-loop
    col = torch.tensor([1, 2, 0, 1, 3, 0, 3, 2], dtype=torch.int32)
    weight = torch.tensor([1, 2, 3, 4, 5, 6, 7, 8])
    for w in (None, weight):
        level = Level(rowptr, col, w, torch.ones(4, dtype=torch.int32), torch.ones(4, 1, dtype=torch.int32))
        row, nbr, got = _chunk_edges(level, 1, 4)
        assert row.tolist() == [0, 0, 1, 2] and nbr.tolist() == [0, 3, 0, 2]
        assert got is None if w is None else got.tolist() == [3, 5, 6, 8]
        row, nbr, got = _chunk_edges(level, 0, 1)
        assert row.tolist() == [0, 0] and nbr.tolist() == [1, 2]
        assert got is None if w is None else got.tolist() == [1, 2]


def test_meta_records_the_artifact():
    folder, meta, _ = ensure_parts(SMALL, METIS, 2)
    assert meta["format_version"] == 1 and meta["num_parts"] == 2 and meta["method"] == "metis"
    assert set(meta["files"]) == {"node_part.npy", "node_local.npy", "degree.npy"} | {
        f"part_{i}/{a}.npy" for i in range(2)
        for a in ("nodes", "rowptr", "col", "x", "y", "train_idx", "val_idx", "test_idx")}
    graph = open_graph(SMALL)
    parts = [open_parts(SMALL, METIS, 2, [i]) for i in range(2)]
    assert sum(p.col.numel() for p in parts) == graph.num_edges
    for p in parts:  # every owned node keeps its full adjacency, in global ids
        v = int(p.nodes[7])
        lo, hi = int(graph.rowptr[v]), int(graph.rowptr[v + 1])
        assert torch.equal(p.col[int(p.rowptr[7]):int(p.rowptr[8])], graph.col[lo:hi])
        assert torch.equal(p.x[7], graph.x[v])


def test_reuse_does_not_rewrite():
    folder, _, _ = ensure_parts(SMALL, METIS, 2)
    before = {p: p.stat().st_mtime_ns for p in folder.rglob("*")}
    _, _, reused = ensure_parts(SMALL, METIS, 2)
    assert reused and before == {p: p.stat().st_mtime_ns for p in folder.rglob("*")}


def _corrupt(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-3] ^= 0xFF
    path.write_bytes(bytes(data))


def test_corrupt_part_is_caught_before_training(tmp_path):
    mine = _private(tmp_path)
    folder, _, _ = ensure_parts(mine, RANDOM, 2)
    _corrupt(folder / "part_1" / "x.npy")
    open_parts(mine, RANDOM, 2, [0])  # part 0 is intact
    with pytest.raises(PartitionError, match=r"part_1/x.npy is corrupt \(sha256 differs from META.json\)"):
        open_parts(mine, RANDOM, 2, [1])


@pytest.mark.slow
def test_a_corrupt_part_met_by_the_ranks_is_a_partition_error_with_exit_code_2(tmp_path):
    """Found on the compute node, not at submit time: the launcher still reports a user error
    (a partition error, not a config error, not a crash) and exits 2."""
    over = ["graph=partitioned", "graph.method=random", f"dataset.num_nodes={SMALL.num_nodes}",
            f"dataset.avg_degree={SMALL.avg_degree}", f"dataset.root={tmp_path / 'data'}", "train.epochs=1"]
    cfg = make_config(*over)
    folder, _, _ = ensure_parts(cfg.dataset, cfg.graph, 2)
    _corrupt(folder / "part_1" / "col.npy")
    res = subprocess.run([sys.executable, "-m", "hpcgnn", *over, f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 2, res.stdout + res.stderr
    assert re.search(r"hpcgnn: partition error: \S+part_1/col.npy is corrupt \(sha256 differs from META.json\)",
                     res.stderr), res.stderr
    assert "config error" not in res.stderr


def test_parts_of_another_graph_or_k_are_refused(tmp_path):
    mine = _private(tmp_path)
    folder, _, _ = ensure_parts(mine, METIS, 2)
    other = dataclasses.replace(mine, seed=5)
    prepare(other)
    _copy(folder, parts_folder(other, METIS, 2))
    with pytest.raises(PartitionError, match="was made from another graph than the prepared synthetic"):
        open_parts(other, METIS, 2, [0])
    _copy(folder, parts_folder(mine, METIS, 3))
    with pytest.raises(PartitionError, match="holds 2 parts, the job needs 3"):
        open_parts(mine, METIS, 3, [0])
    with pytest.raises(PartitionError, match=r"no 4-part partition .* HINT: python -m hpcgnn.partition"):
        open_parts(mine, GraphConfig(mode="partitioned", seed=99), 4, [0])


def test_partitioning_refuses_when_memory_is_short():
    need = partition_memory("metis", 1000, 10**8)
    assert need > 66 * 10**8
    with pytest.raises(PartitionError, match=r"needs about .* HINT: use graph.method=lp .* or graph.method=random"):
        check_partition_memory("metis", 1000, 10**8, available=need - 1)
    check_partition_memory("random", 1000, 10**8, available=10**6)  # random needs no adjacency copy
    assert partition_memory("lp", 1000, 10**8) < need / 3  # lp: O(nodes) state, a chunk, one coarse level
    fresh = GraphConfig(mode="partitioned", seed=123)
    with pytest.raises(PartitionError, match="graph.method=random"):
        ensure_parts(SMALL, fresh, 2, available=10**6)
    assert not parts_folder(SMALL, fresh, 2).exists()


@pytest.mark.parametrize("overrides, message", [
    (["graph=partitioned", "graph.num_parts=3"], r"graph.num_parts=3 cannot be shared by 2 ranks.*multiple of 2"),
    (["graph.mode=sharded"], r"graph.mode='sharded' is unknown: use graph=replicated or graph=partitioned"),
    (["graph.method=kmeans"], r"graph.method='kmeans' is unknown: use metis, lp or random"),
    (["graph.cache_policy=lru"], r"graph.cache_policy='lru' is unknown: use degree or frequency"),
    (["graph.boundary_fraction=0"], r"graph.boundary_fraction=0.0 must be in \(0, 1\]"),
])
def test_graph_config_errors(overrides, message):
    with pytest.raises(ConfigError, match=message):
        make_config(*overrides)


# --------------------------------------------------------------- distributed sampling, real processes


def _sample_worker(rank: int, world: int, port: int, cfg, folder: str) -> None:
    from hpcgnn.dist import process_group
    from hpcgnn.tasks import open_store

    torch.set_num_threads(1)
    env = local_rank_env(rank, world, port)
    with process_group(env, cfg.dist, torch.device("cpu")):
        store = open_store(cfg, env)
        seeds = store.train_seeds(1)[:200]
        gen = torch.Generator().manual_seed(rank)
        before = store.counters()
        batches = []
        for chunk in (seeds[:100], seeds[100:], seeds[:0]):  # an empty batch still serves the others
            out = store.sampler.sample(chunk, gen)
            x, y = store.features.gather(out.n_id, out.batch_size)
            batches.append({"n_id": out.n_id, "edge_index": out.edge_index, "batch_size": out.batch_size,
                            "num_sampled_nodes": list(out.num_sampled_nodes), "x": x, "y": y})
        stats = (store.counters() - before).per_batch()
        torch.save({"batches": batches, "stats": stats, "owned": store.parts.nodes}, f"{folder}/rank{rank}.pt")


def _run_workers(cfg, tmp_path: Path, world: int = 2) -> list[dict]:
    from hpcgnn.submit.local import free_port

    port = free_port(23000 + os.getpid() % 5000, 20000, 32767)
    mp.start_processes(_sample_worker, args=(world, port, cfg, str(tmp_path)), nprocs=world, start_method="spawn")
    return [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(world)]


@pytest.mark.slow
@pytest.mark.parametrize("num_parts, cache_mb, method, features", [(2, 0.0, "metis", "float32"),
                                                                    (4, 0.5, "lp", "bfloat16")],
                         ids=["k2", "k4-over-partitioned-cached-lp-bf16"])
def test_distributed_batches_are_valid_subgraphs(tmp_path, num_parts, cache_mb, method, features):
    ds = [f"dataset.num_nodes={SMALL.num_nodes}", f"dataset.avg_degree={SMALL.avg_degree}",
          f"dataset.feature_dtype={features}", f"graph.method={method}"]
    cfg = make_config("graph=partitioned", f"graph.num_parts={num_parts}", f"graph.cache_mb={cache_mb}",
                      "train.fanouts=[6,4,3]", *ds, f"dataset.root={DATA_ROOT}")
    ensure_parts(cfg.dataset, cfg.graph, num_parts)
    graph = open_graph(cfg.dataset)
    n = graph.num_nodes
    keys = graph.col + n * torch.repeat_interleave(torch.arange(n), graph.degree())  # sorted: target-major CSR
    results = _run_workers(cfg, tmp_path)
    for res in results:
        owned = set(res["owned"].tolist())
        for b in res["batches"]:
            n_id, ei, bs = b["n_id"], b["edge_index"], b["batch_size"]
            assert torch.unique(n_id).numel() == n_id.numel()
            assert set(n_id[:bs].tolist()) <= owned  # seeds come from the rank's own parts
            src, dst = n_id[ei[0]], n_id[ei[1]]
            k = dst * n + src
            pos = torch.searchsorted(keys, k).clamp(max=keys.numel() - 1)
            assert torch.equal(keys[pos], k), "an edge of the batch is not in the graph"
            # Fanouts: every node of hop h-1 gets min(degree, fanout_h) distinct in-neighbours.
            bounds = np.cumsum([0, *b["num_sampled_nodes"]])
            indeg = torch.bincount(ei[1], minlength=n_id.numel())
            for h, fanout in enumerate((6, 4, 3)):
                targets = torch.arange(bounds[h], bounds[h + 1])
                want = graph.degree()[n_id[targets]].clamp(max=fanout)
                assert torch.equal(indeg[targets], want), f"hop {h + 1}"
            assert torch.unique(k).numel() == k.numel()  # without replacement
            assert b["x"].dtype == torch.float32  # rows travel stored (bfloat16: half the bytes), batches in float32
            assert torch.equal(b["x"], graph.x[n_id].float()) and torch.equal(b["y"], graph.y[n_id[:bs]])
        stats = res["stats"]
        assert stats["remote_rows_per_batch"] > 0 and stats["bytes_received_per_batch"] > 0
        if cache_mb:
            assert stats["cache_hit_rate"] > 0
        else:
            assert stats["cache_hit_rate"] == 0


@pytest.mark.slow
def test_frequency_cache_catches_remote_rows(tmp_path):
    cfg = make_config("graph=partitioned", "graph.cache_mb=1", "graph.cache_policy=frequency",
                      "graph.warmup_batches=3", "train.fanouts=[6,4,3]", f"dataset.num_nodes={SMALL.num_nodes}",
                      f"dataset.avg_degree={SMALL.avg_degree}", f"dataset.root={DATA_ROOT}")
    ensure_parts(cfg.dataset, cfg.graph, 2)
    graph = open_graph(cfg.dataset)
    for res in _run_workers(cfg, tmp_path):
        assert res["stats"]["cache_hit_rate"] > 0.2
        for b in res["batches"]:
            assert torch.equal(b["x"], graph.x[b["n_id"]])


def _lp_task(rank: int, world: int, port: int, cfg: DatasetConfig, out: str) -> None:
    import torch.distributed as dist

    from hpcgnn.partition import multilevel
    from hpcgnn.partition.multilevel import Comm

    torch.set_num_threads(1)
    multilevel.COARSEST_NODES = 500  # a hierarchy of several levels on a small graph
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        folder, meta, reused = ensure_parts(cfg, LP, 4, comm=Comm(rank, world))
        torch.save({"meta": meta, "reused": reused, "folder": str(folder)}, f"{out}/task{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_lp_partitions_as_a_multi_task_job_each_task_reading_its_share(tmp_path, monkeypatch):
    """Two gloo tasks partition together (each reads half of every level's rows; moves gathered and agreed
    on): both end with the same META; two such runs write byte-identical parts; the cut is the one task's
    within 2%, the balance within 3%, and the artifact opens and verifies like any other."""
    from hpcgnn.partition import multilevel
    from hpcgnn.submit.local import free_port

    mine = _private(tmp_path)
    prepare(mine)
    runs = []
    for attempt in range(2):
        port = free_port(24000 + os.getpid() % 4000, 20000, 32767)
        mp.start_processes(_lp_task, args=(2, port, mine, str(tmp_path)), nprocs=2, start_method="spawn")
        res = [torch.load(tmp_path / f"task{r}.pt", weights_only=False) for r in range(2)]
        assert res[0]["meta"] == res[1]["meta"] and not res[0]["reused"]
        folder = Path(res[0]["folder"])
        runs.append(_copy(folder, tmp_path / f"run{attempt}"))
        shutil.rmtree(folder)
    first, second = runs
    for path in sorted(first.rglob("*.npy")):
        assert path.read_bytes() == (second / path.relative_to(first)).read_bytes(), path
    meta = res[0]["meta"]
    assert meta["tasks"] == 2
    monkeypatch.setattr(multilevel, "COARSEST_NODES", 500)
    one = ensure_parts(mine, LP, 4)[1]
    assert one["tasks"] == 1
    two_cut, one_cut = meta["report"]["edge_cut_fraction"], one["report"]["edge_cut_fraction"]
    assert abs(two_cut - one_cut) <= 0.02 * one_cut, (two_cut, one_cut)
    assert meta["report"]["balance"]["nodes"] <= 1.031 and meta["report"]["balance"]["train_nodes"] <= 1.031
    shutil.rmtree(parts_folder(mine, LP, 4))
    shutil.copytree(first, parts_folder(mine, LP, 4))
    parts = open_parts(mine, LP, 4, [0, 1, 2, 3])  # checksums verified
    assert parts.nodes.numel() == mine.num_nodes


# --------------------------------------------------------------- the CLIs


@pytest.mark.slow
def test_partition_cli_partitions_then_reuses(tmp_path):
    args = [sys.executable, "-m", "hpcgnn.partition", "graph.num_parts=2", "graph.method=random",
            "dataset.num_nodes=5000", f"dataset.root={DATA_ROOT}"]
    first = subprocess.run(args, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert first.returncode == 0, first.stderr
    assert "2 parts (random, seed 0), edge-cut" in first.stdout and "partitioned in" in first.stdout
    assert "part 1:" in first.stdout and "halo" in first.stdout
    again = subprocess.run(args, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and "(reused in" in again.stdout


@pytest.mark.slow
def test_partitioned_training_matches_replicated_accuracy(tmp_path, cpu_kind):
    """K=2 METIS parts (made by the launcher, or reused), within 1 point of the same job on a replicated graph (both
    evaluated alike, on sampled batches: what training reached, not how it is measured)."""
    runs = {}
    for mode in ("replicated", "partitioned"):
        res = run_cli("dataset.num_nodes=20000", "train.epochs=5", f"graph={mode}", "graph.cache_mb=0.25",
                      "train.eval_mode=sampled", "metrics.tensorboard=false", cwd=tmp_path / mode, timeout=900)
        assert res.returncode == 0, res.stdout + res.stderr
        runs[mode] = summary_of(tmp_path / mode)
    part, rep = runs["partitioned"], runs["replicated"]
    assert part["graph_mode"] == "partitioned" and rep["graph_mode"] == "replicated"
    assert part["precision"] == rep["precision"] == cpu_kind  # (the ranks inherit the CPU kind)
    assert abs(part["test_acc"] - rep["test_acc"]) <= 0.01, (part["test_acc"], rep["test_acc"])
    assert len(set(part["param_checksums"])) == 1
    last = part["history"][-1]
    assert last["remote_rows_per_batch"] > 0 and 0 < last["cache_hit_rate"] < 1
    # Each rank holds its part, not the graph: at most 1/K + 0.25 of the replicated bytes.
    assert max(part["resident_graph_bytes"]) <= (1 / 2 + 0.25) * rep["resident_graph_bytes"][0]
    assert part["world_size"] == 2


INFERENCE_MODELS = ("sage", "gcn", "gin", "gat", "mlp")


@pytest.mark.slow
def test_exact_partitioned_inference_equals_the_replicated_layerwise_inference(tmp_path):
    """train.eval_mode=full on a partitioned graph: each of 2 gloo ranks computes its own nodes layer by layer
    (straight from its CSR), fetching its halo's previous-layer outputs while it computes the nodes that need
    none (each of them, first; or, where they are too few to reorder for, its linear maps alone); equal to PyG's
    layer-wise inference on the whole graph (model.aggregation=pyg), and the task's accuracies equal the whole
    graph's."""
    from hpcgnn.config import ModelConfig
    from hpcgnn.models import build_model, gcn_norm
    from hpcgnn.stores.exact import WholeGraphPieces, exact_outputs
    from hpcgnn.submit.local import free_port

    cfg = make_config("graph=partitioned", "train.eval_mode=full", "train.fanouts=[5,3]", "graph.method=metis",
                      f"dataset.num_nodes={SMALL.num_nodes}", f"dataset.avg_degree={SMALL.avg_degree}",
                      f"dataset.root={DATA_ROOT}")
    ensure_parts(cfg.dataset, cfg.graph, 2)
    graph = open_graph(cfg.dataset)
    port = free_port(23000 + os.getpid() % 5000, 20000, 32767)
    mp.start_processes(exact_inference_worker, args=(2, port, cfg, str(tmp_path),
                                                     (*INFERENCE_MODELS, "sage, in row order")), nprocs=2,
                       start_method="spawn")
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(2)]
    assert sorted(torch.cat([r["nodes"] for r in ranks]).tolist()) == list(range(graph.num_nodes))
    for name in (*INFERENCE_MODELS, "sage, in row order"):
        model_cfg = ModelConfig(name=name.split(",")[0], hidden_channels=16, aggregation="pyg")  # (PyG's path)
        torch.manual_seed(0)
        model = build_model(model_cfg, graph.num_features, graph.num_classes, 2)
        whole = exact_outputs(model, WholeGraphPieces(graph, torch.device("cpu"), 1000, 0, 1,
                                                      gcn_degree=graph.degree() if gcn_norm(model_cfg) else None))
        check_exact_inference(ranks, name, whole, graph.y, {"val": graph.val_idx, "test": graph.test_idx})
    # the nodes computed before the halo is needed: those with no in-neighbour owned by the other rank
    owner = torch.empty(graph.num_nodes, dtype=torch.long)
    for r, rank in enumerate(ranks):
        owner[rank["nodes"]] = r
    far = owner.index_select(0, graph.col) != torch.repeat_interleave(owner, graph.degree())
    needs = torch.zeros(graph.num_nodes, dtype=torch.bool).index_put_((torch.repeat_interleave(
        torch.arange(graph.num_nodes), graph.degree())[far],), torch.tensor(True))
    for r, rank in enumerate(ranks):
        inner = int((~needs[rank["nodes"]]).sum())
        assert 0 < inner < rank["nodes"].numel()
        assert [rank[name]["inner"] for name in INFERENCE_MODELS] == [inner] * 4 + [None], r
        assert rank["sage, in row order"]["inner"] == 0  # (below INTERIOR_FIRST: not reordered, the same outputs)


def test_halo_bound_is_the_halo_of_one_part_and_nothing_for_all_parts():
    ensure_parts(SMALL, METIS, 2)
    for i in range(2):
        p = open_parts(SMALL, METIS, 2, [i])
        halo = torch.unique(p.col[p.node_part.index_select(0, p.col.long()) != i])
        assert p.halo_bound == halo.numel() > 0
    assert open_parts(SMALL, METIS, 2, [0, 1]).halo_bound == 0


def test_exact_evaluation_that_cannot_fit_is_refused_before_training(monkeypatch):
    """The layer tables of train.eval_mode=full are sized at start, against the rank's share of the node's
    memory: refused with the fix named, instead of killed at the first evaluation."""
    from hpcgnn.stores import exact as techniques
    from hpcgnn.stores.exact import check_exact_inference_memory, exact_inference_bytes

    ensure_parts(SMALL, METIS, 2)
    p = open_parts(SMALL, METIS, 2, [0])
    cfg = make_config("graph=partitioned", "train.eval_mode=full", "model.hidden_channels=64")
    need = exact_inference_bytes(p.nodes.numel(), p.halo_bound, p.col.numel(), (p.num_features, 64, p.num_classes))
    assert need >= 2 * (p.nodes.numel() + p.halo_bound) * 64 * 4
    # the largest layer's input, output and mapped input; edges twice (reordered); the fetch buffers; bf16 between
    # layers where narrow (the last output float32)
    assert exact_inference_bytes(100, 20, 1000, (128, 64, 8)) == 120 * (128 + 64 + 64) * 4 + 8000 + 4 * 20 * 128 * 4
    assert exact_inference_bytes(100, 20, 1000, (128, 64, 8), narrow=True) == \
        120 * (128 + 64 + 64) * 2 + 8000 + 4 * 20 * 128 * 2
    assert exact_inference_bytes(100, 20, 1000, (8, 64, 64, 8), narrow=True) == \
        120 * (64 + 64 + 64) * 2 + 8000 + 4 * 20 * 64 * 2
    env = local_rank_env(0, 2, 29500)
    monkeypatch.setattr(techniques, "available_memory", lambda: 2 * need)  # a rank's share: need
    check_exact_inference_memory(p, cfg.model, env)
    monkeypatch.setattr(techniques, "available_memory", lambda: 2 * need - 2)
    with pytest.raises(ConfigError, match=r"train.eval_mode=full on this partitioned graph needs about .* on a rank "
                                          r".*x up to 64 floats.*\(2 rank\(s\) share a node's available memory\)\. "
                                          r"HINT: train.eval_mode=sampled, or more nodes"):
        check_exact_inference_memory(p, cfg.model, env)


@pytest.mark.slow
def test_a_partitioned_run_whose_exact_evaluation_cannot_fit_exits_at_start(tmp_path):
    ds = ["dataset.num_nodes=4000", "graph=partitioned", "graph.num_parts=2"]
    cfg = make_config(*ds, f"dataset.root={DATA_ROOT}")
    ensure_parts(cfg.dataset, cfg.graph, 2)  # (with the memory there is: the run below has 1 MB)
    res = run_cli(*ds, "train.eval_mode=full", "train.epochs=1", cwd=tmp_path, env={"SLURM_MEM_PER_NODE": "1"})
    assert res.returncode == 2, res.stdout + res.stderr
    assert "hpcgnn: config error: train.eval_mode=full on this partitioned graph needs about" in res.stderr
    assert "epoch 1/1" not in res.stdout + res.stderr and not (tmp_path / "run" / "summary.json").exists()
