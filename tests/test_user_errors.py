"""User errors: exit 2 with one clean line, from the launcher and from the ranks, bugs keeping their traceback;
no noise around a clean error, Hydra's reasons kept, the groups' schemas not offered as options; ``files``
folders with stray labels or relations named like an added reverse refused; an OGB dataset prepared without
network: a user error naming the address, the placement and the command.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile

import numpy as np
import pytest
import torch
from conftest import DATA_ROOT, make_config, one_line, run_cli

from hpcgnn.env import RankEnv
from hpcgnn.errors import AllocationError, ConfigError, DatasetError

# One rank in this process: 600 training nodes in steps of 64 seeds, 10 steps an epoch.
SMALL = ["dataset.num_nodes=2000", f"dataset.root={DATA_ROOT}", "train.batch_size=64", "train.epochs=2",
         "model.hidden_channels=16", "metrics.tensorboard=false"]
SINGLE, CPU = RankEnv.from_environ({}), torch.device("cpu")


# ------------------------------------------------------------------ user errors: exit 2, one line


@pytest.mark.parametrize("overrides, message", [
    (["task=link", "dataset.edge_split=[0,0.5,0.5]"], r"three fractions \(train, val, test\) above 0"),
    (["dataset.num_nodes=1"], r"dataset.num_nodes=1 leaves a split without nodes .* HINT: dataset.num_nodes=10"),
    (["dataset.num_nodes=3"], r"dataset.num_nodes=3 leaves a split without nodes"),
    (["train.lr=nan"], r"train.lr=nan is not a finite number"),
    (["train.precision=fp16", "train.device=cpu"], r"fp16 needs a GPU"),
    (["train.lr=abc"], r"Error merging override train.lr=abc: Value 'abc' of type 'str' could not be converted"),
    (["model=base_model"], r"model=base_model is the schema of the model group, not one of its options. HINT: use "
                           r"one of custom, gat, gcn, gin, mlp, rgcn, sage"),
])
def test_user_errors_on_the_launcher_exit_2_with_one_line(tmp_path, overrides, message):
    import re

    res = run_cli(*overrides, cwd=tmp_path, timeout=60)
    assert res.returncode == 2 and re.search(message, one_line(res, "config error")), res.stderr


def test_the_groups_schemas_are_not_offered(tmp_path):
    res = run_cli("model=nope", cwd=tmp_path, timeout=60)
    assert res.returncode == 2 and "Could not find 'model/nope'" in res.stderr and "\tsage" in res.stderr
    assert "base_model" not in res.stderr


def test_what_the_ranks_meet_and_the_user_can_fix_is_a_user_error(tmp_path, monkeypatch):
    import socket

    from hpcgnn.data.prepared import _check_space
    from hpcgnn.dist import pick_device
    from hpcgnn.rank.techniques import grad_scaler
    from hpcgnn.submit.local import free_port
    from hpcgnn.tasks import open_store

    with pytest.raises(DatasetError, match=r"only .* are free. HINT: set dataset.root to a larger file system"):
        _check_space(tmp_path / "graph", 1 << 62)
    with pytest.raises(ConfigError, match=r"train.precision=fp16 needs a GPU, and this rank runs on the CPU"):
        grad_scaler("fp16", CPU)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError, match=rf"no free port in {port}..{port} .* HINT: set dist.port_min"):
            free_port(port, port, port)
    cfg = make_config(*SMALL, "graph=partitioned", "graph.num_parts=3", "launch.procs=3")
    two = RankEnv.from_environ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2",
                                "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29999"})
    with pytest.raises(AllocationError, match=r"graph.num_parts=3 cannot be shared by the 2 ranks started"):
        open_store(cfg, two)
    if not torch.cuda.is_available():
        with pytest.raises(AllocationError, match=r"torch sees no CUDA device here. HINT: ask the job for GPUs"):
            pick_device(SINGLE, make_config("train.device=cuda").train)


def test_a_bug_while_composing_stays_a_bug(monkeypatch):
    """Only OmegaConf's errors become config errors: a KeyError of hpcgnn's own keeps its type and traceback."""
    from hpcgnn import config

    def broken(*args, **kwargs):
        raise KeyError("a bug")

    monkeypatch.setattr(config, "_build", broken)
    with pytest.raises(KeyError, match="a bug"):
        make_config()


# ------------------------------------------------------------------ files folders


def test_a_stray_label_is_refused_unless_num_classes_says_so(tmp_path):
    from test_datasets import _write_files

    from hpcgnn.data import build_graph

    y = np.random.default_rng(0).integers(0, 4, 50)
    y[7] = 99
    _write_files(tmp_path / "g", y=y)
    with pytest.raises(DatasetError, match=r"y.npy: labels run up to 99 but only 5 classes have nodes \(95 ids in "
                                           r"between have none, e.g. 4\).*HINT: number the classes 0..4, or set "
                                           r"dataset.num_classes=100"):
        build_graph(make_config("dataset=files", f"dataset.path={tmp_path / 'g'}").dataset)
    g = build_graph(make_config("dataset=files", f"dataset.path={tmp_path / 'g'}", "dataset.num_classes=100").dataset)
    assert g.num_classes == 100
    with pytest.raises(DatasetError, match=r"label 99 is not below dataset.num_classes=50"):
        build_graph(make_config("dataset=files", f"dataset.path={tmp_path / 'g'}", "dataset.num_classes=50").dataset)


def test_a_relation_named_like_an_added_reverse_is_refused(tmp_path):
    from test_typed import write_typed_folder

    from hpcgnn.config import dataset_config
    from hpcgnn.data.files import load_typed_files
    from hpcgnn.data.synthetic import make_synthetic_typed

    graph = make_synthetic_typed(dataset_config(num_nodes=600, avg_degree=6, seed=5))
    write_typed_folder(tmp_path / "g", graph)
    rev = tmp_path / "g" / "edges" / "paper__rev_writes__author"
    rev.mkdir()
    np.save(rev / "edge_index.npy", graph.edge_index(("paper", "rev_writes", "author")).numpy())
    cfg = make_config("dataset=files", f"dataset.path={tmp_path / 'g'}").dataset
    with pytest.raises(DatasetError, match=r"paper__rev_writes__author: relation names starting with rev_ are the "
                                           r"reverses hpcgnn adds .* It is the very reverse added to "
                                           r"author__writes__paper. HINT: remove this folder"):
        load_typed_files(cfg)


# ------------------------------------------------------------------ noise around a clean error


@pytest.mark.slow
def test_a_dataset_error_met_on_the_ranks_is_one_line(tmp_path):
    """A NaN in a files folder's features, found by local rank 0 while the other rank waits: one line on stderr,
    the launcher's last; HYDRA_FULL_ERROR=1 adds the traceback before it."""
    from test_datasets import _write_files

    x = np.random.default_rng(0).normal(size=(50, 4)).astype(np.float32)
    x[5, 3] = np.nan
    _write_files(tmp_path / "g", x=x)
    over = ["dataset=files", f"dataset.path={tmp_path / 'g'}", "train.epochs=1"]
    res = run_cli(*over, cwd=tmp_path / "quiet", timeout=300)
    assert res.returncode == 2
    assert "x.npy: features contain NaN or inf (1 nodes, first node 5)" in one_line(res, "dataset error")
    full = run_cli(*over, cwd=tmp_path / "full", timeout=300, env={"HYDRA_FULL_ERROR": "1"})
    assert full.returncode == 2 and "Traceback" in full.stderr
    assert full.stderr.strip().splitlines()[-1].startswith("hpcgnn: dataset error: ")


# ------------------------------------------------------------------ OGB without network


OFFLINE = {"http_proxy": "http://127.0.0.1:9", "https_proxy": "http://127.0.0.1:9", "no_proxy": ""}


def test_preparing_ogb_offline_says_what_where_and_how(tmp_path):
    """No network (a proxy on a closed port stands in for it): exit 2, one message naming the address, where the
    files go, and the download step for a login node; no zip half-written."""
    res = subprocess.run([sys.executable, "-m", "hpcgnn.data", "prepare", "dataset=ogbn-products",
                          f"dataset.root={tmp_path}"], capture_output=True, text=True, timeout=120,
                         env={**os.environ, **OFFLINE})
    assert res.returncode == 2 and "Traceback" not in res.stderr
    text = res.stderr
    assert text.startswith("hpcgnn: dataset error: could not download ogbn-products from "
                           "http://snap.stanford.edu/ogb/data/nodeproppred/products.zip")
    assert f"python -m hpcgnn.data download dataset=ogbn-products dataset.root={tmp_path}" in text
    assert f"as {tmp_path}/ogb/products.zip (unpacked as it is)" in text
    assert f"as {tmp_path}/ogb/ogbn_products (holding raw/ and split/)" in text
    assert not (tmp_path / "ogb" / "products.zip").exists()


@pytest.mark.slow
def test_a_zip_placed_by_hand_is_prepared_without_network(tmp_path):
    """OGB's zip copied into dataset.root/ogb/ on a machine without network is unpacked and prepared."""
    from test_datasets import write_mini_ogb

    from hpcgnn.config import dataset_config
    from hpcgnn.data import build_graph

    mini = tmp_path / "mini"
    write_mini_ogb(mini, "ogbn-arxiv", n=80)
    (tmp_path / "root" / "ogb").mkdir(parents=True)
    with zipfile.ZipFile(tmp_path / "root" / "ogb" / "arxiv.zip", "w") as z:  # OGB's zip holds arxiv/...
        for path in (mini / "ogb" / "ogbn_arxiv").rglob("*"):
            z.write(path, "arxiv/" + str(path.relative_to(mini / "ogb" / "ogbn_arxiv")))
    res = subprocess.run([sys.executable, "-m", "hpcgnn.data", "prepare", "dataset=ogbn-arxiv",
                          f"dataset.root={tmp_path / 'root'}"], capture_output=True, text=True, timeout=300,
                         env={**os.environ, **OFFLINE})
    assert res.returncode == 0, res.stdout + res.stderr
    ref = build_graph(dataset_config(name="ogbn-arxiv", root=str(mini), to_undirected=True))
    got = build_graph(dataset_config(name="ogbn-arxiv", root=str(tmp_path / "root"), to_undirected=True))
    assert torch.equal(got.col, ref.col) and torch.equal(got.x, ref.x) and torch.equal(got.y, ref.y)
