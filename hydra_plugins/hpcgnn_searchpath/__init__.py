"""Adds the user's config folder ($HPCGNN_CONFIG_DIR or ~/.config/hpcgnn) to hpcgnn's search path.

Hydra discovers this plugin in the ``hydra_plugins`` namespace; it acts only
when the running app is hpcgnn, so other Hydra apps are untouched.
"""

from pathlib import Path

from hydra.core.config_search_path import ConfigSearchPath
from hydra.plugins.search_path_plugin import SearchPathPlugin


class HpcgnnSearchPathPlugin(SearchPathPlugin):
    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        from hpcgnn import CONF_DIR
        from hpcgnn.env import user_config_dir

        if not any(_is_dir(e.path, CONF_DIR) for e in search_path.get_path()):
            return
        folder = user_config_dir()
        if folder.is_dir():
            search_path.append(provider="hpcgnn-user", path=f"file://{folder}")


def _is_dir(entry: str | None, folder: Path) -> bool:
    if not entry or entry.startswith("pkg://") or entry.startswith("structured://"):
        return False
    return Path(entry.removeprefix("file://")).resolve() == folder
