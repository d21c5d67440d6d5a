"""A training run's faults, as a careless user met them: a new run in a folder holding another run's checkpoints
(nothing lost, nothing mixed, resume never picks the other run's; test_checkpoint for rotation, concurrent runs and
requeues), a setting changed on resume (applied for real and recorded, or refused, never claimed), and a run that
diverges (it stops, exit 4, naming the step and the rank; non-finite settings are refused at submit).

The suite on either kind of CPU: the tests comparing computation paths take ``cpu_kind`` (conftest) and run as if
on an AVX2-only and an AVX512-BF16 CPU (test_link, test_train, test_typed, test_partition).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import DATA_ROOT, make_config, one_line, run_cli

from hpcgnn.env import RankEnv
from hpcgnn.errors import CheckpointError, ConfigError, Diverged
from hpcgnn.rank.checkpoint import Preempted

# One rank in this process: 600 training nodes in steps of 64 seeds, 10 steps an epoch.
SMALL = ["dataset.num_nodes=2000", f"dataset.root={DATA_ROOT}", "train.batch_size=64", "train.epochs=2",
         "model.hidden_channels=16", "metrics.tensorboard=false"]
SINGLE, CPU = RankEnv.from_environ({}), torch.device("cpu")


def _train(*overrides: str, run_dir, trainer: bool = False):
    from hpcgnn.rank.trainer import Trainer

    t = Trainer(make_config(*SMALL, *overrides, run_dir=str(run_dir)), SINGLE, CPU)
    summary = t.train()
    return (summary, t) if trainer else summary


def _steps(folder) -> list[int]:
    return sorted(int(p.name.split("-")[1]) for p in folder.glob("step-*"))


# ------------------------------------------------------------------ checkpoints of another run


@pytest.mark.slow
def test_a_new_run_in_a_used_folder_loses_nothing_and_resumes_only_its_own(tmp_path, capsys):
    """Run A ends at step 20 (checkpoints 12, 16, 20 kept); run B in the same folder with checkpoint.resume=false
    is preempted at step 10: its checkpoint of step 10 is there afterwards, A's are set aside whole, and B's
    command again resumes B (not A's step 20) and ends as an uninterrupted B."""
    run = tmp_path / "run"
    every = ["checkpoint.every_steps=4", "checkpoint.keep=3"]
    a = _train(*every, run_dir=run)
    assert _steps(run / "checkpoints") == [12, 16, 20]
    b = [*every, "train.lr=0.01", "checkpoint.resume=false"]
    with pytest.raises(Preempted, match="checkpoint of step 10 saved"):
        _train(*b, "debug.signal_rank=0", "debug.signal_step=10", run_dir=run)
    assert _steps(run / "checkpoints") == [4, 8, 10]
    (aside,) = (run / "checkpoints" / "previous").iterdir()
    assert _steps(aside) == [12, 16, 20] and "moved to" in capsys.readouterr().out
    again = _train(*every, "train.lr=0.01", run_dir=run)  # B's command, resuming
    whole = _train(*every, "train.lr=0.01", run_dir=tmp_path / "whole")
    assert again["resumes"] == 1 and again["param_checksums"] == whole["param_checksums"]
    assert again["param_checksums"] != a["param_checksums"]


# ------------------------------------------------------------------ settings changed on resume


@pytest.mark.slow
def test_a_changed_learning_rate_is_applied_from_the_resumed_step_and_recorded(tmp_path):
    """Resumed with train.lr=0.03 after a preemption at step 10 of an lr=0.003 run: the optimizer runs at 0.03
    from step 11 on (the parameters differ from resuming at 0.003, which equal the uninterrupted run's), and
    the summary says so; a setting a resume cannot take (accumulation) is refused, naming it."""
    cut = tmp_path / "cut"
    with pytest.raises(Preempted):
        _train("debug.signal_rank=0", "debug.signal_step=10", "checkpoint.keep=10", run_dir=cut)
    import shutil

    shutil.copytree(cut, tmp_path / "same")
    same = _train(run_dir=tmp_path / "same")
    whole = _train(run_dir=tmp_path / "whole")
    assert same["param_checksums"] == whole["param_checksums"] and same["resume_changes"] == []
    with pytest.raises(CheckpointError, match=r"cannot change \(train.accumulate: checkpoint 1, now 2\)\. HINT: set "
                                              r"them back to resume; to start over instead"):
        _train("train.accumulate=2", run_dir=cut)
    changed, trainer = _train("train.lr=0.03", run_dir=cut, trainer=True)
    assert changed["resume_changes"] == [{"setting": "train.lr", "checkpoint": 0.003, "now": 0.03, "from_step": 11}]
    assert changed["effective_lr"] == 0.03 and trainer.optimizer.param_groups[0]["lr"] == pytest.approx(0.03)
    assert changed["param_checksums"] != whole["param_checksums"]


# ------------------------------------------------------------------ divergence


def test_non_finite_settings_are_refused_at_submit_time(tmp_path):
    for value in ("inf", "nan", "-inf"):
        res = run_cli(f"train.lr={value}", cwd=tmp_path, timeout=60)
        assert res.returncode == 2
        assert f"hpcgnn: config error: train.lr={value} is not a finite number" in one_line(res, "config error")
    with pytest.raises(ConfigError, match=r"dataset.edge_split\[2\]=nan is not a finite number"):
        make_config("task=link", "dataset.edge_split=[0.5,0.5,nan]")


@pytest.mark.slow
def test_a_diverging_run_stops_with_exit_code_4_naming_the_step_and_rank(tmp_path):
    """Two ranks, rank 1's loss NaN at step 3: both stop at that step, no checkpoint after it, exit code 4 and
    one line naming step, rank and the likely cause."""
    res = run_cli(*SMALL[:1], "train.batch_size=64", "train.epochs=1", "checkpoint.every_steps=1",
                  "debug.nan_rank=1", "debug.nan_step=3", cwd=tmp_path, timeout=300)
    assert res.returncode == 4, res.stdout + res.stderr
    line = one_line(res, "diverged")
    assert "the loss became NaN or infinite at step 3 (epoch 1) on rank 1" in line and "HINT: lower train.lr" in line
    assert _steps(tmp_path / "run" / "checkpoints") == [1, 2]
    assert not (tmp_path / "run" / "summary.json").exists()


@pytest.mark.slow
def test_a_learning_rate_that_overflows_stops_the_run_or_its_steps_are_skipped_and_counted(tmp_path):
    with pytest.raises(Diverged, match=r"at step 2 \(epoch 1\) on rank 0.*train.lr=1e\+30"):
        _train("train.lr=1e30", run_dir=tmp_path / "stop")
    s = _train("debug.nan_rank=0", "debug.nan_step=13", "train.nonfinite=skip", run_dir=tmp_path / "skip")
    assert s["nonfinite_skipped"] == 1 and [r["nonfinite_skipped"] for r in s["history"]] == [0, 1]
    assert all(np.isfinite(r["loss"]) for r in s["history"])
