"""A model of the user's own (model=custom model._target_=...): checked before anything is submitted, then trained
like hpcgnn's own in every mode that makes sense for it, its provenance recorded, its weights kept."""

from __future__ import annotations

import hashlib

import pytest
import torch
from conftest import DATA_ROOT, EXAMPLES, REPO, TINY, make_config, run_cli, summary_of, train_here

from hpcgnn.errors import ConfigError
from hpcgnn.models.saved import load_model
from hpcgnn.rank.checkpoint import Preempted
from hpcgnn.submit.launch import check_model


class WrongWidth(torch.nn.Module):
    """Returns two columns whatever it was asked for."""

    def __init__(self, in_channels: int, out_channels: int):
        super().__init__()
        self.lin = torch.nn.Linear(in_channels, 2)

    def forward(self, x, edge_index):
        return self.lin(x)


class GraphLevel(torch.nn.Module):
    """Pools the graph: one row for all nodes."""

    def __init__(self, in_channels: int, out_channels: int):
        super().__init__()
        self.lin = torch.nn.Linear(in_channels, out_channels)

    def forward(self, x, edge_index):
        return self.lin(x).mean(0, keepdim=True)


class FunctionalDropout(torch.nn.Module):
    """F.dropout(x, p, self.training): right on a homogeneous graph, always on once to_hetero has traced it."""

    def __init__(self, in_channels: int, out_channels: int, dropout: float):
        super().__init__()
        self.lin, self.p = torch.nn.Linear(in_channels, out_channels), dropout

    def forward(self, x, edge_index):
        return torch.nn.functional.dropout(self.lin(x), self.p, self.training)


class Branching(torch.nn.Module):
    """Control flow on the values: torch.fx (to_hetero) cannot trace it."""

    def __init__(self, in_channels: int, out_channels: int):
        super().__init__()
        self.lin = torch.nn.Linear(in_channels, out_channels)

    def forward(self, x, edge_index):
        return self.lin(x) if x.sum() > 0 else -self.lin(x)


class PaperOnlyWidth(torch.nn.Module):
    """Takes the graph's metadata and returns a dict with the wrong width for the labelled type."""

    def __init__(self, metadata, in_channels: int, out_channels: int):
        super().__init__()
        self.lin = torch.nn.Linear(in_channels, out_channels + 1)

    def forward(self, x_dict, edge_index_dict):
        return {t: self.lin(x) for t, x in x_dict.items()}


class OwnEdgeWidth(torch.nn.Module):
    """Reads edge features of a width of its own (6), which it does not take as an argument."""

    def __init__(self, in_channels: int, out_channels: int):
        super().__init__()
        self.lin, self.edge = torch.nn.Linear(in_channels, out_channels), torch.nn.Linear(6, out_channels)

    def forward(self, x, edge_index, edge_attr):
        return self.lin(x).index_add(0, edge_index[1], self.edge(edge_attr))


def six_wide_edges():
    """A PyG Data whose edges carry 6 features."""
    from torch_geometric.data import Data

    g = torch.Generator().manual_seed(0)
    return Data(x=torch.randn(50, 4, generator=g), edge_index=torch.randint(0, 50, (2, 200), generator=g),
                edge_attr=torch.randn(200, 6, generator=g), y=torch.randint(0, 3, (50,), generator=g))


def _custom(*overrides: str):
    return make_config("model=custom", *overrides)


def test_a_model_that_cannot_be_used_is_refused_before_anything_is_submitted(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "examples"))
    cases = [
        (["model._target_=no_such_pkg.Model"], r"model._target_=no_such_pkg.Model cannot be imported \(ModuleNotFoundError: "
         r"No module named 'no_such_pkg'\). HINT: the job imports it too: install its package in the job's "
         r"environment, or put its folder on PYTHONPATH \(a submitted job inherits it\)"),
        (["model._target_=my_gnn.NoSuchClass"], r"cannot be imported: my_gnn has no NoSuchClass"),
        (["model._target_=my_gnn.JumpingGraphConv"], r"model._target_=my_gnn.JumpingGraphConv refused its arguments "
         r"\{'hidden_channels': 128, 'num_layers': 2\} \(TypeError: .*missing 2 required positional arguments: 'nfeat' "
         r"and 'nclass'\). HINT: set its own in model.kwargs"),
        (["model._target_=my_gnn.ResidualSAGE", "model.widths.in_channels=nfeat"], r"model.widths.in_channels=nfeat: "
         r"my_gnn.ResidualSAGE takes no argument 'nfeat' \(it takes dropout, hidden_channels, in_channels, num_layers, "
         r"out_channels\)"),
        (["model._target_=test_user_models.WrongWidth"], r"model._target_=test_user_models.WrongWidth returned shape "
         r"\(6, 2\), torch.float32 for 6 nodes: a model returns one row of 8 floats per node \(out_channels: the "
         r"classes; a link task's encoder: its embedding, model.hidden_channels\). HINT: take out_channels in __init__"),
        (["model._target_=test_user_models.GraphLevel"], r"returned shape \(1, 8\), torch.float32 for 6 nodes"),
        (["model._target_=torch.nn.Linear", "model.widths.in_channels=in_features",
          "model.widths.out_channels=out_features"], r"model._target_=torch.nn.Linear failed on a 6-node graph: "
         r"forward\(x, edge_index\) raised TypeError"),
        (["model._target_=my_gnn.ResidualSAGE", "train.eval_mode=full"], r"train.eval_mode=full runs a model layer by "
         r"layer \(PyG's BasicGNN interface: num_layers, inference_per_layer\); my_gnn.ResidualSAGE has none. HINT: "
         r"train.eval_mode=sampled"),
        (["model._target_=torch.optim.SGD"], r"model._target_=torch.optim.SGD is not a torch.nn.Module class"),
    ]
    for overrides, message in cases:
        with pytest.raises(ConfigError, match=message):
            check_model(_custom(*overrides))
    with pytest.raises(ConfigError, match=r"model=custom needs model._target_=package.module.Class \(got None\)"):
        _custom()
    with pytest.raises(ConfigError, match=r"model._target_=my_gnn.ResidualSAGE with model=sage: a class of your own "
                                          r"is model=custom"):
        make_config("model=sage", "model._target_=my_gnn.ResidualSAGE")
    check_model(_custom("model._target_=my_gnn.JumpingGraphConv", "model.widths.in_channels=nfeat",
                        "model.widths.out_channels=nclass", "+model.kwargs.mode=max"))
    check_model(_custom("model._target_=test_user_models.FunctionalDropout"))  # (right where nothing traces it)
    check_model(_custom("model._target_=my_gnn.ResidualSAGE", "task=link"))  # the encoder: the embedding's width


def test_a_model_reading_edge_features_is_given_their_width_and_checked_against_it_before_submitting(tmp_path,
                                                                                                    monkeypatch):
    """A model whose __init__ takes edge_dim gets the graph's width (no model.kwargs); where the width is known
    before the graph is prepared (a files folder's edge_attr.npy), a width of the model's own or one given in
    model.kwargs that is not the graph's, and a graph without edge features, are refused at submit; where only
    preparing tells (a PyG dataset), the submit lets a model of a width of its own through, and the rank builds it
    with the graph's."""
    import numpy as np

    from hpcgnn.errors import DatasetError
    from hpcgnn.models.custom import build_custom

    monkeypatch.syspath_prepend(str(REPO / "examples"))
    rng = np.random.default_rng(0)
    folder = tmp_path / "g"
    folder.mkdir()
    for name, a in {"x": rng.normal(size=(30, 4)).astype(np.float32), "edge_index": rng.integers(0, 30, (2, 90)),
                    "edge_attr": rng.normal(size=(90, 3)).astype(np.float32), "y": rng.integers(0, 3, 30),
                    "train_idx": np.arange(10), "val_idx": np.arange(10, 20), "test_idx": np.arange(20, 30)}.items():
        np.save(folder / f"{name}.npy", a)
    files = ["dataset=files", f"dataset.path={folder}", f"dataset.root={tmp_path / 'root'}"]
    gine = ["model._target_=my_gnn.EdgeGINE"]
    check_model(_custom(*files, *gine))  # (edge_dim: the folder's 3)
    model = build_custom(_custom(*files, *gine).model, 4, 3, 2, edge_dim=3)
    assert all(conv.lin.in_channels == 3 for conv in model.convs)  # GINEConv's edge projection: the graph's width
    with pytest.raises(ConfigError, match=r"model.kwargs.edge_dim=8, but the edges of dataset=files have 3 features. "
                                          r"HINT: leave edge_dim out of model.kwargs: hpcgnn fills in the graph's"):
        check_model(_custom(*files, *gine, "+model.kwargs.edge_dim=8"))
    with pytest.raises(ConfigError, match=r"model.kwargs.edge_dim=8, but the edges of dataset=files have 3 features. "
                                          r"HINT: model.kwargs.edge_dim=3"):  # (PyG's GAT passes it to its layers)
        check_model(_custom(*files, "model._target_=torch_geometric.nn.models.GAT", "+model.kwargs.edge_dim=8"))
    with pytest.raises(ConfigError, match=r"model._target_=test_user_models.OwnEdgeWidth failed on a 6-node graph: "
                                          r"forward\(x, edge_index\) raised RuntimeError"):
        check_model(_custom(*files, "model._target_=test_user_models.OwnEdgeWidth"))
    with pytest.raises(ConfigError, match=r"model.edge_dim=8, but the edges of dataset=files have 3 features. HINT: "
                                          r"model.edge_dim=3"):
        check_model(make_config(*files, "model=gat", "model.edge_dim=8"))
    (folder / "edge_attr.npy").unlink()
    with pytest.raises(DatasetError, match=r"model._target_=my_gnn.EdgeGINE \(its forward takes edge features\) "
                                           r"reads edge features, but the edges of dataset=files have none"):
        check_model(_custom(*files, *gine))
    with pytest.raises(DatasetError, match=r"model.edge_dim=3 reads edge features, but the edges of dataset=synthetic "
                                           r"have none"):
        check_model(make_config("model=gat", "model.edge_dim=3"))
    pyg = ["dataset=pyg", "dataset._target_=test_user_models.six_wide_edges", f"dataset.root={tmp_path / 'root'}",
           "model._target_=test_user_models.OwnEdgeWidth"]
    check_model(_custom(*pyg))  # (its width is not known before the graph is prepared: the rank's to check)
    assert not (tmp_path / "root" / "prepared").exists()
    build_custom(_custom(*pyg).model, 4, 3, 2, edge_dim=6)  # (the rank: the graph's width, its own)


TYPED_SMALL = ["dataset=synthetic_hetero", "dataset.num_nodes=3000", f"dataset.root={DATA_ROOT}"]


@pytest.mark.filterwarnings("ignore:Found function 'dropout':UserWarning")  # (PyG's, on the case meant to be refused)
def test_a_relational_model_that_cannot_be_used_is_refused_before_anything_is_submitted(monkeypatch):
    """On a typed graph, a class is checked against the graph's own node types and relations: given them
    (``metadata``), or made relational by to_hetero."""
    monkeypatch.syspath_prepend(str(REPO / "examples"))
    cases = [
        ("test_user_models.FunctionalDropout", r"model._target_=test_user_models.FunctionalDropout gives different "
         r"outputs for the same input in eval mode: its evaluation would be random. HINT: drop out with "
         r"torch.nn.Dropout modules \(a functional dropout that to_hetero traced stays on in eval mode\)"),
        ("test_user_models.Branching", r"model._target_=test_user_models.Branching could not be made relational by "
         r"PyG's to_hetero \(TraceError: .*\). HINT: take metadata in __init__ \(PyG's \(node_types, edge_types\)\) and "
         r"build a layer per relation \(HeteroConv\)"),
        ("test_user_models.PaperOnlyWidth", r"returned shape \(3, 9\), torch.float32 for 3 nodes: a model returns one "
         r"row of 8 floats per node"),
    ]
    for target, message in cases:
        with pytest.raises(ConfigError, match=message):
            check_model(_custom(*TYPED_SMALL, f"model._target_={target}"))
    with pytest.raises(ConfigError, match=r"train.eval_mode=full needs model mlp, rgcn on a typed graph; got "
                                          r"model=custom. HINT: train.eval_mode=sampled"):
        _custom(*TYPED_SMALL, "model._target_=my_gnn.HeteroSAGE", "train.eval_mode=full")
    for target in ("my_gnn.HeteroSAGE", "my_gnn.ResidualSAGE"):
        check_model(_custom(*TYPED_SMALL, f"model._target_={target}"))


@pytest.mark.slow
def test_a_relational_user_model_trains_on_a_typed_graph_and_resumes_bitwise(tmp_path, monkeypatch):
    """The example's HeteroSAGE (PyG's HeteroConv, input widths sized lazily) on the typed synthetic graph, one
    rank in this process: preempted mid-run and resumed, it ends bitwise as an uninterrupted run, and beats an MLP
    on the papers' own features; its kept weights load back into the same class. ResidualSAGE made relational by
    to_hetero trains too."""
    monkeypatch.syspath_prepend(str(REPO / "examples"))
    args = [*TYPED_SMALL, "train.epochs=3", "model.hidden_channels=32", "metrics.tensorboard=false", "model=custom",
            "model._target_=my_gnn.HeteroSAGE"]
    whole = train_here(*args, run_dir=tmp_path / "whole")
    steps = whole["steps_per_epoch"]
    with pytest.raises(Preempted):
        train_here(*args, "debug.signal_rank=0", f"debug.signal_step={steps + 2}", run_dir=tmp_path / "cut")
    again = train_here(*args, run_dir=tmp_path / "cut")
    assert again["resumes"] == 1 and again["param_checksums"] == whole["param_checksums"]
    assert whole["model_class"] == "my_gnn.HeteroSAGE"
    mlp = train_here(*args[:-2], "model=mlp", run_dir=tmp_path / "mlp")
    assert whole["test"] > mlp["test"] + 0.05, (whole["test"], mlp["test"])
    model = load_model(tmp_path / "whole", trust_run=True)  # (the class is the user's own: trusted by name)
    assert type(model.model).__name__ == "HeteroSAGE" and model.target == "paper" and not model.training
    traced = train_here(*args[:-1], "model._target_=my_gnn.ResidualSAGE", run_dir=tmp_path / "traced")
    assert traced["model_class"] == "my_gnn.ResidualSAGE (relational by to_hetero)"
    assert traced["test"] > mlp["test"] + 0.05, (traced["test"], mlp["test"])


@pytest.mark.slow
def test_a_cli_refusal_is_one_line_before_anything_runs(tmp_path):
    res = run_cli("model=custom", "model._target_=my_gnn.JumpingGraphConv", cwd=tmp_path, env=EXAMPLES)
    assert res.returncode == 2 and "starting" not in res.stdout, res.stdout + res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("hpcgnn: config error: model._target_=my_gnn.JumpingGraphConv "
                                                   "refused its arguments"), res.stderr


@pytest.mark.slow
def test_a_user_model_trains_with_sampler_processes_and_resumes_bitwise(tmp_path, monkeypatch):
    """The example's ResidualSAGE (no hpcgnn import), one rank in this process with a sampler process: preempted
    mid-run and resumed, it ends bitwise as an uninterrupted run; the run records its class, source file and the
    file's hash, and keeps weights load_model gives back."""
    monkeypatch.syspath_prepend(str(REPO / "examples"))
    args = [*TINY, f"dataset.root={DATA_ROOT}", "train.epochs=2", "train.sampler_procs=1", "train.num_threads=2",
            "model=custom", "model._target_=my_gnn.ResidualSAGE", "metrics.tensorboard=false"]
    whole = train_here(*args, run_dir=tmp_path / "whole")
    with pytest.raises(Preempted, match="checkpoint of step 4 saved"):
        train_here(*args, "debug.signal_rank=0", "debug.signal_step=4", run_dir=tmp_path / "cut")
    again = train_here(*args, run_dir=tmp_path / "cut")
    assert again["resumes"] == 1 and again["param_checksums"] == whole["param_checksums"]
    source = REPO / "examples" / "my_gnn.py"
    assert whole["model_class"] == "my_gnn.ResidualSAGE" and whole["model_source"] == {
        "class": "my_gnn.ResidualSAGE", "file": str(source), "sha256": hashlib.sha256(source.read_bytes()).hexdigest()}
    model = load_model(tmp_path / "whole", trust_run=True)  # (the class is the user's own: trusted by name)
    assert type(model).__name__ == "ResidualSAGE" and not model.training


JUMPING = ["model=custom", "model._target_=my_gnn.JumpingGraphConv", "model.widths.in_channels=nfeat",
           "model.widths.out_channels=nclass", "metrics.tensorboard=false"]


@pytest.mark.slow
def test_a_user_model_trains_partitioned_on_two_ranks(tmp_path):
    """The example's JumpingGraphConv (its own argument names, mapped) on a partitioned graph, with GCN's
    global-degree weights handed to its forward (model.gcn_norm)."""
    res = run_cli(*TINY, *JUMPING, "graph=partitioned", "model.gcn_norm=true", cwd=tmp_path, env=EXAMPLES)
    assert res.returncode == 0, res.stdout + res.stderr
    s = summary_of(tmp_path)
    assert s["model_class"] == "my_gnn.JumpingGraphConv" and s["eval_mode"] == "sampled" and s["world_size"] == 2
    assert len(set(s["param_checksums"])) == 1 and s["best_val"] > 0.3


def test_a_user_model_is_a_link_encoder(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "examples"))
    s = train_here(*TINY, *JUMPING, f"dataset.root={DATA_ROOT}", "task=link", run_dir=tmp_path)
    assert s["model_class"] == "my_gnn.JumpingGraphConv" and s["eval_mode"] == "sampled" and s["best_val"] > 0.55


def test_pygs_own_graphsage_by_target_gets_csr_aggregation_and_exact_evaluation(tmp_path):
    s = train_here(*TINY, f"dataset.root={DATA_ROOT}", "train.epochs=1", "model=custom",
                   "model._target_=torch_geometric.nn.models.GraphSAGE", "train.eval_mode=full",
                   "metrics.tensorboard=false", run_dir=tmp_path)
    # hpcgnn's CSR twin of PyG's class (the class model=sage builds), evaluated exactly, layer by layer
    assert s["model_class"] == "hpcgnn.models.aggregation.GraphSAGE" and s["eval_mode"] == "full"
