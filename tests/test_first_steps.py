"""A new user's first steps on a cluster: a long prepare says how far it is, data prepare says what it does, every
library hpcgnn imports is declared, and Hydra's launcher and sweeper plugins point to cluster files and -m.
"""

from __future__ import annotations

import logging
import re
import subprocess
import sys

import pytest

from hpcgnn.errors import ConfigError


def test_a_long_prepare_says_how_far_it_is(caplog):
    """(Its lines are kept by a handler on Progress's own logger: whatever handlers earlier tests of the session
    left on the loggers above it, each line is kept once.)"""
    from hpcgnn.logs import Progress

    lines: list[str] = []
    keep = logging.Handler()
    keep.emit = lambda record: lines.append(record.getMessage())
    logger = logging.getLogger("hpcgnn.progress")
    logger.addHandler(keep)
    try:
        with caplog.at_level(logging.INFO, logger="hpcgnn"):
            p = Progress("reading edges", 2_000_000, "edges", every_s=0.0)
            p.advance(500_000)
            p.advance(1_500_000)
            p.finish()
    finally:
        logger.removeHandler(keep)
    assert re.match(r"reading edges: 500.0k of ~2.0M edges \(25%\) in \d+ s, [\d.]+[kMG]?/s$", lines[0]), lines
    assert re.match(r"reading edges: 2.0M of ~2.0M edges \(100%\)", lines[1]) and "reading edges: 2.0M edges in" in lines[2]


@pytest.mark.slow
def test_data_prepare_tells_what_it_does(tmp_path):
    res = subprocess.run([sys.executable, "-m", "hpcgnn", "data", "prepare", "dataset.num_nodes=3000",
                          f"dataset.root={tmp_path}"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert re.search(r"^\d\d:\d\d:\d\d \[prepare\] preparing synthetic into ", res.stdout, re.M), res.stdout


def test_every_library_hpcgnn_imports_is_declared():
    """A plain `pip install` brings what hpcgnn imports: each third-party module it imports (anywhere in the
    package) comes from a distribution pyproject.toml names; one of an optional extra's (optuna, wandb, mlflow)
    only inside the function that needs it, never at a module's top, so that hpcgnn imports without them."""
    import ast
    import importlib.metadata

    import tomllib
    from conftest import REPO

    def names(deps) -> set[str]:
        return {re.split(r"[<>=!~\[ ;]", d)[0].lower().replace("_", "-") for d in deps}

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    required = names(project["dependencies"])
    optional = names(d for extra, deps in project["optional-dependencies"].items() if extra != "dev" for d in deps)
    imported, at_top = set(), set()
    for path in (REPO / "hpcgnn").rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                found = {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found = {node.module.split(".")[0]}
            else:
                continue
            imported |= found
            if node in tree.body:
                at_top |= found
    third_party = sorted(m for m in imported - set(sys.stdlib_module_names) if m not in ("hpcgnn", "_ctypes"))
    dists = importlib.metadata.packages_distributions()

    def dists_of(m: str) -> set[str]:
        return {d.lower().replace("_", "-") for d in dists.get(m, [m])}

    missing = [m for m in third_party if not dists_of(m) & (required | optional)]
    assert not missing, f"imported but not declared in pyproject.toml: {missing}"
    extras_at_top = [m for m in third_party if not dists_of(m) & required and m in at_top]
    assert not extras_at_top, f"an optional extra's module imported at a module's top: {extras_at_top}"


def test_hydras_launcher_and_sweeper_plugins_point_to_cluster_and_m():
    from conftest import make_config

    for override in ("hydra/launcher=submitit_slurm", "hydra/sweeper=optuna"):
        with pytest.raises(ConfigError, match=rf"{override}: hpcgnn submits and sweeps by itself, not through Hydra's "
                                              r"launcher and sweeper plugins. HINT: submit with \+cluster=NAME .* and "
                                              r"sweep with -m .* or search with early stopping: hpcgnn tune"):
            make_config(override)
