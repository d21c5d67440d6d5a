"""A graph the user has in PyG (dataset=pyg dataset._target_=...): prepared once into hpcgnn's format, keyed by the
target and its arguments, then served in every mode; its masks kept, or a seeded split made."""

from __future__ import annotations

import re

import pytest
import torch
from conftest import DATA_ROOT, EXAMPLES, make_config, run_cli, summary_of, train_here
from torch_geometric.data import Data, HeteroData

from hpcgnn.data import TYPED_LOADERS, build_graph, cache_folder
from hpcgnn.errors import ConfigError, DatasetError
from hpcgnn.stores.partitioned import distinct

FAKE = ["dataset=pyg", "dataset._target_=torch_geometric.datasets.FakeDataset",
        "+dataset.kwargs={avg_num_nodes: 3000, num_channels: 16, num_classes: 4}"]


def masked_graph(num_nodes: int = 200) -> Data:
    """A callable of the test's own: a ring with a chord every 7 nodes, labels by position, and its own masks."""
    src = torch.arange(num_nodes)
    edge_index = torch.cat([torch.stack([src, (src + 1) % num_nodes]), torch.stack([src, (src * 7) % num_nodes])], 1)
    mask = torch.zeros(num_nodes, dtype=torch.bool)
    train, val, test = mask.clone(), mask.clone(), mask.clone()
    train[:100], val[100:130], test[130:] = True, True, True
    return Data(x=torch.randn(num_nodes, 5), edge_index=edge_index, y=src % 3, train_mask=train, val_mask=val,
                test_mask=test)


def weighted_graph() -> Data:
    """masked_graph's, its edges weighted (edge_weight, as PyG's GCNConv reads it)."""
    data = masked_graph()
    data.edge_weight = torch.rand(data.edge_index.size(1))
    return data


def coded_graph() -> Data:
    """masked_graph's, its features category codes as PyG keeps them (integers: an atom's type, a bond's)."""
    data = masked_graph()
    data.x = torch.arange(data.num_nodes).view(-1, 1) % 5
    data.edge_attr = (torch.arange(data.edge_index.size(1)) % 3).to(torch.uint8)
    return data


def typed_graph(papers: int = 60, labelled_authors: bool = False) -> HeteroData:
    """A typed callable of the test's own: papers (4 features, labels, masks), authors (2 features) who write them,
    fields (no features) the papers have; papers cite papers."""
    p = torch.arange(papers)
    data = HeteroData()
    data["paper"].x = torch.randn(papers, 4)
    data["paper"].y = p % 3
    data["paper"].train_mask, data["paper"].val_mask, data["paper"].test_mask = p < 30, (p >= 30) & (p < 40), p >= 40
    data["author"].x = torch.randn(20, 2)
    if labelled_authors:
        data["author"].y = torch.arange(20) % 2
    data["field"].num_nodes = 5
    data["author", "writes", "paper"].edge_index = torch.stack([p % 20, p])
    data["paper", "cites", "paper"].edge_index = torch.stack([p, (p * 7 + 1) % papers])
    data["paper", "has", "field"].edge_index = torch.stack([p, p % 5])
    return data


def coded_typed_graph() -> HeteroData:
    """typed_graph's, its authors' features integer codes."""
    data = typed_graph()
    data["author"].x = torch.arange(20).view(-1, 1) % 4
    return data


def test_a_pyg_heterodata_keeps_its_types_pads_its_features_and_gives_featureless_types_a_mean():
    cfg = make_config("dataset=pyg_hetero", "dataset._target_=test_pyg_datasets.typed_graph").dataset
    g = TYPED_LOADERS["pyg_hetero"](cfg, False)
    torch.manual_seed(cfg.seed)  # (the loader calls it under the dataset's seed)
    data = typed_graph()
    assert g.target == "paper" and g.num_nodes == {"paper": 60, "author": 20, "field": 5} and g.num_classes == 3
    assert g.train_idx.tolist() == list(range(30)) and g.test_idx.tolist() == list(range(40, 60))
    assert set(g.relations) == {("author", "writes", "paper"), ("paper", "rev_writes", "author"),
                                ("paper", "cites", "paper"), ("paper", "has", "field"), ("field", "rev_has", "paper")}
    assert g.num_features == 4 and torch.equal(g.x["author"][:, :2], data["author"].x)  # padded on the right
    assert not g.x["author"][:, 2:].any()
    assert g.feature_rule["field"] == "mean over paper__has__field"
    assert torch.allclose(g.x["field"][0], data["paper"].x[p_of_field_0 := torch.arange(0, 60, 5)].mean(0))
    assert len(p_of_field_0) == 12
    directed = TYPED_LOADERS["pyg_hetero"](
        make_config("dataset=pyg_hetero", "dataset._target_=test_pyg_datasets.typed_graph",
                    "dataset.to_undirected=false").dataset, False)
    assert set(directed.relations) == {("author", "writes", "paper"), ("paper", "cites", "paper"),
                                       ("paper", "has", "field")}
    view = build_graph(make_config("dataset=pyg_hetero", "dataset._target_=test_pyg_datasets.typed_graph",
                                   "dataset.erase_types=true").dataset)
    assert view.num_nodes == 85 and view.train_idx.tolist() == list(range(30))  # (paper first: the graph's order)
    two = ["dataset=pyg_hetero", "dataset._target_=test_pyg_datasets.typed_graph", "+dataset.kwargs.labelled_authors=true"]
    with pytest.raises(DatasetError, match=r"dataset._target_=test_pyg_datasets.typed_graph: 2 node types have labels "
                                           r"\(y\) \(paper, author\). HINT: name the one to predict with "
                                           r"dataset.target_type=TYPE"):
        TYPED_LOADERS["pyg_hetero"](make_config(*two).dataset, False)
    authors = TYPED_LOADERS["pyg_hetero"](make_config(*two, "dataset.target_type=author").dataset, False)
    assert authors.target == "author" and authors.num_classes == 2 and authors.train_idx.numel() == int(0.3 * 20)


def test_a_callable_of_ones_own_keeps_its_masks_and_a_class_without_gets_a_seeded_split():
    g = build_graph(make_config("dataset=pyg", "dataset._target_=test_pyg_datasets.masked_graph",
                                "+dataset.kwargs.num_nodes=150").dataset)
    assert g.num_nodes == 150 and g.num_classes == 3 and g.x.shape == (150, 5)
    assert g.train_idx.tolist() == list(range(100)) and g.val_idx.tolist() == list(range(100, 130))
    assert g.test_idx.tolist() == list(range(130, 150))
    fake = make_config(*FAKE).dataset
    a, b = build_graph(fake), build_graph(fake)  # generated under dataset.seed: the same graph each time
    assert torch.equal(a.col, b.col) and torch.equal(a.x, b.x) and torch.equal(a.train_idx, b.train_idx)
    n = a.num_nodes
    assert a.train_idx.numel() == int(0.3 * n) and a.val_idx.numel() == int(0.4 * n) - int(0.3 * n)
    assert torch.cat([a.train_idx, a.val_idx, a.test_idx]).sort().values.tolist() == list(range(n))
    other = make_config(*FAKE[:2], "+dataset.kwargs={avg_num_nodes: 3000, num_channels: 8, num_classes: 4}").dataset
    assert cache_folder(other) != cache_folder(fake)  # another argument: prepared again
    assert cache_folder(make_config(*FAKE, "dataset.seed=1").dataset) != cache_folder(fake)


def test_an_edge_weight_that_is_not_read_is_said(caplog):
    """hpcgnn reads edges' features from edge_attr: a Data's edge_weight is said to go unread, with the line that
    makes it one."""
    import logging

    with caplog.at_level(logging.INFO, logger="hpcgnn.data"):
        g = build_graph(make_config("dataset=pyg", "dataset._target_=test_pyg_datasets.weighted_graph").dataset)
    assert g.edge_attr is None
    assert ("dataset=pyg: the edge_weight of test_pyg_datasets.weighted_graph is not read (hpcgnn reads edges' "
            "features from edge_attr); data.edge_attr = data.edge_weight.view(-1, 1) gives them to a model that reads "
            "edge features") in caplog.text


def test_integer_features_are_read_as_values_and_said_to_be(caplog):
    """PyG keeps category codes as integers: hpcgnn reads them as float values (what they are, where they count)
    and says so, naming the fix where they are codes; a float graph says nothing."""
    import logging

    with caplog.at_level(logging.INFO, logger="hpcgnn.data"):
        g = build_graph(make_config("dataset=pyg", "dataset._target_=test_pyg_datasets.coded_graph").dataset)
    assert g.x.dtype == torch.float32 and g.x.view(-1).tolist()[:6] == [0.0, 1.0, 2.0, 3.0, 4.0, 0.0]
    assert g.edge_attr.dtype == torch.float32 and set(g.edge_attr.view(-1).tolist()) == {0.0, 1.0, 2.0}
    for what, dtype in (("x", "int64"), ("edge_attr", "uint8")):
        assert (f"dataset=pyg: {what} of test_pyg_datasets.coded_graph holds {dtype}: read as float values; where "
                "they are category codes (atom or bond types), one-hot them in what dataset._target_ returns") \
            in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="hpcgnn.data"):
        build_graph(make_config("dataset=pyg", "dataset._target_=test_pyg_datasets.masked_graph").dataset)
    assert "read as float values" not in caplog.text
    with caplog.at_level(logging.INFO, logger="hpcgnn.data"):  # a typed graph's, per node type
        g = TYPED_LOADERS["pyg_hetero"](make_config("dataset=pyg_hetero",
                                                    "dataset._target_=test_pyg_datasets.coded_typed_graph").dataset, False)
    assert "dataset=pyg_hetero: the x of author of test_pyg_datasets.coded_typed_graph holds int64: read as float" \
        in caplog.text and "the x of paper" not in caplog.text


def test_what_cannot_be_read_is_named():
    with pytest.raises(DatasetError, match=r"dataset._target_=torch_geometric.datasets.NoSuchSet cannot be imported. "
                                           r"HINT: name a class or function as package.module.Name"):
        build_graph(make_config("dataset=pyg", "dataset._target_=torch_geometric.datasets.NoSuchSet").dataset)
    with pytest.raises(DatasetError, match=r"FakeHeteroDataset gives a HeteroData, a typed graph. HINT: "
                                           r"dataset=pyg_hetero \(add dataset.erase_types=true for its homogeneous view\)"):
        build_graph(make_config("dataset=pyg", "dataset._target_=torch_geometric.datasets.FakeHeteroDataset").dataset)
    with pytest.raises(DatasetError, match=r"KarateClub gives a Data, one node and edge type. HINT: dataset=pyg$"):
        TYPED_LOADERS["pyg_hetero"](make_config("dataset=pyg_hetero",
                                                "dataset._target_=torch_geometric.datasets.KarateClub").dataset, False)
    with pytest.raises(ConfigError, match=r"dataset.target_type=paper names the labelled node type of a PyG "
                                          r"HeteroData \(dataset=pyg_hetero\); got dataset=pyg. HINT: drop it"):
        make_config(*FAKE, "dataset.target_type=paper")
    with pytest.raises(DatasetError, match=r"KarateClub\(bogus=1\) failed: TypeError: .*HINT: its arguments go in "
                                           r"dataset.kwargs"):
        build_graph(make_config("dataset=pyg", "dataset._target_=torch_geometric.datasets.KarateClub",
                                "+dataset.kwargs.bogus=1").dataset)
    karate = build_graph(make_config("dataset=pyg", "dataset._target_=torch_geometric.datasets.KarateClub").dataset)
    assert karate.num_nodes == 34 and karate.num_classes == 4  # (its one mask: the seeded split instead)
    with pytest.raises(ConfigError, match=r"^dataset=pyg needs dataset._target_: a PyG dataset class or a function "):
        make_config("dataset=pyg")
    with pytest.raises(ConfigError, match=r"HINT: dataset._target_ is a setting of dataset=pyg or dataset=pyg_hetero or dataset=pyg_graphs$"):
        make_config("dataset._target_=torch_geometric.datasets.FakeDataset")


def test_a_padded_batch_holds_each_seed_once():
    """A rank with fewer training seeds than a batch pads by repeating them: the batch keeps each once, in order."""
    assert torch.equal(distinct(torch.tensor([5, 3, 9, 5, 3, 1])), torch.tensor([5, 3, 9, 1]))
    batch = torch.tensor([4, 2, 8])
    assert distinct(batch) is batch


@pytest.mark.slow
def test_a_pyg_dataset_trains_partitioned_on_two_ranks(tmp_path):
    res = run_cli(*FAKE, "graph=partitioned", "train.epochs=2", "metrics.tensorboard=false", cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    s = summary_of(tmp_path)
    assert s["dataset"] == "pyg" and s["graph_mode"] == "partitioned" and s["world_size"] == 2


@pytest.mark.slow
def test_a_pyg_heterodata_trains_partitioned_with_a_relational_model_of_ones_own(tmp_path):
    """PyG's FakeHeteroDataset (three node types of different feature widths, six relations) on two ranks, each
    holding its part, with the example's HeteroSAGE and a sampler process per rank."""
    res = run_cli("dataset=pyg_hetero", "dataset._target_=torch_geometric.datasets.FakeHeteroDataset",
                  "+dataset.kwargs={num_classes: 4}", "graph=partitioned", "model=custom",
                  "model._target_=my_gnn.HeteroSAGE", "model.hidden_channels=32", "train.sampler_procs=1", "train.num_threads=2",
                  "train.epochs=2", "metrics.tensorboard=false", cwd=tmp_path, env=EXAMPLES)
    assert res.returncode == 0, res.stdout + res.stderr
    s = summary_of(tmp_path)
    assert s["dataset"] == "pyg_hetero" and s["graph_mode"] == "partitioned" and s["world_size"] == 2
    assert s["model_class"] == "my_gnn.HeteroSAGE" and len(set(s["param_checksums"])) == 1 and 0 <= s["test"] <= 1


def test_a_pyg_dataset_serves_link_prediction(tmp_path):
    s = train_here(*FAKE, f"dataset.root={DATA_ROOT}", "task=link", "train.epochs=1", "metrics.tensorboard=false",
                   run_dir=tmp_path)
    assert s["dataset"] == "pyg" and s["task"] == "link" and 0 <= s["test"] <= 1


class DatedGraphs:
    """An InMemoryDataset of the user's whose processed folder holds a file PyG's safe loader refuses (a date):
    PyG reads it with torch's full unpickler, warning twice over."""

    def __new__(cls, root: str):
        import datetime
        import os

        from torch_geometric.data import Data, InMemoryDataset
        from torch_geometric.io import fs

        class _Dated(InMemoryDataset):
            @property
            def processed_file_names(self):
                return ["data.pt", "made.pt"]

            def process(self):
                g = torch.Generator().manual_seed(0)
                data = Data(x=torch.randn(30, 4, generator=g), edge_index=torch.randint(0, 30, (2, 90), generator=g),
                            y=torch.randint(0, 3, (30,), generator=g))
                self.save([data], self.processed_paths[0])
                torch.save({"made": datetime.date(2026, 11, 29)}, self.processed_paths[1])

        made = _Dated(root)
        made.load(made.processed_paths[0])
        fs.torch_load(os.path.join(made.processed_dir, "made.pt"))
        return made


def test_a_file_pygs_safe_loader_refuses_is_one_line_not_ten_lines_of_warnings(tmp_path, caplog, recwarn):
    import logging

    caplog.set_level(logging.WARNING, logger="hpcgnn")
    args = ["dataset=pyg", "dataset._target_=test_pyg_datasets.DatedGraphs", f"dataset.root={tmp_path}"]
    g = build_graph(make_config(*args).dataset)
    assert g.num_nodes == 30
    said = [r.getMessage() for r in caplog.records if "full unpickler" in r.getMessage()]
    assert len(said) == 1 and re.search(r"dataset._target_=test_pyg_datasets.DatedGraphs: PyG read 1 processed file\(s\) "
                                        r"with torch's full unpickler, the safe loader having refused "
                                        r"add_safe_globals\(\[.*date.*\]\)", said[0]), said
    assert not [w for w in recwarn if "Weights only load failed" in str(w.message)]


def reciprocal_graph():
    """Every edge given in both directions, none twice: no pair repeats."""
    g = torch.Generator().manual_seed(0)
    src, dst = torch.randint(0, 200, (2, 600), generator=g)
    keep = src != dst
    pairs = torch.unique(torch.stack([torch.minimum(src, dst), torch.maximum(src, dst)])[:, keep], dim=1)
    return Data(x=torch.randn(200, 4, generator=g), edge_index=torch.cat([pairs, pairs.flip(0)], 1),
                y=torch.randint(0, 3, (200,), generator=g))


def test_the_reverses_to_undirected_adds_are_not_counted_as_repeated_pairs(caplog):
    """With dataset.to_undirected=true the log said '28200 of its 71184 edges repeat a (source, target) pair given
    before' of a graph with no repeated pair: the reverses it added were counted. Now only a repeat given is said."""
    import logging

    args = ["dataset=pyg", "dataset._target_=test_pyg_datasets.reciprocal_graph"]
    with caplog.at_level(logging.INFO, logger="hpcgnn.data.graph"):
        g = build_graph(make_config(*args, "dataset.to_undirected=true").dataset)
    assert g.num_edges == reciprocal_graph().num_edges and "repeat" not in caplog.text, caplog.text
    data = reciprocal_graph()
    twice = torch.cat([data.edge_index, data.edge_index[:, :7]], 1)
    assert torch.unique(twice[0] * 200 + twice[1]).numel() == data.num_edges
