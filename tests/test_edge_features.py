"""Edge features: kept by every source in the order of the prepared CSR (a duplicate edge keeps its first
features; a reverse added by to_undirected its edge's), streamed out of core as the edges are."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hpcgnn.config import DatasetConfig
from hpcgnn.data import build_graph, ooc, open_graph, prepare
from hpcgnn.data.files import DatasetFileError
from tests.conftest import make_config


def write_edge_folder(folder, n: int = 50, e: int = 400, d: int = 3, seed: int = 0) -> dict:
    """A files folder with edge features, some edges given twice (their first features are the ones kept)."""
    rng = np.random.default_rng(seed)
    src, dst = rng.integers(0, n, e), rng.integers(0, n, e)
    src[-20:], dst[-20:] = src[:20], dst[:20]  # duplicates of the first 20 edges, other features
    order = rng.permutation(n)
    arrays = {"edge_index": np.stack([src, dst]).astype(np.int64), "x": rng.normal(size=(n, 4)).astype(np.float32),
              "y": rng.integers(0, 3, n), "edge_attr": rng.normal(size=(e, d)).astype(np.float32),
              "train_idx": np.sort(order[:25]), "val_idx": np.sort(order[25:35]), "test_idx": np.sort(order[35:])}
    folder.mkdir(parents=True, exist_ok=True)
    for name, a in arrays.items():
        np.save(folder / f"{name}.npy", a)
    return arrays


def expected_features(arrays: dict, undirected: bool) -> dict:
    """(source, target) -> the features the prepared graph keeps: the pair's first, a reverse its edge's."""
    src, dst = arrays["edge_index"]
    pairs = list(zip(src.tolist(), dst.tolist(), strict=True))
    if undirected:
        pairs += [(d, s) for s, d in pairs]
    feats = np.concatenate([arrays["edge_attr"]] * (2 if undirected else 1))
    out = {}
    for i, p in enumerate(pairs):
        out.setdefault(p, feats[i])
    return out


@pytest.mark.parametrize("undirected", [False, True])
def test_a_folders_edge_features_follow_its_edges_into_the_prepared_csr(tmp_path, monkeypatch, undirected):
    arrays = write_edge_folder(tmp_path / "g")
    monkeypatch.setattr(ooc, "MIN_BUCKET_EDGES", 50)  # several buckets
    cfg = DatasetConfig(name="files", path=str(tmp_path / "g"), root=str(tmp_path / "root"), to_undirected=undirected,
                        prepare_mem_gb=1e-6)
    prepare(cfg)
    g, whole = open_graph(cfg), build_graph(cfg)
    assert g.edge_dim == 3 and torch.equal(g.edge_attr, whole.edge_attr)  # streamed = in memory
    ei = g.edge_index()
    want = expected_features(arrays, undirected)
    assert len(want) == g.num_edges
    got = {(int(s), int(d)): g.edge_attr[i].numpy() for i, (s, d) in enumerate(ei.T.tolist())}
    assert all(np.array_equal(got[p], want[p]) for p in want)


def test_edge_features_are_stored_in_the_feature_dtype(tmp_path):
    write_edge_folder(tmp_path / "g")
    cfg = DatasetConfig(name="files", path=str(tmp_path / "g"), root=str(tmp_path / "root"), feature_dtype="bfloat16")
    prepare(cfg)
    g = open_graph(cfg)
    assert g.edge_attr.dtype == torch.bfloat16 and torch.equal(g.edge_attr, build_graph(cfg).edge_attr.bfloat16())


@pytest.mark.parametrize("bad, message", [
    (lambda a: a["edge_attr"][:-1], r"edge_attr\.npy: 399 rows of edge features for the 400 edges of "
                                    r"edge_index\.npy: one row per edge, in its order"),
    (lambda a: np.where(np.arange(400)[:, None] == 7, np.inf, a["edge_attr"]).astype(np.float32),
     r"edge_attr\.npy: edge features contain NaN or inf \(1 edges, first edge 7\)"),
    (lambda a: a["edge_attr"][:, 0].astype(np.int64), r"edge_attr\.npy: edge features must be a float array of "
                                                       r"shape \[num_edges, edge features\]"),
])
def test_wrong_edge_features_are_refused_naming_the_file(tmp_path, bad, message):
    arrays = write_edge_folder(tmp_path / "g")
    np.save(tmp_path / "g" / "edge_attr.npy", bad(arrays))
    with pytest.raises(DatasetFileError, match=message):
        prepare(DatasetConfig(name="files", path=str(tmp_path / "g"), root=str(tmp_path / "root")))


def test_ogbn_proteins_keeps_its_edges_features_as_ogbs_reader_gives_them(tmp_path, monkeypatch):
    from hpcgnn.data import ogb
    from tests.test_datasets import write_mini_ogb

    write_mini_ogb(tmp_path, "ogbn-proteins", n=80)
    monkeypatch.setattr(ogb, "STREAM_ROWS", 40)
    monkeypatch.setattr(ooc, "MIN_BUCKET_EDGES", 100)
    cfg = make_config("dataset=ogbn-proteins", f"dataset.root={tmp_path}", "dataset.prepare_mem_gb=1e-6").dataset
    prepare(cfg)
    g, whole = open_graph(cfg), build_graph(cfg)
    assert g.edge_dim == 8 and torch.equal(g.edge_attr, whole.edge_attr)
    assert torch.equal(g.col.long(), whole.col)
