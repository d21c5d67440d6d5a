"""Graph tasks (task=graph): datasets of many graphs prepared into one mapped graph set (every source), batches
assembled from offsets (the C kernel, its twin and PyG's collation agree), epochs dealt to the ranks with equal steps,
metrics equal to OGB's Evaluator, and real runs: training, predict and export, the same floats on any number of
ranks, a resume bitwise mid-epoch."""

from __future__ import annotations

import dataclasses
import gzip
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import DATA_ROOT, make_config, predict_here, preempted_and_resumed, run_cli, train_here

from hpcgnn.data import cache_folder, prepare
from hpcgnn.data.graphs import open_graphs
from hpcgnn.errors import ConfigError, DatasetError
from hpcgnn.kernels import ops, twins

SMALL = ["task=graph", "model.hidden_channels=32", "task.layers=3"]
GRAPHS = "dataset.num_graphs=600"  # (the synthetic set's, where no other dataset or size is given)


def small(*overrides: str) -> list[str]:
    """SMALL and ``overrides``, the synthetic set of 600 graphs unless they name a dataset or a size."""
    named = any(o.startswith(("dataset=", "dataset.num_graphs=")) for o in overrides)
    return [*SMALL, *([] if named else [GRAPHS]), *overrides]


def batch_of(gs, ids: torch.Tensor):
    """Graphs ``ids`` of ``gs`` collated by PyG (``Batch.from_data_list``): the reference a batch from offsets
    equals."""
    from torch_geometric.data import Batch, Data

    graphs = []
    for g in ids.tolist():
        a, b = int(gs.node_ptr[g]), int(gs.node_ptr[g + 1])
        c, d = int(gs.edge_ptr[g]), int(gs.edge_ptr[g + 1])
        graphs.append(Data(x=gs.x[a:b], edge_index=gs.edges[c:d].long().t(),
                           edge_attr=gs.edge_attr[c:d] if gs.edge_attr is not None else None, num_nodes=b - a))
    return Batch.from_data_list(graphs)


def graph_set(*overrides: str, root: Path = DATA_ROOT):
    cfg = make_config(*small(*overrides), f"dataset.root={root}")
    prepare(cfg.dataset)
    return cfg, open_graphs(cache_folder(cfg.dataset))


def _assembled(gs, ids: torch.Tensor):
    out_ptr = torch.zeros(ids.numel() + 1, dtype=torch.long)
    out_eptr = torch.zeros(ids.numel() + 1, dtype=torch.long)
    out_ptr[1:] = (gs.node_ptr[ids + 1] - gs.node_ptr[ids]).cumsum(0)
    out_eptr[1:] = (gs.edge_ptr[ids + 1] - gs.edge_ptr[ids]).cumsum(0)
    return (ops.assemble_graphs(gs.x, gs.edges, gs.edge_attr, gs.node_ptr, gs.edge_ptr, ids),
            twins.assemble_graphs(gs.x, gs.edges, gs.edge_attr, gs.node_ptr, gs.edge_ptr, ids, out_ptr, out_eptr))


def test_a_batch_from_offsets_is_pygs_collation_of_its_graphs_in_c_and_in_its_twin():
    """x, edge_index (each end shifted by its graph's place), edge_attr, batch and ptr: the kernel's, its torch
    twin's and PyG's Batch.from_data_list of the same graphs are equal, for graphs in any order, repeated, alone."""
    from hpcgnn.kernels.binding import kernels

    assert kernels() is not None  # (the C path is what this compares)
    _, gs = graph_set()
    gen = torch.Generator().manual_seed(0)
    for ids in (torch.randperm(gs.num_graphs, generator=gen)[:97], torch.tensor([5, 5, 3]), torch.tensor([0]),
                torch.arange(gs.num_graphs)):
        c, twin = _assembled(gs, ids)
        ref = batch_of(gs, ids)
        for got, want, theirs in zip(c, twin, (ref.x, ref.edge_index, ref.edge_attr, ref.batch, ref.ptr), strict=True):
            assert got.dtype == want.dtype and torch.equal(got, want) and torch.equal(got, theirs)
    assert gs.x.dtype == torch.int8 or gs.x.dtype == torch.int16  # (categorical: stored narrow, embedded per column)


def test_the_synthetic_set_is_seeded_streamed_and_holds_molecule_like_graphs(tmp_path):
    """The same seed makes the same files; each graph's edges lie within it, both ways; its columns lie within
    OGB's ranges; the labels follow dataset.label_kind."""
    from ogb.utils.features import get_atom_feature_dims

    cfg, gs = graph_set("dataset.num_graphs=300", root=tmp_path / "a")
    _, again = graph_set("dataset.num_graphs=300", root=tmp_path / "b")
    assert all(torch.equal(getattr(gs, f), getattr(again, f)) for f in ("x", "edges", "edge_attr", "y", "train_idx"))
    nodes = gs.sizes("nodes")
    assert 20 < float(nodes.double().mean()) < 30 and gs.x_vocab == tuple(get_atom_feature_dims())
    owner = torch.repeat_interleave(torch.arange(gs.num_graphs), gs.sizes("edges"))
    assert bool((gs.edges.long() < nodes[owner].unsqueeze(1)).all()) and bool((gs.edges >= 0).all())
    pairs = set(map(tuple, gs.edges[gs.edge_ptr[7]:gs.edge_ptr[8]].tolist()))
    assert pairs == {(b, a) for a, b in pairs}  # (bonds both ways)
    assert (gs.x.long() < torch.tensor(gs.x_vocab)).all()
    _, multi = graph_set("dataset.num_graphs=300", "dataset.label_kind=multilabel", "dataset.num_classes=3",
                         root=tmp_path / "c")
    assert multi.y.shape == (300, 3) and multi.y.dtype == torch.float32
    _, reg = graph_set("dataset.num_graphs=300", "dataset.label_kind=regression", root=tmp_path / "d")
    assert reg.y.shape == (300, 1) and reg.labels["dtype"] == "float"


@pytest.mark.parametrize("readout", ["mean", "sum", "max", "attention"])
def test_a_graphs_output_is_the_same_alone_or_in_any_batch_for_each_readout(readout):
    """In eval mode, each graph's outputs from a batch of many (assembled from offsets) equal its outputs alone:
    the readout keeps each graph's nodes to itself, the virtual node too; and the batch's order does not matter."""
    from hpcgnn.models.graph import GraphModel

    _, gs = graph_set()
    torch.manual_seed(0)
    model = GraphModel(gs.num_features, 16, 3, 2, readout=readout, x_vocab=gs.x_vocab, edge_dim=gs.edge_dim,
                       edge_vocab=gs.edge_vocab, virtual_node=True).eval()
    ids = torch.tensor([4, 90, 17, 33, 2])

    def outputs(batch_ids):
        x, ei, ea, batch, _ = ops.assemble_graphs(gs.x, gs.edges, gs.edge_attr, gs.node_ptr, gs.edge_ptr, batch_ids)
        with torch.no_grad():
            return model(x, ei, batch, ea, batch_ids.numel())

    together = outputs(ids)
    alone = torch.cat([outputs(ids[i:i + 1]) for i in range(ids.numel())])
    assert together.shape == (5, 3) and torch.allclose(together, alone, atol=1e-5)
    assert torch.allclose(outputs(ids.flip(0)), together.flip(0), atol=1e-5)
    model.train()  # a batch of one graph trains too (a step's last batch may hold one; its virtual node is one row)
    x, ei, ea, batch, _ = ops.assemble_graphs(gs.x, gs.edges, gs.edge_attr, gs.node_ptr, gs.edge_ptr, ids[:1])
    model(x, ei, batch, ea, 1).sum().backward()


class NodeRows(torch.nn.Module):
    """A model that forgets to pool: a row per node."""

    def __init__(self, in_channels: int, out_channels: int):
        super().__init__()
        self.lin = torch.nn.Linear(in_channels, out_channels)

    def forward(self, x, edge_index, batch):
        return self.lin(x)


def test_a_graph_model_of_your_own_pools_its_graphs_and_one_that_does_not_is_refused(tmp_path, monkeypatch):
    """model=custom on a graph task: the class built with the widths it takes (categorical features embedded first),
    handed (x, edge_index, batch, edge_attr), one row per graph; trained a step in this process. A model that returns
    a row per node is refused naming the fix."""
    from conftest import REPO

    from hpcgnn.models import graph

    monkeypatch.syspath_prepend(str(REPO / "examples"))
    cfg, gs = graph_set("model=custom", "model._target_=my_gnn.PooledGINE")
    shape = make_items(cfg, gs).shape()
    model = graph.task_model(cfg.model, "mean", shape, 3)
    batch = batch_of(gs, torch.arange(7))
    assert model(batch.x, batch.edge_index, batch.batch, batch.edge_attr, 7).shape == (7, 2)
    summary = train_here(*small("model=custom", "model._target_=my_gnn.PooledGINE", "train.epochs=1"),
                         f"dataset.root={DATA_ROOT}", "metrics.tensorboard=false", run_dir=tmp_path / "run")
    assert summary["metric"] == "val_acc" and 0 <= summary["test_acc"] <= 1
    bad = graph.task_model(dataclasses.replace(cfg.model, _target_="test_graph_tasks.NodeRows"), "mean", shape, 3)
    with pytest.raises(ConfigError, match=r"test_graph_tasks.NodeRows returned shape \(\d+, 2\) for a batch of 7 "
                                          r"graphs: a graph task's model returns one row of 2 floats per graph. HINT: pool"):
        bad(batch.x, batch.edge_index, batch.batch, batch.edge_attr, 7)
    graph.probe_custom(cfg)  # (at submit: on two tiny graphs)
    with pytest.raises(ConfigError, match=r"my_gnn.ResidualSAGE failed on a batch of 2 graphs: forward raised "
                                          r"TypeError: .*HINT: a graph task's model takes \(x \[nodes, in_channels\], "
                                          r"edge_index \[2, edges\], batch"):
        graph.probe_custom(make_config(*small("model=custom", "model._target_=my_gnn.ResidualSAGE")))


def write_graph_folder(folder: Path, graphs: int = 40, seed: int = 0, labels=None) -> dict:
    """A graph_files folder: random graphs, integer x, float edge features, class labels."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(3, 9, graphs)
    ptr = np.concatenate([[0], np.cumsum(sizes)])
    src, dst = [], []
    for g in range(graphs):
        m = int(rng.integers(2, 12))
        src.append(rng.integers(ptr[g], ptr[g + 1], m))
        dst.append(rng.integers(ptr[g], ptr[g + 1], m))
    ei = np.stack([np.concatenate(src), np.concatenate(dst)])
    order = rng.permutation(ei.shape[1])  # (an edge list in any order: each edge's graph found from graph_ptr)
    arrays = {"edge_index": ei[:, order], "graph_ptr": ptr, "x": rng.integers(0, 4, (int(ptr[-1]), 2)),
              "edge_attr": rng.random((ei.shape[1], 3)).astype(np.float32)[order],
              "y": rng.integers(0, 3, graphs) if labels is None else labels}
    folder.mkdir(parents=True, exist_ok=True)
    for name, a in arrays.items():
        np.save(folder / f"{name}.npy", a)
    return arrays


def test_a_files_folder_of_graphs_is_read_each_edge_to_its_graph_and_what_is_wrong_is_named(tmp_path, monkeypatch):
    arrays = write_graph_folder(tmp_path / "g")
    cfg, gs = graph_set("dataset=graph_files", f"dataset.path={tmp_path / 'g'}", root=tmp_path / "root")
    ptr, ei = arrays["graph_ptr"], arrays["edge_index"]
    for g in (0, 17, 39):
        mine = (ei[0] >= ptr[g]) & (ei[0] < ptr[g + 1])
        want = sorted(map(tuple, (ei[:, mine] - ptr[g]).T.tolist()))
        got = gs.edges[gs.edge_ptr[g]:gs.edge_ptr[g + 1]].tolist()
        assert sorted(map(tuple, got)) == want
        rows = gs.edge_attr[gs.edge_ptr[g]:gs.edge_ptr[g + 1]].numpy()
        assert sorted(map(tuple, rows.tolist())) == sorted(map(tuple, arrays["edge_attr"][mine].tolist()))
    assert gs.x_vocab == (4, 4) and gs.edge_vocab == () and torch.equal(gs.y, torch.from_numpy(arrays["y"]))
    assert sorted(torch.cat([gs.train_idx, gs.val_idx, gs.test_idx]).tolist()) == list(range(40))
    # in graph order, read a few edges and graphs at a time: each graph's edges as the file gives them
    from hpcgnn.data import graphs

    monkeypatch.setattr(graphs, "STREAM_EDGES", 7)
    monkeypatch.setattr(graphs, "CHUNK_GRAPHS", 5)
    owner = np.searchsorted(ptr, ei[0], side="right") - 1
    by_graph = np.argsort(owner, kind="stable")
    write_graph_folder(tmp_path / "sorted")
    np.save(tmp_path / "sorted" / "edge_index.npy", ei[:, by_graph])
    np.save(tmp_path / "sorted" / "edge_attr.npy", arrays["edge_attr"][by_graph])
    _, streamed = graph_set("dataset=graph_files", f"dataset.path={tmp_path / 'sorted'}", root=tmp_path / "root")
    local = (ei[:, by_graph] - ptr[owner[by_graph]]).T
    assert np.array_equal(streamed.edges.numpy(), local) and torch.equal(streamed.edge_ptr, gs.edge_ptr)
    assert np.array_equal(streamed.edge_attr.numpy(), arrays["edge_attr"][by_graph])
    assert torch.equal(streamed.x, gs.x) and streamed.x.dtype == torch.int8
    bad = tmp_path / "bad"
    write_graph_folder(bad)
    ei[0, 0], ei[1, 0] = 0, ptr[-1] - 1  # an edge from the first graph to the last
    np.save(bad / "edge_index.npy", ei)
    with pytest.raises(DatasetError, match=r"bad: edge_index's edge 0 \(0 -> \d+\) joins graph 0 to graph 39: each edge lies within "
                                           r"one graph$"):
        graph_set("dataset=graph_files", f"dataset.path={bad}", root=tmp_path / "root")
    write_graph_folder(bad, labels=np.zeros(39, np.int64))
    with pytest.raises(DatasetError, match=r"39 labels for 40 graphs: a graph task takes one label"):
        graph_set("dataset=graph_files", f"dataset.path={bad}", root=tmp_path / "root")
    (bad / "graph_ptr.npy").unlink()
    with pytest.raises(DatasetError, match=r"a graph dataset's folder needs graph_ptr \(.npy or .pt\)"):
        graph_set("dataset=graph_files", f"dataset.path={bad}", root=tmp_path / "root")
    with pytest.raises(ConfigError, match=r"dataset=synthetic is one graph: task=graph trains on datasets of many"):
        make_config("task=graph", "dataset=synthetic")
    with pytest.raises(ConfigError, match=r"dataset=synthetic_graphs is a dataset of many graphs, and task=node "
                                          r"trains on one graph. HINT: task=graph"):
        make_config("dataset=synthetic_graphs")
    with pytest.raises(ConfigError, match=r"task=graph does not take graph.mode=partitioned"):
        make_config("task=graph", "graph=partitioned")


def _csv(path: Path, rows) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        for r in rows:
            f.write(",".join(str(v) for v in np.atleast_1d(r)) + "\n")


def write_ogb_raw(root: Path, name: str, graphs: int = 30, tasks: int = 1, seed: int = 0) -> Path:
    """OGB's raw layout of a molecule dataset (raw/*.csv.gz, split/scaffold/*.csv.gz), random molecules."""
    from ogb.utils.features import get_atom_feature_dims, get_bond_feature_dims

    rng = np.random.default_rng(seed)
    folder = root / "ogb" / name.replace("-", "_")
    nodes = rng.integers(2, 7, graphs)
    edges = rng.integers(0, 6, graphs)
    edge_rows = [rng.integers(0, n, 2) for n, m in zip(nodes, edges, strict=True) for _ in range(m)]
    atoms, bonds = get_atom_feature_dims(), get_bond_feature_dims()
    _csv(folder / "raw" / "num-node-list.csv.gz", nodes)
    _csv(folder / "raw" / "num-edge-list.csv.gz", edges)
    _csv(folder / "raw" / "edge.csv.gz", edge_rows)
    _csv(folder / "raw" / "node-feat.csv.gz", [[rng.integers(0, d) for d in atoms] for _ in range(nodes.sum())])
    _csv(folder / "raw" / "edge-feat.csv.gz", [[rng.integers(0, d) for d in bonds] for _ in range(edges.sum())])
    labels = rng.integers(0, 2, (graphs, tasks)).astype(float)
    labels[rng.random(labels.shape) < 0.2] = np.nan
    labels[:, 0] = rng.integers(0, 2, graphs)  # (the first task known everywhere)
    _csv(folder / "raw" / "graph-label.csv.gz", [["" if np.isnan(v) else int(v) for v in row] for row in labels])
    order = rng.permutation(graphs)
    for split, part in zip(("train", "valid", "test"), np.split(order, [20, 25]), strict=True):
        _csv(folder / "split" / "scaffold" / f"{split}.csv.gz", part)
    return folder


def test_ogb_graph_datasets_are_read_from_their_raw_files_as_ogb_io_reads_them(tmp_path):
    """A molhiv-shaped raw folder prepared block by block equals ogb.io.read_csv_graph_raw's graphs (inverse edges
    added as ogb adds them), with OGB's split, its task type (binary: multilabel, NaN unknown) and metric."""
    from ogb.io.read_graph_raw import read_csv_graph_raw

    folder = write_ogb_raw(tmp_path, "ogbg-molpcba", tasks=3)
    cfg, gs = graph_set("dataset=ogbg-molpcba", root=tmp_path)
    theirs = read_csv_graph_raw(str(folder / "raw"), add_inverse_edge=True)
    assert len(theirs) == gs.num_graphs == 30 and gs.kind == "multilabel" and gs.metric == "ap"
    for g, graph in enumerate(theirs):
        assert np.array_equal(gs.x[gs.node_ptr[g]:gs.node_ptr[g + 1]].numpy(), graph["node_feat"])
        assert np.array_equal(gs.edges[gs.edge_ptr[g]:gs.edge_ptr[g + 1]].numpy().T, graph["edge_index"])
        assert np.array_equal(gs.edge_attr[gs.edge_ptr[g]:gs.edge_ptr[g + 1]].numpy(), graph["edge_feat"])
    import pandas as pd

    labels = pd.read_csv(folder / "raw" / "graph-label.csv.gz", header=None).values
    assert np.array_equal(gs.y.numpy(), labels.astype(np.float32), equal_nan=True)
    split = pd.read_csv(folder / "split" / "scaffold" / "valid.csv.gz", header=None).values.reshape(-1)
    assert gs.val_idx.tolist() == split.tolist()
    store_shape = make_items(cfg, gs).shape()
    assert store_shape.target.kind == "multilabel" and store_shape.target.metric == "ap"
    assert store_shape.num_classes == 3 and store_shape.edge_vocab == (5, 6, 2)
    # trained a few steps in this process: OGB's metric selects the epoch, unknown labels (NaN) left out of the loss
    summary = train_here("task=graph", "dataset=ogbg-molpcba", f"dataset.root={tmp_path}", "train.epochs=2",
                         "train.batch_size=8", "model.hidden_channels=16", "task.layers=2", "metrics.tensorboard=false",
                         run_dir=tmp_path / "run")
    assert summary["metric"] == "val_ap" and np.isfinite(summary["history"][-1]["loss"])
    assert {"val_ap", "val_rocauc", "test_ap"} <= set(summary["history"][-1])


SMILES = ["CC(=O)Oc1ccccc1C(=O)O", "c1ccccc1", "CCO", "C", "O=C=O", "CC(C)Cc1ccc(cc1)C(C)C(=O)O", "CN1C=NC2=C1C(=O)N(C)C(=O)N2C",
          "C1CCCCC1", "CCN(CC)CC", "c1ccncc1", "CC#N", "OC(=O)CC(O)(CC(=O)O)C(=O)O"]


def test_pcqm4mv2_is_read_from_its_smiles_as_ogbs_smiles2graph_reads_them(tmp_path, monkeypatch):
    """OGB-LSC's layout (raw/data.csv.gz: idx, smiles, homolumogap; split_dict.pt of numpy arrays) read a block of
    molecules at a time: each graph is OGB's smiles2graph's; the task a regression scored by MAE (its evaluator's),
    validated on OGB's valid split, with no test split (test-dev's labels are hidden); trained a step here."""
    import pandas as pd
    from ogb.lsc import PCQM4Mv2Evaluator
    from ogb.utils import smiles2graph

    from hpcgnn.data import graphs

    folder = tmp_path / "ogb" / "pcqm4m-v2"
    (folder / "raw").mkdir(parents=True)
    gaps = [3.0 + 0.25 * i if i < 10 else float("nan") for i in range(len(SMILES))]
    pd.DataFrame({"idx": range(len(SMILES)), "smiles": SMILES, "homolumogap": gaps}).to_csv(
        folder / "raw" / "data.csv.gz", index=False)
    torch.save({"train": np.arange(7), "valid": np.arange(7, 10), "test-dev": np.array([10]),
                "test-challenge": np.array([11])}, folder / "split_dict.pt")
    monkeypatch.setattr(graphs, "SMILES_ROWS", 5)  # (three blocks)
    monkeypatch.setattr(graphs, "SMILES_READERS", 1)  # (read here: test_pcqm4mv2_readers reads them in a pool)
    cfg, gs = graph_set("dataset=pcqm4mv2", root=tmp_path)
    for g, smiles in enumerate(SMILES):
        theirs = smiles2graph(smiles)
        assert np.array_equal(gs.x[gs.node_ptr[g]:gs.node_ptr[g + 1]].numpy(), theirs["node_feat"])
        assert np.array_equal(gs.edges[gs.edge_ptr[g]:gs.edge_ptr[g + 1]].numpy().T, theirs["edge_index"])
        assert np.array_equal(gs.edge_attr[gs.edge_ptr[g]:gs.edge_ptr[g + 1]].numpy(), theirs["edge_feat"])
    assert gs.val_idx.tolist() == [7, 8, 9] and gs.test_idx.numel() == 0 and gs.metric == "mae"
    target = make_items(cfg, gs).shape().target
    assert target.kind == "regression" and target.metric == "mae" and target.lower_is_better
    summary = train_here("task=graph", "dataset=pcqm4mv2", f"dataset.root={tmp_path}", "train.epochs=2",
                         "train.batch_size=4", "model.hidden_channels=16", "task.layers=2", "metrics.tensorboard=false",
                         run_dir=tmp_path / "run")
    assert summary["metric"] == "val_mae" and "test_mae" not in summary["history"][-1]
    pred, true = np.random.default_rng(0).random(50), np.random.default_rng(1).random(50)
    from hpcgnn.labels import Target
    from hpcgnn.tasks.node import Regression

    ours = Regression(Target("regression", 1, loss="mse", mean=(0.0,), std=(1.0,)), torch.device("cpu")).metrics(
        torch.from_numpy(pred).view(-1, 1), torch.from_numpy(true).view(-1, 1))["mae"]
    assert abs(ours - PCQM4Mv2Evaluator().eval({"y_pred": pred, "y_true": true})["mae"]) < 1e-6


@pytest.mark.slow
def test_pcqm4mv2_readers_read_its_blocks_in_a_pool_in_order_a_bounded_number_ahead():
    """PCQM4Mv2's SMILES blocks read by two reader processes give the chunks one reader gives, in the file's order,
    and the pool takes at most two blocks a reader ahead of the writer (memory stays bounded)."""
    from hpcgnn.data.graphs import _read_smiles

    blocks = [(SMILES[i:i + 3], i, "data.csv.gz") for i in range(0, len(SMILES), 3)] * 3
    taken = []

    def counted():
        for b in blocks:
            taken.append(1)
            yield b

    here = list(_read_smiles(iter(blocks), 1))
    pooled = _read_smiles(counted(), 2)
    first = next(pooled)
    assert len(taken) <= 2 * 2 + 1  # (the writer holds one; four in the pool)
    pooled = [first, *pooled]
    assert len(pooled) == len(here) == len(blocks)
    for a, b in zip(here, pooled, strict=True):
        assert all(np.array_equal(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a))
    bad = iter([(SMILES[:3], 0, "data.csv.gz"), (["CCO", "C1CC"], 3, "data.csv.gz"), (SMILES[:3], 5, "data.csv.gz")])
    with pytest.raises(DatasetError, match=r"data.csv.gz: row 4 holds SMILES 'C1CC', which RDKit cannot read"):
        list(_read_smiles(bad, 2))  # (a reader's refusal, raised in the writer's process)


def make_items(cfg, gs, world: int = 1, rank: int = 0):
    from hpcgnn.stores.base import GraphViews
    from hpcgnn.tasks.items import GraphItems

    views = GraphViews(gs.num_features, 0, gs.num_graphs, gs.labels, None, gs.edge_dim, whole=True, graph_set=gs)
    return GraphItems(cfg, None, views)


def test_each_metric_equals_ogbs_evaluator_on_the_same_predictions():
    """ROC-AUC (ogbg-molhiv), AP (ogbg-molpcba's 128 tasks, unknown labels NaN), accuracy (ogbg-ppa) and RMSE
    (ogbg-molesol), as the graph task's kinds score them from two ranks' rows, against ogb.graphproppred.Evaluator
    on the same predictions: equal to 1e-6 (MAE, PCQM4Mv2's: the mean absolute error, as its evaluator computes it)."""
    from ogb.graphproppred import Evaluator

    from hpcgnn.labels import Target
    from hpcgnn.tasks.node import Classification, MultiLabel, Regression

    cpu = torch.device("cpu")
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(500, 128, generator=gen)
    true = (torch.rand(500, 128, generator=gen) < 0.3).float()
    true[torch.rand(500, 128, generator=gen) < 0.25] = float("nan")
    ours = MultiLabel(Target("multilabel", 128), cpu).scores([(logits[:300], true[:300]), (logits[300:], true[300:])])
    pcba = Evaluator("ogbg-molpcba").eval({"y_true": true.numpy(), "y_pred": logits.numpy()})
    assert abs(ours["ap"] - pcba["ap"]) < 1e-6
    one, known = logits[:, :1], true[:, :1].nan_to_num(0)
    hiv = Evaluator("ogbg-molhiv").eval({"y_true": known.numpy(), "y_pred": one.numpy()})
    assert abs(MultiLabel(Target("multilabel", 1), cpu).scores([(one, known)])["rocauc"] - hiv["rocauc"]) < 1e-6
    classes = torch.randint(0, 37, (500,), generator=gen)
    out = torch.randn(500, 37, generator=gen)
    acc = Classification(Target("classification", 37), cpu).scores([(out, classes)])["acc"]
    ppa = Evaluator("ogbg-ppa").eval({"y_true": classes.view(-1, 1).numpy(), "y_pred": out.argmax(1).view(-1, 1).numpy()})
    assert abs(acc - ppa["acc"]) < 1e-6
    pred = torch.randn(500, 1, generator=gen) * 2 + 1
    y = pred + 0.5 * torch.randn(500, 1, generator=gen)
    got = Regression(Target("regression", 1, loss="mse", mean=(0.0,), std=(1.0,)), cpu).metrics(pred, y)
    esol = Evaluator("ogbg-molesol").eval({"y_true": y.numpy(), "y_pred": pred.numpy()})
    assert abs(got["rmse"] - esol["rmse"]) < 1e-6
    assert abs(got["mae"] - float(np.mean(np.abs(pred.numpy() - y.numpy())))) < 1e-6


def write_tu_raw(root: Path, name: str = "TOY", graphs: int = 24, seed: int = 0) -> None:
    """A TU dataset's raw text files (as PyG's TUDataset reads them offline): adjacency, graph indicator, graph
    labels, node labels."""
    rng = np.random.default_rng(seed)
    raw = root / "pyg" / "TUDataset" / name / "raw"
    raw.mkdir(parents=True)
    sizes = rng.integers(3, 8, graphs)
    starts = np.concatenate([[1], 1 + np.cumsum(sizes)[:-1]])
    adj = []
    for s, n in zip(starts, sizes, strict=True):
        for v in range(n - 1):  # a chain, both ways (TU files list both)
            adj += [(s + v, s + v + 1), (s + v + 1, s + v)]
    (raw / f"{name}_A.txt").write_text("".join(f"{a}, {b}\n" for a, b in adj))
    (raw / f"{name}_graph_indicator.txt").write_text("".join(f"{g + 1}\n" for g, n in enumerate(sizes)
                                                            for _ in range(n)))
    (raw / f"{name}_graph_labels.txt").write_text("".join(f"{v}\n" for v in rng.integers(0, 2, graphs)))
    (raw / f"{name}_node_labels.txt").write_text("".join(f"{v}\n" for v in rng.integers(0, 3, sizes.sum())))


def test_a_tu_dataset_is_read_offline_from_its_raw_files_as_pyg_reads_it(tmp_path):
    from torch_geometric.datasets import TUDataset

    write_tu_raw(tmp_path)
    cfg, gs = graph_set("dataset=pyg_graphs", "dataset._target_=torch_geometric.datasets.TUDataset",
                        "+dataset.kwargs.name=TOY", root=tmp_path)
    theirs = TUDataset(str(tmp_path / "pyg" / "TUDataset"), "TOY")
    assert gs.num_graphs == len(theirs) == 24
    ids = torch.arange(24)
    ours = batch_of(gs, ids)
    from torch_geometric.data import Batch

    ref = Batch.from_data_list(list(theirs))
    assert torch.equal(ours.edge_index, ref.edge_index) and torch.equal(ours.x, ref.x)
    assert torch.equal(gs.y, ref.y) and gs.x_vocab == ()  # (PyG's one-hot node labels: floats, mapped linearly)


def molecule_list() -> list:
    """A callable returning a list of Data (as dataset._target_ may name one): MoleculeNet's form, integer atom
    columns and one float column of 0 and 1 per graph, NaN where unknown."""
    from torch_geometric.data import Data

    gen = torch.Generator().manual_seed(5)
    out = []
    for g in range(30):
        n = 3 + g % 4
        y = torch.tensor([[float(g % 2) if g % 7 else float("nan")]])
        out.append(Data(x=torch.randint(0, 5, (n, 2), generator=gen), y=y,
                        edge_index=torch.stack([torch.arange(n - 1), torch.arange(1, n)])))
    return out


def test_a_callable_returning_a_list_of_data_is_a_dataset_and_float_binary_columns_are_labels(tmp_path):
    cfg, gs = graph_set("dataset=pyg_graphs", "dataset._target_=test_graph_tasks.molecule_list", root=tmp_path)
    assert gs.num_graphs == 30 and gs.x_vocab == (5, 5) and gs.x.dtype == torch.int32
    target = make_items(cfg, gs).shape().target
    assert target.kind == "multilabel" and target.width == 1 and target.metric == "rocauc"
    assert "1 float column(s) of 0 and 1" in target.describe()
    assert torch.isnan(gs.y[0, 0]) and gs.y[1, 0] == 1


def store_of(*overrides: str, world: int = 1, rank: int = 0):
    from hpcgnn.env import RankEnv
    from hpcgnn.stores.graphs import GraphSetStore
    from hpcgnn.tasks.items import GraphItems

    cfg = make_config(*small(*overrides), f"dataset.root={DATA_ROOT}")
    env = dataclasses.replace(RankEnv.from_environ({}), rank=rank, world_size=world, local_world_size=world)
    return GraphSetStore(cfg, env, torch.device("cpu"), GraphItems)


@pytest.mark.parametrize("budget", [[], ["task.batch_by=nodes", "task.budget=700"]])
def test_an_epoch_is_dealt_to_the_ranks_in_equal_steps_and_evaluation_in_the_same_batches_on_any_rank_count(budget):
    """Three ranks: each runs the store's step count, every training graph is in some rank's epoch (a few twice:
    the padding), a step's batches weigh alike across the ranks; by a node budget, each batch near it. Evaluation:
    each split's batches are the same graphs whatever the rank count, each graph scored once."""
    stores = [store_of(*budget, world=3, rank=r) for r in range(3)]
    steps = stores[0].steps
    epoch = [s.train_batches(2) for s in stores]
    assert all(len(b) == steps for b in epoch)
    seen = torch.cat([torch.cat(b) for b in epoch])
    gs = stores[0].graphs
    assert set(seen.tolist()) == set(gs.train_idx.tolist()) and seen.numel() - gs.train_idx.numel() < 3
    nodes = gs.sizes("nodes")
    weights = torch.tensor([[float(nodes[b].sum()) for b in e] for e in epoch])  # [rank, step]
    spread = (weights.max(0).values - weights.min(0).values) / weights.mean(0)
    assert float(spread[:-1].max()) < 0.25  # (a step's batches alike; the last may be short)
    if budget:
        assert float(weights.mean()) == pytest.approx(700, rel=0.25)
    assert [b.tolist() for b in stores[1].train_batches(2)] == [b.tolist() for b in epoch[1]]  # (seeded)
    assert [b.tolist() for b in stores[1].train_batches(3)] != [b.tolist() for b in epoch[1]]
    for split in ("val", "test"):
        one = store_of(*budget).eval_batches(split)
        dealt = [b for s in stores for b in s.eval_batches(split)]
        assert [b.tolist() for b in dealt] == [b.tolist() for b in one]
        assert torch.cat(dealt).tolist() == gs.split(split).tolist()


@pytest.mark.slow
@pytest.mark.parametrize("kind, metric", [("multilabel", "rocauc"), ("regression", "rmse")])
def test_each_kind_trains_and_a_run_preempted_mid_epoch_resumes_bitwise(tmp_path, kind, metric):
    """One rank in this process: a multilabel and a regression graph task learn (better than chance, an R² above
    0), and the run preempted mid-epoch resumes to the same parameters and metrics."""
    overrides = [*small("dataset.num_graphs=2000"), f"dataset.label_kind={kind}", "dataset.num_classes=3",
                 "train.epochs=3", "train.batch_size=64", f"dataset.root={DATA_ROOT}", "metrics.tensorboard=false",
                 "train.precision=fp32", *(["model.virtual_node=true"] if kind == "multilabel" else [])]
    whole, again = preempted_and_resumed(*overrides, step=30, folder=tmp_path)
    assert again["resumes"] == 1 and again["param_checksums"] == whole["param_checksums"]
    assert [r[f"val_{metric}"] for r in again["history"]] == [r[f"val_{metric}"] for r in whole["history"]]
    assert whole["metric"] == f"val_{metric}"
    assert whole["test_rocauc"] > 0.7 if kind == "multilabel" else whole["test_r2"] > 0.2


@pytest.mark.slow
def test_a_graph_task_trains_on_two_ranks_and_predicts_the_same_floats_on_one_or_two(tmp_path):
    """The default graph task on 2 local ranks learns; predict with 1 rank and with 2 writes the same outputs, bit
    for bit, and the run's metric; export keeps the readout and head (the exported module gives predict's outputs).
    (Sampler processes: test_sampler_procs trains a graph task bitwise as the rank does.)"""
    res = run_cli("task=graph", "train.epochs=3", "model.hidden_channels=64", "train.precision=fp32", cwd=tmp_path / "a",
                  timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    summary = json.loads((tmp_path / "a" / "run" / "summary.json").read_text())
    assert summary["metric"] == "val_acc" and summary["test_acc"] > 0.7 and summary["world_size"] == 2
    assert summary["seeds_unit"] == "graphs" and re.search(r"epoch 3/3 \| .* \| \d+ graphs/s", res.stderr + res.stdout)
    assert re.search(r"2 ranks on \S+, \d+ graphs/s", res.stdout)
    run = tmp_path / "a" / "run"
    outs = []
    for procs in (1, 2):
        res = subprocess.run([sys.executable, "-m", "hpcgnn", "predict", str(run), f"launch.procs={procs}",
                              f"out={tmp_path / f'p{procs}'}"], capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, res.stdout + res.stderr
        outs.append({k: np.load(tmp_path / f"p{procs}" / f"{k}.npy") for k in ("ids", "probs", "labels")})
        manifest = json.loads((tmp_path / f"p{procs}" / "manifest.json").read_text())
        assert manifest["value"] == summary["test_acc"] and manifest["rows"] == 400
    assert all(np.array_equal(outs[0][k], outs[1][k]) for k in outs[0])
    here = predict_here(run, "split=all", "--embeddings", f"out={tmp_path / 'emb'}")
    assert here["rows"] == 4000 and np.load(tmp_path / "emb" / "embeddings.npy").shape == (4000, 64)
    # export: the module with its readout and head, rebuilt from the file alone, gives predict's probabilities
    from hpcgnn.models.saved import export

    plain = torch.load(export(run), weights_only=True)
    assert plain["class"] == "hpcgnn.models.graph.GraphModel" and plain["kwargs"]["readout"] == "mean"
    from hpcgnn.models.graph import GraphModel

    model = GraphModel(**plain["kwargs"])
    model.load_state_dict(plain["state_dict"])
    gs = open_graphs(cache_folder(make_config("task=graph", f"dataset.root={DATA_ROOT}").dataset))
    ids = torch.from_numpy(outs[0]["ids"])
    b = batch_of(gs, ids)
    with torch.no_grad():
        probs = torch.softmax(model.eval()(b.x, b.edge_index, b.batch, b.edge_attr, ids.numel()), -1)
    assert np.abs(probs.numpy() - outs[0]["probs"]).max() < 0.02  # (predict ran in the run's precision)
