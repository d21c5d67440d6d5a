"""hpcgnn predict RUN_DIR: a trained run's model on the run's graph and mode, every node of a split written as
memory-mappable arrays by the ranks that own them, the metric printed equal to the run's own."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
from conftest import DATA_ROOT, REPO, TINY, predict_here, run_cli, summary_of, train_here

from hpcgnn.__main__ import main
from hpcgnn.errors import ConfigError, PredictError
from hpcgnn.models.saved import ModelFileError

SMALL = [*TINY, f"dataset.root={DATA_ROOT}", "metrics.tensorboard=false"]


def _arrays(folder) -> dict:
    manifest = json.loads((folder / "manifest.json").read_text())
    return {k: np.load(folder / v["file"], mmap_mode="r") for k, v in manifest["arrays"].items()}


@pytest.fixture(scope="module")
def node_run(tmp_path_factory):
    """A one-rank node classifier trained here, evaluated on sampled batches (the default is exact)."""
    folder = tmp_path_factory.mktemp("node") / "run"
    return folder, train_here(*SMALL, "train.eval_mode=sampled", run_dir=folder)


def test_predictions_reproduce_the_runs_test_accuracy_and_are_what_the_manifest_says(node_run):
    run, trained = node_run
    s = predict_here(run)
    assert s["value"] == trained["test"] and s["run_value"] == trained["test"] and s["mode"] == "sampled"
    out = run / "predict" / "predictions-test-best"
    a = _arrays(out)
    manifest = json.loads((out / "manifest.json").read_text())
    test = np.load(next((DATA_ROOT / "prepared").glob(f"{s['dataset']}/test_idx.npy")))
    assert np.array_equal(a["ids"], np.sort(test)) and manifest["rows"] == test.size
    assert a["probs"].shape == (test.size, 8) and a["probs"].dtype == np.float32
    assert np.allclose(a["probs"].sum(1), 1, atol=1e-5) and np.array_equal(a["labels"], a["probs"].argmax(1))
    assert manifest["model_file"] == str(run / "model" / "best.pt") and manifest["epoch"] == trained["best_epoch"]
    assert not list(out.glob("*.part"))
    exact = predict_here(run, "mode=full", "split=all", "which=last", "out=" + str(run.parent / "all"))
    assert exact["rows"] == 4000 and exact["mode"] == "full" and 0 < exact["value"] < 1
    odd = run.parent / "model=sage, lr=0.01" / "run"  # (a folder named as a sweep's member may be)
    shutil.copytree(run, odd, ignore=shutil.ignore_patterns("predict"))
    assert predict_here(odd)["value"] == trained["test"]
    emb = predict_here(run, "split=all", "--embeddings")
    e = _arrays(run / "predict" / "embeddings-all-best")["embeddings"]
    assert emb["value"] is None and e.shape == (4000, 32) and np.isfinite(e).all() and (e >= 0).all()  # (after ReLU)


@pytest.mark.slow
def test_a_partitioned_runs_ranks_write_their_own_nodes_equal_to_the_replicated_outputs(tmp_path):
    """Two ranks, each holding its part, write their own nodes' rows: fp32, the arrays equal those of the same
    model run on the whole graph exactly, and the test accuracy is the run's (exact evaluation on both)."""
    res = run_cli(*TINY, "graph=partitioned", "train.eval_mode=full", "train.precision=fp32",
                  "metrics.tensorboard=false", cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    run, trained = tmp_path / "run", summary_of(tmp_path)
    res = subprocess_predict(run, "split=all")
    assert res.returncode == 0, res.stdout + res.stderr
    whole = subprocess_predict(run, "split=all", "graph.mode=replicated", f"out={tmp_path / 'whole'}")
    assert whole.returncode == 0, whole.stdout + whole.stderr
    parts, rep = _arrays(run / "predict" / "predictions-all-best"), _arrays(tmp_path / "whole")
    assert np.array_equal(parts["probs"], rep["probs"]) and np.array_equal(parts["ids"], np.arange(4000))
    test = subprocess_predict(run)
    assert f"test accuracy {trained['test']:.4f} over 2400 nodes (the run's: {trained['test']:.4f}" in test.stdout


def subprocess_predict(run, *args: str):
    return subprocess.run([sys.executable, "-m", "hpcgnn", "predict", str(run), *args], capture_output=True,
                          text=True, timeout=300, env={**os.environ, "PYTHONUNBUFFERED": "1"}, cwd=run.parent)


def test_a_typed_run_and_a_user_models_run_predict_as_they_evaluated(tmp_path, monkeypatch):
    typed = tmp_path / "typed"
    t = train_here("dataset=synthetic_hetero", "dataset.num_nodes=3000", "model=rgcn", "train.epochs=2",
                   "model.hidden_channels=32", f"dataset.root={DATA_ROOT}", "metrics.tensorboard=false",
                   run_dir=typed)
    assert predict_here(typed)["value"] == t["test"]
    emb = predict_here(typed, "split=all", "--embeddings")
    assert emb["arrays"]["embeddings"]["shape"] == [3000, 32]  # (the papers, the labelled type)
    monkeypatch.syspath_prepend(str(REPO / "examples"))
    mine = tmp_path / "mine"
    m = train_here(*SMALL, "model=custom", "model._target_=my_gnn.ResidualSAGE", run_dir=mine)
    assert predict_here(mine)["value"] == m["test"]  # (your own folder, your own package: no trust=true asked)
    assert predict_here(mine, "trust=true")["value"] == m["test"]
    with pytest.raises(PredictError, match=r"my_gnn.ResidualSAGE cannot be run layer by layer \(exact inference: "
                                           r"PyG's BasicGNN interface, num_layers and inference_per_layer\), and a "
                                           r"node classifier's embedding is its last hidden layer's output. HINT: build "
                                           r"the model on torch_geometric.nn.models.basic_gnn.BasicGNN"):
        predict_here(mine, "--embeddings", "trust=true")
    from hpcgnn.submit.predict import compose_prediction

    with pytest.raises(PredictError, match=r"my_gnn.ResidualSAGE cannot be run layer by layer .*HINT: mode=sampled"):
        compose_prediction([str(mine), "mode=full", "trust=true"])  # (at submit: no job started to find it out)


def test_a_prediction_job_starts_no_sampler_servers_of_its_run(node_run, tmp_path):
    """A run trained with sampler servers: its prediction job replayed launch.sampler_servers=1, and the launcher
    then waited, its prediction written, for a server no rank of it would ever connect to (30 minutes)."""
    from hpcgnn.submit.predict import compose_prediction

    run = tmp_path / "served"
    shutil.copytree(node_run[0], run)
    overrides = run / ".hydra" / "overrides.yaml"
    overrides.write_text(overrides.read_text() + "- launch.sampler_servers=1\n")
    assert "launch.sampler_servers=1" in (run / ".hydra" / "overrides.yaml").read_text()
    assert compose_prediction([str(run)]).cfg.launch.sampler_servers == 0


def test_a_prediction_job_writes_its_own_folder_where_the_run_named_its_own(node_run, tmp_path):
    """A run trained with run_dir=DIR: its prediction job replayed run_dir=DIR, which outranks the folder it names
    itself, and wrote its arrays and summary over the run's own."""
    from hpcgnn.submit.predict import compose_prediction

    run = tmp_path / "named"
    shutil.copytree(node_run[0], run)
    overrides = run / ".hydra" / "overrides.yaml"
    overrides.write_text(overrides.read_text() + f"- run_dir={run}\n")
    assert compose_prediction([str(run)]).cfg.run_dir == str(run / "predict" / "predictions-test-best")


def test_what_cannot_be_predicted_is_refused_in_one_line(node_run, tmp_path, capsys):
    run, _ = node_run
    cases = [
        ([str(tmp_path)], r"is not a run folder of hpcgnn \(no .hydra/config.yaml and overrides.yaml\)"),
        ([str(run), "which=middle"], r"which=middle: a run keeps best and last"),
        ([str(run), "dataset.num_nodes=5000"], r"the graph here \(synthetic-\w+\) is not the one the model was trained "
         r"on \(synthetic-\w+\): dataset.num_nodes=5000 \(the run's: \d+\). HINT: drop those dataset.\* overrides .* "
         r"or add --allow-other-graph"),
        ([str(run), "--sideways"], r"unknown option '--sideways'"),
        ([str(run), "split=everything"], r"predict.split='everything' is unknown: use train, val, test or all"),
        ([str(run), f"out={run}"], r"is the run's own folder"),
        ([str(run), "pairs=p.npy"], r"pairs=FILE: a node classifier scores no pairs; a link model or an edge model does"),
    ]
    for argv, message in cases:
        assert main(["predict", *argv]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("hpcgnn: ") and re.search(message, err[0]), err
    moved = tmp_path / "moved"  # a run whose model file is another graph's: no override to drop
    shutil.copytree(run, moved)
    for name in ("config.yaml", "overrides.yaml"):
        text = (moved / ".hydra" / name).read_text()
        (moved / ".hydra" / name).write_text(text.replace("num_nodes: 4000", "num_nodes: 5000").replace(
            "dataset.num_nodes=4000", "dataset.num_nodes=5000"))
    assert main(["predict", str(moved)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and re.search(r"not the one the model was trained on \(synthetic-\w+\): the run's own dataset "
                                       r"settings give it now, so the model file is another graph's .* HINT: add "
                                       r"--allow-other-graph", err[0]) and "drop" not in err[0], err
    other = run.parent / "other"  # an older run's folder: no model kept
    (other / ".hydra").mkdir(parents=True)
    for name in ("config.yaml", "overrides.yaml"):
        (other / ".hydra" / name).write_text((run / ".hydra" / name).read_text())
    with pytest.raises(ModelFileError, match=r"no model file .*other/model/best.pt. HINT: a run keeps model/best.pt"):
        predict_here(other)
    (other / "model").mkdir()
    (other / "model" / "best.pt").write_bytes((run / "model" / "best.pt").read_bytes()[:1000])  # cut short
    with pytest.raises(ModelFileError, match=r"best.pt is not a model file hpcgnn can read"):
        predict_here(other)
    with pytest.raises(PredictError, match=r"--allow-other-graph: the model was trained on a graph of other widths: "
                                           r"num_features 32 \(here 16\)"):
        predict_here(run, "dataset.num_features=16", "--allow-other-graph", f"out={tmp_path / 'o'}")
    wider = predict_here(run, "dataset.num_nodes=5000", "--allow-other-graph", f"out={tmp_path / 'w'}")
    assert wider["rows"] == int(0.6 * 5000) and wider["dataset"] != wider["model_dataset"]  # inductive: its own nodes
    with pytest.raises(ConfigError, match=r"predict.mode='exactish' is unknown: use auto, full or sampled"):
        predict_here(run, "mode=exactish")


def test_an_exported_model_loads_without_hpcgnn_into_pygs_own_class(node_run, tmp_path, capsys):
    """The four lines of docs/after-training.md, in a process that never imports hpcgnn: PyG's own GraphSAGE with
    the run's weights gives the outputs hpcgnn's model gives."""
    run, _ = node_run
    assert main(["export", str(run), f"out={tmp_path / 'plain.pt'}"]) == 0
    assert capsys.readouterr().out.strip() == f"exported: {tmp_path / 'plain.pt'}"
    code = ("import importlib, sys, torch\n"
            f"rec = torch.load({str(tmp_path / 'plain.pt')!r}, weights_only=True)\n"
            "module, _, name = rec['class'].rpartition('.')\n"
            "model = getattr(importlib.import_module(module), name)(**rec['kwargs'])\n"
            "model.load_state_dict(rec['state_dict'])\n"
            "torch.manual_seed(0); x, ei = torch.randn(50, 32), torch.randint(0, 50, (2, 300))\n"
            "torch.save(model.eval()(x, ei).detach(), sys.argv[1])\n"
            "assert not [m for m in sys.modules if m.split('.')[0] == 'hpcgnn'], 'hpcgnn imported'\n"
            "print(rec['class'])\n")
    res = subprocess.run([sys.executable, "-c", code, str(tmp_path / "out.pt")], capture_output=True, text=True,
                         timeout=120, cwd=tmp_path, env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert res.returncode == 0 and res.stdout.strip() == "torch_geometric.nn.models.GraphSAGE", res.stderr
    import torch

    from hpcgnn.models.saved import load_model

    torch.manual_seed(0)
    x, ei = torch.randn(50, 32), torch.randint(0, 50, (2, 300))
    assert torch.equal(torch.load(tmp_path / "out.pt"), load_model(run)(x, ei).detach())


def test_what_an_edge_or_link_model_is_asked_of_a_pairs_file_is_checked_at_submit(tmp_path):
    """The pairs of a file fit the model's ends (a typed edge model's: its relation's two types, each in its own ids)
    and what is asked of them fits the task, refused at submit naming the fix."""
    from conftest import make_config

    from hpcgnn.rank.predict import check_request

    plain = {"shape": {"num_nodes": 10, "schema": None}, "relation": None}
    typed = {"shape": {"num_nodes": 30, "schema": {"num_nodes": {"user": 10, "item": 20}}},
             "relation": ["user", "rates", "item"]}
    for name, pairs in (("ok", [[0, 19], [9, 3], [9, 19]]), ("far", [[12, 3]]), ("none", np.zeros((0, 2), np.int64)),
                        ("square", [[0, 1], [2, 3]]), ("small", [[0, 1], [2, 3], [4, 9]])):
        np.save(tmp_path / f"{name}.npy", np.array(pairs, dtype=np.int64))

    def check(record, *over):
        check_request(make_config(*over, "predict.model_file=m.pt", "predict.split=all"), record)

    check(typed, "task=edge", f"predict.pairs={tmp_path / 'ok.npy'}")  # (users 0 and 9; items 19 and 3)
    check(plain, "task=link", "predict.what=scores", f"predict.pairs={tmp_path / 'small.npy'}")
    cases = [
        (plain, ["task=edge", f"predict.pairs={tmp_path / 'ok.npy'}"],
         r"pairs=.*ok.npy names node 19, but the graph's nodes are 0..9$"),
        (typed, ["task=edge", f"predict.pairs={tmp_path / 'far.npy'}"],
         r"pairs=.*far.npy names node 12, but the user nodes \(sources of rates\) are 0..9$"),
        (plain, ["task=link", "predict.what=scores", f"predict.pairs={tmp_path / 'none.npy'}"],
         r"pairs=.*none.npy holds no pairs. HINT: a .npy file of node id pairs"),
        (plain, ["task=link", "predict.what=scores", f"predict.pairs={tmp_path / 'square.npy'}"],
         r"pairs=.*square.npy is 2 x 2, as \[2, P\] and as \[P, 2\] alike: which are its pairs cannot be told. HINT: "
         r"add a third pair"),
        (plain, ["task=edge", "predict.what=scores"], r"what=scores is a link model's output; an edge model's are its "
         r"predictions \(of a split's targets, or of pairs=FILE\) or embeddings. HINT: drop what=scores"),
        (plain, ["task=edge", "predict.what=embeddings", f"predict.pairs={tmp_path / 'ok.npy'}"],
         r"pairs=FILE: an edge model gives its predictions of a file's pairs; got what=embeddings. HINT: drop "
         r"what=embeddings, or pairs="),
        (plain, ["task=node", f"predict.pairs={tmp_path / 'ok.npy'}"],
         r"pairs=FILE: a node classifier scores no pairs; a link model or an edge model does. HINT: drop pairs="),
    ]
    for record, over, message in cases:
        with pytest.raises(PredictError, match=message):
            check(record, *over)
    with pytest.raises(PredictError, match=r"pairs=FILE: an edge model predicts every pair of the file, not a split's; "
                                           r"got split=test. HINT: drop split="):
        check_request(make_config("task=edge", "predict.model_file=m.pt", "predict.split=test",
                                  f"predict.pairs={tmp_path / 'ok.npy'}"), plain)


def test_a_link_runs_embeddings_and_the_scores_of_a_pairs_file(tmp_path):
    """A link run writes every node's embedding (exact: its replicated evaluation's path), and scores the pairs of a
    file as its decoder scores their exact embeddings."""
    run = tmp_path / "link"
    train_here(*SMALL, "task=link", "train.epochs=1", run_dir=run)
    emb = predict_here(run)
    assert emb["what"] == "embeddings" and emb["mode"] == "full" and emb["rows"] == 4000
    e = np.load(run / "predict" / "embeddings-all-best" / "embeddings.npy")
    assert e.shape == (4000, 32) and (np.abs(e).sum(1) > 0).all()  # every node's row written
    pairs = np.array([[0, 1], [5, 9], [100, 3999], [7, 7]])
    np.save(tmp_path / "pairs.npy", pairs)
    np.save(tmp_path / "pairs_t.npy", pairs.T)
    s = predict_here(run, f"pairs={tmp_path / 'pairs.npy'}")
    scores = np.load(run / "predict" / "scores-pairs-best" / "scores.npy")
    assert s["rows"] == 4 and np.allclose(scores, (e[pairs[:, 0]] * e[pairs[:, 1]]).sum(1), rtol=1e-4, atol=1e-4)
    predict_here(run, f"pairs={tmp_path / 'pairs_t.npy'}")
    assert np.array_equal(np.load(run / "predict" / "scores-pairs_t-best" / "scores.npy"), scores)
    np.save(tmp_path / "far.npy", np.array([[0, 4000]]))
    np.save(tmp_path / "flat.npy", np.arange(6))
    for name, message in (("far.npy", r"names node 4000, but the graph's nodes are 0..3999"),
                          ("flat.npy", r"holds int64 of shape \[6\]: want integer node ids, shape \[P, 2\] or \[2, P\]"),
                          ("none.npy", r"pairs=.*none.npy: no such file")):
        with pytest.raises(PredictError, match=message):
            predict_here(run, f"pairs={tmp_path / name}")
    with pytest.raises(PredictError, match=r"what=predictions is a node classifier's or an edge model's or a graph model's output; a link "
                                           r"model's are its node embeddings \(what=embeddings split=all\) or the "
                                           r"scores of pairs \(pairs=FILE\). HINT: drop what=predictions"):
        predict_here(run, "what=predictions")
