"""A graph the user has in PyG (dataset=pyg dataset._target_=...): prepared once into hpcgnn's format, keyed by the
target and its arguments, then served in every mode; its masks kept, or a seeded split made."""

from __future__ import annotations

import pytest
import torch
from conftest import DATA_ROOT, make_config, run_cli, summary_of, train_here
from torch_geometric.data import Data

from hpcgnn.data import build_graph, cache_folder
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


def test_what_cannot_be_read_is_named():
    with pytest.raises(DatasetError, match=r"dataset._target_=torch_geometric.datasets.NoSuchSet cannot be imported. "
                                           r"HINT: name a class or function as package.module.Name"):
        build_graph(make_config("dataset=pyg", "dataset._target_=torch_geometric.datasets.NoSuchSet").dataset)
    with pytest.raises(DatasetError, match=r"gives a HeteroData: typed PyG graphs are not read yet"):
        build_graph(make_config("dataset=pyg", "dataset._target_=torch_geometric.datasets.FakeHeteroDataset").dataset)
    with pytest.raises(DatasetError, match=r"KarateClub\(bogus=1\) failed: TypeError: .*HINT: its arguments go in "
                                           r"dataset.kwargs"):
        build_graph(make_config("dataset=pyg", "dataset._target_=torch_geometric.datasets.KarateClub",
                                "+dataset.kwargs.bogus=1").dataset)
    karate = build_graph(make_config("dataset=pyg", "dataset._target_=torch_geometric.datasets.KarateClub").dataset)
    assert karate.num_nodes == 34 and karate.num_classes == 4  # (its one mask: the seeded split instead)
    with pytest.raises(ConfigError, match=r"goes with dataset=pyg"):
        make_config("dataset=pyg")
    with pytest.raises(ConfigError, match=r"goes with dataset=pyg"):
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


def test_a_pyg_dataset_serves_link_prediction(tmp_path):
    s = train_here(*FAKE, f"dataset.root={DATA_ROOT}", "task=link", "train.epochs=1", "metrics.tensorboard=false",
                   run_dir=tmp_path)
    assert s["dataset"] == "pyg" and s["task"] == "link" and 0 <= s["test"] <= 1
