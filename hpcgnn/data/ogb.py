"""OGB node-property datasets through the ``ogb`` package's own loader.

The raw download lives under ``<dataset.root>/ogb/<name>`` in OGB's layout; ogb's
readers turn it into arrays once, and hpcgnn keeps the result in its own
memory-mappable cache.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import torch

from hpcgnn.config import DatasetConfig
from hpcgnn.data.graph import Graph
from hpcgnn.errors import ConfigError, DatasetError

NAMES = ("ogbn-arxiv", "ogbn-products", "ogbn-papers100M")


class DatasetMissing(DatasetError):
    """The dataset is not on disk and this process may not download it."""


def prepare_command(cfg: DatasetConfig) -> str:
    """The command that prepares ``cfg``'s dataset (run where the internet is)."""
    root = f" dataset.root={cfg.root}" if cfg.root != DatasetConfig.root else ""
    return f"python -m hpcgnn.data prepare dataset={cfg.name}{root}"


def ogb_root(cfg: DatasetConfig) -> Path:
    return Path(cfg.root).expanduser() / "ogb"


def ogb_folder(cfg: DatasetConfig) -> Path:
    """Where OGB's layout of this dataset lives (``ogbn-arxiv`` -> ``ogb/ogbn_arxiv``)."""
    return ogb_root(cfg) / cfg.name.replace("-", "_")


def has_raw(cfg: DatasetConfig) -> bool:
    return any((ogb_folder(cfg) / p).exists() for p in ("raw/edge.csv.gz", "raw/data.npz"))


def _meta(name: str) -> dict:
    """ogb's own metadata row for ``name`` (url, split name, inverse edges, binary layout, classes)."""
    import ogb
    import pandas as pd

    master = pd.read_csv(Path(ogb.__file__).parent / "nodeproppred" / "master.csv", index_col=0,
                         keep_default_na=False)
    return master[name].to_dict()


def _download(cfg: DatasetConfig, meta: dict, folder: Path) -> None:
    """ogb's download path: fetch the zip, unpack it, move it into place."""
    from ogb.utils.url import decide_download, download_url, extract_zip

    root = ogb_root(cfg)
    root.mkdir(parents=True, exist_ok=True)
    if not decide_download(meta["url"]):
        raise DatasetMissing(f"download of {cfg.name} declined")
    path = download_url(meta["url"], str(root))
    extract_zip(path, str(root))
    os.unlink(path)
    shutil.rmtree(folder, ignore_errors=True)
    shutil.move(str(root / meta["download_name"]), str(folder))


def load_ogb(cfg: DatasetConfig, allow_download: bool) -> Graph:
    """Read OGB's raw files with ogb's own readers (ogb.io), never its pickled processed file.

    ogb 1.3.6's NodePropPredDataset torch.load()s that file without weights_only, which
    torch >= 2.6 refuses; hpcgnn keeps its own cache instead.
    """
    if cfg.name not in NAMES:
        raise ConfigError(f"dataset.name={cfg.name!r} is not an OGB node dataset hpcgnn knows: {', '.join(NAMES)}")
    from ogb.io.read_graph_raw import read_binary_graph_raw, read_csv_graph_raw

    meta = _meta(cfg.name)
    folder = ogb_folder(cfg)
    if not has_raw(cfg):
        if not allow_download:
            raise DatasetMissing(
                f"{cfg.name} is not under {ogb_root(cfg)}, and training jobs do not download (compute nodes often "
                f"have no internet). HINT: on a login node run\n    {prepare_command(cfg)}")
        _download(cfg, meta, folder)
    raw = folder / "raw"
    if meta["binary"] == "True":
        graph = read_binary_graph_raw(str(raw), add_inverse_edge=False)[0]
        labels = np.load(raw / "node-label.npz")["node_label"]
    else:
        graph = read_csv_graph_raw(str(raw), add_inverse_edge=meta["add_inverse_edge"] == "True")[0]
        labels = _read_csv(raw / "node-label.csv.gz")
    split_dir = folder / "split" / meta["split"]
    split = {part: _read_csv(split_dir / f"{part}.csv.gz").reshape(-1) for part in ("train", "valid", "test")}

    n = int(graph["num_nodes"])
    edge_index = torch.from_numpy(np.ascontiguousarray(graph["edge_index"], dtype=np.int64))
    if cfg.to_undirected:
        edge_index = torch.cat([edge_index, edge_index.flip(0)], dim=1)
    x = torch.from_numpy(np.ascontiguousarray(graph["node_feat"], dtype=np.float32))
    # papers100M labels only a subset of nodes (NaN elsewhere): those become -1 and lie in no split.
    y_np = np.asarray(labels, dtype=np.float64).reshape(-1)
    y = torch.from_numpy(np.where(np.isnan(y_np), -1, y_np).astype(np.int64))
    idx = {k: torch.from_numpy(v.astype(np.int64)) for k, v in split.items()}
    return Graph.from_edge_index(edge_index, n, x, y, idx["train"], idx["valid"], idx["test"],
                                 int(meta["num classes"]))


def _read_csv(path: Path) -> np.ndarray:
    import pandas as pd

    return pd.read_csv(path, compression="gzip", header=None).values
