"""Datasets: OGB through ogb's own loader (miniatures in OGB's raw format), user files, the cache."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import dead_pid, run_cli, start_and_stop

from hpcgnn.config import dataset_config
from hpcgnn.data import build_graph, cache, cache_folder, open_graph, prepare
from hpcgnn.data.files import DatasetFileError
from hpcgnn.data.ogb import DatasetMissing
from hpcgnn.errors import ConfigError


def _csv_gz(path: Path, rows) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        for row in rows:
            f.write(",".join(str(v) for v in np.atleast_1d(row)) + "\n")


def write_mini_ogb(root: Path, name: str, n: int = 60, seed: int = 0) -> dict:
    """A miniature ogbn dataset in the exact on-disk layout ogb's loader reads (no download)."""
    rng = np.random.default_rng(seed)
    folder = root / "ogb" / name.replace("-", "_")
    folder.mkdir(parents=True)
    (folder / "RELEASE_v1.txt").write_text("miniature for tests\n")
    src = rng.integers(0, n, 4 * n)
    dst = rng.integers(0, n, 4 * n)
    keep = src != dst
    edges = np.stack([src[keep], dst[keep]])
    x = rng.normal(size=(n, 5)).astype(np.float32)
    y = rng.integers(0, 3, n)
    perm = rng.permutation(n)
    split = {"train": np.sort(perm[:30]), "valid": np.sort(perm[30:40]), "test": np.sort(perm[40:])}
    split_name = {"ogbn-products": "sales_ranking", "ogbn-proteins": "species"}.get(name, "time")
    if name == "ogbn-proteins":  # no node features; 8 per edge; 112 binary labels per node (a label's rate its own)
        raw = folder / "raw"
        edge_feat = rng.random((edges.shape[1], 8)).round(3)
        y = (rng.random((n, 112)) < rng.uniform(0.1, 0.9, 112)).astype(np.int64)
        _csv_gz(raw / "edge.csv.gz", edges.T)
        _csv_gz(raw / "edge-feat.csv.gz", edge_feat)
        _csv_gz(raw / "node-label.csv.gz", y)
        _csv_gz(raw / "node_species.csv.gz", rng.integers(0, 8, n))
        _csv_gz(raw / "num-node-list.csv.gz", [n])
        _csv_gz(raw / "num-edge-list.csv.gz", [edges.shape[1]])
        x = None
    elif name == "ogbn-papers100M":  # the binary layout
        (folder / "raw").mkdir()
        np.savez(folder / "raw" / "data.npz", edge_index=edges, num_nodes_list=np.array([n]),
                 num_edges_list=np.array([edges.shape[1]]), node_feat=x, node_year=np.full((n, 1), 2020))
        labels = y.astype(np.float64)
        labels[perm[50:]] = np.nan  # papers100M labels only some nodes
        np.savez(folder / "raw" / "node-label.npz", node_label=labels.reshape(-1, 1))
        split["test"] = np.sort(perm[40:50])
    else:
        raw = folder / "raw"
        _csv_gz(raw / "edge.csv.gz", edges.T)
        _csv_gz(raw / "node-feat.csv.gz", x)
        _csv_gz(raw / "node-label.csv.gz", y)
        _csv_gz(raw / "num-node-list.csv.gz", [n])
        _csv_gz(raw / "num-edge-list.csv.gz", [edges.shape[1]])
        if name == "ogbn-arxiv":
            _csv_gz(raw / "node_year.csv.gz", np.full(n, 2020))
    for part, idx in split.items():
        _csv_gz(folder / "split" / split_name / f"{part}.csv.gz", idx)
    mini = {"edges": edges, "x": x, "y": y, "split": split, "n": n}
    if name == "ogbn-proteins":
        mini["edge_feat"] = edge_feat
    return mini


def _edge_set(graph) -> set:
    ei = graph.edge_index()
    return set(zip(ei[0].tolist(), ei[1].tolist(), strict=True))


@pytest.mark.parametrize("name", ["ogbn-arxiv", "ogbn-products", "ogbn-papers100M"])
def test_ogb_through_ogbs_loader(tmp_path, name):
    mini = write_mini_ogb(tmp_path, name)
    cfg = dataset_config(name=name, root=str(tmp_path), to_undirected=name == "ogbn-arxiv")
    g = build_graph(cfg)
    assert g.num_nodes == mini["n"] and g.num_classes == (40 if name == "ogbn-arxiv" else 47 if name == "ogbn-products" else 172)
    assert np.allclose(g.x.numpy(), mini["x"])
    assert torch.equal(g.train_idx, torch.from_numpy(mini["split"]["train"]))
    assert torch.equal(g.val_idx, torch.from_numpy(mini["split"]["valid"]))
    directed = {(int(s), int(d)) for s, d in mini["edges"].T}
    expected = directed | {(d, s) for s, d in directed} if name in ("ogbn-arxiv", "ogbn-products") else directed
    assert _edge_set(g) == expected  # arxiv: made undirected by us; products: ogb adds inverse edges
    if name == "ogbn-papers100M":
        assert bool((g.y[g.train_idx] >= 0).all()) and int((g.y == -1).sum()) == mini["n"] - 50
    g2 = build_graph(cfg)  # a second read (ogb's own NodePropPredDataset would torch.load a pickle here)
    assert torch.equal(g.col, g2.col) and torch.equal(g.y, g2.y)


@pytest.mark.parametrize("name, layout", [("ogbn-arxiv", "csv"), ("ogbn-products", "csv"),
                                          ("ogbn-papers100M", "C"), ("ogbn-papers100M", "F")])
def test_ogb_is_prepared_a_chunk_at_a_time_into_the_graph_ogbs_readers_give(tmp_path, monkeypatch, name, layout):
    """OGB's raw files streamed (csv in chunks of rows, data.npz decompressed a block at a time, sources and
    targets side by side or as pairs) into several buckets: the prepared graph is the one ogb.io reads whole."""
    from hpcgnn.data import ogb, ooc, prepare_mem_bytes

    mini = write_mini_ogb(tmp_path, name, n=300)
    if layout == "F":  # numpy stores a column-major edge_index as (source, target) pairs
        raw = tmp_path / "ogb" / "ogbn_papers100M" / "raw" / "data.npz"
        data = dict(np.load(raw))
        np.savez_compressed(raw, **{**data, "edge_index": np.asfortranarray(data["edge_index"])})
    monkeypatch.setattr(ogb, "STREAM_ROWS", 37)
    monkeypatch.setattr(ooc, "MIN_BUCKET_EDGES", 100)
    cfg = dataset_config(name=name, root=str(tmp_path), to_undirected=name == "ogbn-arxiv", prepare_mem_gb=1e-5)
    assert ooc.EdgeBuckets(300, 2400, tmp_path / "s", prepare_mem_bytes(cfg)).num_buckets > 1
    prepare(cfg)
    g, ref = open_graph(cfg), build_graph(cfg)
    assert g.col.dtype == torch.int32 and g.num_edges > 0
    for array in cache.ARRAYS:
        assert torch.equal(getattr(g, array).long() if array == "col" else getattr(g, array), getattr(ref, array)), array
    assert g.num_classes == ref.num_classes and np.allclose(g.x.numpy(), mini["x"])


def test_ogb_missing_is_a_clear_error_naming_prepare(tmp_path):
    cfg = dataset_config(name="ogbn-products", root=str(tmp_path))
    with pytest.raises(DatasetMissing, match=r"training jobs do not download.*\n    python -m hpcgnn.data "
                                             r"prepare dataset=ogbn-products"):
        build_graph(cfg)


@pytest.mark.slow
def test_prepare_command_and_training_on_ogb(tmp_path):
    write_mini_ogb(tmp_path, "ogbn-arxiv", n=200)
    from hpcgnn.data.__main__ import main

    assert main(["prepare", "dataset=ogbn-arxiv", f"dataset.root={tmp_path}"]) == 0
    folder = cache_folder(dataset_config(name="ogbn-arxiv", root=str(tmp_path), to_undirected=True))
    assert cache.is_complete(folder)
    stamp = (folder / "meta.json").stat().st_mtime_ns
    assert main(["prepare", "dataset=ogbn-arxiv", f"dataset.root={tmp_path}"]) == 0  # nothing to do
    assert (folder / "meta.json").stat().st_mtime_ns == stamp
    res = run_cli("dataset=ogbn-arxiv", "train.epochs=1", "launch.procs=1", cwd=tmp_path, timeout=300)
    # run_cli points dataset.root at the session's data folder: the dataset is missing there.
    assert res.returncode == 2 and "python -m hpcgnn.data prepare dataset=ogbn-arxiv" in res.stderr


@pytest.mark.slow
def test_cli_trains_on_prepared_ogb(tmp_path):
    write_mini_ogb(tmp_path / "data", "ogbn-arxiv", n=300)
    import subprocess
    import sys

    res = subprocess.run([sys.executable, "-m", "hpcgnn", "dataset=ogbn-arxiv", f"dataset.root={tmp_path / 'data'}",
                          "train.epochs=2", "train.batch_size=64", f"hydra.run.dir={tmp_path / 'run'}"],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert s["dataset"] == "ogbn-arxiv" and s["world_size"] == 2


def _write_files(folder: Path, n: int = 50, **override) -> None:
    rng = np.random.default_rng(1)
    arrays = {"edge_index": rng.integers(0, n, (2, 200)), "x": rng.normal(size=(n, 4)).astype(np.float32),
              "y": rng.integers(0, 3, n), "train_idx": np.arange(0, 20), "val_idx": np.arange(20, 30),
              "test_idx": np.arange(30, 50)}
    arrays.update(override)
    folder.mkdir(parents=True, exist_ok=True)
    for name, value in arrays.items():
        if value is not None:
            np.save(folder / f"{name}.npy", value)


def test_files_dataset_loads_npy_and_pt(tmp_path):
    _write_files(tmp_path / "g")
    (tmp_path / "g" / "y.npy").unlink()
    torch.save(torch.from_numpy(np.random.default_rng(1).integers(0, 3, 50)), tmp_path / "g" / "y.pt")
    g = build_graph(dataset_config(name="files", path=str(tmp_path / "g")))
    assert g.num_nodes == 50 and g.num_features == 4 and g.train_idx.numel() == 20


@pytest.mark.parametrize("undirected", [False, True])
def test_files_are_prepared_a_chunk_at_a_time_into_the_same_graph(tmp_path, monkeypatch, undirected):
    """A files folder streamed from its mapped .npy arrays, in chunks of a few edges and several buckets,
    prepares the graph the in-memory reader builds (duplicate edges removed, reverses added)."""
    from hpcgnn.data import files

    _write_files(tmp_path / "g")
    real = files.stream_files
    monkeypatch.setattr("hpcgnn.data.prepared.stream_files", lambda cfg, b, f: real(cfg, b, f, chunk=32))
    cfg = dataset_config(name="files", path=str(tmp_path / "g"), root=str(tmp_path / "root"), to_undirected=undirected,
                        prepare_mem_gb=1e-6)
    prepare(cfg)
    g, ref = open_graph(cfg), build_graph(cfg)
    assert g.col.dtype == torch.int32
    for name in cache.ARRAYS:
        assert torch.equal(getattr(g, name).long() if name == "col" else getattr(g, name), getattr(ref, name)), name
    assert g.num_classes == ref.num_classes


@pytest.mark.parametrize("override, message", [
    ({"edge_index": np.zeros((3, 5), dtype=np.int64)}, r"edge_index\.npy: edge_index must be an integer array of shape \[2, num_edges\]"),
    ({"edge_index": np.array([[0, 1], [2, 50]])}, r"edge_index\.npy: node ids must lie in \[0, 50\).*max 50"),
    ({"x": np.full((50, 4), np.nan, dtype=np.float32)}, r"x\.npy: features contain NaN or inf \(50 nodes, first node 0\)"),
    ({"y": np.zeros(49, dtype=np.int64)}, r"y\.npy: labels must be an array of shape \[50\] \(class ids, or values\) "
                                          r"or \[50, C\] \(binary labels, or values\), got int64 \(49,\)"),
    ({"y": np.full((50, 2), np.inf, dtype=np.float32)}, r"y\.npy: labels contain inf \(NaN marks an unknown value"),
    ({"test_idx": np.arange(15, 50)}, r"train_idx\.npy and .*test_idx\.npy overlap in 5 nodes \(e\.g\. node 15\)"),
    ({"val_idx": np.array([60])}, r"val_idx\.npy: node ids must lie in \[0, 50\)"),
    ({"train_idx": None}, r"train_idx\.npy or train_idx\.pt is missing"),
])
def test_files_dataset_errors_name_the_file(tmp_path, override, message):
    _write_files(tmp_path / "g", **override)
    with pytest.raises(DatasetFileError, match=message):
        build_graph(dataset_config(name="files", path=str(tmp_path / "g")))


def test_files_dataset_needs_a_path():
    with pytest.raises(ConfigError, match=r"set dataset.path=/path/to/graph"):
        build_graph(dataset_config(name="files"))


def test_cache_round_trip_is_memory_mapped(tmp_path):
    cfg = dataset_config(num_nodes=2000, root=str(tmp_path))
    folder = prepare(cfg)
    g, ref = open_graph(cfg), build_graph(cfg)
    for name in cache.ARRAYS:
        assert torch.equal(getattr(g, name), getattr(ref, name)), name
    assert isinstance(np.load(folder / "x.npy", mmap_mode="c"), np.memmap)
    assert prepare(cfg) == folder  # cached: not rebuilt
    other = prepare(dataset_config(num_nodes=2000, seed=1, root=str(tmp_path)))
    assert other != folder  # a different graph gets its own folder
    with pytest.raises(DatasetMissing, match=r"not prepared .*HINT: python -m hpcgnn.data prepare"):
        open_graph(dataset_config(num_nodes=3000, root=str(tmp_path)))


def test_meta_json_is_read_and_written_through_one_schema(tmp_path):
    """A prepared graph's meta.json is cache.GraphMeta's: its fields as written, a kind's own record (a typed graph's,
    a link dataset's) kept at the top level and read back into ``more``; another format is refused naming the fix."""
    from hpcgnn.errors import DatasetError

    cfg = dataset_config(num_nodes=2000, root=str(tmp_path))
    folder = prepare(cfg)
    meta = cache.GraphMeta.read(folder)
    g = open_graph(cfg)
    assert (meta.num_nodes, meta.num_edges, meta.num_classes) == (g.num_nodes, g.num_edges, g.num_classes)
    assert meta.bytes == cache.size_bytes(folder) and meta.labels == g.labels and meta.more == {}
    written = cache.GraphMeta(10, 20, 3, 2, edge_dim=4, extra=("a",), more={"link": {"eval metric": "auc"}})
    written.write(tmp_path)
    assert json.loads((tmp_path / "meta.json").read_text())["link"] == {"eval metric": "auc"}
    assert cache.GraphMeta.read(tmp_path) == written
    (tmp_path / "meta.json").write_text(json.dumps({**json.loads((tmp_path / "meta.json").read_text()),
                                                    "format_version": 0}))
    with pytest.raises(DatasetError, match=r"holds format 0, this hpcgnn reads 1. HINT: delete the folder to prepare "
                                           r"the dataset again"):
        cache.GraphMeta.read(tmp_path)


@pytest.mark.parametrize("kind", [{}, {"degree_exponent": 2.5, "centroids": "community"}], ids=["default", "hubs"])
def test_streamed_prepare_equals_the_graph_built_in_memory(tmp_path, monkeypatch, kind):
    """Drawn in several chunks, bucketed on disk in several buckets (each chunk in several slices), the
    prepared CSR (int32 columns) is the graph the in-memory builder makes from the same chunks, edge for edge."""
    from hpcgnn.data import ooc, prepare_mem_bytes, synthetic

    monkeypatch.setattr(synthetic, "SOURCE_CHUNK", 1500)  # several chunks of sources
    monkeypatch.setattr(ooc, "ADD_EDGES", 4000)  # several slices of each chunk's edges
    cfg = dataset_config(num_nodes=5000, root=str(tmp_path), prepare_mem_gb=0.002, **kind)
    assert ooc.EdgeBuckets(5000, synthetic.expected_edges(cfg), tmp_path / "s", prepare_mem_bytes(cfg)).num_buckets > 1
    prepare(cfg)
    g, ref = open_graph(cfg), build_graph(cfg)
    assert g.col.dtype == torch.int32 and g.rowptr.dtype == torch.int64
    for name in cache.ARRAYS:
        assert torch.equal(getattr(g, name).long() if name == "col" else getattr(g, name), getattr(ref, name)), name
    assert not (cache_folder(cfg) / "scratch").exists()  # the buckets are gone


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_features_take_half_the_bytes_and_batches_are_float32(tmp_path, dtype):
    from hpcgnn.sampling import BatchLoader, CSRNeighborSampler

    full = dataset_config(num_nodes=3000, root=str(tmp_path))
    half = dataset_config(num_nodes=3000, root=str(tmp_path), feature_dtype=dtype)
    a, b = prepare(full), prepare(half)
    assert a != b and (b / "x.npy").stat().st_size < 0.55 * (a / "x.npy").stat().st_size
    g, ref = open_graph(half), open_graph(full)
    assert g.x.dtype == getattr(torch, dtype)
    assert torch.equal(g.x, ref.x.to(g.x.dtype))
    loader = BatchLoader(g, CSRNeighborSampler(g.rowptr, g.col, (5, 5)), g.train_idx[:64], 32)
    batch = next(iter(loader))
    assert batch.x.dtype == torch.float32 and torch.equal(batch.x, g.x[batch.n_id].float())


@pytest.mark.parametrize("field, value, message", [
    ("feature_dtype", "float8", r"dataset.feature_dtype='float8' is unknown: use float32, float16 or bfloat16"),
    ("prepare_mem_gb", 0.0, r"dataset.prepare_mem_gb=0.0 must be above 0"),
])
def test_storage_option_errors(field, value, message):
    with pytest.raises(ConfigError, match=message):
        build_graph(dataset_config(num_nodes=100, **{field: value}))


def test_power_law_degrees_have_hubs():
    g = build_graph(dataset_config(num_nodes=50_000, avg_degree=20, degree_exponent=2.5))
    d = g.degree().double().sort(descending=True).values
    top = (d[: d.numel() // 100].sum() / d.sum()).item()
    base = build_graph(dataset_config(num_nodes=50_000, avg_degree=20)).degree().double().sort(descending=True).values
    base_top = (base[: base.numel() // 100].sum() / base.sum()).item()
    assert top > 0.12 and base_top < 0.05, (top, base_top)  # the top 1% of nodes hold a large share of edges
    assert abs(g.num_edges / g.num_nodes - 20) < 4


def test_cache_checks_free_space_first(tmp_path, monkeypatch):
    import shutil as _shutil

    graph = build_graph(dataset_config(num_nodes=1000))
    usage = _shutil.disk_usage(tmp_path)
    monkeypatch.setattr(cache.shutil, "disk_usage", lambda p: usage._replace(free=1000))
    with pytest.raises(OSError, match=r"needs [\d.]+ [KM]iB in .*only 1000 B are free: set dataset.root"):
        cache.save(graph, tmp_path / "g", {})
    assert not list(tmp_path.iterdir())  # nothing half-written


def test_handing_back_pages_keeps_every_value(tmp_path):
    """drop_pages after a pass over a mapped array: the values read again are the file's; on memory that is
    not a file's (no swap) it changes nothing."""
    from hpcgnn.data.ooc import drop_pages

    np.save(tmp_path / "a.npy", np.arange(3_000_000, dtype=np.int64))
    mapped = torch.from_numpy(np.load(tmp_path / "a.npy", mmap_mode="c"))
    total = int(mapped.sum())
    drop_pages(mapped[1000:2_500_000])
    assert int(mapped.sum()) == total
    anon = torch.arange(3_000_000)
    drop_pages(anon)
    assert int(anon.sum()) == total


def test_leftovers_of_a_gone_writer_here_are_removed_others_named_when_old(tmp_path, capsys):
    import os

    from hpcgnn.writers import _host, sweep_leftovers, writer_tag

    prefix = ".synthetic-0123.tmp-"
    dead = tmp_path / f"{prefix}{_host()}-{dead_pid()}-0badc0de"
    mine = tmp_path / f"{prefix}{writer_tag()}"  # this process: alive
    elsewhere = tmp_path / f"{prefix}othernode-{os.getpid()}-0badc0de"  # can't tell: another host
    untagged = tmp_path / f"{prefix}1f2e3d4c"  # the names before writer tags
    unrelated = tmp_path / ".synthetic-0124.tmp-x"
    for folder in (dead, mine, elsewhere, untagged, unrelated):
        folder.mkdir()
        (folder / "col.npy").write_bytes(b"\0" * 1000)
    old = 0  # untouched since 1970
    os.utime(untagged / "col.npy", (old, old))
    os.utime(untagged, (old, old))
    assert sweep_leftovers(tmp_path, prefix) == [dead]
    assert not dead.exists() and mine.exists() and elsewhere.exists() and untagged.exists() and unrelated.exists()
    err = capsys.readouterr().err
    assert f"hpcgnn: removed {dead} (0.0 GiB), left by process {dead.name.split('-')[-2]}, which is gone" in err
    assert str(elsewhere) not in err  # fresh: maybe a live job on othernode
    assert f"{untagged} (0.0 GiB) is a temporary folder left by an unknown writer" in err
    assert "delete it if no job is writing it" in err


@pytest.mark.slow
def test_a_killed_prepare_leaves_a_folder_the_next_prepare_removes(tmp_path):
    """SIGKILL mid-prepare (the OOM killer, a time limit's last word) leaves the temporary folder; the next
    prepare of the same graph on this host removes it and prepares the graph."""
    import signal

    cfg = dataset_config(num_nodes=400_000, root=str(tmp_path))
    prepared = tmp_path / "prepared"
    child = start_and_stop(["-m", "hpcgnn.data", "prepare", "dataset.num_nodes=400000", f"dataset.root={tmp_path}"],
                           lambda: any(prepared.glob(".synthetic-*.tmp-*/scratch/bucket*")), signal.SIGKILL)
    left = list(prepared.glob(".synthetic-*.tmp-*"))
    assert len(left) == 1 and left[0].name.endswith(f"-{child.pid}-" + left[0].name[-8:])
    folder = prepare(cfg)
    assert folder.exists() and not left[0].exists()
    assert [p.name for p in prepared.iterdir()] == [folder.name]


@pytest.mark.slow
@pytest.mark.parametrize("signame, status, said", [("SIGTERM", 143, "SIGTERM"), ("SIGINT", 130, "Ctrl-C")])
def test_a_prepare_stopped_by_sigterm_removes_its_temporary_folder(tmp_path, signame, status, said):
    """scancel or a job's time limit sends SIGTERM: the prepare stops at once, says so, and leaves nothing.
    Ctrl-C likewise, in one line with no traceback."""
    import signal

    prepared = tmp_path / "prepared"
    child = start_and_stop(["-m", "hpcgnn.data", "prepare", "dataset.num_nodes=400000", f"dataset.root={tmp_path}"],
                           lambda: any(prepared.glob(".synthetic-*.tmp-*/scratch/bucket*")), getattr(signal, signame))
    stderr = child.stderr.read()
    assert child.returncode == status, stderr
    assert f"hpcgnn: prepare stopped by {said}; removing its temporary files" in stderr
    assert "Traceback" not in stderr, stderr
    assert list(prepared.iterdir()) == []


def test_buckets_by_row_edges_hold_about_equal_edges_and_write_the_same_csr(tmp_path, monkeypatch):
    """Rows that get very different edge counts (a coarse level's clusters): given each row's count, the
    buckets split the edges, not the rows, evenly (each within the sort's budget), and the CSR is the same."""
    from hpcgnn.data import ooc

    monkeypatch.setattr(ooc, "MIN_BUCKET_EDGES", 1000)
    g = torch.Generator().manual_seed(0)
    n, m = 1000, 60_000
    heavy = torch.rand(m, generator=g) < 0.8
    dst = torch.where(heavy, torch.randint(0, 10, (m,), generator=g), torch.randint(0, n, (m,), generator=g))
    src = torch.randint(0, n, (m,), generator=g)
    out = {}
    for name, row_edges in (("rows", None), ("edges", torch.bincount(dst, minlength=n))):
        b = ooc.EdgeBuckets(n, m, tmp_path / name / "s", 6000 * 56, weighted=True, row_edges=row_edges)
        b.add(dst, src)
        sizes = [b._file(k, "dst").stat().st_size // 4 if b._file(k, "dst").exists() else 0
                 for k in range(b.num_buckets)]
        assert b.num_buckets == 13 and sum(sizes) == m
        out[name] = sizes
        b.write_csr(tmp_path / name)
    assert max(out["rows"]) > 0.8 * m  # equal rows: rows 0-9 in one bucket
    assert max(out["edges"]) < 2 * m / 13  # equal edges: a bucket holds its share and at most one row more
    for f in ("rowptr", "col", "weight"):
        assert np.array_equal(np.load(tmp_path / "rows" / f"{f}.npy"), np.load(tmp_path / "edges" / f"{f}.npy")), f
