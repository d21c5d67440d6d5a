"""Sweeps: `python -m hpcgnn -m ...` runs members here, or submits them as a job array and returns."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import DATA_ROOT, TINY


def _sweep(tmp_path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hpcgnn", "-m", *args, *TINY, f"dataset.root={DATA_ROOT}",
                           f"hydra.sweep.dir={tmp_path / 'sweep'}"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "PYTHONUNBUFFERED": "1"})


def _status(tmp_path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hpcgnn.submit.status", str(tmp_path / "sweep"), *args],
                          capture_output=True, text=True, timeout=900)


@pytest.mark.slow
def test_local_sweep_runs_members_one_after_another(local_sweep):
    sweep, res = local_sweep
    assert "sweep of 2 members, run here one after another" in res.stdout
    manifest = json.loads((sweep / "manifest.json").read_text())
    assert [m["overrides"][0] for m in manifest["members"]] == ["model=sage", "model=mlp"]
    for m in manifest["members"]:  # own folder, own resolved config and overrides
        assert (sweep / str(m["member"]) / ".hydra" / "config.yaml").is_file()
        assert "model=" in (sweep / str(m["member"]) / ".hydra" / "overrides.yaml").read_text()
        assert json.loads((sweep / str(m["member"]) / "summary.json").read_text())["epochs"] == 2
    st = subprocess.run([sys.executable, "-m", "hpcgnn.submit.status", str(sweep)], capture_output=True, text=True, timeout=300)
    assert st.returncode == 0, st.stderr
    assert st.stdout.count("COMPLETED") == 2 and "model=mlp" in st.stdout and "2/2" in st.stdout


@pytest.mark.slow
def test_an_invalid_member_stops_the_sweep_before_anything_runs(tmp_path):
    res = _sweep(tmp_path, "train.lr=1e-3,-1", "+cluster=local")
    assert res.returncode == 2
    assert "train.lr=-1.0 must be positive" in res.stderr
    assert not (tmp_path / "sweep" / "manifest.json").exists()


@pytest.mark.slow
def test_status_names_the_folder_to_give(tmp_path):
    st = _status(tmp_path)
    assert st.returncode == 2 and "manifest.json not found" in st.stderr
