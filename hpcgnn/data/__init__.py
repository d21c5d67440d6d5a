"""Datasets: each source builds a Graph once; the prepared graph is cached and memory-mapped.

- :func:`build_graph`: the graph from its source, in memory (synthetic, OGB, files);
- :func:`prepare`: build it into the cache unless it is there (``python -m hpcgnn.data prepare``);
- :func:`open_graph`: memory-map the cached graph; ranks of a node share its pages.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from collections.abc import Callable
from pathlib import Path

from hpcgnn.config import DatasetConfig
from hpcgnn.data import cache
from hpcgnn.data.files import files_folder, load_files
from hpcgnn.data.graph import Graph
from hpcgnn.data.ogb import NAMES as OGB_NAMES
from hpcgnn.data.ogb import DatasetMissing, has_raw, load_ogb, prepare_command
from hpcgnn.data.synthetic import GENERATOR_VERSION, make_synthetic
from hpcgnn.errors import ConfigError

log = logging.getLogger(__name__)

# name -> builder(cfg, allow_download)
LOADERS: dict[str, Callable[[DatasetConfig, bool], Graph]] = {
    "synthetic": lambda cfg, allow_download: make_synthetic(cfg),
    "files": load_files,
    **{name: load_ogb for name in OGB_NAMES},
}

# The fields that change what each source builds (the cache key).
_KEY_FIELDS = {
    "synthetic": ("num_nodes", "num_classes", "num_features", "avg_degree", "degree_exponent",
                  "communities_per_class", "homophily", "locality", "feature_noise", "train_fraction", "val_fraction",
                  "seed"),
    "files": ("path", "to_undirected"),
    **{name: ("to_undirected",) for name in OGB_NAMES},
}


def check_dataset_config(cfg: DatasetConfig) -> None:
    """The dataset's name is one this registry knows (a submit-time check)."""
    if cfg.name not in LOADERS:
        raise ConfigError(f"dataset.name={cfg.name!r} is unknown: use one of {', '.join(sorted(LOADERS))}")


def build_graph(cfg: DatasetConfig, allow_download: bool = False) -> Graph:
    """The graph from its source, in memory, without touching the cache."""
    check_dataset_config(cfg)
    return LOADERS[cfg.name](cfg, allow_download)


def cache_folder(cfg: DatasetConfig) -> Path:
    """``<root>/prepared/<name>-<key>``: the key covers every setting that changes the graph."""
    fields = {k: getattr(cfg, k) for k in _KEY_FIELDS[cfg.name]}
    if cfg.name == "files":
        folder = files_folder(cfg)
        fields["path"] = str(folder)
        # Replaced files must not be served from an old cache.
        fields["files"] = sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in folder.glob("*")
                                 if p.suffix in (".npy", ".pt"))
    if cfg.name == "synthetic":
        fields["generator"] = GENERATOR_VERSION
    key = hashlib.sha256(json.dumps({"name": cfg.name, **fields}, sort_keys=True, default=str).encode()).hexdigest()
    return Path(cfg.root).expanduser() / "prepared" / f"{cfg.name}-{key[:12]}"


def prepare(cfg: DatasetConfig, allow_download: bool = False) -> Path:
    """Build the graph into the cache unless it is there already; returns the cache folder."""
    folder = cache_folder(cfg)
    if cache.is_complete(folder):
        return folder
    log.info("preparing %s into %s", cfg.name, folder)
    graph = build_graph(cfg, allow_download)
    return cache.save(graph, folder, {"dataset": dataclasses.asdict(cfg)})


def check_available(cfg: DatasetConfig) -> None:
    """Before submitting: fail now, not on a compute node, when the data cannot be there."""
    if cfg.name == "files":
        files_folder(cfg)
    elif cfg.name in OGB_NAMES and not cache.is_complete(cache_folder(cfg)) and not has_raw(cfg):
        raise DatasetMissing(f"{cfg.name} is not under {Path(cfg.root).expanduser()}: jobs do not download. "
                             f"HINT: first run\n    {prepare_command(cfg)}")


def open_graph(cfg: DatasetConfig) -> Graph:
    """Memory-map the prepared graph; fails if :func:`prepare` has not run."""
    folder = cache_folder(cfg)
    if not cache.is_complete(folder):
        raise DatasetMissing(f"{cfg.name} is not prepared in {folder}. HINT: {prepare_command(cfg)}")
    return cache.load(folder)


__all__ = ["Graph", "LOADERS", "build_graph", "cache_folder", "check_dataset_config", "open_graph", "prepare"]
