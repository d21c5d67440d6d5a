"""hpcgnn: SLURM-native distributed training of graph neural networks."""

from __future__ import annotations

from pathlib import Path

__version__ = "0.1.0"

from hpcgnn.env import apply_process_defaults  # noqa: E402  (before anything here imports torch)

apply_process_defaults()


def _conf_dir() -> Path:
    """The Hydra configs: the repository's conf/, installed inside the package by a wheel (hpcgnn/conf), read in
    place beside the package in a clone and an editable install."""
    here = Path(__file__).resolve().parent
    return here / "conf" if (here / "conf").is_dir() else here.parent / "conf"


CONF_DIR = _conf_dir()


def __getattr__(name: str):
    """``hpcgnn.load_model``: imported when first used (a plain ``import hpcgnn``, which every command does, stays
    free of torch)."""
    if name == "load_model":
        from hpcgnn.models.saved import load_model

        return load_model
    raise AttributeError(f"module 'hpcgnn' has no attribute {name!r}")

