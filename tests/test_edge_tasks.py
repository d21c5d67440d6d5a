"""Edge tasks (task=edge): targets on given edges from a files folder, a PyG Data or the synthetic graph; their
kinds (classes, binary labels, values) as a node task's; batches around both ends that leave their targets out;
the decoders; predict, the model file and the producers."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import DATA_ROOT, EXAMPLES, make_config, predict_here, preempted_and_resumed, train_here

from hpcgnn.errors import ConfigError, DatasetError

SMALL = ["task=edge", "train.batch_size=256", "model.hidden_channels=32", "train.precision=fp32",
         "metrics.tensorboard=false"]


def write_edge_task(folder: Path, kind: str = "classification", n: int = 2000, m: int = 4000, deg: int = 8,
                    seed: int = 0, splits: bool = True, signal: float = 2.0) -> dict:
    """A files folder whose nodes have 4 classes and features around them, a homophilous graph, and ``m`` target
    pairs (any two nodes, an edge or not) labelled from their ends: ``classification`` (same class or not),
    ``multilabel`` (same class; each end in the upper half of the classes: three columns, a few unknown) or
    ``regression`` (a weighted sum of the ends' features, and its product's sign, two columns)."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    y = rng.integers(0, 4, n)
    x = (np.eye(4)[y] @ rng.normal(size=(4, 16)) * signal + rng.normal(size=(n, 16))).astype(np.float32)
    src = rng.integers(0, n, n * deg)
    same = rng.random(n * deg) < 0.7
    by_class = [np.flatnonzero(y == c) for c in range(4)]
    dst = np.where(same, [rng.choice(by_class[c]) for c in y[src]], rng.integers(0, n, n * deg))
    pairs = np.stack([rng.integers(0, n, m), rng.integers(0, n, m)])
    pairs[:, : m // 2] = np.stack([src[: m // 2], dst[: m // 2]])  # half of them edges of the graph
    u, v = pairs
    if kind == "classification":
        label = (y[u] == y[v]).astype(np.int64)
    elif kind == "multilabel":
        label = np.stack([y[u] == y[v], y[u] >= 2, y[v] >= 2], 1).astype(np.float32)
        label[rng.random(label.shape) < 0.05] = np.nan
    else:
        w = rng.normal(size=16)
        value = x[u] @ w + 0.5 * (x[v] @ w)
        label = np.stack([value, value * 3 + 10], 1).astype(np.float32)
    ids = {"train": np.arange(n)[: int(n * 0.6)], "val": np.arange(n)[int(n * 0.6): int(n * 0.8)],
           "test": np.arange(n)[int(n * 0.8):]}
    for name, array in (("x", x), ("y", y), ("edge_index", np.stack([src, dst])), ("edge_label_index", pairs),
                        ("edge_label", label), *((f"{s}_idx", i) for s, i in ids.items())):
        np.save(folder / f"{name}.npy", array)
    if splits:
        order = rng.permutation(m)
        for s, part in zip(("train", "val", "test"), np.split(order, [int(m * 0.7), int(m * 0.85)]), strict=True):
            np.save(folder / f"edge_{s}_idx.npy", np.sort(part))
    return {"pairs": pairs, "label": label, "y": y}


def _files(folder: Path, *extra: str) -> list[str]:
    return ["dataset=files", f"dataset.path={folder}", f"dataset.root={folder.parent / 'root'}", *SMALL, *extra]


# ------------------------------------------------------------------ what is refused, at submit and on reading


def test_an_edge_task_where_it_cannot_run_yet_is_refused_naming_the_fix(tmp_path):
    for extra, why in ((["dataset=synthetic_hetero", "model=rgcn"], None),
                       (["dataset=ogbn-arxiv"], r"dataset=ogbn-arxiv \(its edges carry no targets\)"),
                       (["train.sampler=cluster"], "train.sampler=cluster"),
                       (["train.edge_budget=1000"], "train.edge_budget=1000")):
        if why is None:  # (a typed graph's own check speaks first)
            with pytest.raises(ConfigError, match=r"typed graphs \(dataset=synthetic_hetero\) train with task=node "
                                                  r"\(task=edge: a typed files folder or a HeteroData\)"):
                make_config("task=edge", *extra)
            continue
        with pytest.raises(ConfigError, match=rf"task=edge trains on a graph of dataset synthetic, files, pyg, pyg_hetero "
                                              rf"with train.sampler=neighbor so far, not with {why}. HINT: change that"):
            make_config("task=edge", *extra)
    with pytest.raises(ConfigError, match=r"task.decoder='dot' is unknown: use concat, hadamard or a module "
                                          r"of your own \(task.decoder=pkg.module.Class"):
        make_config("task=edge", "task.decoder=dot")
    with pytest.raises(ConfigError, match=r"task.loss=l1 is a regression's loss; task.kind=classification"):
        make_config("task=edge", "task.kind=classification", "task.loss=l1")
    assert make_config("task=edge").task.decoder == "concat"
    with pytest.raises(ConfigError, match=r"not with train.eval_mode=full on a typed graph with model=sage "
                                          r"graph=replicated \(exact: model=rgcn, replicated\). HINT: change that"):
        write_rated_edges(tmp_path / "typed", users=10, items=10)
        make_config("task=edge", "dataset=files", f"dataset.path={tmp_path / 'typed'}", "model=sage",
                    "train.eval_mode=full")


def test_target_files_that_do_not_fit_the_graph_are_refused_naming_the_file(tmp_path):
    from hpcgnn.data import prepare
    from hpcgnn.data.edges import prepare_targets

    folder = tmp_path / "g"
    write_edge_task(folder, n=300, m=200)

    def prepared(**files):
        for name, array in files.items():
            np.save(folder / f"{name}.npy", array)
        cfg = make_config(*_files(folder)).dataset
        prepare(cfg)
        return prepare_targets(cfg)

    good = np.load(folder / "edge_label_index.npy")
    with pytest.raises(DatasetError, match=rf"{folder}/edge_label_index: node ids must be in \[0, 300\) \(the graph's "
                                           r"nodes\), got \[0, 300\]"):
        prepared(edge_label_index=np.concatenate([good[:, :-1], [[0], [300]]], 1))
    with pytest.raises(DatasetError, match=rf"{folder}/edge_label: 199 labels for 200 target edges \(edge_label_index\)"
                                           r": one row per target edge"):
        prepared(edge_label_index=good, edge_label=np.zeros(199, dtype=np.int64))
    np.save(folder / "edge_label.npy", np.ones(200, dtype=np.int64))
    (folder / "edge_val_idx.npy").unlink()
    with pytest.raises(DatasetError, match=rf"{folder}: give all of edge_train_idx, edge_val_idx, edge_test_idx or none "
                                           r"\(a seeded split by dataset.edge_split\); edge_val_idx missing"):
        prepared()
    (folder / "edge_label_index.npy").unlink()
    with pytest.raises(DatasetError, match=r"edge_label_index.npy or edge_label_index.pt is missing .* \(task=edge "
                                           r"reads its targets from edge_label_index \[2, M\] and edge_label"):
        prepared()


@pytest.mark.parametrize("labels, found", [(np.array([-1, 1]), r"-1 and 1, no 0 \(signs\?\): -1 marks a target "
                                                                  r"without a class, so every -1 would be dropped"),
                                           (np.arange(-10, 11), r"integers from -10 to 10")])
def test_integer_edge_labels_that_are_not_class_ids_are_refused_at_submit_naming_the_fix(labels, found, tmp_path,
                                                                                        capsys):
    """SNAP's trust signs (-1/+1) or ratings (-10..10) stored as int64: 'edge task: classification (2 classes,
    inferred ...)', then every rank failed at its first step, IndexError: Target -1 is out of bounds (and -1 as
    'no class' would drop every distrust edge silently). Now: exit 2, one line, before anything runs."""
    from hpcgnn.__main__ import main

    folder = tmp_path / "g"
    write_edge_task(folder, n=300, m=200)
    rng = np.random.default_rng(0)
    np.save(folder / "edge_label.npy", rng.choice(labels, 200).astype(np.int64))
    assert main([*_files(folder, "task=edge"), "launch.procs=1", f"hydra.run.dir={tmp_path / 'run'}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and re.search(rf"edge_label: one integer column of labels holds {found}; classes are ids "
                                       r"0\.\.K-1 \(-1: none\)\. HINT: remap them to 0\.\.K-1 \(signs -1/\+1 as 0/1\), "
                                       r"or store them as floats and give task.kind=regression", err[0]), err
    for kind in ("classification", "regression"):  # (explicit kinds: the same refusal, or the float hint)
        assert main([*_files(folder, "task=edge", f"task.kind={kind}"), "launch.procs=1",
                     f"hydra.run.dir={tmp_path / 'run'}"]) == 2
        line = capsys.readouterr().err.strip()
        assert ("store the labels as floats" if kind == "regression" else "remap them to 0..K-1") in line, line


def test_a_batch_leaves_its_target_edges_out_in_both_directions_and_its_degrees_count_them():
    from hpcgnn.data.edges import EdgeTargets, target_edges_in
    from hpcgnn.data.graph import Graph, csr_has_edge
    from hpcgnn.sampling import CSRNeighborSampler
    from hpcgnn.sampling.link import EdgeTargetSampler

    rng = np.random.default_rng(3)
    n = 200
    ei = torch.from_numpy(rng.integers(0, n, (2, 3000)))
    ei = torch.cat([ei, ei.flip(0)], 1)
    empty = torch.empty(0, dtype=torch.long)
    g = Graph.from_edge_index(ei, n, torch.zeros(n, 1), torch.zeros(n, dtype=torch.long), empty, empty, empty, 1)
    index = torch.cat([g.edge_index()[:, :40].flip(0), torch.tensor([[0, 1], [2, 3]])], 1)  # edges, and two pairs
    label = torch.arange(index.size(1))
    has = csr_has_edge(g.rowptr, g.col)
    node = CSRNeighborSampler(g.rowptr, g.col, (50, 50))
    items = torch.arange(index.size(1))
    place, reverse = (torch.from_numpy(a) for a in target_edges_in(g, index.numpy()))
    assert torch.equal(place >= 0, has(index[0], index[1])) and torch.equal(reverse, has(index[1], index[0]))
    assert torch.equal(g.col[g.rowptr[index[1]] + place.clamp(min=0)][place >= 0], index[0][place >= 0])
    targets = EdgeTargets(index, label, {}, {}, place, reverse)
    dropped = EdgeTargetSampler(node, targets, drop_targets=True).sample(items, torch.Generator())
    kept = EdgeTargetSampler(node, targets, drop_targets=False).sample(items, torch.Generator())

    def joined(out) -> int:
        s, d = out.targets["edge_label_index"]
        keys = set((s * 100000 + d).tolist()) | set((d * 100000 + s).tolist())
        src, dst = out.edge_index
        return sum(k in keys for k in (src * 100000 + dst).tolist())

    assert joined(kept) > 0 and joined(dropped) == 0
    assert torch.equal(dropped.targets["edge_label"], label)
    seeds = dropped.n_id[: dropped.batch_size]
    s, d = dropped.targets["edge_label_index"]
    assert torch.equal(seeds[s], index[0]) and torch.equal(seeds[d], index[1])
    want = torch.zeros(dropped.n_id.numel(), dtype=torch.long)  # each target's edge in each direction the graph has
    for a, b in index.t().tolist():
        want[int(torch.searchsorted(seeds, torch.tensor(b)))] += int(has(torch.tensor([a]), torch.tensor([b])))
        want[int(torch.searchsorted(seeds, torch.tensor(a)))] += int(has(torch.tensor([b]), torch.tensor([a])))
    assert torch.equal(dropped.absent_in_degree, want)


# ------------------------------------------------------------------ training, evaluation and predict


@pytest.mark.slow
def test_an_edge_regression_learns_in_its_units_and_predict_gives_them_back(tmp_path):
    """Two float columns: MSE on standardised values, RMSE in the labels' own units far below the spread of the
    values (predicting the training mean); predict writes values.npy in those units and scores the run's RMSE; the
    model file rebuilds as an EdgeModel; export gives its encoder."""
    import hpcgnn
    from hpcgnn.models import EdgeModel

    made = write_edge_task(tmp_path / "g", "regression")
    s = train_here(*_files(tmp_path / "g", "train.epochs=12", "task.decoder=hadamard"), run_dir=tmp_path / "run")
    assert (s["task"], s["metric"], s["kind"], s["lower_is_better"]) == ("edge", "val_rmse", "regression", True)
    test = np.load(tmp_path / "g" / "edge_test_idx.npy")
    spread = float(np.sqrt(((made["label"][test] - made["label"][test].mean(0)) ** 2).mean()))
    assert s["test"] < 0.5 * spread, (s["test"], spread)
    p = predict_here(tmp_path / "run")
    out = Path(p["run_dir"])
    assert p["value"] == pytest.approx(s["test"], rel=1e-5) and p["of"] == "target edges"
    ids, values = np.load(out / "ids.npy"), np.load(out / "values.npy")
    assert np.array_equal(ids, np.sort(test)) and values.shape == (test.size, 2)
    rmse = float(np.sqrt(((values - made["label"][ids]) ** 2).mean()))
    assert rmse == pytest.approx(s["test"], rel=1e-4)
    # the pairs of a file (the test targets', [P, 2], then two pairs that are no target) predicted as the targets
    # are, exactly: the same values as the test split's, bit for bit; no labels, no metric
    np.save(tmp_path / "cand.npy", np.concatenate([made["pairs"][:, ids].T, [[0, 1], [5, 5]]]))
    exact = predict_here(tmp_path / "run", "mode=full")
    p = predict_here(tmp_path / "run", f"pairs={tmp_path / 'cand.npy'}", "mode=full")
    assert (p["of"], p["rows"], p["split"], p["metric"], p["value"]) == ("pairs", test.size + 2, "all", None, None)
    out = tmp_path / "run" / "predict" / "predictions-cand-best"
    assert p["run_dir"] == str(out) and np.array_equal(np.load(out / "ids.npy"), np.arange(test.size + 2))
    assert np.array_equal(np.load(out / "values.npy")[:-2], np.load(Path(exact["run_dir"]) / "values.npy"))
    assert not list(out.glob(".pairs-*"))  # (the pairs found in the graph, once per node: gone with the job)
    # another file into the same folder: its own pairs (the pairs found before are keyed by the file), reversed
    np.save(tmp_path / "other.npy", np.concatenate([made["pairs"][:, ids].T, [[0, 1], [5, 5]]])[::-1].copy())
    again = predict_here(tmp_path / "run", f"pairs={tmp_path / 'other.npy'}", "mode=full", f"out={out}")
    assert again["rows"] == test.size + 2
    assert np.array_equal(np.load(out / "values.npy")[2:][::-1], np.load(Path(exact["run_dir"]) / "values.npy"))
    model = hpcgnn.load_model(tmp_path / "run")
    assert isinstance(model, EdgeModel) and model.score(torch.zeros(3, 32), torch.zeros(3, 32)).shape == (3, 2)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["classification", "regression"])
def test_each_edge_kind_reaches_its_full_batch_twins_metric(kind, tmp_path):
    """Edge classification (whether both ends share a class, which their features tell weakly and their homophilous
    neighbourhoods more) and edge regression (a weighted sum of the ends' features): hpcgnn's sampled training
    (fanouts 15, 10: about every neighbour at mean degree 8; 200 epochs of 3 batches of 1024 targets, as many steps
    as the twin's 600 at the same learning rate; exact evaluation every epoch), over two seeds, reaches the test
    metric of its full-batch PyG twin (benchmarks/edge_twin.py, evaluated as often) within the twin's standard
    deviation over four seeds (each twin 8 s here, hpcgnn's 11 s). (Seen: each of six seeds of hpcgnn does, alone,
    against six of the twin's, so two seeds' mean does; with batches of 512 and the twin evaluated less often than
    hpcgnn, one seed in nine fell 0.03 below the rest, and three seeds' mean below the bar.)"""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    from edge_twin import edge_twin

    write_edge_task(tmp_path / "g", kind, signal=0.3)
    ours = [train_here(*_files(tmp_path / "g", "train.epochs=200", "train.batch_size=1024", "train.fanouts=[15,10]",
                                "train.eval_mode=full", "train.eval_every=1", "train.lr=0.003", f"train.seed={seed}"),
                       run_dir=tmp_path / f"run{seed}") for seed in range(2)]
    assert {(s["metric"], s["kind"]) for s in ours} == {("val_acc" if kind == "classification" else "val_rmse", kind)}
    twins = [edge_twin(tmp_path / "g", seed, steps=600, lr=0.003, eval_every=3) for seed in range(4)]
    mine, mean, std = float(np.mean([s["test"] for s in ours])), float(np.mean(twins)), float(np.std(twins))
    print(f"edge {kind}: hpcgnn {mine:.4f}, full-batch twin {mean:.4f} +- {std:.4f}")
    assert mine <= mean + std if kind == "regression" else mine >= mean - std, (mine, mean, std)


@pytest.mark.slow
def test_an_edge_multilabel_task_with_unknown_labels_learns_and_scores_rocauc_exactly(tmp_path):
    """Three binary columns, 5% unknown: BCE over the known; ROC-AUC well above chance, exact evaluation (every
    node's embedding) and sampled evaluation agreeing where the targets' ends' neighbourhoods are whole."""
    write_edge_task(tmp_path / "g", "multilabel")
    s = train_here(*_files(tmp_path / "g", "train.epochs=6"), run_dir=tmp_path / "run")
    assert (s["metric"], s["kind"]) == ("val_rocauc", "multilabel") and s["test"] > 0.8, s["test"]
    full = predict_here(tmp_path / "run", "mode=full")
    assert full["mode"] == "full" and full["value"] > 0.8 and np.load(Path(full["run_dir"]) / "probs.npy").shape[1] == 3


@pytest.mark.slow
def test_the_synthetic_edge_task_learns_and_resumes_bitwise_after_a_preemption(tmp_path):
    """The embedded default's edge task (same-class pairs of the synthetic graph): far above chance; preempted
    mid-epoch and resumed, the same parameters as the run left alone."""
    over = ["task=edge", "dataset.num_nodes=20000", "train.epochs=4", f"dataset.root={DATA_ROOT}",
            "train.precision=fp32", "metrics.tensorboard=false"]
    whole, resumed = preempted_and_resumed(*over, step=5, folder=tmp_path)
    assert whole["test"] > 0.75, whole["test"]
    assert resumed["param_checksums"] == whole["param_checksums"] and resumed["test"] == whole["test"]


@pytest.mark.slow
def test_a_decoder_of_the_users_own_is_built_and_trained(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(EXAMPLES["PYTHONPATH"].split(":")[0])
    write_edge_task(tmp_path / "g", "classification", n=600, m=1000)
    s = train_here(*_files(tmp_path / "g", "train.epochs=2", "task.decoder=my_gnn.BilinearDecoder"),
                   run_dir=tmp_path / "run")
    record = torch.load(tmp_path / "run" / "model" / "best.pt", weights_only=True)
    assert record["decoder"] == "my_gnn.BilinearDecoder" and any(k.startswith("decoder.bilinear") for k in
                                                                    record["state_dict"])
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["task"] == "edge" and s["test"] > 0
    with pytest.raises(ConfigError, match=r"task.decoder=my_gnn.Nothing does not name a torch.nn.Module class\. "
                                          r"HINT: use concat, hadamard, or a class importable where the job runs"):
        train_here(*_files(tmp_path / "g", "train.epochs=1", "task.decoder=my_gnn.Nothing"), run_dir=tmp_path / "r2")


def rated_graph(given: bool = False):
    """A PyG Data whose edges carry values (``edge_label``, one per edge of ``edge_index``), or (``given``) whose
    targets are 800 other pairs (``edge_label_index``) with their own masks."""
    from torch_geometric.data import Data

    g = torch.Generator().manual_seed(0)
    x = torch.randn(500, 16, generator=g)
    ei = torch.randint(0, 500, (2, 3000), generator=g)
    y = torch.randint(0, 3, (500,), generator=g)
    masks = {f"{s}_mask": torch.arange(500) % 5 == k for k, s in enumerate(("train", "val", "test"))}
    if not given:
        return Data(x=x, edge_index=ei, y=y, edge_label=(x[ei[0]] * x[ei[1]]).sum(1), **masks)
    pairs = torch.randint(0, 500, (2, 800), generator=g)
    split = torch.arange(800) % 10
    return Data(x=x, edge_index=ei, y=y, edge_label_index=pairs, edge_label=(x[pairs[0]] - x[pairs[1]]).sum(1),
                edge_train_mask=split < 7, edge_val_mask=split == 7, edge_test_mask=split >= 8, **masks)


def test_a_pyg_datas_edge_labels_are_the_targets_with_its_masks_or_a_seeded_split(tmp_path):
    from hpcgnn.data import open_graph, prepare
    from hpcgnn.data.edges import open_targets, prepare_targets

    for target, count, train in (("test_edge_tasks.rated_graph", 3000, None),
                                 ("test_edge_tasks.rated_graph_given", 800, 560),
                                 ("test_edge_tasks.rated_graph_unlabelled", 800, 560)):
        cfg = make_config("task=edge", "dataset=pyg", f"dataset._target_={target}", f"dataset.root={tmp_path}").dataset
        prepare(cfg)
        prepare_targets(cfg)
        t = open_targets(cfg)
        assert t.count == count and t.labels["dtype"] == "float" and t.labels["columns"] == 0
        sizes = [t.split(s).numel() for s in ("train", "val", "test")]
        assert sum(sizes) == count and (train is None or sizes[0] == train)
        if train is None:  # seeded by dataset.edge_split: about 85/5/10
            assert 0.8 < sizes[0] / count < 0.9
    # A Data without node labels (transactions: the labels are the edges'): its nodes get none, as a folder's
    g = open_graph(make_config("task=edge", "dataset=pyg", "dataset._target_=test_edge_tasks.rated_graph_unlabelled",
                               f"dataset.root={tmp_path}").dataset)
    assert g.y.shape == (500,) and bool((g.y == -1).all()) and g.train_idx.numel() == 0
    with pytest.raises(DatasetError, match=r"dataset._target_=test_edge_tasks.rated_graph_unlabelled: its graph has no "
                                           r"labels \(y\): node tasks need them. HINT: task=link trains on the edges "
                                           r"alone; task=edge on labels of edges \(edge_label\)"):
        prepare(make_config("dataset=pyg", "dataset._target_=test_edge_tasks.rated_graph_unlabelled",
                            f"dataset.root={tmp_path / 'r2'}").dataset)


def test_targets_prepared_by_two_nodes_at_once_keep_the_first_ones_folder(tmp_path, monkeypatch):
    """Each node's local rank 0 prepares the targets where they are not yet (a shared file system: several at once).
    A writer that finds another's folder in place when it commits keeps that one, which nodes may be reading already
    (before, it removed the folder in place and renamed its own there: on a two-node SLURM job the second node's
    rename, after the first's, failed, and the job with it)."""
    import os

    import hpcgnn.data.edges as edges
    from hpcgnn.data import prepare

    cfg = make_config("task=edge", "dataset=pyg", "dataset._target_=test_edge_tasks.rated_graph_given",
                      f"dataset.root={tmp_path}").dataset
    prepare(cfg)
    check, first = edges._check_index, {}

    def another_node_first(*args):  # another node's writer commits while this one prepares the same targets
        if not first:
            first["folder"] = None  # (its own call does not race again)
            first["folder"] = edges.prepare_targets(cfg)
            first["inode"] = os.stat(first["folder"]).st_ino
        return check(*args)

    monkeypatch.setattr(edges, "_check_index", another_node_first)
    folder = edges.prepare_targets(cfg)
    assert folder == first["folder"] and os.stat(folder).st_ino == first["inode"]  # (the first one's, not replaced)
    assert edges.open_targets(cfg).count == 800 and not list(folder.parent.glob(".edge-targets-*"))


def transactions():
    """A multigraph: 400 transactions among 60 accounts (pairs repeat), each with its own features and label."""
    from torch_geometric.data import Data

    g = torch.Generator().manual_seed(0)
    ei = torch.randint(0, 60, (2, 400), generator=g)
    attr = torch.randn(400, 3, generator=g)
    return Data(x=torch.randn(60, 4, generator=g), edge_index=ei, edge_attr=attr, edge_label=(attr[:, 0] > 0).long())


def test_a_multigraphs_targets_each_read_their_own_edge_features(tmp_path, caplog):
    """Parallel edges are one edge of the prepared graph (its first features; the log says how many were merged).
    Targets that are the graph's edges keep their own features apart where pairs repeat: each target's batch row
    (sampled, and exact evaluation's) holds its own, not its pair's first edge's."""
    import logging

    from hpcgnn.data import prepare
    from hpcgnn.data.edges import open_targets, prepare_targets
    from hpcgnn.env import RankEnv
    from hpcgnn.tasks import open_store

    data = transactions()
    ei, attr = data.edge_index, data.edge_attr
    repeats = 400 - torch.unique(ei[0] * 60 + ei[1]).numel()
    assert repeats > 0
    over = ["task=edge", "dataset=pyg", "dataset._target_=test_edge_tasks.transactions", f"dataset.root={tmp_path}"]
    cfg = make_config(*over).dataset
    with caplog.at_level(logging.INFO, logger="hpcgnn.data"):
        prepare(cfg)
        prepare_targets(cfg)
    assert (f"dataset=pyg: {repeats} of its 400 edges repeat a (source, target) pair given before, each merged into "
            f"the first (the graph holds one edge per pair, with the first one's features") in caplog.text
    assert (f"edge targets of pyg: {repeats} of the 400 repeat an earlier target's (source, target) pair, which the "
            "graph holds as one edge; each target's own edge features are kept with the targets") in caplog.text
    assert torch.equal(open_targets(cfg).own, attr)
    store = open_store(make_config(*over, "train.precision=fp32"), RankEnv.from_environ({}))
    items = torch.arange(400)
    out = store.train_sampler.sample(items, torch.Generator().manual_seed(0))
    assert torch.equal(out.targets["edge_label_attr"], attr) and "edge_label_e_id" not in out.targets
    assert torch.equal(store.items.pair_features(items), attr)  # (exact evaluation's)
    first = {}
    for i, pair in enumerate(ei.T.tolist()):
        first.setdefault(tuple(pair), i)
    parallel = [i for i, pair in enumerate(ei.T.tolist()) if first[tuple(pair)] != i]
    assert not torch.equal(attr[parallel], attr[[first[tuple(ei[:, i].tolist())] for i in parallel]])


def rated_graph_given():
    return rated_graph(given=True)


def rated_graph_unlabelled():
    data = rated_graph(given=True)
    del data.y
    return data


@pytest.mark.slow
def test_an_edge_task_needs_no_node_labels(tmp_path):
    """A folder of transactions: nodes with features, edges, and labelled target edges, but no node labels nor
    node splits: the edge task trains (its nodes are unlabelled, -1); a node task on it names the missing y."""
    write_edge_task(tmp_path / "g", "classification", n=800, m=1500)
    for name in ("y", "train_idx", "val_idx", "test_idx"):
        (tmp_path / "g" / f"{name}.npy").unlink()
    s = train_here(*_files(tmp_path / "g", "train.epochs=3"), run_dir=tmp_path / "run")
    assert s["task"] == "edge" and s["test"] > 0.8, s["test"]
    from hpcgnn.data import prepare

    with pytest.raises(DatasetError, match=r"y.npy or y.pt is missing"):
        prepare(make_config("dataset=files", f"dataset.path={tmp_path / 'g'}", f"dataset.root={tmp_path / 'r2'}").dataset)


# ------------------------------------------------------------------ a typed graph: a relation's edges as the targets


RATES, REV = ("user", "rates", "item"), ("item", "rev_rates", "user")


def write_rated_edges(folder: Path, users: int = 600, items: int = 800, deg: int = 8, noise: float = 0.3,
                      seed: int = 0) -> dict:
    """A typed folder (users rate items; no node labels) whose ratings are an edge task's targets, labelled 1 where
    the rating user's hidden class is its item's (the first feature of each node tells its class, ``noise``
    aside); split seeded by dataset.edge_split."""
    rng = np.random.default_rng(seed)
    cls = {"user": rng.integers(0, 2, users), "item": rng.integers(0, 2, items)}
    src, dst = rng.integers(0, users, items * deg), np.repeat(np.arange(items), deg)
    for t, c in cls.items():
        (folder / "nodes" / t).mkdir(parents=True, exist_ok=True)
        x = rng.normal(scale=noise, size=(c.size, 8)).astype(np.float32)
        x[:, 0] += 2 * c - 1
        np.save(folder / "nodes" / t / "x.npy", x)
    rel = folder / "edges" / "__".join(RATES)
    rel.mkdir(parents=True, exist_ok=True)
    label = (cls["user"][src] == cls["item"][dst]).astype(np.int64)
    np.save(rel / "edge_index.npy", np.stack([src, dst]))
    np.save(rel / "edge_label.npy", label)
    return {"index": np.stack([src, dst]), "label": label}


def test_a_typed_folders_relation_gives_the_targets_found_in_its_csr(tmp_path):
    """The targets are the edges of the one relation whose folder holds edge_label, in its two types' own ids; each
    one's place among its item's in-edges of the relation names its edge, and its reverse is in rev_rates."""
    from hpcgnn.data import open_typed, prepare
    from hpcgnn.data.edges import open_targets, prepare_targets

    given = write_rated_edges(tmp_path / "g", users=50, items=60)
    cfg = make_config("task=edge", "dataset=files", f"dataset.path={tmp_path / 'g'}",
                      f"dataset.root={tmp_path / 'root'}").dataset
    prepare(cfg)
    prepare_targets(cfg)
    t, g = open_targets(cfg), open_typed(cfg)
    assert t.relation == RATES and t.count == given["index"].shape[1]
    assert np.array_equal(t.index.numpy(), given["index"]) and np.array_equal(t.label.numpy(), given["label"])
    assert sorted(torch.cat([t.split(s) for s in ("train", "val", "test")]).tolist()) == list(range(t.count))
    rows = g.rowptr[RATES].index_select(0, t.index[1]) + t.place
    assert bool((t.place >= 0).all()) and torch.equal(g.col[RATES].index_select(0, rows), t.index[0])
    assert bool(t.reverse.all())
    assert g.y.numel() == 60 and bool((g.y == -1).all())  # (no node labels: the relation's target type, unknown)


def test_a_typed_folder_without_one_labelled_relation_is_refused_naming_it(tmp_path):
    from hpcgnn.data import prepare
    from hpcgnn.data.files import DatasetFileError

    write_rated_edges(tmp_path / "g", users=20, items=30)
    (tmp_path / "g" / "edges" / "__".join(RATES) / "edge_label.npy").unlink()
    with pytest.raises(DatasetFileError, match=r"edges: task=edge on a typed graph takes one relation's edges as its "
                                               r"targets: exactly one relation folder holds edge_label.npy \(a row per "
                                               r"edge of its edge_index\); found none"):
        prepare(make_config("task=edge", "dataset=files", f"dataset.path={tmp_path / 'g'}",
                            f"dataset.root={tmp_path / 'root'}").dataset)


def test_a_typed_edge_batch_leaves_its_targets_out_in_both_directions(tmp_path):
    """Around both ends of its targets (users and items, each type's seeds first): no target pair is an edge of the
    batch in rates or rev_rates (task.target_edges=keep: some are), per-hop counts add up to what is kept, and
    each pair's local ends are its nodes."""
    from hpcgnn.env import RankEnv
    from hpcgnn.sampling.loader import BatchLoader
    from hpcgnn.tasks import open_store

    write_rated_edges(tmp_path / "g", users=100, items=150)
    over = ["task=edge", "dataset=files", f"dataset.path={tmp_path / 'g'}", f"dataset.root={tmp_path / 'root'}",
            "model=rgcn", "train.fanouts=[25,10]"]
    found = {}
    for drop in ("drop", "keep"):
        store = open_store(make_config(*over, f"task.target_edges={drop}"), RankEnv.from_environ({}))
        items = store.train_batches(0)[0]
        batch = next(iter(BatchLoader(store.features, store.train_sampler, items, items.numel())))
        pairs = store.items.targets.index[:, items]
        ends = torch.stack([batch["user"].n_id[batch.edge_label_index[0]], batch["item"].n_id[batch.edge_label_index[1]]])
        assert torch.equal(ends, pairs) and batch.positives == items.numel()
        targets = set(map(tuple, pairs.T.tolist()))
        for rel, flip in ((RATES, False), (REV, True)):
            ei = batch[rel].edge_index
            assert sum(batch.num_sampled_edges_dict[rel]) == ei.size(1)
            src, dst = batch[rel[0]].n_id[ei[0]], batch[rel[2]].n_id[ei[1]]
            edges = set(map(tuple, (torch.stack([dst, src]) if flip else torch.stack([src, dst])).T.tolist()))
            found[(drop, rel)] = len(targets & edges)
    assert found[("drop", RATES)] == found[("drop", REV)] == 0
    assert found[("keep", RATES)] > 0 and found[("keep", REV)] > 0


@pytest.mark.slow
@pytest.mark.parametrize("model", [["model=rgcn"], ["model=custom", "model._target_=my_gnn.HeteroSAGE"]])
def test_a_typed_edge_task_learns_what_its_ends_tell_and_predict_says_it_again(model, tmp_path, monkeypatch):
    """Ratings labelled by whether the user's class is the item's (which each end's features tell): R-GCN and a
    relational model of one's own reach 0.95 test accuracy; predict and load_model give the run's back."""
    import hpcgnn

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent.parent / "examples"))  # (my_gnn)
    given = write_rated_edges(tmp_path / "g")
    run = tmp_path / "run"
    s = train_here("task=edge", "dataset=files", f"dataset.path={tmp_path / 'g'}", *model, "train.epochs=5",
                   "model.hidden_channels=32", "metrics.tensorboard=false", f"dataset.root={DATA_ROOT}", run_dir=run)
    assert s["test"] >= 0.95, s["test"]
    assert predict_here(run, "trust=true")["value"] == s["test"]
    assert hpcgnn.load_model(run, trust_run=True).relation == RATES
    if model == ["model=rgcn"]:  # the pairs of a file (users', items': each end in its type's ids) as the targets
        whole = Path(predict_here(run, "mode=full")["run_dir"])
        ids = np.load(whole / "ids.npy")
        np.save(tmp_path / "cand.npy", np.concatenate([given["index"][:, ids].T, [[0, 0]]]))
        p = predict_here(run, f"pairs={tmp_path / 'cand.npy'}", "mode=full")
        probs = np.load(Path(p["run_dir"]) / "probs.npy")
        assert p["rows"] == ids.size + 1 and np.array_equal(probs[:-1], np.load(whole / "probs.npy"))


@pytest.mark.slow
def test_a_preempted_typed_edge_task_resumes_bitwise(tmp_path):
    """Preempted mid-epoch and resumed, a typed edge task's parameters equal the uninterrupted run's bit for bit."""
    write_rated_edges(tmp_path / "g", users=200, items=300)
    over = ["task=edge", "dataset=files", f"dataset.path={tmp_path / 'g'}", "model=rgcn", "train.epochs=2",
            "train.batch_size=128", "train.precision=fp32", "metrics.tensorboard=false", f"dataset.root={DATA_ROOT}"]
    whole, cut = preempted_and_resumed(*over, step=5, folder=tmp_path)
    assert cut["param_checksums"] == whole["param_checksums"] and cut["test"] == whole["test"]


def rated_hetero(users: int = 300, items: int = 400, deg: int = 8) -> HeteroData:  # noqa: F821
    """(for dataset=pyg_hetero) :func:`write_rated_edges`' graph as a HeteroData: the ratings' edge_label, no node
    labels, a seeded split."""
    import tempfile

    from torch_geometric.data import HeteroData

    with tempfile.TemporaryDirectory() as folder:
        given = write_rated_edges(Path(folder), users, items, deg)
        data = HeteroData()
        for t in ("user", "item"):
            data[t].x = torch.from_numpy(np.load(Path(folder) / "nodes" / t / "x.npy"))
    data[RATES].edge_index = torch.from_numpy(given["index"])
    data[RATES].edge_label = torch.from_numpy(given["label"])
    return data


@pytest.mark.slow
def test_a_heterodatas_labelled_relation_gives_an_edge_tasks_targets(tmp_path):
    """dataset=pyg_hetero with task=edge: the one relation with edge_label gives the targets (no node labels
    needed); R-GCN learns them."""
    from hpcgnn.data import prepare
    from hpcgnn.data.edges import open_targets, prepare_targets

    over = ["task=edge", "dataset=pyg_hetero", "dataset._target_=test_edge_tasks.rated_hetero",
            "dataset.to_undirected=true", "model=rgcn"]
    cfg = make_config(*over, f"dataset.root={tmp_path / 'root'}")
    prepare(cfg.dataset)
    prepare_targets(cfg.dataset)
    t, data = open_targets(cfg.dataset), rated_hetero()
    assert t.relation == RATES and torch.equal(t.index, data[RATES].edge_index)
    assert torch.equal(t.label, data[RATES].edge_label) and bool(t.reverse.all())
    s = train_here(*over, "train.epochs=8", "model.hidden_channels=32", "metrics.tensorboard=false",
                   f"dataset.root={tmp_path / 'root'}", run_dir=tmp_path / "run")
    assert s["test"] >= 0.9, s["test"]
