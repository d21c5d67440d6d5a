"""hpcgnn: SLURM-native distributed training of graph neural networks."""

from __future__ import annotations

import os
from pathlib import Path

__version__ = "0.1.0"

# The project's Hydra configs (editable install: the repository's conf/).
CONF_DIR = Path(__file__).resolve().parent.parent / "conf"

# Environment variables hpcgnn itself reads (launchers' variables live in env.SOURCES).
ENV_VARS = {
    "HPCGNN_CONFIG_DIR": "extra Hydra config folder for your own cluster/, model/, dataset/ files "
                         "(default ~/.config/hpcgnn)",
}


def user_config_dir() -> Path:
    """Where users keep their own config files, e.g. cluster/mycluster.yaml."""
    return Path(os.environ.get("HPCGNN_CONFIG_DIR") or Path.home() / ".config" / "hpcgnn").expanduser()
