"""Shared helpers: compose a RunConfig like the CLI does, and run the CLI itself."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from hpcgnn import CONF_DIR
from hpcgnn.config import RunConfig, register_configs

REPO = Path(__file__).resolve().parent.parent
# Test accuracy the default job must reach, wherever it runs (local processes or SLURM).
ACCURACY_BAR = 0.85
# Prepared datasets of this test session (shared by its runs, removed at the end; never ~/.cache).
DATA_ROOT = Path(tempfile.mkdtemp(prefix="hpcgnn-test-data-"))


@pytest.fixture(scope="session", autouse=True)
def _remove_data_root():
    yield
    shutil.rmtree(DATA_ROOT, ignore_errors=True)


def make_config(*overrides: str, run_dir: str = "/tmp/hpcgnn-test-run") -> RunConfig:
    """Compose conf/ with ``overrides`` through Hydra, as ``python -m hpcgnn`` does."""
    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        dcfg = compose(config_name="config", overrides=[*overrides, f"run_dir={run_dir}"])
    return RunConfig.from_dictconfig(dcfg)


def run_cli(*args: str, cwd: Path, timeout: float = 300, env: dict | None = None) -> subprocess.CompletedProcess:
    """``python -m hpcgnn ARGS`` in a subprocess whose run folder is ``cwd/run``."""
    cwd.mkdir(parents=True, exist_ok=True)
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    return subprocess.run([sys.executable, "-m", "hpcgnn", *args, f"dataset.root={DATA_ROOT}",
                           f"hydra.run.dir={cwd / 'run'}"],
                          cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def tiny_overrides() -> list[str]:
    """A graph and schedule small enough for a multi-process run in seconds."""
    return ["dataset.num_nodes=4000", "train.epochs=2", "train.batch_size=256", "model.hidden_channels=32"]


def summary_of(folder: Path) -> dict:
    return json.loads((folder / "run" / "summary.json").read_text())


@pytest.fixture(scope="session")
def default_run(tmp_path_factory):
    """`python -m hpcgnn` exactly as a user types it: the embedded default, 2 local processes."""
    folder = tmp_path_factory.mktemp("default")
    res = run_cli(cwd=folder, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    return folder, res
