"""Pictures: `python -m hpcgnn report` and the notebooks, executed headless on a small real run and sweep."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

pytestmark = pytest.mark.slow

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def run_dir(tiny_run) -> Path:
    return tiny_run / "run"


@pytest.fixture(scope="module")
def sweep_dir(local_sweep) -> Path:
    return local_sweep[0]


def _report(folder: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hpcgnn.submit.report", str(folder)], capture_output=True, text=True,
                          timeout=300)


def test_report_writes_the_run_figures(run_dir):
    res = _report(run_dir)
    assert res.returncode == 0, res.stderr
    for name in ("curves.png", "phases.png", "balance.png"):
        data = (run_dir / name).read_bytes()
        assert data.startswith(PNG) and len(data) > 5000, name


def test_report_writes_the_sweep_figure(sweep_dir):
    res = _report(sweep_dir)
    assert res.returncode == 0, res.stderr
    assert (sweep_dir / "sweep.png").read_bytes().startswith(PNG)


def test_report_refuses_other_folders(tmp_path):
    res = _report(tmp_path)
    assert res.returncode == 2 and "not a run folder" in res.stderr


@pytest.mark.parametrize("notebook, var, fixture", [("run_report.ipynb", "HPCGNN_RUN_DIR", "run_dir"),
                                                    ("sweep_report.ipynb", "HPCGNN_SWEEP_DIR", "sweep_dir")])
def test_notebooks_execute_headless(notebook, var, fixture, request, monkeypatch):
    import nbformat
    from nbclient import NotebookClient

    folder = request.getfixturevalue(fixture)
    monkeypatch.setenv(var, str(folder))
    nb = nbformat.read(REPO / "notebooks" / notebook, as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3",
                   resources={"metadata": {"path": str(REPO / "notebooks")}}).execute()
    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    assert sum("image/png" in o.get("data", {}) for o in outputs) >= (3 if fixture == "run_dir" else 1)
    assert str(folder) in "".join(o.get("text", "") for o in outputs)
    assert os.environ[var] == str(folder)
