"""Checkpoint files: atomic, checksummed, pruned, matched to the job, never unpickling code."""

from __future__ import annotations

import pickle
import random
import re

import numpy as np
import pytest
import torch
from conftest import make_config

from hpcgnn.env import RankEnv
from hpcgnn.errors import CheckpointError
from hpcgnn.rank.checkpoint import Checkpointer, PreemptionFlag
from hpcgnn.rng import rng_state, set_rng_state

SINGLE = RankEnv.from_environ({}, (20000, 32767), 0)


def _ckpt(tmp_path, *overrides: str, env: RankEnv = SINGLE) -> Checkpointer:
    return Checkpointer(make_config(*overrides, run_dir=str(tmp_path)), env)


def _run(tmp_path, *overrides: str, env: RankEnv = SINGLE) -> Checkpointer:
    """A job's checkpointer after it started (continuing a run, or a new one)."""
    ck = _ckpt(tmp_path, *overrides, env=env)
    ck.start()
    return ck


def _steps(folder) -> list[str]:
    return sorted(p.name for p in folder.glob("step-*"))


def _save(ck: Checkpointer, step: int) -> None:
    ck.save(step, {"model": {"w": torch.full((3,), float(step))}, "cursor": {"step": step}},
            {"seeds": torch.arange(4), "rng": rng_state()})


def test_newest_k_are_kept_and_the_newest_is_loaded(tmp_path):
    ck = _run(tmp_path, "checkpoint.keep=2")
    for step in (10, 20, 30):
        _save(ck, step)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step-000000020", "step-000000030"]
    again = _ckpt(tmp_path, "checkpoint.keep=2")
    folder = again.start()
    assert again.run == ck.run  # the same run goes on
    common, mine = ck.load(folder)
    assert common["cursor"]["step"] == 30 and torch.equal(common["model"]["w"], torch.full((3,), 30.0))
    assert torch.equal(mine["seeds"], torch.arange(4))


@pytest.mark.parametrize("damage", ["truncate", "flip", "delete"])
def test_corrupt_newest_checkpoint_falls_back_to_the_previous_with_a_warning(tmp_path, capsys, damage):
    ck = _run(tmp_path)
    _save(ck, 1)
    _save(ck, 2)
    target = tmp_path / "checkpoints" / "step-000000002" / "common.pt"
    data = target.read_bytes()
    if damage == "truncate":
        target.write_bytes(data[: len(data) // 2])
    elif damage == "flip":
        target.write_bytes(data[:100] + bytes([data[100] ^ 1]) + data[101:])
    else:
        target.unlink()
    assert _ckpt(tmp_path).start().name == "step-000000001"
    assert "WARNING: checkpoint" in capsys.readouterr().out


def test_a_half_written_checkpoint_is_invisible(tmp_path):
    ck = _run(tmp_path)
    _save(ck, 1)
    (tmp_path / "checkpoints" / ".step-000000002.tmp").mkdir()  # a writer died before the rename
    assert _ckpt(tmp_path).start().name == "step-000000001"


@pytest.mark.parametrize("other", [["dataset.num_nodes=5000"], ["model=gat"], ["train.fanouts=[5,5,5]"]])
def test_checkpoint_of_another_job_is_refused(tmp_path, other):
    _save(_run(tmp_path), 1)
    with pytest.raises(CheckpointError, match=r"belongs to another job \(.*HINT: to start over instead, use a new "
                                              r"output folder \(hydra.run.dir=...\) or checkpoint.resume=false"):
        _ckpt(tmp_path, *other).start()
    assert _ckpt(tmp_path, *other, "checkpoint.resume=false").start() is None
    assert _steps(tmp_path / "checkpoints") == []  # moved aside, not deleted
    assert len(list((tmp_path / "checkpoints" / "previous").glob("*/step-000000001/MANIFEST.json"))) == 1


class _Payload:
    def __reduce__(self):
        return (print, ("pwned",))


def test_loading_never_unpickles_arbitrary_objects(tmp_path):
    ck = _run(tmp_path)
    _save(ck, 1)
    path = tmp_path / "checkpoints" / "step-000000001" / "rank-0.pt"
    torch.save({"evil": _Payload()}, path)
    with pytest.raises(pickle.UnpicklingError, match="Weights only load failed"):
        torch.load(path, weights_only=True)
    with pytest.raises(pickle.UnpicklingError):
        ck.load(path.parent)  # (its checksum no longer matches either: latest() would skip it)


def test_rng_states_round_trip():
    state = rng_state()
    a = (torch.rand(3), np.random.rand(3), random.random())
    set_rng_state(state)
    b = (torch.rand(3), np.random.rand(3), random.random())
    assert torch.equal(a[0], b[0]) and np.array_equal(a[1], b[1]) and a[2] == b[2]


def test_signal_handler_only_sets_a_flag():
    import os
    import signal

    flag = PreemptionFlag("USR1")
    try:
        os.kill(os.getpid(), signal.SIGUSR1)
        assert flag.raised
    finally:
        flag.restore()
    assert signal.getsignal(signal.SIGUSR1) in (signal.SIG_DFL, flag.previous)


def test_a_new_run_sets_the_old_runs_checkpoints_aside_and_rotation_counts_its_own(tmp_path, capsys):
    """checkpoint.resume=false: run A's checkpoints move to checkpoints/previous/<A>/ (never deleted); run B's
    rotation keeps B's newest and never touches A's, whatever their step numbers."""
    a = _run(tmp_path, "checkpoint.keep=2")
    for step in (12, 16, 18):
        _save(a, step)
    b = _run(tmp_path, "checkpoint.keep=2", "checkpoint.resume=false")
    assert b.run["id"] != a.run["id"]
    assert "checkpoint.resume=false: 2 checkpoint(s) of run" in capsys.readouterr().out
    for step in (2, 4, 6):
        _save(b, step)
    ckpts = tmp_path / "checkpoints"
    assert _steps(ckpts) == ["step-000000004", "step-000000006"]
    assert _steps(ckpts / "previous" / a.run["id"]) == ["step-000000016", "step-000000018"]
    folder = _ckpt(tmp_path, "checkpoint.keep=2").start()  # the same command again resumes B, not A's step 18
    assert folder.name == "step-000000006"


def test_a_run_writing_beside_another_never_replaces_or_prunes_its_checkpoints(tmp_path):
    """Two runs in one folder at once (the same command submitted twice): neither's step overwrites the other's,
    and each prunes its own."""
    a = _run(tmp_path, "checkpoint.keep=1")
    b = _run(tmp_path, "checkpoint.keep=1", "checkpoint.resume=false")  # (A had none yet: nothing moved)
    _save(a, 12)
    _save(b, 10)
    _save(b, 12)  # A's step 12 is set aside, not replaced
    _save(b, 14)
    ckpts = tmp_path / "checkpoints"
    assert _steps(ckpts) == ["step-000000014"]
    kept = ckpts / "previous" / a.run["id"] / "step-000000012"
    common, _ = a.load(kept)
    assert torch.equal(common["model"]["w"], torch.full((3,), 12.0)) and a._verify(kept) is None


def _slurm_env(job: str) -> RankEnv:
    return RankEnv.from_environ({"SLURM_JOB_ID": job, "SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_LOCALID": "0",
                                 "SLURM_NODEID": "0", "SLURM_JOB_NUM_NODES": "1", "SLURM_JOB_NODELIST": "n1",
                                 "SLURM_TASKS_PER_NODE": "1"}, (20000, 32767), 0)


def test_resume_false_continues_only_a_requeued_jobs_own_checkpoints(tmp_path):
    """A SLURM job requeued after a preemption continues what it wrote itself, even with checkpoint.resume=false;
    another job's checkpoints are set aside, as for a fresh start."""
    other = _run(tmp_path, "checkpoint.resume=false", env=_slurm_env("100"))
    _save(other, 5)
    first = _run(tmp_path, "checkpoint.resume=false", env=_slurm_env("200"))  # job 200 starts: 100's set aside
    _save(first, 3)
    requeued = _ckpt(tmp_path, "checkpoint.resume=false", env=_slurm_env("200"))
    assert requeued.start().name == "step-000000003" and requeued.run == first.run
    assert _ckpt(tmp_path, "checkpoint.resume=false", env=_slurm_env("300")).start() is None


def test_settings_a_resume_can_take_are_applied_and_the_rest_refused(tmp_path):
    """The manifest records the settings; a resume lists what changed: applied (lr, epochs, ...) or refused with
    what the checkpoint holds (the model's shape, the batches), or ignored (evaluation, logging)."""
    _save(_run(tmp_path, "model=gat"), 1)
    ck = _ckpt(tmp_path, "model=gat", "train.lr=0.03", "train.epochs=20", "train.eval_every=2",
               "metrics.every_steps=5")
    ck.start()
    assert [(c["setting"], c["checkpoint"], c["now"]) for c in ck.changes] == [
        ("train.epochs", 8, 20), ("train.lr", 0.003, 0.03)]
    with pytest.raises(CheckpointError, match=r"settings a resumed run cannot change \(model.heads: checkpoint 4, "
                                              r"now 8; train.accumulate: checkpoint 1, now 2\)\. HINT: set them back"):
        _ckpt(tmp_path, "model=gat", "model.heads=8", "train.accumulate=2").start()


def test_a_checkpoint_whose_common_state_cannot_be_loaded_is_skipped_and_the_resume_ends_bitwise(tmp_path, capsys):
    """The newest checkpoint's common.pt replaced by a pickle of code, its manifest made to match: before, the resume
    exited 1 with a 26-line traceback. Now it is skipped for the previous one, with one warning, as a corrupt one."""
    import json

    from conftest import DATA_ROOT, TINY, train_here

    from hpcgnn.io import sha256_file
    from hpcgnn.rank.checkpoint import Preempted

    args = [*TINY, f"dataset.root={DATA_ROOT}", "metrics.tensorboard=false", "checkpoint.every_steps=3"]
    whole = train_here(*args, run_dir=tmp_path / "whole")
    with pytest.raises(Preempted):
        train_here(*args, "debug.signal_rank=0", "debug.signal_step=7", run_dir=tmp_path / "cut")
    newest = tmp_path / "cut" / "checkpoints" / "step-000000007"
    torch.save({"evil": _Payload()}, newest / "common.pt")
    manifest = json.loads((newest / "MANIFEST.json").read_text())
    manifest["files"]["common.pt"] = sha256_file(newest / "common.pt")
    (newest / "MANIFEST.json").write_text(json.dumps(manifest))
    capsys.readouterr()
    again = train_here(*args, run_dir=tmp_path / "cut")
    captured = capsys.readouterr()
    out = captured.out + captured.err
    assert "pwned" not in out
    warned = [line for line in out.splitlines() if "skipped" in line]  # (one line, not the log's and a print's)
    assert len(warned) == 1 and f"checkpoint {newest} skipped: it cannot be loaded (UnpicklingError: Weights only " \
        "load failed" in warned[0], warned
    reason = re.search(r"\(UnpicklingError: (.*)\); trying the previous one$", warned[0]).group(1)
    assert reason.endswith((" ...", ".")) or len(reason) < 200, reason  # (cut at a word, never mid-word)
    assert re.fullmatch(r".*\w ...|.*\.", reason), reason
    assert again["resumes"] == 1 and again["param_checksums"] == whole["param_checksums"]
