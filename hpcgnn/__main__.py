"""``python -m hpcgnn [overrides]``: compose the config, then run or submit it."""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

from hpcgnn import CONF_DIR
from hpcgnn.config import ConfigError, RunConfig, check_override_keys, register_configs

_exit_codes: list[int] = []


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")
def _hydra_entry(dcfg: DictConfig) -> None:
    from hpcgnn.launch import launch

    try:
        _exit_codes.append(launch(RunConfig.from_dictconfig(dcfg)))
    except ConfigError as exc:  # includes AllocationError: what was launched does not match the config
        print(f"hpcgnn: config error: {exc}", file=sys.stderr)
        _exit_codes.append(2)


def main() -> None:
    try:
        check_override_keys([a for a in sys.argv[1:] if not a.startswith("-")])
    except ConfigError as exc:
        print(f"hpcgnn: config error: {exc}", file=sys.stderr)
        sys.exit(2)
    register_configs()
    _hydra_entry()
    sys.exit(max(_exit_codes, default=0))


if __name__ == "__main__":
    main()
