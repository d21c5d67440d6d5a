"""Edge features: kept by every source in the order of the prepared CSR (a duplicate edge keeps its first
features; a reverse added by to_undirected its edge's), streamed out of core as the edges are."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from conftest import make_config

from hpcgnn.config import dataset_config
from hpcgnn.data import build_graph, ooc, open_graph, prepare
from hpcgnn.data.files import DatasetFileError


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
def test_a_folders_edge_features_follow_its_edges_into_the_prepared_csr(tmp_path, monkeypatch, caplog, undirected):
    import logging

    arrays = write_edge_folder(tmp_path / "g")
    monkeypatch.setattr(ooc, "MIN_BUCKET_EDGES", 50)  # several buckets
    cfg = dataset_config(name="files", path=str(tmp_path / "g"), root=str(tmp_path / "root"), to_undirected=undirected,
                        prepare_mem_gb=1e-6)
    with caplog.at_level(logging.INFO, logger="hpcgnn.data.graph"):
        prepare(cfg)
    g, whole = open_graph(cfg), build_graph(cfg)
    given = 400 * (2 if undirected else 1)  # (the log says how many repeats were merged: a multigraph's are)
    assert (f"dataset=files: {given - g.num_edges} of its {given} edges repeat a (source, target) pair given before, "
            "each merged into the first" if not undirected else f"dataset=files: its 400 edges and their reverses "
            f"(dataset.to_undirected) hold {g.num_edges} distinct (source, target) pairs: {given - g.num_edges} "
            "coincide with another (an edge given in both directions, or given twice)") in caplog.text
    assert g.edge_dim == 3 and torch.equal(g.edge_attr, whole.edge_attr)  # streamed = in memory
    ei = g.edge_index()
    want = expected_features(arrays, undirected)
    assert len(want) == g.num_edges
    got = {(int(s), int(d)): g.edge_attr[i].numpy() for i, (s, d) in enumerate(ei.T.tolist())}
    assert all(np.array_equal(got[p], want[p]) for p in want)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_link_datasets_message_passing_edges_keep_their_features(tmp_path, monkeypatch, dtype):
    """task=link: the training edges left in message passing carry the features the graph gives each (src, dst),
    split in memory or a few rows at a time out of core (the same arrays), in the stored dtype."""
    from hpcgnn.data import build_link, link, open_link

    arrays = write_edge_folder(tmp_path / "g", n=300, e=3000)
    monkeypatch.setattr(link, "SPLIT_CHUNK_EDGES", 300)
    monkeypatch.setattr(ooc, "MIN_BUCKET_EDGES", 500)
    cfg = dataset_config(name="files", path=str(tmp_path / "g"), root=str(tmp_path / "root"), to_undirected=True,
                        prepared_for="link", prepare_mem_gb=1e-5, feature_dtype=dtype)
    prepare(cfg)
    got, ref = open_link(cfg), build_link(cfg)
    assert got.graph.edge_dim == 3 and got.graph.edge_attr.dtype == getattr(torch, dtype)
    assert torch.equal(got.graph.col.long(), ref.graph.col) and torch.equal(got.graph.edge_attr.float(),
                                                                            ref.graph.edge_attr.to(getattr(torch, dtype)).float())
    want = expected_features(arrays, True)
    ei = got.graph.edge_index()
    assert 0 < got.graph.num_edges < len(want)  # (the held-out edges are gone)
    for i, (s, d) in enumerate(ei.T.tolist()):
        assert torch.equal(got.graph.edge_attr[i].float(), torch.from_numpy(want[(s, d)]).to(getattr(torch, dtype)).float())


def test_edge_features_are_stored_in_the_feature_dtype(tmp_path):
    write_edge_folder(tmp_path / "g")
    cfg = dataset_config(name="files", path=str(tmp_path / "g"), root=str(tmp_path / "root"), feature_dtype="bfloat16")
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
        prepare(dataset_config(name="files", path=str(tmp_path / "g"), root=str(tmp_path / "root")))


def test_ogbn_proteins_keeps_its_edges_features_as_ogbs_reader_gives_them(tmp_path, monkeypatch):
    from test_datasets import write_mini_ogb

    from hpcgnn.data import ogb

    write_mini_ogb(tmp_path, "ogbn-proteins", n=80)
    monkeypatch.setattr(ogb, "STREAM_ROWS", 40)
    monkeypatch.setattr(ooc, "MIN_BUCKET_EDGES", 100)
    cfg = make_config("dataset=ogbn-proteins", f"dataset.root={tmp_path}", "dataset.prepare_mem_gb=1e-6").dataset
    prepare(cfg)
    g, whole = open_graph(cfg), build_graph(cfg)
    assert g.edge_dim == 8 and torch.equal(g.edge_attr, whole.edge_attr)
    assert torch.equal(g.col.long(), whole.col)


# ------------------------------------------------------------------ each sampled edge's id, its features in the batch


def test_a_sampled_edges_id_is_its_position_in_the_csr_in_c_and_in_the_torch_twin():
    from hpcgnn.kernels import ops, twins

    g = torch.Generator().manual_seed(0)
    rowptr = torch.cat([torch.zeros(1, dtype=torch.long), torch.randint(0, 30, (200,), generator=g).cumsum(0)])
    col = torch.randint(0, 200, (int(rowptr[-1]),), generator=g)
    nodes = torch.randperm(200, generator=g)[:80]
    row, nbr, eid = ops.sample_neighbors(rowptr, col, nodes, 10, torch.Generator().manual_seed(5), eid=True)
    want = twins.sample_neighbors(rowptr, col, nodes, 10, torch.Generator().manual_seed(5), eid=True)
    assert all(torch.equal(a, b) for a, b in zip((row, nbr, eid), want, strict=True))
    assert torch.equal(col[eid], nbr)
    assert bool(((eid >= rowptr[nodes[row]]) & (eid < rowptr[nodes[row] + 1])).all())  # each in its target's row


def write_marked(folder, n: int = 3000, deg: int = 8, seed: int = 1) -> None:
    """Each node's label is the sign of one in-neighbour's first feature: the neighbour whose edge is marked (its
    first edge feature 1, every other edge's 0; the other features noise). Attention over edge features finds it."""
    rng = np.random.default_rng(seed)
    dst, src = np.repeat(np.arange(n), deg), rng.integers(0, n, n * deg)
    edge_attr = rng.normal(size=(n * deg, 4)).astype(np.float32)
    edge_attr[:, 0] = 0
    marked = np.arange(n) * deg + rng.integers(0, deg, n)
    edge_attr[marked, 0] = 1
    x = rng.normal(size=(n, 8)).astype(np.float32)
    _save(folder, rng, np.stack([src, dst]), x, (x[src[marked], 0] > 0).astype(np.int64), edge_attr)


def write_edge_labels(folder, n: int = 2000, deg: int = 8, seed: int = 0) -> None:
    """Each node's label is the sign of the mean of its in-edges' first feature: the edges' features alone (node
    features are noise)."""
    rng = np.random.default_rng(seed)
    src, dst = rng.integers(0, n, n * deg), rng.integers(0, n, n * deg)
    src, dst = np.unique(np.stack([src, dst]), axis=1)  # (no duplicate: every edge's features count)
    edge_attr = rng.normal(size=(src.size, 8)).astype(np.float32)
    sums, count = np.zeros(n), np.zeros(n)
    np.add.at(sums, dst, edge_attr[:, 0])
    np.add.at(count, dst, 1)
    _save(folder, rng, np.stack([src, dst]), rng.normal(size=(n, 8)).astype(np.float32),
          (sums / np.maximum(count, 1) > 0).astype(np.int64), edge_attr)


def _save(folder, rng, edge_index, x, y, edge_attr) -> None:
    n = x.shape[0]
    order = rng.permutation(n)
    folder.mkdir(parents=True, exist_ok=True)
    for name, a in {"edge_index": edge_index.astype(np.int64), "x": x, "y": y, "edge_attr": edge_attr,
                    "train_idx": np.sort(order[: n // 2]), "val_idx": np.sort(order[n // 2: n * 3 // 4]),
                    "test_idx": np.sort(order[n * 3 // 4:])}.items():
        np.save(folder / f"{name}.npy", a)


EDGE_RUNS = {  # (graph, model overrides, the test accuracy it must reach, or stay below)
    "user GINE": ("edge_labels", ["model=custom", "model._target_=my_gnn.EdgeGINE"], 0.9),  # (edge_dim: filled in)
    "gin without": ("edge_labels", ["model=gin"], -0.6),
    "gat edge_dim": ("marked", ["model=gat", "model.edge_dim=4"], 0.9),
    "gat without": ("marked", ["model=gat"], -0.7),
    "gin edge_dim, GraphSAINT's random walks": ("edge_labels", ["model=gin", "model.edge_dim=8",
                                                                "train.sampler=saint_rw"], 0.85),
}


@pytest.mark.slow
@pytest.mark.parametrize("run", sorted(EDGE_RUNS))
def test_edge_features_reach_the_models_that_read_them(run, tmp_path, monkeypatch, caplog):
    """On graphs whose labels follow from the edges' features, a model that reads them learns the labels (a user's
    GINEConv model, hpcgnn's gat with model.edge_dim: GATConv's attention over edge features), the same model
    without them stays near chance, and the log says that the edges' features go unread, and what reads them.
    predict reads them: on sampled batches and exactly (every edge's features in each layer) it scores the run's
    test accuracy."""
    import logging

    from conftest import DATA_ROOT, REPO, predict_here, train_here

    graph, over, bar = EDGE_RUNS[run]
    (write_edge_labels if graph == "edge_labels" else write_marked)(tmp_path / "graph")
    monkeypatch.syspath_prepend(str(REPO / "examples"))  # (my_gnn)
    with caplog.at_level(logging.INFO, logger="hpcgnn.tasks.items"):
        trained = train_here("dataset=files", f"dataset.path={tmp_path / 'graph'}", *over, "train.epochs=20",
                             "train.lr=0.01", "train.batch_size=256", "model.hidden_channels=64",
                             "metrics.tensorboard=false", f"dataset.root={DATA_ROOT}", run_dir=tmp_path / "run")
    acc = trained["test"]
    assert acc >= bar if bar > 0 else acc <= -bar, (run, acc)
    width = 8 if graph == "edge_labels" else 4
    unread = (f"edge features: the graph's edges carry {width}, which nothing in this run reads (model={over[0][6:]}); "
              f"model.edge_dim={width} (gat, gin) or a model of your own whose forward takes edge_attr would")
    assert (unread in caplog.text) == (bar < 0), caplog.text[-2000:]
    read = (f"edge features: the graph's edges carry {width}; the model (model={over[0][6:]}) reads {width} per edge "
            "in message passing")  # (the case that reads them is said too, not only the unread one)
    assert (read in caplog.text) == (bar > 0), caplog.text[-2000:]
    if bar > 0:
        # (the run's own evaluation: exact for hpcgnn's models, the default; sampled for a model of the user's own)
        assert predict_here(tmp_path / "run", f"mode={trained['eval_mode']}", "trust=true")["value"] == acc
    if run == "user GINE":  # exported with the arguments it was built with, edge_dim filled in: loads without hpcgnn
        import importlib

        from hpcgnn.models.saved import export

        rec = torch.load(export(tmp_path / "run", trusted=True), weights_only=True)
        assert rec["class"] == "my_gnn.EdgeGINE" and rec["kwargs"]["edge_dim"] == 8
        module, _, name = rec["class"].rpartition(".")
        getattr(importlib.import_module(module), name)(**rec["kwargs"]).load_state_dict(rec["state_dict"])
    if run == "gat edge_dim":  # (a PyG basic GNN: exact layer by layer; the user's GINE is not one)
        assert abs(predict_here(tmp_path / "run", "mode=full")["value"] - acc) <= 0.03


def test_a_model_reading_edge_features_is_refused_where_they_cannot_reach_it(tmp_path):
    from hpcgnn.env import RankEnv
    from hpcgnn.errors import ConfigError, DatasetError
    from hpcgnn.tasks import open_store

    with pytest.raises(ConfigError, match=r"model.edge_dim=8: gat and gin read edge features \(a width of 1 or more\); "
                                          r"model=sage does not"):
        make_config("model.edge_dim=8")
    with pytest.raises(ConfigError, match=r"model.edge_dim=8: gat and gin read edge features"):
        make_config("model.edge_dim=8", "dataset=synthetic_hetero", "model=rgcn")  # (hpcgnn's typed models read none)
    # (a typed graph: tests/test_typed_edge_features.py)
    for sampler in ("ladies", "saint_rw", "cluster"):
        make_config("model=gat", "model.edge_dim=8", f"train.sampler={sampler}")
    make_config("model=gat", "model.edge_dim=8", "train.eval_mode=full")  # (exact: every edge's features)
    make_config("model=gat", "model.edge_dim=8", "graph=partitioned")
    make_config("model=gat", "model.edge_dim=8", "task=edge")
    make_config("model=gat", "model.edge_dim=8", "task=link")
    write_edge_folder(tmp_path / "g")  # 3 features per edge
    env = RankEnv.from_environ({"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
                                "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"})
    over = ["dataset=files", f"dataset.path={tmp_path / 'g'}", f"dataset.root={tmp_path / 'root'}", "model=gat"]
    with pytest.raises(ConfigError, match=r"model.edge_dim=8, but the edges of dataset=files have 3 features. HINT: "
                                          r"model.edge_dim=3"):
        open_store(make_config(*over, "model.edge_dim=8"), env)
    assert open_store(make_config(*over, "model.edge_dim=3"), env).shape.edge_dim == 3
    assert open_store(make_config(*over), env).shape.edge_dim == 0  # (read by none: not gathered)
    with pytest.raises(DatasetError, match=r"model.edge_dim=3 reads edge features, but the edges of dataset=synthetic "
                                           r"have none. HINT: give them \(files: edge_attr.npy"):
        open_store(make_config("model=gat", "model.edge_dim=3", "dataset.num_nodes=500",
                                    f"dataset.root={tmp_path / 'root'}"), env)


@pytest.mark.parametrize("sampler", ["train.sampler=ladies", "train.sampler=saint_node", "train.sampler=saint_edge",
                                     "train.sampler=saint_rw", "train.sampler=cluster", "train.edge_budget=3000"])
def test_every_samplers_batches_carry_their_edges_features(tmp_path, sampler):
    """LADIES, GraphSAINT's three, Cluster-GCN and edge budgets: each edge of a training batch carries the features
    the graph gives its (source, target) pair."""
    from hpcgnn.env import RankEnv
    from hpcgnn.sampling.loader import BatchLoader
    from hpcgnn.tasks import open_store

    arrays = write_edge_folder(tmp_path / "g", n=300, e=3000)
    cfg = make_config("dataset=files", f"dataset.path={tmp_path / 'g'}", f"dataset.root={tmp_path / 'root'}",
                      "model=gin", "model.edge_dim=3", "train.batch_size=40", "train.num_clusters=20", sampler)
    store = open_store(cfg, RankEnv.from_environ({}))
    items = store.train_batches(0)[0]
    batch = next(iter(BatchLoader(store.features, store.train_sampler, items, items.numel())))
    ends = batch.n_id[batch.edge_index].T.tolist()
    want = expected_features(arrays, False)
    assert len(ends) > 0 and np.array_equal(batch.edge_attr.numpy(), np.stack([want[(s, d)] for s, d in ends]))


# ------------------------------------------------------------------ edge features in link prediction


def write_grouped(folder, n: int = 1200, deg: int = 6, k: int = 4, seed: int = 0) -> dict:
    """A files folder for task=link whose edges join nodes of one hidden group (of k) and carry that group one-hot
    (plus noise); node features are noise. Which pairs are edges follows from the groups, which only the edges'
    features tell (the graph is random within a group: its shape tells little)."""
    rng = np.random.default_rng(seed)
    group = rng.integers(0, k, n)
    members = [np.flatnonzero(group == g) for g in range(k)]
    src = rng.integers(0, n, n * deg)
    dst = np.array([rng.choice(members[group[s]]) for s in src])
    src, dst = src[src != dst], dst[src != dst]
    edge_attr = (np.eye(k)[group[src]] + rng.normal(scale=0.3, size=(src.size, k))).astype(np.float32)
    arrays = {"edge_index": np.stack([src, dst]), "x": rng.normal(size=(n, 8)).astype(np.float32), "y": group,
              "edge_attr": edge_attr, "train_idx": np.arange(n // 2), "val_idx": np.arange(n // 2, n * 3 // 4),
              "test_idx": np.arange(n * 3 // 4, n)}
    folder.mkdir(parents=True, exist_ok=True)
    for name, a in arrays.items():
        np.save(folder / f"{name}.npy", a)
    return arrays


def test_a_link_batch_carries_each_sampled_edges_features_without_its_targets(tmp_path):
    """A link training batch: its positives' edges are left out of message passing with their ids, so each edge
    the batch keeps carries the features the graph gives its (source, target) pair."""
    from hpcgnn.env import RankEnv
    from hpcgnn.sampling.loader import BatchLoader
    from hpcgnn.tasks import open_store

    arrays = write_grouped(tmp_path / "g", n=400)
    cfg = make_config("task=link", "dataset=files", f"dataset.path={tmp_path / 'g'}", "dataset.to_undirected=true",
                      f"dataset.root={tmp_path / 'root'}", "model=gin", "model.edge_dim=4")
    store = open_store(cfg, RankEnv.from_environ({}))
    assert store.shape.edge_dim == 4
    want = expected_features(arrays, True)
    batch = next(iter(BatchLoader(store.features, store.train_sampler, store.train_batches(0), 128)))
    ends = batch.n_id[batch.edge_index].T.tolist()
    targets = {tuple(p) for p in batch.n_id[batch.edge_label_index[:, :batch.positives]].T.tolist()}
    assert len(ends) > 0 and not targets & {(s, d) for s, d in ends} and not targets & {(d, s) for s, d in ends}
    assert np.array_equal(batch.edge_attr.numpy(), np.stack([want[(s, d)] for s, d in ends]))


LINK_RUNS = {  # (overrides, the test ROC-AUC it must reach, or stay below)
    "gin edge_dim, exact evaluation": (["model=gin", "model.edge_dim=4"], 0.8),
    "gin edge_dim, partitioned, sampled evaluation": (["model=gin", "model.edge_dim=4", "graph=partitioned",
                                                       "train.eval_mode=sampled"], 0.8),
    "gin without": (["model=gin"], -0.65),
}


@pytest.mark.slow
@pytest.mark.parametrize("run", sorted(LINK_RUNS))
def test_edge_features_reach_a_link_models_encoder(run, tmp_path):
    """Link prediction where only the edges' features tell which pairs are edges: a GINE encoder reading them
    ranks the held-out edges well above the negatives, one reading none near chance."""
    from conftest import DATA_ROOT, run_cli, summary_of, train_here

    over, bar = LINK_RUNS[run]
    write_grouped(tmp_path / "g")
    over = ["task=link", "dataset=files", f"dataset.path={tmp_path / 'g'}", "dataset.to_undirected=true", *over,
            "train.epochs=8", "metrics.tensorboard=false"]
    if "graph=partitioned" in over:  # (2 ranks, launched: the launcher partitions the graph)
        res = run_cli(*over, cwd=tmp_path)
        assert res.returncode == 0, res.stdout + res.stderr
        auc = summary_of(tmp_path)["test"]
    else:
        auc = train_here(*over, f"dataset.root={DATA_ROOT}", run_dir=tmp_path / "run")["test"]
    assert auc >= bar if bar > 0 else auc <= -bar, (run, auc)


# ------------------------------------------------------------------ edge features in edge tasks


def write_edge_feature_targets(folder, target: str, n: int = 1500, deg: int = 8, m: int = 2000, seed: int = 0) -> dict:
    """A files folder for task=edge on a graph with 8 features per edge (node features are noise). ``own``: the
    targets are edges of the graph, each labelled by the sign of its own second feature (what only a decoder
    reading the target's features can know); ``near``: any two nodes, labelled by the sign of the mean first feature
    of the target end's in-edges (what only an encoder reading the edges' features can know)."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    src, dst = np.unique(np.stack([rng.integers(0, n, n * deg), rng.integers(0, n, n * deg)]), axis=1)
    edge_attr = rng.normal(size=(src.size, 8)).astype(np.float32)
    if target == "own":
        pick = rng.choice(src.size, m, replace=False)
        pairs, label = np.stack([src[pick], dst[pick]]), (edge_attr[pick, 1] > 0).astype(np.int64)
    else:
        sums, count = np.zeros(n), np.zeros(n)
        np.add.at(sums, dst, edge_attr[:, 0])
        np.add.at(count, dst, 1)
        pairs = rng.integers(0, n, (2, m))
        label = (sums / np.maximum(count, 1) > 0)[pairs[1]].astype(np.int64)
    arrays = {"x": rng.normal(size=(n, 8)).astype(np.float32), "edge_index": np.stack([src, dst]),
              "edge_attr": edge_attr, "edge_label_index": pairs, "edge_label": label}
    for name, a in arrays.items():
        np.save(folder / f"{name}.npy", a)
    return arrays


def test_an_edge_tasks_batches_carry_their_targets_own_features_where_the_decoder_reads_them(tmp_path):
    """concat reads each target's own edge features: a batch's edge_label_attr holds the graph edge's features of
    each of its pairs (zeros for a pair that is no edge); hadamard reads none, and its batches carry none."""
    from hpcgnn.env import RankEnv
    from hpcgnn.tasks import open_store

    arrays = write_edge_feature_targets(tmp_path / "g", "own", n=300, m=400)
    pairs = arrays["edge_label_index"].copy()
    pairs[:, ::3] = np.stack([pairs[1, ::3], pairs[0, ::3]])  # some of them reversed: mostly no edge of the graph
    np.save(tmp_path / "g" / "edge_label_index.npy", pairs)
    feats = {(s, d): arrays["edge_attr"][i] for i, (s, d) in enumerate(zip(*arrays["edge_index"].tolist(), strict=True))}
    env = RankEnv.from_environ({})
    over = ["dataset=files", f"dataset.path={tmp_path / 'g'}", f"dataset.root={tmp_path / 'root'}", "task=edge"]
    store = open_store(make_config(*over), env)
    assert (store.shape.pair_edge_dim, store.shape.edge_dim) == (8, 0)  # (the encoder reads none: none sampled)
    batch = next(iter(store.eval_loader("val")))
    assert "edge_attr" not in batch
    ends = batch.n_id[batch.edge_label_index].T.tolist()
    want = np.stack([feats.get((s, d), np.zeros(8, dtype=np.float32)) for s, d in ends])
    assert 0 < sum((s, d) in feats for s, d in ends) < len(ends)
    assert np.array_equal(batch.edge_label_attr.numpy(), want)
    plain = open_store(make_config(*over, "task.decoder=hadamard"), env)
    assert plain.shape.pair_edge_dim == 0 and "edge_label_attr" not in next(iter(plain.eval_loader("val")))


EDGE_TASK_RUNS = {  # (targets, overrides, the test accuracy it must reach, or stay below)
    "concat reads the target's": ("own", ["task.decoder=concat"], 0.9),
    "concat, partitioned, exact evaluation": ("own", ["graph=partitioned", "train.eval_mode=full"], 0.9),
    "hadamard reads none": ("own", ["task.decoder=hadamard"], -0.65),
    "gin edge_dim, exact evaluation": ("near", ["model=gin", "model.edge_dim=8", "train.eval_mode=full"], 0.9),
    "gin without": ("near", ["model=gin"], -0.65),
}


@pytest.mark.slow
@pytest.mark.parametrize("run", sorted(EDGE_TASK_RUNS))
def test_edge_features_reach_an_edge_tasks_decoder_and_encoder(run, tmp_path):
    """An edge task whose labels are its target edges' own features: concat (which reads them) learns them, hadamard
    stays near chance; one whose labels follow from the edges around a target's end: a GINE encoder learns them
    (evaluated exactly: every edge's features in its layers), gin without them stays near chance. predict, exactly
    or on sampled batches, scores the run's test accuracy."""
    from conftest import predict_here, run_cli, summary_of, train_here

    target, over, bar = EDGE_TASK_RUNS[run]
    write_edge_feature_targets(tmp_path / "g", target)
    common = ["dataset=files", f"dataset.path={tmp_path / 'g'}", "task=edge", "train.batch_size=256",
              "model.hidden_channels=32", "train.precision=fp32", "train.epochs=10", "train.lr=0.01",
              "metrics.tensorboard=false", *over]
    if "graph=partitioned" in over:  # (two ranks, each with its targets: those whose target node it owns)
        res = run_cli(*common, cwd=tmp_path)
        assert res.returncode == 0, res.stdout + res.stderr
        s = summary_of(tmp_path)
        assert s["test"] >= bar and s["world_size"] == 2, s["test"]
        res = run_cli("predict", str(tmp_path / "run"), cwd=tmp_path / "predict")
        assert f"test accuracy {s['test']:.4f} over " in res.stdout, res.stdout + res.stderr
        return
    s = train_here(*common, f"dataset.root={tmp_path / 'root'}", run_dir=tmp_path / "run")
    assert s["test"] >= bar if bar > 0 else s["test"] <= -bar, (run, s["test"])
    if bar > 0:
        mode = s["eval_mode"]  # (the run's own: exact where the graph is whole, the default)
        p = predict_here(tmp_path / "run", f"mode={mode}")
        assert (p["value"], p["mode"]) == (s["test"], mode)


@pytest.mark.slow
def test_an_edge_tasks_edge_features_come_bitwise_from_sampler_processes_and_servers(tmp_path):
    """An edge task on a partitioned graph whose encoder (gat, model.edge_dim) and decoder (concat) both read edge
    features (a remote edge's fetched from the rank that holds it; a rank's targets those whose target node it
    owns): batches from two sampler processes and from two sampler servers train the parameters the ranks' own
    batches do; predict, launched, scores the run's test accuracy over the whole test split, and predicts the pairs
    of a file exactly as the targets."""
    from pathlib import Path

    from conftest import predict_here, run_cli, summary_of

    write_edge_feature_targets(tmp_path / "g", "own", n=600, m=600)
    over = ["dataset=files", f"dataset.path={tmp_path / 'g'}", "task=edge", "graph=partitioned", "model=gat",
            "model.edge_dim=8", "train.epochs=1", "train.batch_size=64", "model.hidden_channels=16",
            "train.precision=fp32", "metrics.tensorboard=false"]
    runs = {}
    for name, extra in (("rank", ["train.num_threads=1"]), ("procs", ["train.sampler_procs=2", "train.num_threads=3"]),
                        ("servers", ["launch.sampler_servers=2", "train.num_threads=1"])):
        res = run_cli(*over, *extra, cwd=tmp_path / name)
        assert res.returncode == 0, res.stdout + res.stderr
        runs[name] = summary_of(tmp_path / name)
    assert runs["rank"]["graph_mode"] == "partitioned" and runs["rank"]["world_size"] == 2
    assert runs["rank"]["history"][-1]["remote_rows_per_batch"] > 0
    assert runs["procs"]["param_checksums"] == runs["rank"]["param_checksums"]
    assert runs["servers"]["param_checksums"] == runs["rank"]["param_checksums"]
    res = run_cli("predict", str(tmp_path / "rank" / "run"), cwd=tmp_path / "predict")
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"test accuracy {runs['rank']['test']:.4f} over 55 target edges (the run's: {runs['rank']['test']:.4f}" \
        in res.stdout
    # the pairs of a file (the test targets', a pair that is no edge, a target reversed) predicted exactly by the two
    # ranks on their parts (each pair's own edge features fetched where its edge is) as one rank predicts the test
    # split's targets on the whole graph: the same probabilities, bit for bit
    whole = Path(predict_here(tmp_path / "rank" / "run", "mode=full", "graph=replicated")["run_dir"])
    ids, index = np.load(whole / "ids.npy"), np.load(tmp_path / "g" / "edge_label_index.npy")
    np.save(tmp_path / "cand.npy", np.concatenate([index[:, ids].T, [[0, 1], index[::-1, ids[0]]]]))
    res = run_cli("predict", str(tmp_path / "rank" / "run"), f"pairs={tmp_path / 'cand.npy'}", "mode=full",
                  f"out={tmp_path / 'pairs'}", cwd=tmp_path / "predict")
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"predictions of {ids.size + 2} pair(s), full inference, 2 ranks" in res.stdout
    probs = np.load(tmp_path / "pairs" / "probs.npy")
    assert np.array_equal(probs[:-2], np.load(whole / "probs.npy")) and np.allclose(probs.sum(1), 1, atol=1e-6)


# ------------------------------------------------------------------ edge features on a partitioned graph


def _partitioned_worker(rank: int, world: int, port: int, cfg, folder: str) -> None:
    """One of two gloo ranks on a partitioned graph whose model reads edge features: its evaluation batches' sampled
    edges (global ends) with the features they carry, and a seeded gat's exact outputs of its own nodes."""
    import torch
    from conftest import local_rank_env

    from hpcgnn.dist import process_group
    from hpcgnn.models import build_node_model
    from hpcgnn.stores import exact as ex
    from hpcgnn.tasks import open_store

    torch.set_num_threads(1)
    ex.FETCH_ROWS = 97
    env = local_rank_env(rank, world, port)
    with process_group(env, cfg.dist, torch.device("cpu")):
        store = open_store(cfg, env)
        edges, feats, remote = [], [], 0
        for batch in store.eval_loader("val"):
            edges.append(batch.n_id[batch.edge_index])
            feats.append(batch.edge_attr)
            remote += int((store.view.owner(edges[-1][1]) != rank).sum())  # (an edge is its target's owner's)
        torch.manual_seed(0)
        model = build_node_model(cfg.model, store.shape, 2)
        out = {"edges": torch.cat(edges, 1), "feats": torch.cat(feats), "remote": remote, "nodes": store.parts.nodes,
               "exact": store.exact(model).split("all")[0], "state": model.state_dict()}
    torch.save(out, f"{folder}/rank{rank}.pt")


@pytest.mark.slow
def test_on_a_partitioned_graph_each_sampled_edge_carries_its_features_and_exact_inference_reads_every_edges(tmp_path):
    """Two ranks on a 2-part partition, a gat reading edge features: every sampled edge of their batches, a remote
    node's included (sampled by its owner, its features fetched from it), carries the features the graph gives
    that edge; the ranks' exact outputs of their own nodes are the whole graph's forward pass with every edge's
    features."""
    import torch.multiprocessing as mp

    from hpcgnn.data import open_graph
    from hpcgnn.partition import ensure_parts
    from hpcgnn.submit.local import free_port

    write_marked(tmp_path / "g", n=800)
    cfg = make_config("dataset=files", f"dataset.path={tmp_path / 'g'}", f"dataset.root={tmp_path / 'root'}",
                      "graph=partitioned", "graph.num_parts=2", "graph.method=metis", "model=gat", "model.edge_dim=4",
                      "model.hidden_channels=8", "train.eval_batch_size=50", "graph.cache_mb=0")
    ensure_parts(cfg.dataset, cfg.graph, 2)
    g = open_graph(cfg.dataset)
    port = free_port(23000 + os.getpid() % 5000, 20000, 32767)
    mp.start_processes(_partitioned_worker, args=(2, port, cfg, str(tmp_path)), nprocs=2, start_method="spawn")
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(2)]
    src, dst = g.edge_index()
    features = {(s, d): g.edge_attr[i] for i, (s, d) in enumerate(zip(src.tolist(), dst.tolist(), strict=True))}
    for r in ranks:
        assert r["remote"] > 0 and r["edges"].size(1) > 0
        want = torch.stack([features[(s, d)] for s, d in r["edges"].T.tolist()])
        assert torch.equal(r["feats"], want)
    from hpcgnn.data.graph import GraphShape
    from hpcgnn.models import build_node_model

    model = build_node_model(cfg.model, GraphShape(g.num_features, g.num_classes, g.num_nodes, edge_dim=4), 2)
    model.load_state_dict(ranks[0]["state"])
    with torch.no_grad():
        whole = model.eval()(g.x.float(), g.edge_index(), edge_attr=g.edge_attr.float())
    for r in ranks:
        assert (r["exact"] - whole[r["nodes"]]).abs().max() <= 1e-5 * whole.abs().max()


def test_parts_carry_their_edges_features_and_a_partition_written_without_them_is_refused(tmp_path):
    """Each part holds its edges' features in its CSR order, and the parts' first edge ids number every edge once;
    a partition written without them (an older hpcgnn's) is refused for a model that reads them, naming the fix."""
    import json

    from hpcgnn.env import RankEnv
    from hpcgnn.errors import PartitionError
    from hpcgnn.partition import ensure_parts, open_parts, parts_folder
    from hpcgnn.tasks import open_store

    write_marked(tmp_path / "g", n=400)
    cfg = make_config("dataset=files", f"dataset.path={tmp_path / 'g'}", f"dataset.root={tmp_path / 'root'}",
                      "graph=partitioned", "graph.num_parts=2", "graph.method=random", "model=gat", "model.edge_dim=4",
                      "launch.procs=1")
    ensure_parts(cfg.dataset, cfg.graph, 2)
    g = open_graph(cfg.dataset)
    src, dst = g.edge_index()
    features = {(s, d): g.edge_attr[i] for i, (s, d) in enumerate(zip(src.tolist(), dst.tolist(), strict=True))}
    for i in range(2):
        p = open_parts(cfg.dataset, cfg.graph, 2, [i])
        rows = torch.repeat_interleave(p.nodes, p.rowptr[1:] - p.rowptr[:-1])
        assert torch.equal(p.edge_attr, torch.stack([features[(s, d)] for s, d in zip(p.col.tolist(), rows.tolist(),
                                                                                       strict=True)]))
        assert int(p.edge_base[i + 1] - p.edge_base[i]) == p.col.numel()
    assert int(p.edge_base[-1]) == g.num_edges
    folder = parts_folder(cfg.dataset, cfg.graph, 2)
    meta = json.loads((folder / "META.json").read_text())
    del meta["edge_features"], meta["part_edges"]
    (folder / "META.json").write_text(json.dumps(meta))
    assert open_parts(cfg.dataset, cfg.graph, 2, [0, 1]).edge_attr is None
    with pytest.raises(PartitionError, match=r"the 2-part partition of files was written without its edges' features "
                                             r"\(by an older hpcgnn\), and the model reads them. HINT: delete .* and "
                                             r"partition again"):
        open_store(cfg, RankEnv.from_environ({}))
