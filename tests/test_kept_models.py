"""Every run keeps its trained model (model/best.pt, model/last.pt) and hpcgnn.load_model gives it back: in a fresh
process, without SLURM, a process group or the data, with the weights that reproduce the summary's metrics."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from conftest import DATA_ROOT, TINY, run_cli, summary_of, train_here

from hpcgnn.models.saved import ModelFileError, load_model, read
from hpcgnn.rank.checkpoint import Preempted

# In a fresh process: the run's own config (its overrides), rank 0 of 1, the run's evaluation path (sampled batches,
# the run's precision), with the best weights load_model gives back.
EVALUATE = """
import json, sys
from pathlib import Path
import torch
import hpcgnn
from hpcgnn.env import RankEnv
from hpcgnn.rank.techniques import autocast, resolve_precision
from hpcgnn.tasks import open_store
from hpcgnn.submit.compose import compose
from hpcgnn.tasks import build_task
import yaml

run = Path(sys.argv[1])
overrides = yaml.safe_load((run / ".hydra" / "overrides.yaml").read_text())
cfg = compose([*overrides, f"run_dir={run}"]).cfg
cpu = torch.device("cpu")
store = open_store(cfg, RankEnv.from_environ({}), cpu)
task = build_task(cfg, RankEnv.from_environ({}), store, cpu)
model = hpcgnn.load_model(run)
with autocast(resolve_precision(cfg.train.precision, cpu)[0], cpu):
    print(json.dumps(task.evaluate(model)))
"""


@pytest.mark.slow
def test_the_best_weights_come_back_in_a_fresh_process_and_reproduce_the_summary(tmp_path):
    """One rank on the default graph (100k nodes): the best epoch's weights, loaded where no SLURM, process group or
    hpcgnn run is, score exactly the validation and test accuracy the summary reports for that epoch."""
    res = run_cli("launch.procs=1", "train.epochs=2", "metrics.tensorboard=false", cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    summary = summary_of(tmp_path)
    assert summary["model_files"] == {w: str(tmp_path / "run" / "model" / f"{w}.pt") for w in ("best", "last")}
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "MASTER_", "RANK", "WORLD_SIZE"))}
    out = subprocess.run([sys.executable, "-c", EVALUATE, str(tmp_path / "run")], capture_output=True, text=True,
                         env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    scores = json.loads(out.stdout.strip().splitlines()[-1])
    assert scores["val_acc"] == summary["best_val"] and scores["test_acc"] == summary["test"], (scores, summary)
    best = read(tmp_path / "run" / "model" / "best.pt")
    assert best["epoch"] == summary["best_epoch"] and best["metrics"]["val_acc"] == summary["best_val"]
    assert best["task"] == "node" and best["class"].endswith("GraphSAGE") and best["shape"]["num_classes"] == 8


def test_a_preempted_run_keeps_the_best_model_of_its_own_history(tmp_path):
    """Preempted mid-run, its best.pt overwritten (as by an improvement after the checkpoint that the resumed run
    will not see), then resumed: best.pt is that of an uninterrupted run, bitwise; last.pt too."""
    args = [*TINY, f"dataset.root={DATA_ROOT}", "train.epochs=3", "metrics.tensorboard=false"]
    whole = train_here(*args, run_dir=tmp_path / "whole")
    with pytest.raises(Preempted):
        train_here(*args, "debug.signal_rank=0", "debug.signal_step=7", run_dir=tmp_path / "cut")  # (epoch 2)
    best = tmp_path / "cut" / "model" / "best.pt"
    record = read(best)
    record["state_dict"] = {k: torch.zeros_like(v) for k, v in record["state_dict"].items()}
    torch.save(record, best)
    again = train_here(*args, run_dir=tmp_path / "cut")
    assert again["resumes"] == 1 and again["best_epoch"] == whole["best_epoch"]
    for which in ("best", "last"):
        mine = read(tmp_path / "cut" / "model" / f"{which}.pt")["state_dict"]
        theirs = read(tmp_path / "whole" / "model" / f"{which}.pt")["state_dict"]
        assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine), which


def test_a_run_folder_without_a_model_is_named(tmp_path):
    with pytest.raises(ModelFileError, match=r"no model file .*model/best.pt. HINT: a run keeps model/best.pt"):
        load_model(tmp_path)
    with pytest.raises(ModelFileError, match=r"which='middle': a run keeps best and last"):
        load_model(tmp_path, which="middle")
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "best.pt").write_bytes(b"not a model")
    with pytest.raises(ModelFileError, match=r"best.pt is not a model file hpcgnn can read"):
        load_model(tmp_path)


def test_link_and_typed_runs_keep_models_that_load(tmp_path):
    for name, extra in (("link", ["task=link"]), ("typed", ["dataset=synthetic_hetero", "model=rgcn",
                                                            "dataset.num_nodes=3000"])):
        train_here(*TINY, f"dataset.root={DATA_ROOT}", "train.epochs=1", "metrics.tensorboard=false", *extra,
                   run_dir=tmp_path / name)
        model = load_model(tmp_path / name)
        assert not model.training and all(p.device.type == "cpu" for p in model.parameters())
        assert read(tmp_path / name / "model" / "last.pt")["task"] == ("link" if name == "link" else "node")
