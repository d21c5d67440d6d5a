"""``python -m hpcgnn [overrides]``: compose the config, then run or submit it."""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

from hpcgnn import CONF_DIR
from hpcgnn.config import ConfigError, RunConfig, check_override_keys, register_configs

_exit_codes: list[int] = []
_sweep: list = []  # members of a -m sweep, collected first, submitted together after Hydra's loop
_sweep_dir: list[str] = []


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")
def _hydra_entry(dcfg: DictConfig) -> None:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from hpcgnn.launch import launch

    try:
        cfg = RunConfig.from_dictconfig(dcfg)
        hc = HydraConfig.get()
        if hc.mode == RunMode.MULTIRUN:
            from hpcgnn.sweep import SweepMember

            _sweep.append(SweepMember(num=int(hc.job.num), overrides=list(hc.overrides.task), cfg=cfg))
            _sweep_dir[:] = [hc.sweep.dir]
            return
        _exit_codes.append(launch(cfg))
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
    if _sweep and not _exit_codes:  # every member valid: only now is anything submitted
        from pathlib import Path

        from hpcgnn.sweep import launch_sweep

        try:
            _exit_codes.append(launch_sweep(_sweep, Path(_sweep_dir[0]).absolute()))
        except ConfigError as exc:
            print(f"hpcgnn: config error: {exc}", file=sys.stderr)
            _exit_codes.append(2)
    sys.exit(max(_exit_codes, default=0))


if __name__ == "__main__":
    main()
