"""``python -m hpcgnn.data prepare dataset=NAME [overrides]``: download and prepare a dataset.

Run it on a login node: compute nodes often have no internet, and training jobs
never download. Does nothing when the prepared dataset is already there.
"""

from __future__ import annotations

import sys

from hpcgnn.config import ConfigError


def main(argv: list[str]) -> int:
    if not argv or argv[0] != "prepare":
        print(__doc__.strip(), file=sys.stderr)
        return 2
    from hydra import compose, initialize_config_dir

    from hpcgnn import CONF_DIR
    from hpcgnn.config import RunConfig, check_override_keys, register_configs
    from hpcgnn.data import cache, prepare

    overrides = argv[1:]
    try:
        check_override_keys(overrides)
        register_configs()
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            dcfg = compose(config_name="config", overrides=[*overrides, "run_dir=."])
        cfg = RunConfig.from_dictconfig(dcfg).dataset
        folder = prepare(cfg, allow_download=True)
    except ConfigError as exc:
        print(f"hpcgnn: {exc}", file=sys.stderr)
        return 2
    print(f"{cfg.name}: prepared in {folder} ({cache.human_bytes(cache.size_bytes(folder))})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
