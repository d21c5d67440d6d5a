"""One path from command-line overrides to checked RunConfigs, shared by every hpcgnn command.

``python -m hpcgnn``, ``hpcgnn data prepare``, ``hpcgnn partition`` and the tests all compose
through :func:`compose`: the typo guard first (the key and its valid neighbours, before any
YAML is read), then Hydra's compose API over the packaged ``conf/`` (plus the user's config
folder, see ``hydra_plugins/``), then the frozen :class:`RunConfig` with its cross-field
checks, then the registries' own checks of their names (models, datasets, tasks). A sweep
(``-m``) is expanded by :func:`expand_sweep` the way Hydra's basic sweeper does (the
product of every comma list, ``range()``, ``choice()`` and ``glob()``), and every member is
composed on this same path.

The run folder: ``run_dir=...`` if given, else ``hydra.run.dir`` (a run) or
``hydra.sweep.dir``/``hydra.sweep.subdir`` (member N of a sweep), made absolute.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from hpcgnn import CONF_DIR
from hpcgnn.checks import check_registered_names
from hpcgnn.config import RunConfig, check_override_keys, register_configs
from hpcgnn.errors import ConfigError
from hpcgnn.tuning import expand_best

CONFIG_NAME = "config"


@dataclass(frozen=True)
class Composed:
    """A composed run: the checked config, the overrides it came from, and Hydra's own settings."""

    cfg: RunConfig
    overrides: tuple[str, ...]
    sweep_dir: str | None  # the sweep's folder, for members of a sweep


def _compose_dict(overrides: list[str]) -> DictConfig:
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.utils import setup_globals
    from hydra.errors import HydraException

    from hpcgnn import paths
    from hpcgnn.env import user_config_dir

    paths.check_tree(user_config_dir(), "your config folder", "keep it where only you can write (HPCGNN_CONFIG_DIR="
                     "...): Hydra composes what it holds, and a _target_ there is code")
    register_configs()
    setup_globals()  # Hydra's ${now:...} resolver, which hydra.run.dir and hydra.sweep.dir use
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            return hydra_compose(config_name=CONFIG_NAME, overrides=overrides, return_hydra_config=True)
    except (HydraException, OmegaConfBaseException) as exc:  # unknown group option, bad syntax, wrong type
        raise ConfigError(hydra_message(exc)) from None
    finally:
        GlobalHydra.instance().clear()


def hydra_message(exc: BaseException) -> str:
    """Hydra's error with its cause (``Error merging override train.lr=abc``: why), without the schema
    configs (``base_<group>``) in its lists of available options: they are not choices."""
    text = str(exc).strip()
    cause = exc.__cause__ or exc.__context__
    if cause is not None and str(cause).strip() and str(cause).strip() not in text:
        text += ": " + str(cause).strip().splitlines()[0]
    return " ".join(_without_context(text).splitlines()[:2]) if "ConfigKeyError" in text else \
        "\n".join(line for line in _without_context(text).splitlines() if not line.strip().startswith(SCHEMA_PREFIX))


_CONTEXT = ("full_key:", "object_type=", "reference_type=")  # OmegaConf's lines about where, after what


def _without_context(text: str) -> str:
    """An OmegaConf error's message without its context lines (the key and class it says in words already)."""
    return "\n".join(line for line in text.splitlines() if not line.strip().startswith(_CONTEXT))


SCHEMA_PREFIX = "base_"  # the schema of each config group (config.register_configs), stored beside its options


def check_group_choices(dcfg: DictConfig) -> None:
    """A group's schema (``model=base_model``) is not an option of the group: refuse it by name."""
    choices = OmegaConf.select(dcfg, "hydra.runtime.choices") or {}
    for group, choice in choices.items():
        if isinstance(choice, str) and choice.startswith(SCHEMA_PREFIX) and not group.startswith("hydra"):
            raise ConfigError(f"{group}={choice} is the schema of the {group} group, not one of its options. HINT: "
                              f"use one of {', '.join(group_options(group))}")


def config_groups() -> set[str]:
    """The config groups: the folders of the packaged ``conf/`` and of the user's config folder."""
    from hpcgnn.env import user_config_dir

    return {p.name for folder in (CONF_DIR, user_config_dir()) if folder.is_dir() for p in folder.iterdir()
            if p.is_dir()}


_OPTION = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.@-]*")


def check_group_values(overrides: list[str] | tuple[str, ...]) -> None:
    """A config group's value is the name of one of its options (a YAML file in the group's folder), never a path:
    ``model=../../x`` or ``model=/abs/x`` would have Hydra compose a YAML from outside the config tree (another
    user's, whose ``# @package _global_`` can set any ``_target_``). Refused before anything is read."""
    groups = None
    for o in overrides:
        key, eq, value = o.lstrip("+~").partition("=")
        if not eq:
            continue
        if key in ("hydra.searchpath", "hydra.searchpath[]"):
            raise ConfigError(f"{key}: hpcgnn composes configs from its own conf/ and your config folder alone (a path "
                              "added here could be another user's). HINT: put your YAML into your config folder "
                              "(HPCGNN_CONFIG_DIR, default ~/.config/hpcgnn)")
        if groups is None:
            groups = config_groups()
        if key.split("/")[0] not in groups and not key.startswith("hydra/"):
            continue  # (a value such as train.lr or hydra.run.dir, not a group)
        if value.strip() in ("null", ""):
            continue
        parts = value.split("/")
        if any(not _OPTION.fullmatch(part) or part.startswith("..") for part in parts):
            raise ConfigError(f"{key}={value}: a config group's value is the name of one of its options, not a path "
                              f"(a YAML from outside the config tree would be composed: it can name code to run). "
                              f"HINT: use one of {', '.join(group_options(key)) or 'its options'}, or put your own "
                              f"YAML into your config folder's {key}/ and give its name")


def group_options(group: str) -> list[str]:
    """The options of a config group: its YAML files, packaged and in the user's config folder."""
    from hpcgnn.env import user_config_dir

    found = {p.stem for folder in (CONF_DIR, user_config_dir()) for p in (folder / group).glob("*.yaml")}
    return sorted(found)


def compose(overrides: list[str] | tuple[str, ...] = (), job_num: int | None = None, sweep_dir: str | None = None,
            check_names: bool = True) -> Composed:
    """Overrides -> a checked RunConfig. ``job_num``: member ``job_num`` of a sweep whose folder is
    ``sweep_dir`` (None: ``hydra.sweep.dir``, resolved now).

    Raises :class:`ConfigError` naming the key or value to change.
    """
    overrides = expand_best(overrides)  # (+tune.best=FILE: a tune's best trial's overrides)
    check_group_values(overrides)
    check_override_keys(overrides)
    extra = [f"hydra.job.num={job_num}"] if job_num is not None else []
    if sweep_dir is not None:
        extra.append(f"hydra.sweep.dir={sweep_dir}")
    dcfg = _compose_dict(overrides + extra)
    check_group_choices(dcfg)
    sweep_dir = None
    try:
        run_dir = dcfg.get("run_dir") or None
        if job_num is not None:
            sweep_dir = str(Path(OmegaConf.select(dcfg, "hydra.sweep.dir")).absolute())
            run_dir = run_dir or str(Path(sweep_dir) / str(OmegaConf.select(dcfg, "hydra.sweep.subdir")))
        run_dir = str(Path(run_dir or OmegaConf.select(dcfg, "hydra.run.dir")).absolute())
        with open_dict(dcfg):
            del dcfg["hydra"]
        dcfg.run_dir = run_dir
        cfg = RunConfig.from_dictconfig(dcfg)
    except OmegaConfBaseException as exc:  # OmegaConf's interpolation and type errors, worded by OmegaConf
        raise ConfigError(_without_context(str(exc).strip())) from None
    if check_names:
        check_registered_names(cfg)  # (hpcgnn.checks: the registries' names, no torch imported)
    return Composed(cfg, tuple(overrides), sweep_dir)


def expand_sweep(overrides: list[str]) -> list[list[str]]:
    """The members of a ``-m`` sweep: every combination of the sweep overrides' values, in
    Hydra's order (the last override varies fastest); other overrides are shared."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    overrides = expand_best(overrides)
    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except HydraException as exc:
        raise ConfigError(str(exc).strip()) from None
    lists: dict[str, list[str]] = {}
    for ov in parsed:
        key = ov.get_key_element()
        if ov.is_sweep_override():
            if not ov.is_discrete_sweep():
                raise ConfigError(f"{ov.input_line}: interval sweeps need an optimising sweeper; list the values "
                                  "instead, e.g. train.lr=1e-3,3e-3 or train.lr=range(1,4)")
            lists[key] = [f"{key}={value}" for value in ov.sweep_string_iterator()]
        else:
            lists[key] = [f"{key}={ov.get_value_element_as_str()}"] if not ov.is_delete() else [ov.input_line]
    return [list(combo) for combo in itertools.product(*lists.values())]


def compose_sweep(overrides: list[str]) -> list[Composed]:
    """Every member of a sweep, composed and checked (nothing runs before all of them are valid).

    The sweep folder is resolved once (its default holds the time) and shared by every member.
    """
    members = expand_sweep(overrides)
    first = compose(members[0], job_num=0)
    return [first] + [compose(m, job_num=num, sweep_dir=first.sweep_dir) for num, m in enumerate(members[1:], 1)]


def resolved_yaml(cfg: RunConfig) -> str:
    """The resolved config as YAML (a dry run prints it, a run folder keeps it)."""
    import dataclasses

    return OmegaConf.to_yaml(OmegaConf.create(dataclasses.asdict(cfg)))


def record_config(cfg: RunConfig, overrides: tuple[str, ...] | list[str]) -> None:
    """``<run_dir>/.hydra/``: the resolved config and the overrides it came from (as Hydra's own runs keep)."""
    from hpcgnn.io import atomic_open

    folder = Path(cfg.run_dir) / ".hydra"
    with atomic_open(folder / "config.yaml") as f:
        f.write(resolved_yaml(cfg))
    with atomic_open(folder / "overrides.yaml") as f:
        f.write(OmegaConf.to_yaml(OmegaConf.create(list(overrides))))
