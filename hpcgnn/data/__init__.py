"""Datasets: each loader turns a DatasetConfig into a Graph."""

from __future__ import annotations

from collections.abc import Callable

from hpcgnn.config import ConfigError, DatasetConfig
from hpcgnn.data.graph import Graph
from hpcgnn.data.synthetic import make_synthetic

LOADERS: dict[str, Callable[[DatasetConfig], Graph]] = {
    "synthetic": make_synthetic,
}


def load_graph(cfg: DatasetConfig) -> Graph:
    try:
        loader = LOADERS[cfg.name]
    except KeyError:
        raise ConfigError(f"dataset.name={cfg.name!r} is unknown: use one of {', '.join(sorted(LOADERS))}") from None
    return loader(cfg)


__all__ = ["Graph", "LOADERS", "load_graph"]
