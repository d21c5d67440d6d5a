"""Checkpoint files: atomic, checksummed, pruned, matched to the job, never unpickling code."""

from __future__ import annotations

import pickle
import random

import numpy as np
import pytest
import torch
from conftest import make_config

from hpcgnn.checkpoint import Checkpointer, PreemptionFlag
from hpcgnn.env import RankEnv
from hpcgnn.errors import CheckpointError
from hpcgnn.rng import rng_state, set_rng_state

SINGLE = RankEnv.from_environ({}, (20000, 32767), 0)


def _ckpt(tmp_path, *overrides: str) -> Checkpointer:
    return Checkpointer(make_config(*overrides, run_dir=str(tmp_path)), SINGLE)


def _save(ck: Checkpointer, step: int) -> None:
    ck.save(step, {"model": {"w": torch.full((3,), float(step))}, "cursor": {"step": step}},
            {"seeds": torch.arange(4), "rng": rng_state()})


def test_newest_k_are_kept_and_the_newest_is_loaded(tmp_path):
    ck = _ckpt(tmp_path, "checkpoint.keep=2")
    for step in (10, 20, 30):
        _save(ck, step)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step-000000020", "step-000000030"]
    folder = ck.latest()
    common, mine = ck.load(folder)
    assert common["cursor"]["step"] == 30 and torch.equal(common["model"]["w"], torch.full((3,), 30.0))
    assert torch.equal(mine["seeds"], torch.arange(4))


@pytest.mark.parametrize("damage", ["truncate", "flip", "delete"])
def test_corrupt_newest_checkpoint_falls_back_to_the_previous_with_a_warning(tmp_path, capsys, damage):
    ck = _ckpt(tmp_path)
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
    assert ck.latest().name == "step-000000001"
    assert "WARNING: checkpoint" in capsys.readouterr().out


def test_a_half_written_checkpoint_is_invisible(tmp_path):
    ck = _ckpt(tmp_path)
    _save(ck, 1)
    (tmp_path / "checkpoints" / ".step-000000002.tmp").mkdir()  # a writer died before the rename
    assert ck.latest().name == "step-000000001"


@pytest.mark.parametrize("other", [["dataset.num_nodes=5000"], ["model=gat"], ["train.fanouts=[5,5,5]"]])
def test_checkpoint_of_another_job_is_refused(tmp_path, other):
    _save(_ckpt(tmp_path), 1)
    with pytest.raises(CheckpointError, match=r"belongs to another job \(.*HINT: use a new output folder"):
        _ckpt(tmp_path, *other).latest()
    assert _ckpt(tmp_path, *other, "checkpoint.resume=false").latest() is None


class _Payload:
    def __reduce__(self):
        return (print, ("pwned",))


def test_loading_never_unpickles_arbitrary_objects(tmp_path):
    ck = _ckpt(tmp_path)
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
