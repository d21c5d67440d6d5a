"""Adds the user's config folder ($HPCGNN_CONFIG_DIR or ~/.config/hpcgnn) to hpcgnn's search path.

Hydra discovers this plugin in the ``hydra_plugins`` namespace; it acts only
when the running app is hpcgnn, so other Hydra apps are untouched.
"""

from hydra.core.config_search_path import ConfigSearchPath
from hydra.plugins.search_path_plugin import SearchPathPlugin


class HpcgnnSearchPathPlugin(SearchPathPlugin):
    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        from hpcgnn import CONF_DIR, user_config_dir

        ours = f"file://{CONF_DIR}"
        if not any(e.path == ours for e in search_path.get_path()):
            return
        folder = user_config_dir()
        if folder.is_dir():
            search_path.append(provider="hpcgnn-user", path=f"file://{folder}")
