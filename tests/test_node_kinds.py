"""Node tasks of every kind (hpcgnn.labels, hpcgnn.tasks.node): classification, multi-label and regression, the kind
inferred from the labels or set, their losses and metrics, and what refuses labels that do not fit."""

from __future__ import annotations

import json
import logging
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import make_config, run_cli, summary_of

from hpcgnn.errors import ConfigError, DatasetError
from hpcgnn.labels import Target, profile, resolve, stored
from hpcgnn.tasks import node_metrics
from hpcgnn.tasks.node import MultiLabel, Ordinal, Regression

SPLITS = {"train": np.arange(0, 60), "val": np.arange(60, 80), "test": np.arange(80, 100)}


def _target(y, kind: str = "auto", loss: str = "auto", splits=SPLITS) -> Target:
    y = stored(np.asarray(y), "y.npy")
    return resolve(profile(y, splits), kind, loss, 0, "y.npy")


# ------------------------------------------------------------------ the kind, from the labels or task.kind


def test_the_kind_follows_the_labels_where_they_are_unambiguous():
    rng = np.random.default_rng(0)
    classes = _target(rng.integers(0, 4, 100))
    assert (classes.kind, classes.width, classes.metric, classes.inferred) == ("classification", 4, "acc", True)
    binary = rng.integers(0, 2, (100, 6)).astype(np.float32)
    binary[3, 2] = np.nan
    ml = _target(binary)
    assert (ml.kind, ml.width, ml.metric, ml.lower_is_better) == ("multilabel", 6, "rocauc", False)
    marked = rng.integers(-1, 2, (100, 3))  # integer multi-label, -1 unknown: stored as NaN
    assert _target(marked).kind == "multilabel" and np.isnan(stored(marked, "y")[marked == -1]).all()
    values = rng.normal(5.0, 2.0, 100).astype(np.float32)
    reg = _target(values)
    assert (reg.kind, reg.width, reg.column, reg.loss, reg.metric, reg.lower_is_better) == \
        ("regression", 1, True, "mse", "rmse", True)
    assert reg.mean[0] == pytest.approx(values[:60].mean(), rel=1e-6) and \
        reg.std[0] == pytest.approx(values[:60].std(), rel=1e-5)  # the training split's alone
    wide = _target(rng.normal(size=(100, 3)), loss="huber")
    assert (wide.kind, wide.width, wide.column, wide.loss) == ("regression", 3, False, "huber")
    assert "inferred from y: 6 columns of 0 and 1" in ml.describe()


def test_labels_at_odds_with_the_kind_or_with_themselves_are_refused_naming_the_fix():
    rng = np.random.default_rng(0)
    with pytest.raises(DatasetError, match=r"^y.npy: task.kind=classification takes one integer class per node; "
                                           r"these labels are float \[N, 4\]. HINT: task.kind=multilabel"):
        _target(rng.integers(0, 2, (100, 4)).astype(np.float32), "classification")
    with pytest.raises(DatasetError, match=r"^y.npy: task.kind=multilabel takes labels of 0 and 1 \(unknown: NaN, "
                                           r"or -1 in integer labels\); these are float \[N, 3\] with other values"):
        _target(np.full((100, 3), 0.5, np.float32), "multilabel")
    with pytest.raises(DatasetError, match=r"labels of 3 integer columns other than 0, 1 and -1 are neither classes "
                                           r"nor binary labels. HINT: task.kind=regression"):
        _target(rng.integers(0, 5, (100, 3)))
    assert _target(rng.integers(0, 5, (100, 3)), "regression").kind == "regression"
    val_unknown = rng.normal(size=100).astype(np.float32)
    val_unknown[60:80] = np.nan
    with pytest.raises(DatasetError, match=r"^y.npy: the val split has no known value \(every target unknown: NaN\): it "
                                           r"cannot be scored"):
        _target(val_unknown)
    with pytest.raises(DatasetError, match=r"inf \(NaN marks an unknown value; inf is none\)"):
        stored(np.array([1.0, np.inf]), "y.npy")
    for overrides, message in CONFIG_REFUSALS:
        with pytest.raises(ConfigError, match=message):
            make_config(*overrides)


CONFIG_REFUSALS = [  # (overrides, the one line that refuses them)
    (["task.kind=classification", "task.loss=l1"], r"task.loss=l1 is a regression's loss; task.kind=classification "
                                                   r"trains with cross-entropy. HINT: drop task.loss, or "
                                                   r"task.kind=regression"),
    (["task.kind=values"], r"task.kind='values' is unknown: use auto, classification, multilabel, regression or "
                           r"ordinal"),
    (["task.kind=ordinal", "task.loss=huber"], r"task.loss=huber is a regression's loss; task.kind=ordinal trains "
                                               r"with binary cross-entropy over its thresholds"),
    (["dataset=ogbn-proteins", "dataset.node_features_from_edges=none"],
     r"dataset=ogbn-proteins has no node features: dataset.node_features_from_edges=mean \(or sum\)"),
    (["dataset=ogbn-arxiv", "dataset.node_features_from_edges=mean"], r"dataset.node_features_from_edges=mean: the edges of "
                                                r"dataset=ogbn-arxiv carry no features \(ogbn-proteins do\)"),
]


# ------------------------------------------------------------------ losses and metrics


def test_unknown_labels_add_nothing_to_the_loss():
    target = Target("multilabel", 3, False, "bce")
    out = torch.randn(4, 3, requires_grad=True)
    y = torch.tensor([[1, 0, float("nan")], [0, 1, 1], [float("nan")] * 3, [1, 1, 0]])
    MultiLabel(target, torch.device("cpu")).mean_loss(out, y).backward()
    assert out.grad[0, 2] == 0 and (out.grad[2] == 0).all() and (out.grad[1] != 0).all()
    reg = Regression(Target("regression", 2, False, "mse", (10.0, -1.0), (2.0, 4.0)), torch.device("cpu"))
    out = torch.zeros(2, 2, requires_grad=True)
    loss = reg.loss(out, torch.tensor([[12.0, float("nan")], [10.0, 3.0]]))  # standardised: (1, ?), (0, 1)
    assert torch.allclose(loss, torch.tensor([1.0, 0.5]))
    loss.sum().backward()
    assert out.grad[0, 1] == 0


def test_ordinal_levels_learn_each_threshold_and_score_in_levels():
    """task.kind=ordinal (never inferred): one integer level per node, K-1 threshold logits; the loss is each
    threshold's BCE summed (nothing for an unknown level), the predicted level counts the thresholds passed, and the
    metrics are MAE in levels (lower is better: it selects the epoch) and accuracy."""
    rng = np.random.default_rng(0)
    levels = rng.integers(0, 5, 100)
    assert _target(levels).kind == "classification"  # (integers are classes unless the kind says ordered)
    target = _target(levels, "ordinal")
    assert (target.kind, target.width, target.metric, target.lower_is_better) == ("ordinal", 4, "mae", True)
    assert target.outputs() == "5 ordered levels"
    with pytest.raises(DatasetError, match=r"^y.npy: task.kind=ordinal takes one integer level per node \(0..K-1 in "
                                           r"order, -1: none\); these labels are float \[N\]"):
        _target(rng.normal(size=100).astype(np.float32), "ordinal")
    with pytest.raises(DatasetError, match=r"one integer column of labels holds integers from -10 to 10; classes are"):
        _target(rng.integers(-10, 11, 100), "ordinal")
    kind = Ordinal(target, torch.device("cpu"))
    out = torch.tensor([[5.0, 5.0, -5.0, -5.0], [-5.0, -5.0, -5.0, -5.0], [5.0, 5.0, 5.0, 5.0]], requires_grad=True)
    y = torch.tensor([2, 3, -1])
    assert Ordinal.level(out).tolist() == [2, 0, 4]
    loss = kind.loss(out, y)
    assert loss[0] < 0.05 and loss[1] > 10 and loss[2] == 0  # right; three thresholds wrong by 5; unknown
    loss.sum().backward()
    assert (out.grad[2] == 0).all()
    assert kind.correct(out, y).tolist() == [1.0, 0.0, 0.0]
    scores = kind.metrics(torch.tensor([[2.0], [0.0], [4.0]]), torch.tensor([[2.0], [3.0], [float("nan")]]))
    assert scores == {"mae": 1.5, "acc": 0.5}
    written = kind.outputs(out.detach())
    assert written["labels"].tolist() == [2, 0, 4] and written["probs"].shape == (3, 4)


def test_multilabel_rocauc_is_ogbs_evaluators_on_the_same_predictions():
    """ogbn-proteins' metric: OGB's Evaluator on the same predictions, unknown entries and tied scores included,
    a label without both classes left out."""
    from ogb.nodeproppred import Evaluator

    rng = np.random.default_rng(3)
    n, c = 500, 112
    true = (rng.random((n, c)) < rng.random(c)).astype(np.float32)
    true[:, 7] = 0  # no positive: left out
    pred = (true * 0.8 + rng.normal(size=(n, c))).astype(np.float32)
    pred[:, :10] = np.round(pred[:, :10], 1)  # ties
    ours = node_metrics.rocauc(torch.from_numpy(pred), torch.from_numpy(true))
    want = Evaluator("ogbn-proteins").eval({"y_true": true, "y_pred": pred})["rocauc"]
    assert abs(ours - want) < 1e-6
    masked = true.copy()
    masked[rng.random((n, c)) < 0.2] = np.nan
    from sklearn.metrics import roc_auc_score  # (OGB's own, per label over the known entries: its nan rule)

    each = [roc_auc_score(masked[~np.isnan(masked[:, i]), i], pred[~np.isnan(masked[:, i]), i]) for i in range(c)
            if (masked[:, i] == 1).any() and (masked[:, i] == 0).any()]
    assert abs(node_metrics.rocauc(torch.from_numpy(pred), torch.from_numpy(masked)) - np.mean(each)) < 1e-6


def test_regression_metrics_are_the_formulas_and_the_same_floats_in_any_row_order():
    rng = np.random.default_rng(1)
    true = rng.normal(3.0, 2.0, (300, 2))
    true[rng.random((300, 2)) < 0.1] = np.nan
    pred = true + rng.normal(0, 0.5, (300, 2))
    pred[np.isnan(pred)] = 0.0
    got = node_metrics.regression(torch.from_numpy(pred).float(), torch.from_numpy(true).float())
    p, t = pred.astype(np.float32).astype(np.float64), true.astype(np.float32).astype(np.float64)
    known = ~np.isnan(t)
    err = (p - t)[known]
    r2 = [1 - ((p[:, k] - t[:, k])[known[:, k]] ** 2).sum() / ((t[known[:, k], k] - t[known[:, k], k].mean()) ** 2).sum()
          for k in range(2)]
    assert got["rmse"] == pytest.approx(math.sqrt((err ** 2).mean()), rel=1e-12)
    assert got["mae"] == pytest.approx(np.abs(err).mean(), rel=1e-12)
    assert got["r2"] == pytest.approx(np.mean(r2), rel=1e-12)
    order = torch.from_numpy(rng.permutation(300))
    again = node_metrics.regression(torch.from_numpy(pred).float()[order], torch.from_numpy(true).float()[order])
    assert again == got  # bit for bit: a partitioned run's rows come in another order
    f1 = node_metrics.micro_f1(torch.tensor([[1.0, -1.0], [2.0, 3.0]]), torch.tensor([[1.0, 0.0], [0.0, float("nan")]]))
    assert f1 == pytest.approx(2 * 1 / (2 * 1 + 1 + 0))


# ------------------------------------------------------------------ whole runs: a graph whose answer is known


def write_folder(folder: Path, kind: str, n: int = 3000, seed: int = 0) -> Path:
    """A files dataset whose targets are a function of each node's own and its in-neighbours' features: 5 binary
    labels (10% unknown) for ``ml``, two values (one scaled far from 0) for ``reg``."""
    rng = np.random.default_rng(seed)
    src, dst = rng.integers(0, n, 6 * n), rng.integers(0, n, 6 * n)
    x = rng.normal(size=(n, 8)).astype(np.float32)
    agg, count = np.zeros((n, 8)), np.zeros(n)
    np.add.at(agg, dst, x[src])
    np.add.at(count, dst, 1)
    agg /= np.maximum(count, 1)[:, None]
    if kind == "ml":
        y = (agg[:, :5] + 0.3 * x[:, :5] > 0).astype(np.float32)
        y[rng.random(y.shape) < 0.1] = np.nan
    else:
        y = np.stack([3 * agg[:, 0] + x[:, 1] + 10, -2 * agg[:, 2] + 0.5 * x[:, 3]], 1).astype(np.float32)
    order = rng.permutation(n)
    folder.mkdir(parents=True, exist_ok=True)
    arrays = {"edge_index": np.stack([src, dst]).astype(np.int64), "x": x, "y": y,
              "train_idx": np.sort(order[: n // 2]), "val_idx": np.sort(order[n // 2: n * 3 // 4]),
              "test_idx": np.sort(order[n * 3 // 4:])}
    for name, a in arrays.items():
        np.save(folder / f"{name}.npy", a)
    return folder


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["ml", "reg"])
def test_each_kind_reaches_its_full_batch_twins_metric(kind, tmp_path, caplog):
    """hpcgnn's sampled training (fanouts 15, 10: about every neighbour of a node of mean degree 6) reaches the test
    metric of PyG's full-batch twin (the same model and loss, 300 steps; benchmarks/real_kinds.py's), within the
    twin's standard deviation over seeds."""
    import sys

    from conftest import DATA_ROOT, train_here

    folder = write_folder(tmp_path / "graph", kind)
    with caplog.at_level(logging.INFO, logger="hpcgnn.tasks.node"):
        ours = train_here("dataset=files", f"dataset.path={folder}", "train.epochs=200", "train.fanouts=[15,10]",
                          "train.eval_mode=full", "train.eval_every=10", "train.batch_size=256",
                          "model.hidden_channels=32", "train.lr=0.01", "train.precision=fp32",
                          "metrics.tensorboard=false", f"dataset.root={DATA_ROOT}", run_dir=tmp_path / "hpcgnn")
    want = {"ml": "node task: multilabel (5 binary labels, inferred from y: 5 columns of 0 and 1)",
            "reg": "node task: regression (2 values, inferred from y: 2 float columns)"}[kind]
    assert want in caplog.text
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    from real_kinds import node_twin

    twins = [node_twin(folder, seed, hidden=32, undirected=False) for seed in range(3)]  # (300 full-batch steps)
    mean, std = float(np.mean(twins)), float(np.std(twins))
    print(f"{kind}: hpcgnn {ours['test']:.4f}, full-batch twin {mean:.4f} +- {std:.4f}")
    if kind == "ml":
        assert ours["metric"] == "val_rocauc" and ours["test"] >= mean - std
    else:
        assert ours["metric"] == "val_rmse" and ours["lower_is_better"] and ours["test"] <= mean + std


@pytest.mark.slow
@pytest.mark.parametrize("kind, mode, producer", [("ml", "replicated", ("train.sampler_procs=2", "train.num_threads=3")),
                                                  ("reg", "partitioned", ("launch.sampler_servers=2",))])
def test_a_kind_trains_bitwise_from_other_producers_and_predicts_in_its_own_terms(kind, mode, producer, tmp_path):
    """Batches from sampler processes (a replicated graph, one rank) or servers (a partitioned one, two ranks) train the same
    parameters as the ranks' own, the float labels travelling with them; predict writes each label's probability
    (multi-label) or the values in the labels' own units (regression), and scores the run's own metric."""
    folder = write_folder(tmp_path / "graph", kind, n=2000)
    over = ["dataset=files", f"dataset.path={folder}", "train.epochs=2", "train.batch_size=128",
            "model.hidden_channels=16", "train.precision=fp32", "metrics.tensorboard=false",
            *(["graph=partitioned", "graph.cache_mb=0.1"] if mode == "partitioned" else ["launch.procs=1"])]
    runs = {}
    for name, extra in (("rank", []), ("producer", producer)):  # (the rank keeps one thread either way)
        res = run_cli(*over, "train.num_threads=1", *extra, cwd=tmp_path / name)
        assert res.returncode == 0, res.stdout + res.stderr
        runs[name] = summary_of(tmp_path / name)
    assert runs["producer"]["param_checksums"] == runs["rank"]["param_checksums"]
    assert runs["producer"]["history"][-1]["loss"] == runs["rank"]["history"][-1]["loss"]
    run = tmp_path / "rank" / "run"
    res = run_cli("predict", str(run), cwd=tmp_path / "predict")
    assert res.returncode == 0, res.stdout + res.stderr
    out = next((run / "predict").iterdir())
    ids = np.load(out / "ids.npy")
    y = np.load(folder / "y.npy")[ids]
    trained = runs["rank"]
    if kind == "ml":
        probs = np.load(out / "probs.npy")
        assert probs.shape == (ids.size, 5) and probs.min() >= 0 and probs.max() <= 1
        assert f"test ROC-AUC {trained['test_rocauc']:.4f} over {ids.size} nodes (the run's: " in res.stdout
        # (the run scored logits; float32 probabilities may tie two logits that differed: a few ranks in 10^5)
        assert abs(node_metrics.rocauc(torch.from_numpy(probs), torch.from_numpy(y)) - trained["test_rocauc"]) < 1e-5
    else:
        values = np.load(out / "values.npy")
        assert values.shape == (ids.size, 2)  # in the labels' units: column 0 lies about 10
        rmse = math.sqrt(np.mean((values.astype(np.float64) - y) ** 2))
        assert rmse == pytest.approx(trained["test_rmse"], rel=1e-5) and abs(values[:, 0].mean() - 10) < 2
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["metric"] == f"test_{'rocauc' if kind == 'ml' else 'rmse'}"


def write_ordinal_folder(folder: Path, n: int = 3000, seed: int = 0) -> Path:
    """A files dataset whose 5 levels are quantile bins of a score made of each node's own and its in-neighbours'
    features (a page's traffic, binned)."""
    write_folder(folder, "reg", n, seed)
    y = np.load(folder / "y.npy")[:, 0]
    np.save(folder / "y.npy", np.searchsorted(np.quantile(y, [0.2, 0.4, 0.6, 0.8]), y).astype(np.int64))
    return folder


@pytest.mark.slow
def test_an_ordinal_kind_trains_selects_by_mae_and_predicts_levels(tmp_path):
    """task.kind=ordinal end to end: the run selects its epoch by validation MAE (lower is better), its test MAE is
    well below the best constant guess's (the median level), and predict writes each node's level and threshold
    probabilities and prints the run's own test MAE."""
    from conftest import DATA_ROOT, train_here

    folder = write_ordinal_folder(tmp_path / "graph")
    ours = train_here("dataset=files", f"dataset.path={folder}", "task.kind=ordinal", "train.epochs=6",
                      "train.fanouts=[10,10]", "train.batch_size=256", "model.hidden_channels=32", "train.lr=0.01",
                      "metrics.tensorboard=false", f"dataset.root={DATA_ROOT}", run_dir=tmp_path / "run")
    y = np.load(folder / "y.npy")
    test = np.load(folder / "test_idx.npy")
    constant = float(np.abs(y[test] - np.median(y[np.load(folder / "train_idx.npy")])).mean())
    assert ours["metric"] == "val_mae" and ours["lower_is_better"] and ours["kind"] == "ordinal"
    print(f"ordinal: test MAE {ours['test']:.4f}, the median level's {constant:.4f}")
    assert ours["test"] < 0.75 * constant, (ours["test"], constant)
    res = run_cli("predict", str(tmp_path / "run"), cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    out = next((tmp_path / "run" / "predict").iterdir())
    levels, probs, ids = np.load(out / "labels.npy"), np.load(out / "probs.npy"), np.load(out / "ids.npy")
    assert probs.shape == (ids.size, 4) and set(np.unique(levels)) <= set(range(5))
    assert np.abs(levels - y[ids]).mean() == pytest.approx(ours["test"], abs=1e-6)
    assert f"test MAE {ours['test']:.4f}" in res.stdout


@pytest.mark.slow
def test_a_kind_at_odds_with_the_labels_is_refused_before_anything_starts(tmp_path):
    folder = write_folder(tmp_path / "graph", "reg", n=200)
    res = run_cli("dataset=files", f"dataset.path={folder}", "task.kind=multilabel", cwd=tmp_path / "run")
    assert res.returncode == 2, res.stdout + res.stderr
    assert res.stderr.strip().splitlines()[-1] == (
        f"hpcgnn: dataset error: {folder}/y: task.kind=multilabel takes labels of 0 and 1 (unknown: NaN, or -1 in "
        "integer labels); these are float [N, 2] with other values. HINT: task.kind=regression for values, "
        "classification for class ids")
    assert "[rank 0]" not in res.stdout + res.stderr  # refused by the launcher


# ------------------------------------------------------------------ ogbn-proteins: 112 binary labels, features from edges


def test_ogbn_proteins_is_read_and_prepared_with_its_labels_and_each_nodes_mean_edge_features(tmp_path, monkeypatch):
    """A miniature in OGB's raw layout: ogb.io's reader (in memory) and the streamed preparation give the same
    graph; 112 binary labels per node (a multi-label task); each node's features the mean of its edges' (ogb adds
    every edge's reverse: both ends)."""
    from test_datasets import write_mini_ogb

    from hpcgnn.data import build_graph, cache, ogb, open_graph, prepare

    mini = write_mini_ogb(tmp_path, "ogbn-proteins", n=120)
    monkeypatch.setattr(ogb, "STREAM_ROWS", 50)  # several chunks
    cfg = make_config("dataset=ogbn-proteins", f"dataset.root={tmp_path}").dataset
    assert cfg.node_features_from_edges == "mean"
    prepare(cfg)
    g, ref = open_graph(cfg), build_graph(cfg)
    for array in cache.ARRAYS:
        got, want = getattr(g, array), getattr(ref, array)
        assert torch.allclose(got.long() if array == "col" else got, want), array
    src, dst = mini["edges"]
    sums, count = np.zeros((120, 8)), np.zeros(120)
    for ends in (src, dst):
        np.add.at(sums, ends, mini["edge_feat"])
        np.add.at(count, ends, 1)
    assert np.allclose(g.x.numpy(), sums / np.maximum(count, 1)[:, None], atol=1e-6)
    assert g.y.shape == (120, 112) and torch.equal(g.y, torch.from_numpy(mini["y"]).float())
    target = resolve(g.labels, "auto", "auto", g.num_classes, "y")
    assert (target.kind, target.width) == ("multilabel", 112)


@pytest.mark.slow
def test_a_miniature_ogbn_proteins_trains_and_scores_as_ogbs_evaluator(tmp_path):
    """Prepared, trained on two ranks and evaluated: the run's test ROC-AUC is what OGB's Evaluator gives on the
    probabilities predict writes for the test split."""
    from conftest import DATA_ROOT
    from ogb.nodeproppred import Evaluator
    from test_datasets import write_mini_ogb

    shutil.rmtree(DATA_ROOT / "ogb" / "ogbn_proteins", ignore_errors=True)  # (the session's data root: run_cli's)
    mini = write_mini_ogb(DATA_ROOT, "ogbn-proteins", n=400)
    res = run_cli("dataset=ogbn-proteins", "train.epochs=3", "train.batch_size=64", "model.hidden_channels=16",
                  cwd=tmp_path / "train")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "node task: multilabel (112 binary labels, inferred from y: 112 columns of 0 and 1)" in res.stdout
    trained = summary_of(tmp_path / "train")
    assert trained["metric"] == "val_rocauc" and 0 < trained["test_rocauc"] <= 1
    res = run_cli("predict", str(tmp_path / "train" / "run"), cwd=tmp_path / "predict")
    assert res.returncode == 0, res.stdout + res.stderr
    out = next((tmp_path / "train" / "run" / "predict").iterdir())
    ids, probs = np.load(out / "ids.npy"), np.load(out / "probs.npy")
    assert np.array_equal(ids, mini["split"]["test"]) and probs.shape == (ids.size, 112)
    want = Evaluator("ogbn-proteins").eval({"y_true": mini["y"][ids], "y_pred": probs})["rocauc"]
    assert abs(want - trained["test_rocauc"]) < 1e-6


# ------------------------------------------------------------------ a typed graph's labelled type, of any kind


@pytest.mark.slow
def test_a_typed_graphs_labelled_type_takes_several_labels(tmp_path):
    """A typed folder whose papers carry five binary labels (their class one-hot, 10% unknown): prepared out of core,
    served typed, trained with R-GCN as a multi-label task that learns them."""
    from conftest import DATA_ROOT, train_here
    from test_typed import write_typed_folder

    from hpcgnn.config import dataset_config
    from hpcgnn.data.synthetic import make_synthetic_typed

    graph = make_synthetic_typed(dataset_config(num_nodes=3000, avg_degree=10, homophily=0.8, seed=5, num_classes=5))
    write_typed_folder(tmp_path / "typed", graph)
    y = torch.nn.functional.one_hot(graph.y, 5).float()
    y[torch.rand(y.shape, generator=torch.Generator().manual_seed(0)) < 0.1] = float("nan")
    np.save(tmp_path / "typed" / "nodes" / graph.target / "y.npy", y.numpy())
    summary = train_here("dataset=files", f"dataset.path={tmp_path / 'typed'}", "model=rgcn", "train.epochs=5",
                         "model.hidden_channels=32", f"dataset.root={DATA_ROOT}", run_dir=tmp_path / "run")
    assert summary["kind"] == "multilabel" and summary["metric"] == "val_rocauc" and summary["test_rocauc"] > 0.8


@pytest.mark.slow
def test_a_preempted_regression_resumes_bitwise_with_its_lowest_epoch(tmp_path):
    """One rank in this process: a regression run preempted mid-epoch resumes to the parameters, the history and
    the selected (lowest RMSE) epoch of the run left alone."""
    from conftest import DATA_ROOT, preempted_and_resumed

    folder = write_folder(tmp_path / "graph", "reg", n=1500)
    whole, again = preempted_and_resumed("dataset=files", f"dataset.path={folder}", "train.epochs=4",
                                         "train.batch_size=128", "model.hidden_channels=16", f"dataset.root={DATA_ROOT}",
                                         "metrics.tensorboard=false", step=9, folder=tmp_path)
    assert again["resumes"] == 1 and again["param_checksums"] == whole["param_checksums"]
    assert [r["val_rmse"] for r in again["history"]] == [r["val_rmse"] for r in whole["history"]]
    lowest = min(range(4), key=lambda i: whole["history"][i]["val_rmse"]) + 1
    assert again["best_epoch"] == whole["best_epoch"] == lowest and again["test_rmse"] == whole["test_rmse"]
