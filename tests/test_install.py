"""hpcgnn installed the way users install it: a wheel in a fresh virtual environment.

The wheel is built from a copy of the tracked sources (nothing is written into the clone),
installed with pip into a new venv, and every command is run from an unrelated folder, so
nothing can come from the repository: the repository's conf/ ships inside the package. The venv reaches
the already-installed dependencies (torch, PyG, hydra, ...) through a .pth file, since
tests download nothing; hpcgnn itself must come from the wheel, which the test checks.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from conftest import REPO

pytestmark = pytest.mark.slow


def _run(args: list, cwd: Path, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in args], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})


@pytest.fixture(scope="module")
def wheel_venv(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("install")
    src = root / "src"
    src.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(REPO / name, src / name)
    for pkg in ("hpcgnn", "hydra_plugins", "conf"):  # (conf/ ships inside the package: pyproject's package-dir)
        shutil.copytree(REPO / pkg, src / pkg, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    built = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                  "-w", root / "dist", src], cwd=root)
    assert built.returncode == 0, built.stdout + built.stderr
    (wheel,) = (root / "dist").glob("hpcgnn-*.whl")
    venv = root / "venv"
    made = _run([sys.executable, "-m", "venv", "--without-pip", venv], cwd=root)
    assert made.returncode == 0, made.stderr
    python = venv / "bin" / "python"
    site = Path(_run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                     cwd=root).stdout.strip())
    installed = _run([sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index", wheel],
                     cwd=root)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    # The dependencies this machine already has (a .pth line adds a path; it activates no editable install).
    (site / "_test_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return venv


def test_the_installed_package_is_the_wheel(wheel_venv, tmp_path):
    res = _run([wheel_venv / "bin" / "python", "-c",
                "import hpcgnn, hydra_plugins.hpcgnn_searchpath as p; print(hpcgnn.__file__); print(p.__file__); "
                "print(hpcgnn.CONF_DIR)"], cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    package, plugin, conf = res.stdout.split()
    assert package.startswith(str(wheel_venv)) and plugin.startswith(str(wheel_venv)), res.stdout
    assert (Path(conf) / "config.yaml").is_file() and (Path(conf) / "model" / "gcn.yaml").is_file()
    assert Path(conf) == Path(package).parent / "conf"  # the repository's conf/, installed inside the package
    # The C sampling kernels are built into the wheel (setup.py): they load where no compiler is (CC names none),
    # from the installed package, checked against the source installed beside them.
    native = _run([wheel_venv / "bin" / "python", "-c", "from hpcgnn.kernels import binding, build, sources; "
                   "print(sources.SOURCES[0]); print(build.packaged()); print(binding.kernels() is not None)"], cwd=tmp_path,
                  env={"XDG_CACHE_HOME": str(tmp_path), "HPCGNN_NATIVE": "1", "CC": "no-such-cc"})
    source, packaged, loaded = native.stdout.split()
    assert source.startswith(str(wheel_venv)) and Path(source).is_file(), native.stdout + native.stderr
    has_cc = shutil.which("cc") is not None
    assert (packaged != "None") == has_cc and packaged.startswith(str(wheel_venv)) == has_cc, native.stdout
    assert loaded == str(has_cc) and ("not available" in native.stderr) != has_cc, native.stderr
    assert not (tmp_path / "hpcgnn").exists()  # nothing built into the cache


def test_a_one_epoch_job_runs_from_any_folder(wheel_venv, tmp_path):
    data = tmp_path / "data"
    res = _run([wheel_venv / "bin" / "hpcgnn", "dataset.num_nodes=3000", "train.epochs=1", "model.hidden_channels=16",
                f"dataset.root={data}", "metrics.tensorboard=false"], cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    (summary,) = (tmp_path / "outputs").glob("*/*/summary.json")
    s = json.loads(summary.read_text())
    assert s["world_size"] == 2 and len(s["history"]) == 1 and 0 <= s["test_acc"] <= 1
    assert (summary.parent / ".hydra" / "config.yaml").is_file()
    # The other commands, as console-script subcommands and as modules.
    venv_python = wheel_venv / "bin" / "python"
    report = _run([wheel_venv / "bin" / "hpcgnn", "report", summary.parent], cwd=tmp_path)
    assert report.returncode == 0 and (summary.parent / "curves.png").is_file(), report.stderr
    part = _run([venv_python, "-m", "hpcgnn.partition", "dataset.num_nodes=3000", f"dataset.root={data}",
                 "graph.num_parts=2", "graph.method=random"], cwd=tmp_path)
    assert part.returncode == 0 and "2 parts (random, seed 0)" in part.stdout, part.stderr
    prep = _run([wheel_venv / "bin" / "hpcgnn", "data", "prepare", "dataset.num_nodes=3000", f"dataset.root={data}"],
                cwd=tmp_path)
    assert prep.returncode == 0 and "synthetic: prepared in" in prep.stdout, prep.stderr
    status = _run([venv_python, "-m", "hpcgnn.submit.status", tmp_path], cwd=tmp_path)
    assert status.returncode == 2 and "manifest.json not found" in status.stderr
    cluster = _run([wheel_venv / "bin" / "hpcgnn", "cluster", "--help"], cwd=tmp_path)
    assert cluster.returncode == 0 and "init" in cluster.stdout


def test_user_cluster_files_and_errors_from_the_wheel(wheel_venv, tmp_path):
    (tmp_path / "conf" / "cluster").mkdir(parents=True)
    (tmp_path / "conf" / "cluster" / "mine.yaml").write_text("defaults:\n  - base_cluster\nname: mine\nnodes: 2\n")
    dry = _run([wheel_venv / "bin" / "hpcgnn", "+cluster=mine", "launch.dry_run=true"], cwd=tmp_path,
               env={"HPCGNN_CONFIG_DIR": str(tmp_path / "conf")})
    assert dry.returncode == 0 and "#SBATCH --nodes=2" in dry.stdout, dry.stderr
    typo = _run([wheel_venv / "bin" / "hpcgnn", "train.lrr=1"], cwd=tmp_path)
    assert typo.returncode == 2 and "hpcgnn: config error: Unknown config key 'train.lrr'" in typo.stderr
