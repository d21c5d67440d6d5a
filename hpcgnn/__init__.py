"""hpcgnn: SLURM-native distributed training of graph neural networks."""

from __future__ import annotations

from pathlib import Path

__version__ = "0.1.0"

# The Hydra configs ship inside the package: a clone and an installed wheel read the same files.
CONF_DIR = Path(__file__).resolve().parent / "conf"


def user_config_dir() -> Path:
    """Where users keep their own config files, e.g. cluster/mycluster.yaml ($HPCGNN_CONFIG_DIR)."""
    from hpcgnn.env import user_config_dir as _folder

    return _folder()
