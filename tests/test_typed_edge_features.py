"""Edge features on typed graphs: each relation keeps its own (a typed folder's edges/<relation>/edge_attr.npy, a
HeteroData relation's edge_attr), in its CSR's order (a reverse has its edge's, a duplicate keeps the first given);
a typed batch carries each sampled edge's, per relation, to a model of the user's own that takes them."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import REPO, make_config
from torch_geometric.data import HeteroData

from hpcgnn.config import dataset_config
from hpcgnn.data import TYPED_LOADERS, ooc, open_typed, prepare
from hpcgnn.data.files import DatasetFileError

RATES, REV, FOLLOWS = ("user", "rates", "item"), ("item", "rev_rates", "user"), ("user", "follows", "user")
GINE = ["model=custom", "model._target_=my_gnn.EdgeGINE", "+model.kwargs.edge_dim=4"]


def write_rated(folder, users: int = 600, items: int = 800, deg: int = 8, follows: int = 0, seed: int = 0,
                edge_labels: bool = False) -> dict:
    """A typed folder: users rate items (4 features per rating; node features are noise), and an item's class is the
    sign of the mean first feature of its ratings: what only a model reading the edges' features can know.
    ``follows``: that many user -> user edges with 2 features each, some given twice (the first kept).
    ``edge_labels``: each rating labelled too (the sign of its own second feature), an edge task's targets."""
    rng = np.random.default_rng(seed)
    src, dst = rng.integers(0, users, items * deg), np.repeat(np.arange(items), deg)
    rating = rng.normal(size=(src.size, 4)).astype(np.float32)
    sums = np.zeros(items)
    np.add.at(sums, dst, rating[:, 0])
    order = rng.permutation(items)
    nodes = {"user": {"x": rng.normal(size=(users, 8)).astype(np.float32)},
             "item": {"x": rng.normal(size=(items, 8)).astype(np.float32), "y": (sums > 0).astype(np.int64),
                      "train_idx": np.sort(order[:items // 2]), "val_idx": np.sort(order[items // 2:items // 4 * 3]),
                      "test_idx": np.sort(order[items // 4 * 3:])}}
    edges = {RATES: {"edge_index": np.stack([src, dst]), "edge_attr": rating}}
    if edge_labels:
        edges[RATES]["edge_label"] = (rating[:, 1] > 0).astype(np.int64)
    if follows:
        a, b = rng.integers(0, users, follows), rng.integers(0, users, follows)
        a[-10:], b[-10:] = a[:10], b[:10]  # given twice: the first features are kept
        edges[FOLLOWS] = {"edge_index": np.stack([a, b]), "edge_attr": rng.normal(size=(follows, 2)).astype(np.float32)}
    for t, arrays in nodes.items():
        (folder / "nodes" / t).mkdir(parents=True, exist_ok=True)
        for name, a in arrays.items():
            np.save(folder / "nodes" / t / f"{name}.npy", a)
    for rel, arrays in edges.items():
        (folder / "edges" / "__".join(rel)).mkdir(parents=True, exist_ok=True)
        for name, a in arrays.items():
            np.save(folder / "edges" / "__".join(rel) / f"{name}.npy", a)
    return edges


def expected(edges: dict) -> dict:
    """(stored relation, source, target) -> the features the prepared graph keeps: the pair's first given; a reverse
    (rev_rates, or follows made undirected) its edge's, after the edges given that way."""
    out = {}
    for rel, arrays in edges.items():
        src, dst = arrays["edge_index"].tolist()
        back = REV if rel == RATES else rel
        for (s, d), row in zip(zip(src, dst, strict=True), arrays["edge_attr"], strict=True):
            out.setdefault((rel, s, d), row)
        for (s, d), row in zip(zip(src, dst, strict=True), arrays["edge_attr"], strict=True):
            out.setdefault((back, d, s), row)
    return out


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_each_relations_edge_features_follow_its_edges_into_the_prepared_csr(tmp_path, monkeypatch, caplog, dtype):
    """Streamed out of core (several buckets) the arrays the in-memory build makes; every stored edge's features are
    its pair's (a reverse's its edge's, a duplicate's the first given, the log counting the given relations' merged
    repeats), in the stored dtype."""
    import logging

    edges = write_rated(tmp_path / "g", users=60, items=80, follows=300)
    monkeypatch.setattr(ooc, "MIN_BUCKET_EDGES", 100)
    cfg = dataset_config(name="files", path=str(tmp_path / "g"), root=str(tmp_path / "root"), prepare_mem_gb=1e-6,
                        feature_dtype=dtype)
    with caplog.at_level(logging.INFO, logger="hpcgnn.data.graph"):
        prepare(cfg)
    for rel, arrays in edges.items():  # (follows, inside one type: its reverses go into it too)
        src, dst = arrays["edge_index"]
        if rel == FOLLOWS:
            src, dst = np.concatenate([src, dst]), np.concatenate([dst, src])
        repeats = src.size - np.unique(src * 1000 + dst).size
        said = (f"dataset=files: its {src.size // 2} edges of {'__'.join(rel)} and their reverses (dataset.to_undirected)"
                f" hold {src.size - repeats} distinct (source, target) pairs: {repeats} coincide with another"
                if rel == FOLLOWS else f"dataset=files: {repeats} of its {src.size} edges of {'__'.join(rel)} repeat a "
                "(source, target) pair")
        assert (said in caplog.text) == (repeats > 0), (rel, repeats, caplog.text)
    g, whole = open_typed(cfg), TYPED_LOADERS["files"](cfg, False)
    assert g.schema.edge_dims == {"user__follows__user": 2, "user__rates__item": 4, "item__rev_rates__user": 4}
    assert g.schema.edge_dims == whole.schema.edge_dims
    want, kind = expected(edges), getattr(torch, dtype)
    for rel in g.relations:
        assert g.edge_attr[rel].dtype == kind
        assert torch.equal(g.col[rel].long(), whole.col[rel]) and torch.equal(g.edge_attr[rel], whole.edge_attr[rel].to(kind))
        src, dst = g.edge_index(rel).tolist()
        assert g.num_edges(rel) == sum(1 for key in want if key[0] == rel)
        rows = np.stack([want[(rel, s, d)] for s, d in zip(src, dst, strict=True)])
        assert torch.equal(g.edge_attr[rel], torch.from_numpy(rows).to(kind)), rel


def hetero_with_edge_features() -> HeteroData:
    """(for dataset=pyg_hetero) a HeteroData whose ratings carry features, its follows none."""
    g = torch.Generator().manual_seed(0)
    data = HeteroData()
    data["user"].x, data["item"].x = torch.randn(30, 4, generator=g), torch.randn(40, 4, generator=g)
    data["item"].y = torch.randint(0, 2, (40,), generator=g)
    data["user", "rates", "item"].edge_index = torch.stack([torch.randint(0, 30, (200,), generator=g),
                                                            torch.randint(0, 40, (200,), generator=g)])
    data["user", "rates", "item"].edge_attr = torch.randn(200, 3, generator=g)
    data["user", "follows", "user"].edge_index = torch.randint(0, 30, (2, 50), generator=g)
    return data


def test_a_heterodatas_relations_keep_their_edge_features(tmp_path):
    cfg = make_config("dataset=pyg_hetero", "dataset._target_=test_typed_edge_features.hetero_with_edge_features",
                      "dataset.to_undirected=true", f"dataset.root={tmp_path}").dataset
    data = hetero_with_edge_features()
    prepare(cfg)
    g = open_typed(cfg)
    assert g.schema.edge_dims == {"user__rates__item": 3, "item__rev_rates__user": 3}
    features = {}
    for i, (s, d) in enumerate(data[RATES].edge_index.T.tolist()):
        features.setdefault((s, d), data[RATES].edge_attr[i])  # (a pair given twice keeps its first)
    for rel, flip in ((RATES, False), (REV, True)):
        src, dst = g.edge_index(rel).tolist()
        pairs = zip(dst, src, strict=True) if flip else zip(src, dst, strict=True)
        assert torch.equal(g.edge_attr[rel], torch.stack([features[p] for p in pairs]))
    assert torch.equal(g.edge_attr[REV], TYPED_LOADERS["pyg_hetero"](cfg, False).edge_attr[REV])


def test_wrong_edge_features_of_a_relation_are_refused_naming_the_file(tmp_path):
    edges = write_rated(tmp_path / "g", users=20, items=30)
    np.save(tmp_path / "g" / "edges" / "user__rates__item" / "edge_attr.npy", edges[RATES]["edge_attr"][:-1])
    with pytest.raises(DatasetFileError, match=r"user__rates__item/edge_attr\.npy: 239 rows of edge features for the "
                                               r"240 edges of edge_index\.npy: one row per edge, in its order"):
        prepare(dataset_config(name="files", path=str(tmp_path / "g"), root=str(tmp_path / "root")))


def test_a_typed_batch_carries_each_sampled_edges_features_per_relation(tmp_path, monkeypatch):
    """Each edge of each relation in a typed training batch carries the features the graph gives its pair; a model
    reading none gets a batch without them."""
    from hpcgnn.env import RankEnv
    from hpcgnn.sampling.loader import BatchLoader
    from hpcgnn.tasks import open_store

    monkeypatch.syspath_prepend(str(REPO / "examples"))  # (my_gnn)
    edges = write_rated(tmp_path / "g", users=60, items=80, follows=300)
    over = ["dataset=files", f"dataset.path={tmp_path / 'g'}", f"dataset.root={tmp_path / 'root'}"]
    store = open_store(make_config(*over, "model=custom", "model._target_=my_gnn.HeteroEdgeSAGE"), RankEnv.from_environ({}))
    batch = next(iter(BatchLoader(store.features, store.train_sampler, store.train_batches(0)[0], 20)))
    want = expected(edges)
    for rel in (RATES, REV, FOLLOWS):
        src_type, _, dst_type = rel
        ei = batch[rel].edge_index
        src, dst = batch[src_type].n_id[ei[0]].tolist(), batch[dst_type].n_id[ei[1]].tolist()
        assert len(src) > 0
        rows = np.stack([want[(rel, s, d)] for s, d in zip(src, dst, strict=True)])
        assert np.array_equal(batch[rel].edge_attr.numpy(), rows), rel
    plain = open_store(make_config(*over, "model=rgcn"), RankEnv.from_environ({}))
    batch = next(iter(BatchLoader(plain.features, plain.train_sampler, plain.train_batches(0)[0], 20)))
    assert plain.shape.edge_dim == 0 and not batch.collect("edge_attr", allow_empty=True)


def test_a_typed_model_reading_edge_features_on_a_graph_without_them_is_refused_at_submit(tmp_path, monkeypatch):
    from hpcgnn.data import typed_shape
    from hpcgnn.errors import DatasetError
    from hpcgnn.models.custom import check_custom

    monkeypatch.syspath_prepend(str(REPO / "examples"))  # (my_gnn)
    cfg = make_config("dataset=synthetic_hetero", "model=custom", "model._target_=my_gnn.HeteroEdgeSAGE",
                      f"dataset.root={tmp_path}")
    schema, width, classes = typed_shape(cfg.dataset)
    with pytest.raises(DatasetError, match=r"model._target_=my_gnn.HeteroEdgeSAGE reads edge features "
                                           r"\(edge_attr_dict\), but no relation of the typed graph has any. HINT: "
                                           r"give them \(files: edges/<relation>/edge_attr.npy"):
        check_custom(cfg, width, classes, schema)


def _partitioned_worker(rank: int, world: int, port: int, cfg, folder: str) -> None:
    """One of two gloo ranks on a partitioned typed graph whose model reads edge features: its evaluation batches'
    sampled edges per relation (global ends, types' own ids) with the features they carry."""
    import sys

    sys.path.insert(0, str(REPO / "examples"))  # (my_gnn)
    from conftest import local_rank_env

    from hpcgnn.dist import process_group
    from hpcgnn.tasks import open_store

    torch.set_num_threads(1)
    env = local_rank_env(rank, world, port)
    with process_group(env, cfg.dist, torch.device("cpu")):
        store = open_store(cfg, env)
        out, off = {"edge_dim": store.shape.edge_dim, "remote": 0}, store.parts.typed.schema.offsets()
        for batch in store.eval_loader("val"):
            for rel in (RATES, REV, FOLLOWS):
                ei = batch[rel].edge_index
                ends = torch.stack([batch[rel[0]].n_id[ei[0]], batch[rel[2]].n_id[ei[1]]])
                out.setdefault(rel, []).append((ends, batch[rel].edge_attr))
                out["remote"] += int((store.view.owner(ends[1] + off[rel[2]]) != rank).sum())  # (its target's owner's)
    torch.save(out, f"{folder}/rank{rank}.pt")


@pytest.mark.slow
def test_on_a_partitioned_typed_graph_each_sampled_edge_carries_its_relations_features(tmp_path):
    """Two ranks on a 2-part partition of a typed graph whose relations carry features: every sampled edge of each
    relation in their batches, those sampled by a remote node's owner included (their features fetched from it),
    carries the features the graph gives its pair."""
    import os

    import torch.multiprocessing as mp

    from hpcgnn.partition import ensure_parts
    from hpcgnn.submit.local import free_port

    edges = write_rated(tmp_path / "g", users=200, items=300, follows=600)
    cfg = make_config("dataset=files", f"dataset.path={tmp_path / 'g'}", f"dataset.root={tmp_path / 'root'}",
                      "graph=partitioned", "graph.num_parts=2", "graph.method=metis", "model=custom",
                      "model._target_=my_gnn.HeteroEdgeSAGE", "train.eval_batch_size=40", "graph.cache_mb=0")
    prepare(cfg.dataset)
    ensure_parts(cfg.dataset, cfg.graph, 2)
    port = free_port(23000 + os.getpid() % 5000, 20000, 32767)
    mp.start_processes(_partitioned_worker, args=(2, port, cfg, str(tmp_path)), nprocs=2, start_method="spawn")
    want = expected(edges)
    for r in range(2):
        got = torch.load(tmp_path / f"rank{r}.pt", weights_only=True)
        assert got["edge_dim"] == 4 and got["remote"] > 0
        for rel in (RATES, REV, FOLLOWS):
            ends = torch.cat([e for e, _ in got[rel]], 1)
            feats = torch.cat([f for _, f in got[rel]])
            assert ends.size(1) > 0
            rows = np.stack([want[(rel, s, d)] for s, d in ends.T.tolist()])
            assert torch.equal(feats, torch.from_numpy(rows)), (r, rel)


def _train(tmp_path, *over, run: str = "run"):
    from conftest import DATA_ROOT, train_here

    return train_here("dataset=files", f"dataset.path={tmp_path / 'g'}", *over, "train.epochs=20", "train.lr=0.01",
                      "train.batch_size=128", "model.hidden_channels=32", "metrics.tensorboard=false",
                      f"dataset.root={DATA_ROOT}", run_dir=tmp_path / run)


TYPED_RUNS = {  # (overrides, the test accuracy it must reach, or stay below)
    "GINE made relational by to_hetero": (GINE, 0.9),
    "a relational model of one's own taking edge_attr_dict": (["model=custom", "model._target_=my_gnn.HeteroEdgeSAGE"],
                                                               0.9),
    "rgcn reads none": (["model=rgcn"], -0.65),
    "GINE on a partitioned graph": ([*GINE, "graph=partitioned"], 0.9),
}


@pytest.mark.slow
@pytest.mark.parametrize("run", sorted(TYPED_RUNS))
def test_edge_features_reach_a_typed_model_that_reads_them(run, tmp_path, monkeypatch):
    """On a typed graph whose labels follow from one relation's edge features, a user's model reading them (a GINE
    made relational by to_hetero, taking edge_attr; a HeteroConv model taking edge_attr_dict) learns them, a model
    reading none stays near chance; predict gives the run's accuracy again."""
    from conftest import EXAMPLES, predict_here, run_cli, summary_of

    monkeypatch.syspath_prepend(str(REPO / "examples"))  # (my_gnn)
    write_rated(tmp_path / "g")
    over, bar = TYPED_RUNS[run]
    if "graph=partitioned" in over:  # (2 ranks, launched: the launcher partitions the graph)
        res = run_cli("dataset=files", f"dataset.path={tmp_path / 'g'}", *over, "train.epochs=20", "train.lr=0.01",
                      "train.batch_size=128", "model.hidden_channels=32", "metrics.tensorboard=false",
                      cwd=tmp_path, env=EXAMPLES)
        assert res.returncode == 0, res.stdout + res.stderr
        assert summary_of(tmp_path)["test"] >= bar
        return
    acc = _train(tmp_path, *over)["test"]
    assert acc >= bar if bar > 0 else acc <= -bar, (run, acc)
    if bar > 0:
        assert predict_here(tmp_path / "run", "trust=true")["value"] == acc


TYPED_EDGE_RUNS = {"concat reads each rating's own": (["task.decoder=concat"], 0.9),
                   "concat, partitioned": (["task.decoder=concat", "graph=partitioned"], 0.9),
                   "hadamard reads none": (["task.decoder=hadamard"], -0.65)}


@pytest.mark.slow
@pytest.mark.parametrize("run", sorted(TYPED_EDGE_RUNS))
def test_a_typed_edge_tasks_decoder_reads_its_targets_own_features(run, tmp_path):
    """task=edge on a typed folder whose ratings are labelled by the sign of their own second feature (left out of
    message passing with their edges): R-GCN with the concat decoder, which reads each target's own features,
    learns it, replicated or partitioned (2 ranks: each its targets, their features from its own parts); hadamard,
    which reads none, stays near chance; predict gives the run's accuracy again."""
    from conftest import DATA_ROOT, predict_here, run_cli, summary_of, train_here

    extra, bar = TYPED_EDGE_RUNS[run]
    write_rated(tmp_path / "g", edge_labels=True)
    over = ["task=edge", "dataset=files", f"dataset.path={tmp_path / 'g'}", "model=rgcn", *extra, "train.epochs=5",
            "metrics.tensorboard=false"]
    if "graph=partitioned" in extra:  # (launched: the launcher partitions the graph)
        res = run_cli(*over, cwd=tmp_path)
        assert res.returncode == 0, res.stdout + res.stderr
        s = summary_of(tmp_path)
        assert s["graph_mode"] == "partitioned" and s["test"] >= bar, s["test"]
        return
    s = train_here(*over, f"dataset.root={DATA_ROOT}", run_dir=tmp_path / "run")
    assert s["test"] >= bar if bar > 0 else s["test"] <= -bar, (run, s["test"])
    if bar > 0:
        assert predict_here(tmp_path / "run")["value"] == s["test"]


@pytest.mark.slow
def test_a_typed_edge_tasks_exact_evaluation_is_its_sampled_one_with_every_neighbour(tmp_path):
    """R-GCN's exact evaluation of a typed edge task (every node of both end types layer by layer, each target's
    own features for concat) scores what sampled evaluation does when the fanouts take every neighbour and the
    targets keep their edges: the same metrics; predict with mode=full prints the run's."""
    from conftest import DATA_ROOT, predict_here, train_here

    write_rated(tmp_path / "g", users=200, items=300, edge_labels=True)
    over = ["task=edge", "dataset=files", f"dataset.path={tmp_path / 'g'}", "model=rgcn", "task.target_edges=keep",
            "train.fanouts=[1000,1000]", "train.precision=fp32", "train.epochs=2", "metrics.tensorboard=false",
            f"dataset.root={DATA_ROOT}"]
    full = train_here(*over, "train.eval_mode=full", run_dir=tmp_path / "full")
    sampled = train_here(*over, "train.eval_mode=sampled", run_dir=tmp_path / "sampled")
    assert full["param_checksums"] == sampled["param_checksums"]
    assert abs(full["best_val"] - sampled["best_val"]) < 1e-9 and abs(full["test"] - sampled["test"]) < 1e-9
    assert predict_here(tmp_path / "full", "mode=full")["value"] == full["test"]
