"""Link prediction: edge splits, link batches, negatives, metrics against OGB's evaluator, OGB's link datasets."""

from __future__ import annotations

import dataclasses
import gzip
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import DATA_ROOT, UNIT_ROUNDOFF, local_rank_env, make_config, train_batches
from sklearn.metrics import average_precision_score, roc_auc_score

from hpcgnn.config import dataset_config
from hpcgnn.data import build_graph, build_link, cache_folder, open_link, prepare
from hpcgnn.data.graph import csr_has_edge
from hpcgnn.data.link import edge_keys, has_edge
from hpcgnn.errors import ConfigError
from hpcgnn.sampling import BatchLoader, CSRNeighborSampler
from hpcgnn.sampling.link import LinkSampler, pair_sampler
from hpcgnn.tasks import link_metrics as lm

LINK = dataset_config(num_nodes=3000, avg_degree=10, centroids="community", homophily=0.7, root=str(DATA_ROOT),
                     prepared_for="link")


@pytest.fixture(scope="module")
def data():
    prepare(LINK)
    return open_link(LINK)


def common_neighbour_scores(graph, pairs: torch.Tensor) -> torch.Tensor:
    """The common-neighbours heuristic for ``pairs`` [2, P]: in-neighbours ``u`` and ``v`` share (a baseline
    a GNN must beat; vectorised over the pairs)."""
    from hpcgnn.sampling.neighbor import sample_neighbors
    from hpcgnn.sampling.subgraph import ALL

    n = graph.num_nodes
    row_u, nbr_u = sample_neighbors(graph.rowptr, graph.col, pairs[0], ALL)
    row_v, nbr_v = sample_neighbors(graph.rowptr, graph.col, pairs[1], ALL)
    shared = torch.isin(row_u * n + nbr_u, row_v * n + nbr_v)
    return torch.bincount(row_u[shared], minlength=pairs.size(1)).float()


def _pairs(ei: torch.Tensor) -> set[tuple[int, int]]:
    return set(map(tuple, ei.t().tolist()))


def test_edge_split_keeps_both_directions_together_and_out_of_message_passing(data):
    full = build_graph(LINK)
    edges = _pairs(full.edge_index())
    mp = _pairs(data.graph.edge_index())
    train, val, test = (_pairs(data.split(s).pos) for s in ("train", "val", "test"))
    undirected = lambda pairs: {(min(a, b), max(a, b)) for a, b in pairs}  # noqa: E731
    assert not undirected(train) & undirected(val) and not undirected(train) & undirected(test)
    assert not undirected(val) & undirected(test)
    assert len(undirected(val)) == len(val) and len(undirected(test)) == len(test)  # one direction each
    total = len(undirected(edges))
    assert abs(len(val) / total - 0.05) < 0.01 and abs(len(test) / total - 0.1) < 0.01
    assert not undirected(mp) & (undirected(val) | undirected(test))  # never in message passing
    train_pairs = undirected(train)
    assert mp == {(a, b) for a, b in edges if (min(a, b), max(a, b)) in train_pairs}  # in both directions
    degree = full.degree().double()
    for split in ("val", "test"):
        s = data.split(split)
        assert s.neg_kind == "pairs" and s.neg.shape == s.pos.shape and bool((s.neg[0] != s.neg[1]).all())
        assert not _pairs(s.neg) & edges and not _pairs(s.neg.flip(0)) & edges  # negatives are no edges at all
        # random pairs (PyG's RandomLinkSplit, OGB): their ends are nodes at random, of the graph's mean degree,
        # not the positives' ends (an edge's end has more neighbours: E[d^2]/E[d]), whichever end is the source
        mean, ends = float(degree.mean()), float(degree[s.pos].mean())
        assert ends > 1.1 * mean and all(abs(float(degree[e].mean()) - mean) < (ends - mean) / 2 for e in s.neg)
        assert float((s.neg[0] == s.pos[0]).double().mean()) < 0.01  # not the positive's source kept
    again = build_link(LINK)  # seeded: the same split every time
    assert torch.equal(again.test.pos, data.test.pos) and torch.equal(again.test.neg, data.test.neg)


def test_a_splits_auc_does_not_depend_on_how_the_nodes_are_numbered():
    """Validation and test negatives are random pairs (PyG's RandomLinkSplit, OGB): a score's AUC is the same
    whichever way the nodes are numbered. Negatives that kept the positive's source (the end with the larger id)
    gave the degree product AUC 0.53 with ids ascending by degree and 0.79 descending, on this graph."""
    from hpcgnn.data.link import message_passing_graph, split_edges

    full = build_graph(dataclasses.replace(LINK, degree_exponent=2.5))  # hubs: degrees that differ
    n = full.num_nodes
    by_degree = torch.empty(n, dtype=torch.long)
    by_degree[torch.argsort(full.degree(), stable=True)] = torch.arange(n)
    auc = []
    for ids in (by_degree, n - 1 - by_degree):  # ascending, then descending by degree
        g = message_passing_graph(ids[full.edge_index()], n, full.x)
        test, degree = split_edges(g, (0.85, 0.05, 0.1), 0).test, g.degree().double()
        auc.append(lm.roc_auc(degree[test.pos[0]] * degree[test.pos[1]], degree[test.neg[0]] * degree[test.neg[1]]))
    assert abs(auc[0] - auc[1]) < 0.05 and min(auc) > 0.7, auc


@pytest.mark.parametrize("name", ["synthetic", "files"])
def test_link_datasets_are_prepared_out_of_core_into_the_split_made_in_memory(tmp_path, monkeypatch, name):
    """The graph streamed to disk, then split a few rows at a time (the training edges bucketed into the
    message-passing CSR, positives and negatives appended to their files): the dataset the in-memory
    split makes of the whole graph, array for array."""
    from hpcgnn.data import link, ooc

    monkeypatch.setattr(link, "SPLIT_CHUNK_EDGES", 300)
    monkeypatch.setattr(ooc, "MIN_BUCKET_EDGES", 500)
    cfg = dataset_config(num_nodes=1500, avg_degree=8, root=str(tmp_path), prepared_for="link", prepare_mem_gb=1e-5)
    if name == "files":  # a directed graph of the user's: some pairs in one direction only
        g = build_graph(dataset_config(num_nodes=1500, avg_degree=8, seed=3))
        keep = torch.rand(g.num_edges, generator=torch.Generator().manual_seed(0)) < 0.7
        folder = tmp_path / "mine"
        folder.mkdir()
        for key, value in (("edge_index", g.edge_index()[:, keep]), ("x", g.x), ("y", g.y), ("train_idx", g.train_idx),
                           ("val_idx", g.val_idx), ("test_idx", g.test_idx)):
            np.save(folder / f"{key}.npy", value.numpy())
        cfg = dataset_config(name="files", path=str(folder), root=str(tmp_path), prepared_for="link",
                             prepare_mem_gb=1e-5)
    assert ooc.EdgeBuckets(1500, 12000, tmp_path / "s", int(1e-5 * 2**30)).num_buckets > 1
    prepare(cfg)
    got, ref = open_link(cfg), build_link(cfg)
    assert got.graph.col.dtype == torch.int32
    for array in ("rowptr", "col", "x"):
        assert torch.equal(getattr(got.graph, array).long(), getattr(ref.graph, array).long()), array
    for split in ("train", "val", "test"):
        a, b = got.split(split), ref.split(split)
        assert a.pos.numel() > 0 and torch.equal(a.pos, b.pos) and a.neg_kind == b.neg_kind, split
        assert (a.neg is None and b.neg is None) or torch.equal(a.neg, b.neg), split
    assert sorted(p.name for p in cache_folder(cfg).iterdir() if not p.name.endswith(".npy")) == ["meta.json"]


@pytest.mark.parametrize("fractions, message", [([0.9, 0.1], "must be three fractions"), ([0.9, 0.1, 0.1], "sum to 1"),
                                                ([1.0, 0.0, 0.0], r"\(train, val, test\) above 0"),
                                                ([0.0, 0.5, 0.5], r"above 0 .*the training edges carry the messages")])
def test_edge_split_fractions_are_checked(fractions, message):
    with pytest.raises(ConfigError, match=message):
        make_config("task=link", f"dataset.edge_split=[{','.join(map(str, fractions))}]")


def test_csr_edge_membership_is_exact(data):
    g = data.graph
    has = csr_has_edge(g.rowptr, g.col)
    gen = torch.Generator().manual_seed(0)
    src, dst = torch.randint(g.num_nodes, (5000,), generator=gen), torch.randint(g.num_nodes, (5000,), generator=gen)
    ei = g.edge_index()
    src, dst = torch.cat([src, ei[0, :3000]]), torch.cat([dst, ei[1, :3000]])
    edges = _pairs(ei)
    want = torch.tensor([(int(a), int(b)) in edges for a, b in zip(src, dst, strict=True)])
    assert torch.equal(has(src, dst), want) and int(want.sum()) >= 3000
    assert torch.equal(has_edge(edge_keys(g), g.num_nodes, src, dst), want)


def _loader(data, negatives: str, form: str = "binary", k: int = 2, seed: int = 1):
    g = data.graph
    sampler = LinkSampler(CSRNeighborSampler(g.rowptr, g.col, (5, 3)), data.train.pos, g.num_nodes, negatives, k,
                          retries=3, form=form, has_edge=csr_has_edge(g.rowptr, g.col))
    return BatchLoader(g, sampler, torch.arange(600), 200, batch_seed=seed)


@pytest.mark.parametrize("negatives", ["uniform", "strict", "in_batch"])
def test_link_batches_hold_their_targets_but_never_pass_messages_along_them(data, negatives):
    g = data.graph
    edges = _pairs(g.edge_index())
    for i, batch in enumerate(_loader(data, negatives)):
        n_id, bs = batch.n_id, batch.batch_size
        idx = batch.edge_label_index
        pos = data.train.pos[:, i * 200:(i + 1) * 200]
        assert batch.positives == 200 and torch.equal(n_id[idx[:, :200]], pos)  # positives first, in order
        assert bool((idx < bs).all())  # every endpoint is a seed of the batch
        assert set(n_id[idx.reshape(-1)].tolist()) == set(n_id[:bs].tolist())  # the seeds are the endpoints
        assert torch.equal(batch.edge_label, torch.cat([torch.ones(200), torch.zeros(400)]))
        src, dst = n_id[batch.edge_index[0]], n_id[batch.edge_index[1]]
        mp = set(zip(src.tolist(), dst.tolist(), strict=True))
        assert mp <= edges  # every message-passing edge is a training edge
        targets = _pairs(pos)
        assert not mp & (targets | {(b, a) for a, b in targets})  # the answers are left out
        assert sum(batch.num_sampled_edges) == batch.edge_index.size(1)
        ends, first = torch.tensor([0, *batch.num_sampled_nodes]).cumsum(0), 0  # hop h's edges end in hop h - 1's nodes
        for h, m in enumerate(batch.num_sampled_edges):
            d = batch.edge_index[1, first:first + m]
            assert bool(((d >= ends[h]) & (d < ends[h + 1])).all()), h
            first += m
        negs = n_id[idx[:, 200:]]
        assert torch.equal(negs[0], pos[0].repeat_interleave(2))  # the source is kept, the target corrupted
        if negatives == "strict":  # no edge either way, unless padded (weight 0)
            w = batch.edge_label_weight[200:]
            bad = torch.tensor([(a, b) in edges or (b, a) in edges or a == b for a, b in negs.t().tolist()])
            assert not bool(bad[w > 0].any()) and batch.padded == int((w == 0).sum())
        if negatives == "in_batch":
            assert torch.equal(negs[1].reshape(200, 2)[:, 0], pos[1].roll(-1))
            assert torch.equal(negs[1].reshape(200, 2)[:, 1], pos[1].roll(-2))
    first = [b.edge_label_index for b in _loader(data, negatives)]
    assert all(torch.equal(a, b.edge_label_index) for a, b in zip(first, _loader(data, negatives), strict=True))


@pytest.mark.parametrize("targets", ["drop", "keep"])
def test_dropped_target_edges_leave_the_degrees_gcn_normalises_by(data, targets):
    """task.target_edges=drop: each node of a batch counts, among the graph's edges into it, those from its target
    partners as absent (GCN's degrees leave them out); keep: nothing is absent and every edge may carry messages."""
    g = data.graph
    edges = _pairs(g.edge_index())
    sampler = LinkSampler(CSRNeighborSampler(g.rowptr, g.col, (5, 3)), data.train.pos, g.num_nodes,
                          has_edge=csr_has_edge(g.rowptr, g.col), drop_targets=targets == "drop")
    out = sampler.sample(torch.arange(300), torch.Generator().manual_seed(0))
    if targets == "keep":
        assert out.absent_in_degree is None
        return
    gone: dict[int, int] = {}
    for a, b in _pairs(data.train.pos[:, :300]):
        for u, v in ((a, b), (b, a)):
            gone[v] = gone.get(v, 0) + ((u, v) in edges)
    assert out.absent_in_degree.tolist() == [gone.get(v, 0) for v in out.n_id.tolist()]
    assert sum(gone.values()) > 300  # (both directions of most pairs are edges of the graph)


def test_triplet_batches_pair_each_positive_with_its_negatives(data):
    batch = next(iter(_loader(data, "uniform", form="triplet", k=3)))
    n_id = batch.n_id
    pos = data.train.pos[:, :200]
    assert torch.equal(n_id[batch.src_index], pos[0]) and torch.equal(n_id[batch.dst_pos_index], pos[1])
    assert batch.dst_neg_index.shape == (200, 3) and batch.neg_weight.shape == (200, 3)


def test_evaluation_pairs_are_the_splits_pairs(data):
    g = data.graph
    s = data.val
    sampler = pair_sampler(CSRNeighborSampler(g.rowptr, g.col, (5, 3)), s)
    items = torch.arange(s.pos.size(1) + s.neg.size(1))
    seen = torch.cat([b.n_id[b.edge_label_index] for b in BatchLoader(g, sampler, items, 500, batch_seed=0)], 1)
    assert torch.equal(seen, torch.cat([s.pos, s.neg], 1))


# ------------------------------------------------------------------------------------ metrics


def test_metrics_equal_sklearn_and_ogbs_evaluator():
    from ogb.linkproppred import Evaluator

    gen = torch.Generator().manual_seed(0)
    pos = (torch.randn(500, generator=gen) + 1).round(decimals=1)  # ties, on purpose
    neg = torch.randn(700, generator=gen).round(decimals=1)
    labels, scores = np.r_[np.ones(500), np.zeros(700)], np.r_[pos.numpy(), neg.numpy()]
    assert lm.roc_auc(pos, neg) == pytest.approx(roc_auc_score(labels, scores), abs=1e-12)
    assert lm.average_precision(pos, neg) == pytest.approx(average_precision_score(labels, scores), abs=1e-12)
    collab = Evaluator("ogbl-collab")  # Hits@50 against the split's shared negatives
    assert lm.hits_shared(pos, neg, 50) == collab.eval({"y_pred_pos": pos, "y_pred_neg": neg})["hits@50"]
    shared = lm.shared_negative_metrics(pos, neg, (20, 50), paired=False)
    assert shared["hits@50"] == collab.eval({"y_pred_pos": pos, "y_pred_neg": neg})["hits@50"]
    candidates = torch.randn(500, 40, generator=gen).round(decimals=1)
    ogb = Evaluator("ogbl-citation2").eval({"y_pred_pos": pos, "y_pred_neg": candidates})
    ours = lm.per_positive_metrics(pos, candidates, (1, 3, 10))
    assert ours["mrr"] == pytest.approx(float(ogb["mrr_list"].mean()), abs=1e-6)
    for k in (1, 3, 10):
        assert ours[f"hits@{k}"] == pytest.approx(float(ogb[f"hits@{k}_list"].mean()), abs=1e-6)


def _sharded_worker(rank: int, world: int, port: int, folder: str) -> None:
    from hpcgnn.dist import process_group
    from hpcgnn.sampling.link import share

    env = local_rank_env(rank, world, port)
    scores = torch.load(f"{folder}/scores.pt", weights_only=True)
    with process_group(env, make_config().dist, torch.device("cpu")):
        lo, hi = share(scores["pos"].numel(), rank, world)
        nlo, nhi = share(scores["neg"].numel(), rank, world)
        shared = lm.shared_negative_metrics(scores["pos"][lo:hi], scores["neg"][nlo:nhi], (20, 50), paired=False)
        per = lm.per_positive_metrics(scores["pos"][lo:hi], scores["cand"][lo:hi], (1, 10))
        torch.save({"shared": shared, "per": per}, f"{folder}/rank{rank}.pt")


@pytest.mark.slow
def test_sharded_metrics_are_exact_across_ranks(tmp_path):
    """Three ranks, uneven shares: every rank gets the numbers of the whole split."""
    import torch.multiprocessing as mp

    from hpcgnn.submit.local import free_port

    gen = torch.Generator().manual_seed(1)
    scores = {"pos": torch.randn(1001, generator=gen) + 1, "neg": torch.randn(1502, generator=gen),
              "cand": torch.randn(1001, 30, generator=gen)}
    torch.save(scores, tmp_path / "scores.pt")
    mp.start_processes(_sharded_worker, args=(3, free_port(24000 + os.getpid() % 3000, 20000, 32767), str(tmp_path)),
                       nprocs=3, start_method="spawn")
    whole = {"shared": lm.shared_negative_metrics(scores["pos"], scores["neg"], (20, 50), paired=False),
             "per": lm.per_positive_metrics(scores["pos"], scores["cand"], (1, 10))}
    for rank in range(3):
        got = torch.load(tmp_path / f"rank{rank}.pt", weights_only=True)
        assert got["shared"] == whole["shared"]
        assert got["per"] == pytest.approx(whole["per"], abs=1e-12)


# ------------------------------------------------------------------------------- OGB's link datasets


def _csv_gz(path: Path, rows) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        for row in rows:
            f.write(",".join(str(v) for v in np.atleast_1d(row)) + "\n")


def write_mini_ogbl(root: Path, name: str, n: int = 80, seed: int = 0, held_out_in_raw: bool = False) -> dict:
    """A miniature ogbl dataset in OGB's on-disk layout: raw CSVs, and split files as OGB ships them
    (torch-pickled dicts of numpy arrays). ``held_out_in_raw``: the raw graph holds the validation and test
    edges too (they must leave message passing)."""
    rng = np.random.default_rng(seed)
    folder = root / "ogb" / name.replace("-", "_")
    (folder / "raw").mkdir(parents=True)
    src, dst = rng.integers(0, n, 6 * n), rng.integers(0, n, 6 * n)
    keep = src != dst
    edges = np.unique(np.stack([src[keep], dst[keep]]).T, axis=0)
    rng.shuffle(edges)
    train, valid, test = edges[: len(edges) - 40], edges[-40:-20], edges[-20:]
    x = rng.normal(size=(n, 4)).astype(np.float32)
    raw = folder / "raw"
    raw_edges = edges if held_out_in_raw else train
    _csv_gz(raw / "edge.csv.gz", raw_edges)
    _csv_gz(raw / "node-feat.csv.gz", x)
    _csv_gz(raw / "num-node-list.csv.gz", [n])
    _csv_gz(raw / "num-edge-list.csv.gz", [len(raw_edges)])
    split = folder / "split" / "time"
    split.mkdir(parents=True)
    if name == "ogbl-collab":
        year = lambda m: rng.integers(2000, 2020, m)  # noqa: E731
        torch.save({"edge": train, "weight": np.ones(len(train)), "year": year(len(train))}, split / "train.pt")
        for part, pos in (("valid", valid), ("test", test)):
            torch.save({"edge": pos, "weight": np.ones(len(pos)), "year": year(len(pos)),
                        "edge_neg": rng.integers(0, n, (60, 2))}, split / f"{part}.pt")
    else:
        _csv_gz(raw / "node_year.csv.gz", rng.integers(2000, 2020, n))
        torch.save({"source_node": train[:, 0], "target_node": train[:, 1]}, split / "train.pt")
        for part, pos in (("valid", valid), ("test", test)):
            torch.save({"source_node": pos[:, 0], "target_node": pos[:, 1],
                        "target_node_neg": rng.integers(0, n, (len(pos), 25))}, split / f"{part}.pt")
    return {"train": train, "valid": valid, "test": test, "x": x, "n": n}


@pytest.mark.parametrize("name", ["ogbl-collab", "ogbl-citation2"])
def test_ogbl_datasets_through_ogbs_readers_and_official_splits(tmp_path, name):
    mini = write_mini_ogbl(tmp_path, name)
    cfg = make_config("task=link", f"dataset={name}", f"dataset.root={tmp_path}").dataset
    data = build_link(cfg)
    assert data.graph.num_nodes == mini["n"] and np.allclose(data.graph.x.numpy(), mini["x"])
    mp = _pairs(data.graph.edge_index())
    train = {tuple(e) for e in mini["train"].tolist()}
    assert torch.equal(data.val.pos, torch.from_numpy(mini["valid"].T)) and torch.equal(data.test.pos,
                                                                                     torch.from_numpy(mini["test"].T))
    held_out = _pairs(data.val.pos) | _pairs(data.test.pos)
    held_out |= {(b, a) for a, b in held_out}
    # collab: ogb adds the inverse edges; citation2: made undirected. Held-out edges leave message passing.
    assert mp == (train | {(b, a) for a, b in train}) - held_out and len(mp) > 0
    if name == "ogbl-collab":
        assert data.metric == "hits@50" and data.val.neg_kind == "pairs" and data.val.neg.shape == (2, 60)
    else:
        assert data.metric == "mrr" and data.val.neg_kind == "targets" and data.val.neg.shape == (20, 25)
    folder = prepare(cfg)  # cached like every prepared graph, splits beside it
    again = open_link(cfg)
    assert torch.equal(again.test.neg, data.test.neg) and again.metric == data.metric and folder.name.startswith(name)


@pytest.mark.parametrize("name", ["ogbl-collab", "ogbl-citation2"])
def test_ogbl_datasets_are_prepared_out_of_core_into_what_the_readers_give(tmp_path, monkeypatch, name):
    """The raw csv streamed in chunks of rows into several buckets, the held-out positives dropped as they
    pass (in both directions): the message-passing graph and the official splits of the whole read."""
    from hpcgnn.data import ogb, ooc

    write_mini_ogbl(tmp_path, name, n=200, held_out_in_raw=True)
    monkeypatch.setattr(ogb, "STREAM_ROWS", 50)
    monkeypatch.setattr(ooc, "MIN_BUCKET_EDGES", 200)
    cfg = dataclasses.replace(make_config("task=link", f"dataset={name}", f"dataset.root={tmp_path}").dataset,
                              prepare_mem_gb=1e-5)
    assert ooc.EdgeBuckets(200, 2400, tmp_path / "s", int(1e-5 * 2**30)).num_buckets > 1
    prepare(cfg)
    got, ref = open_link(cfg), build_link(cfg)
    held_out = _pairs(ref.val.pos) | _pairs(ref.test.pos)
    assert held_out and not held_out & _pairs(got.graph.edge_index())
    for array in ("rowptr", "col", "x"):
        assert torch.equal(getattr(got.graph, array).long(), getattr(ref.graph, array).long()), array
    for split in ("train", "val", "test"):
        a, b = got.split(split), ref.split(split)
        assert torch.equal(a.pos, b.pos) and a.neg_kind == b.neg_kind and got.metric == ref.metric, split
        assert (a.neg is None and b.neg is None) or torch.equal(a.neg, b.neg), split


# ------------------------------------------------------------------------------- training end to end

# Sampled evaluation everywhere, so that replicated and partitioned runs are measured alike.
SMALL = ["task=link", "dataset.num_nodes=10000", "metrics.tensorboard=false", "train.eval_mode=sampled"]


@pytest.fixture(scope="module")
def link_runs(tmp_path_factory) -> dict:
    """2 ranks each (3 epochs, 10k nodes): the GNN and the GNN on a partitioned graph; and an MLP on the
    features with the same decoder (one rank in this process, the same global batch)."""
    from conftest import run_cli, summary_of

    from hpcgnn.env import RankEnv
    from hpcgnn.rank.trainer import Trainer

    runs = {}
    for name, over in (("sage", ["model=sage"]), ("partitioned", ["graph=partitioned"])):
        folder = tmp_path_factory.mktemp(f"link-{name}")
        res = run_cli(*SMALL, *over, "metrics.every_steps=1", cwd=folder, timeout=600)
        assert res.returncode == 0, res.stdout + res.stderr
        runs[name] = {"summary": summary_of(folder), "folder": folder, "stdout": res.stdout}
    # The baseline needs no second process: one rank here, with the two ranks' global batch.
    per_rank = runs["sage"]["summary"]["global_batch"]
    cfg = make_config(*SMALL, "model=mlp", f"train.batch_size={per_rank}", f"dataset.root={DATA_ROOT}",
                      run_dir=str(tmp_path_factory.mktemp("link-mlp") / "run"))
    runs["mlp"] = {"summary": Trainer(cfg, RankEnv.from_environ({}), torch.device("cpu")).train()}
    return runs


@pytest.mark.slow
def test_the_gnn_beats_an_mlp_and_common_neighbours_on_the_synthetic_default(link_runs):
    """Measured: GNN test AUC 0.870, MLP 0.634, common neighbours 0.562 (bars pinned below)."""

    gnn, mlp = link_runs["sage"]["summary"], link_runs["mlp"]["summary"]
    assert gnn["task"] == "link" and gnn["metric"] == "val_auc" and gnn["eval_mode"] == "sampled"
    for key in ("val_auc", "test_auc", "val_ap", "test_ap", "test_mrr", "test_hits@20", "test_hits@50", "test_hits@100"):
        assert 0 <= gnn[key] <= 1, key
    assert gnn["test"] == gnn["test_auc"] and gnn["best_val"] == gnn["val_auc"]
    data = open_link(make_config(*SMALL, f"dataset.root={DATA_ROOT}").dataset)
    cn = lm.roc_auc(common_neighbour_scores(data.graph, data.test.pos), common_neighbour_scores(data.graph, data.test.neg))
    assert gnn["test_auc"] >= 0.82, gnn["test_auc"]
    assert gnn["test_auc"] - mlp["test_auc"] >= 0.15, (gnn["test_auc"], mlp["test_auc"])
    assert gnn["test_auc"] - cn >= 0.2, (gnn["test_auc"], cn)
    assert "test auc" in link_runs["sage"]["stdout"]


@pytest.mark.slow
@pytest.mark.parametrize("run", ["sage", "partitioned"])
def test_ranks_take_equal_steps_and_end_equal(link_runs, run):
    """Replicated: the edges split evenly; partitioned: each rank's own edges (by source), padded to the most."""
    folder = link_runs[run]["folder"]
    s = link_runs[run]["summary"]
    lines = [len((folder / "run" / "metrics" / f"rank-{r}.jsonl").read_text().splitlines()) for r in range(2)]
    assert lines[0] == lines[1] == s["steps_per_epoch"] * s["epochs"]
    assert len(set(s["param_checksums"])) == 1


@pytest.mark.slow
def test_partitioned_link_training_is_within_a_point_of_replicated(link_runs):
    part, rep = link_runs["partitioned"]["summary"], link_runs["sage"]["summary"]
    assert part["graph_mode"] == "partitioned" and rep["graph_mode"] == "replicated"
    assert abs(part["test_auc"] - rep["test_auc"]) <= 0.01, (part["test_auc"], rep["test_auc"])
    assert part["history"][-1]["remote_rows_per_batch"] > 0
    assert max(part["resident_graph_bytes"]) < rep["resident_graph_bytes"][0]


def test_common_neighbours_counts_shared_neighbours(data):

    g = data.graph
    pairs = data.val.pos[:, :200]
    want = [len(set(g.col[g.rowptr[u]:g.rowptr[u + 1]].tolist()) & set(g.col[g.rowptr[v]:g.rowptr[v + 1]].tolist()))
            for u, v in pairs.t().tolist()]
    assert common_neighbour_scores(g, pairs).tolist() == want


@pytest.mark.slow
@pytest.mark.parametrize("form, negatives", [("binary", "strict"), ("triplet", "in_batch")])
def test_preempted_link_training_resumes_bitwise(tmp_path, form, negatives, cpu_kind):
    """One rank in this process, preempted mid-epoch and resumed: the parameters of an uninterrupted run."""
    from hpcgnn.env import RankEnv
    from hpcgnn.rank.checkpoint import Preempted
    from hpcgnn.rank.trainer import Trainer

    over = ["task=link", "dataset.num_nodes=3000", "dataset.avg_degree=10", f"dataset.root={DATA_ROOT}",
            "train.epochs=2", "train.batch_size=256", f"task.form={form}", f"task.negatives={negatives}",
            "task.num_negatives=2", "model.hidden_channels=32", "metrics.tensorboard=false"]
    single, cpu = RankEnv.from_environ({}), torch.device("cpu")
    whole = Trainer(make_config(*over, run_dir=str(tmp_path / "whole")), single, cpu).train()
    steps = whole["steps_per_epoch"]
    cut = make_config(*over, "debug.signal_rank=0", f"debug.signal_step={steps + 2}", run_dir=str(tmp_path / "cut"))
    with pytest.raises(Preempted):
        Trainer(cut, single, cpu).train()
    again = Trainer(cut, single, cpu).train()
    assert again["resumes"] == 1 and again["param_checksums"] == whole["param_checksums"]
    assert [r["loss"] for r in again["history"]] == [r["loss"] for r in whole["history"]]
    assert again["test_auc"] == whole["test_auc"] and again["precision"] == cpu_kind


def test_files_with_an_edge_split(tmp_path):
    """dataset=files under task=link: the user's own edges, split with dataset.edge_split."""
    g = build_graph(dataset_config(num_nodes=500, avg_degree=8, seed=4))
    folder = tmp_path / "mine"
    folder.mkdir()
    ei = g.edge_index()
    for name, value in (("edge_index", ei), ("x", g.x), ("y", g.y), ("train_idx", g.train_idx), ("val_idx", g.val_idx),
                        ("test_idx", g.test_idx)):
        np.save(folder / f"{name}.npy", value.numpy())
    cfg = make_config("task=link", "dataset=files", f"dataset.path={folder}", "dataset.edge_split=[0.7,0.1,0.2]",
                      f"dataset.root={tmp_path / 'data'}").dataset
    data = build_link(cfg)
    total = ei.size(1) // 2  # undirected
    assert abs(data.test.pos.size(1) / total - 0.2) < 0.02 and abs(data.val.pos.size(1) / total - 0.1) < 0.02
    assert data.graph.num_edges + 2 * (data.val.pos.size(1) + data.test.pos.size(1)) == ei.size(1)


def _score_tolerance(rows, src: torch.Tensor, dst: torch.Tensor, precision: str, layers: int):
    """How far two computation paths' scores of the same pairs may lie apart. Each layer's output and the score
    are rounded to the compute type once; summed in another order before that rounding, a value may land one ulp
    (2u of it) away. To first order each of the ``layers + 1`` roundings moves a factor of the score's products by
    2u in each embedding, so the score moves by at most 4 (layers + 1) u sum_i |eu_i ev_i|; in fp32 that is
    within 1e-6 of the score's size, in bf16 (u = 2^-8) a few percent."""
    emb = [rows(ids.reshape(-1)).view(*ids.shape, -1) for ids in (src, dst)]
    return 4 * (layers + 1) * UNIT_ROUNDOFF[precision] * (emb[0].abs() * emb[1].abs()).sum(-1)


@pytest.mark.parametrize("dataset", ["synthetic", "ogbl-citation2"])
def test_sampled_evaluation_with_full_fanouts_equals_exact_evaluation(tmp_path, dataset, cpu_kind, monkeypatch):
    """Fanouts above every degree put whole neighbourhoods in the sampled batches: both evaluation paths
    (pairs of a binary split; positives with their candidate targets) score every pair alike, to the rounding
    of the precision ``auto`` picks on each kind of CPU, and their metrics lie within what that rounding can
    move them (every metric rises with the positives' scores and falls with the negatives')."""
    from hpcgnn.env import RankEnv
    from hpcgnn.rank.techniques import autocast
    from hpcgnn.rank.trainer import Trainer
    from hpcgnn.tasks.link import LinkPrediction

    over = ["task=link", "train.epochs=1", "train.fanouts=[500,500]", "metrics.tensorboard=false",
            "model.hidden_channels=16"]
    if dataset == "synthetic":
        over += ["dataset.num_nodes=2000", f"dataset.root={DATA_ROOT}"]
    else:
        write_mini_ogbl(tmp_path, dataset)
        over += [f"dataset={dataset}", f"dataset.root={tmp_path}", "train.batch_size=64"]
    trainer = Trainer(make_config(*over, run_dir=str(tmp_path / "run")), RankEnv.from_environ({}), torch.device("cpu"))
    summary = trainer.train()
    task, model = trainer.task, trainer.model
    assert summary["precision"] == cpu_kind
    metrics = {}
    for mode in ("sampled", "full"):
        monkeypatch.setattr(LinkPrediction, "eval_mode", property(lambda self, mode=mode: mode))
        metrics[mode] = trainer.evaluate()  # (in the run's precision)
    with autocast(cpu_kind, torch.device("cpu")):
        emb = task._embeddings(model)
    for split in ("val", "test"):
        s = task.data.split(split)
        with autocast(cpu_kind, torch.device("cpu")):
            full, sampled = task._scores_full(model, emb, split), task._scores_sampled(model, split)
        if s.neg_kind == "targets":
            ends = {"pos": (s.pos[0], s.pos[1]), "neg": (s.pos[0].unsqueeze(1).expand_as(s.neg), s.neg)}
        else:
            ends = {"pos": (s.pos[0], s.pos[1]), "neg": (s.neg[0], s.neg[1])}
        tol = {k: _score_tolerance(emb.rows, *ends[k], cpu_kind, 2) for k in ends}
        for k, f, p in (("pos", full[0], sampled[0]), ("neg", full[1], sampled[1])):
            assert f.shape == p.shape and bool(((f - p).abs() <= tol[k]).all()), (split, k, (f - p).abs().max())
        ks = tuple(task.cfg.task.hits_k)
        if s.neg_kind == "targets":
            bound = [lm.per_positive_metrics(full[0] + sign * tol["pos"], full[1] - sign * tol["neg"], ks)
                     for sign in (-1, 1)]
        else:
            bound = [lm.shared_negative_metrics(full[0] + sign * tol["pos"], full[1] - sign * tol["neg"], ks,
                                                paired=True) for sign in (-1, 1)]
        for name in bound[0]:
            key = f"{split}_{name}"
            for mode in ("sampled", "full"):
                assert bound[0][name] - 1e-9 <= metrics[mode][key] <= bound[1][name] + 1e-9, (key, mode, bound)
        if cpu_kind == "fp32":  # the two paths agree in fp32 but for a near-tie their float noise may flip (one
            # pair of a positive and a negative moves the AUC by 1 / (positives x negatives): 1.6e-6 seen here)
            assert all(metrics["sampled"][k] == pytest.approx(metrics["full"][k], abs=1e-5) for k in metrics["full"]), \
                {k: (metrics["sampled"][k], metrics["full"][k]) for k in metrics["full"]}


def _partitioned_link_worker(rank: int, world: int, port: int, cfg, folder: str) -> None:
    from hpcgnn.dist import process_group
    from hpcgnn.tasks import open_store

    torch.set_num_threads(1)
    env = local_rank_env(rank, world, port)
    with process_group(env, cfg.dist, torch.device("cpu")):
        store = open_store(cfg, env)
        batches = []
        for batch in train_batches(store, 1):  # every step of an epoch, prefetched: the exchanges of both ranks meet
            keep = ("n_id", "edge_index", "edge_label_index", "edge_label", "edge_label_weight", "x", "num_sampled_edges")
            batches.append({k: batch[k] for k in keep} | {"positives": batch.positives, "batch_size": batch.batch_size})
        torch.save({"batches": batches, "own": store.parts.train_pos, "owned_nodes": store.parts.nodes,
                    "steps": store.steps}, f"{folder}/rank{rank}.pt")


@pytest.mark.slow
def test_partitioned_link_batches_are_checked_edge_by_edge_against_the_whole_graph(tmp_path):
    """Two ranks, two METIS parts: every message-passing edge exists in the training graph, no step's target
    edge (or its reverse) passes messages, features are the graph's, and each rank trains on the edges whose
    source it owns, in equal step counts."""
    import torch.multiprocessing as mp

    from hpcgnn.partition import ensure_parts
    from hpcgnn.submit.local import free_port

    cfg = make_config("task=link", "graph=partitioned", "dataset.num_nodes=3000", "dataset.avg_degree=10",
                      f"dataset.root={DATA_ROOT}", "train.batch_size=400", "train.fanouts=[6,4]",
                      "task.negatives=strict", "graph.cache_mb=0.05")
    ensure_parts(cfg.dataset, cfg.graph, 2)
    data = open_link(cfg.dataset)
    edges = _pairs(data.graph.edge_index())
    mp.start_processes(_partitioned_link_worker, args=(2, free_port(25000 + os.getpid() % 3000, 20000, 32767), cfg,
                                                       str(tmp_path)), nprocs=2, start_method="spawn")
    results = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(2)]
    assert len(results[0]["batches"]) == len(results[1]["batches"]) == results[0]["steps"]
    mine = [_pairs(r["own"]) for r in results]
    assert not mine[0] & mine[1] and mine[0] | mine[1] == _pairs(data.train.pos)  # each edge on one rank
    for r, res in enumerate(results):
        owned = set(res["owned_nodes"].tolist())
        assert {a for a, _ in mine[r]} <= owned  # by source
        remote_endpoints = 0
        for b in res["batches"]:
            n_id, idx = b["n_id"], b["edge_label_index"]
            pos = n_id[idx[:, :b["positives"]]]
            assert _pairs(pos) <= mine[r]
            remote_endpoints += sum(int(v) not in owned for v in n_id[: b["batch_size"]])
            src, dst = n_id[b["edge_index"][0]], n_id[b["edge_index"][1]]
            mp_edges = set(zip(src.tolist(), dst.tolist(), strict=True))
            assert mp_edges <= edges
            targets = _pairs(pos)
            assert not mp_edges & (targets | {(d, s) for s, d in targets})
            assert torch.equal(b["x"], data.graph.x[n_id])
            negs = n_id[idx[:, b["positives"]:]]
            valid = b["edge_label_weight"][b["positives"]:] > 0
            assert not any((s, d) in edges or (d, s) in edges for s, d in negs[:, valid].t().tolist())
        assert remote_endpoints > 0  # seeds need not be owned: targets and negatives anywhere are sampled


def test_exact_evaluation_is_taken_on_partitioned_graphs_when_asked():
    from hpcgnn.checks import eval_mode

    assert eval_mode(make_config("task=link", "graph=partitioned", "train.eval_mode=full")) == "full"
    assert eval_mode(make_config("task=link", "graph=partitioned")) == "sampled"  # auto: cheap, as nodes'
    assert eval_mode(make_config("task=link")) == "full"  # auto on a replicated graph: exact


def _full_evaluation_worker(rank: int, world: int, port: int, cfgs: dict, folder: str) -> None:
    from hpcgnn.dist import process_group
    from hpcgnn.stores import exact as ex
    from hpcgnn.tasks import build_task, open_store

    torch.set_num_threads(1)
    ex.FETCH_ROWS, ex.SLICE_EDGES = 97, 1000  # several exchanges and slices
    env = local_rank_env(rank, world, port)
    out = {}
    with process_group(env, next(iter(cfgs.values())).dist, torch.device("cpu")):
        for name, cfg in cfgs.items():
            task = build_task(cfg, env, open_store(cfg, env), torch.device("cpu"))
            torch.manual_seed(0)
            out[name] = task.evaluate(task.build_model())
    torch.save(out, f"{folder}/rank{rank}.pt")


@pytest.mark.slow
@pytest.mark.parametrize("dataset", ["synthetic", "ogbl-citation2"])
def test_exact_evaluation_on_a_partitioned_graph_equals_the_whole_graphs(tmp_path, dataset):
    """train.eval_mode=full with graph=partitioned: 2 gloo ranks compute their own nodes' embeddings layer
    by layer and fetch the embeddings of the pairs' endpoints from their owners; every metric equals one
    process's on the whole graph (pairs of a binary split; positives with their candidate targets)."""
    import torch.multiprocessing as mp

    from hpcgnn.env import RankEnv
    from hpcgnn.partition import ensure_parts
    from hpcgnn.submit.local import free_port
    from hpcgnn.tasks import build_task, open_store

    over = ["task=link", "train.eval_mode=full", "model.hidden_channels=16", "train.fanouts=[5,3]",
            "train.eval_chunk=300", "train.eval_batch_size=250"]  # (several chunks and rounds)
    if dataset == "synthetic":
        over += ["dataset.num_nodes=2000", f"dataset.root={DATA_ROOT}"]
    else:
        write_mini_ogbl(tmp_path, dataset, n=300)
        over += [f"dataset={dataset}", f"dataset.root={tmp_path}", "train.eval_batch_size=100"]
    cfgs = {model: make_config(*over, f"model={model}", "graph=partitioned", "graph.method=metis")
            for model in ("sage", "gcn")}
    ensure_parts(cfgs["sage"].dataset, cfgs["sage"].graph, 2)
    port = free_port(26000 + os.getpid() % 3000, 20000, 32767)
    mp.start_processes(_full_evaluation_worker, args=(2, port, cfgs, str(tmp_path)), nprocs=2, start_method="spawn")
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(2)]
    for model in cfgs:
        cfg = make_config(*over, f"model={model}")
        task = build_task(cfg, RankEnv.from_environ({}), open_store(cfg, RankEnv.from_environ({})),
                          torch.device("cpu"))
        torch.manual_seed(0)
        whole = task.evaluate(task.build_model())
        assert len(whole) >= 4 and ranks[0][model] == ranks[1][model], model
        assert ranks[0][model] == pytest.approx(whole, abs=1e-6), (model, ranks[0][model], whole)


def _pyg_twin(encoder: torch.nn.Module, name: str) -> torch.nn.Module:
    """``encoder``'s weights in PyG's own model, as a full-batch GAE runs it (GCN normalising itself)."""
    import torch_geometric.nn as pyg

    cls = {"sage": pyg.GraphSAGE, "gcn": pyg.GCN}[name]
    twin = cls(encoder.in_channels, encoder.hidden_channels, encoder.num_layers, encoder.out_channels, dropout=0.0)
    twin.load_state_dict(encoder.state_dict())
    return twin


@pytest.mark.parametrize("model", ["sage", "gcn"])
@pytest.mark.parametrize("targets", ["keep", "drop"])
def test_one_step_equals_a_full_batch_gae_step_with_the_same_negatives(tmp_path, model, targets):
    """Fanouts above every degree: one hpcgnn link step is one step of PyG's full-batch GAE (GAE.recon_loss on
    PyG's own encoder) with the batch's negatives: the same loss and gradients. task.target_edges=keep, one batch
    holding every training edge: the GAE's graph is the training graph. drop (the default), 60 training edges: the
    GAE's graph is the training graph without them (both directions), GCN normalised on that graph."""
    from torch_geometric.nn import GAE

    from hpcgnn.env import RankEnv
    from hpcgnn.tasks import build_task, open_store

    over = ["task=link", "dataset.num_nodes=400", "dataset.avg_degree=6", f"dataset.root={DATA_ROOT}",
            f"model={model}", "model.hidden_channels=16", "model.dropout=0", "train.fanouts=[1000,1000]",
            f"task.target_edges={targets}", "task.num_negatives=2", "train.prefetch=0"]
    cfg = make_config(*over, "train.batch_size=100000" if targets == "keep" else "train.batch_size=60")
    env, cpu = RankEnv.from_environ({}), torch.device("cpu")
    store = open_store(cfg, env)
    task = build_task(cfg, env, store, cpu)
    torch.manual_seed(0)
    net = task.build_model()
    batch = next(iter(train_batches(store, 1, task.transform)))
    loss = task.step(net, batch).loss
    loss.backward()

    ends = batch.n_id[batch.edge_label_index]
    pos, neg = ends[:, :batch.positives], ends[:, batch.positives:]
    g = store.graph
    if targets == "keep":
        assert pos.size(1) == store.items.data.train.pos.size(1)  # one batch holds every training edge
    graph = g.edge_index()
    if targets == "drop":
        graph = graph[:, ~torch.isin(graph[0] * g.num_nodes + graph[1],
                                     torch.cat([pos[0] * g.num_nodes + pos[1], pos[1] * g.num_nodes + pos[0]]))]
    twin = GAE(_pyg_twin(net.encoder, model))
    twin.encoder.load_state_dict(net.encoder.state_dict())  # (GAE() re-initialises its encoder)
    twin_loss = twin.recon_loss(twin.encode(g.x.float(), graph), pos, neg)
    twin_loss.backward()
    assert loss.item() == pytest.approx(twin_loss.item(), rel=1e-5), (loss.item(), twin_loss.item())
    mine = dict(net.encoder.named_parameters())
    for name, p in twin.encoder.named_parameters():
        assert torch.allclose(mine[name].grad, p.grad, rtol=1e-4, atol=1e-6), (name, (mine[name].grad - p.grad).abs().max())


@pytest.mark.slow
def test_the_sampled_link_run_does_not_trail_its_full_batch_twin(tmp_path):
    """The link default (task=link: sage, fanouts [10, 5], 512 positives a step, one uniform negative each, lr
    0.003) on a 4000-node synthetic link graph, 10 epochs (about the steps the default run takes on its 20k-node
    graph), against PyG's full-batch GAE on the same split, 300 full-batch steps: at most one AUC point below it
    (benchmarks/link_twin.py measures the default graph itself). One seed of the twin: its seeds 0, 1 and 2 gave
    0.8958, 0.8965 and 0.8958 here, 23-25 s each, so two more would cost most of a minute of CI to move its AUC
    by less than a tenth of the margin (with random-pair validation and test negatives since: seed 0 0.8963, the
    sampled run 0.9118)."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    from link_twin import gae_twin, hpcgnn_run

    over = ["dataset.num_nodes=4000", f"dataset.root={DATA_ROOT}"]
    ours = hpcgnn_run([*over, "train.epochs=10"], str(tmp_path / "run"))["test_auc"]
    cfg = make_config("task=link", *over)
    twin = gae_twin(cfg, 0, 300, eval_every=10)["test_auc"]
    assert ours >= twin - 0.01, (ours, twin)
