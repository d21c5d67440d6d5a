"""The preemption signal sent to a local launcher: it checkpoints, exits 3, and the same command resumes.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import pytest
from conftest import DATA_ROOT, TINY, summary_of


@pytest.mark.slow
def test_usr2_to_a_local_launcher_checkpoints_exits_3_and_the_same_command_resumes(tmp_path):
    """USR2 (what `scancel --signal=USR2` or a wrapper sends) to the process the user started: the rank gets it,
    checkpoints and stops, the launcher exits 3; the same command resumes from that checkpoint to the end (that a
    resume after the preemption signal is bitwise: test_train)."""
    args = [*TINY, "train.epochs=6", "launch.procs=1", "debug.slow_rank=0", "debug.slow_s=0.1",
            "metrics.tensorboard=false", f"dataset.root={DATA_ROOT}"]  # (slow steps: the signal comes while it trains)
    folder = tmp_path / "cut"
    folder.mkdir()
    log = folder / "out.txt"
    command = [sys.executable, "-m", "hpcgnn", *args, f"hydra.run.dir={folder / 'run'}"]
    child = subprocess.Popen(command, stdout=log.open("w"), stderr=subprocess.STDOUT, cwd=folder,
                             env={**os.environ, "PYTHONUNBUFFERED": "1"})
    deadline = time.monotonic() + 120
    while "epoch 1/6" not in log.read_text() and child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    os.kill(child.pid, signal.SIGUSR2)
    assert child.wait(timeout=120) == 3, log.read_text()
    out = log.read_text()
    assert "hpcgnn: SIGUSR2 received: passed to the ranks: they checkpoint at their next step and stop" in out
    assert re.search(r"hpcgnn: preempted: checkpoint of step \d+ saved in .*; run the same command with "
                     rf"hydra.run.dir={folder / 'run'} to resume", out), out
    again = subprocess.run(command, capture_output=True, text=True, cwd=folder, timeout=300)
    assert again.returncode == 0, again.stdout + again.stderr
    resumed = summary_of(folder)
    assert resumed["resumes"] == 1 and [r["epoch"] for r in resumed["history"]] == list(range(1, 7))
    assert "resumed from" in again.stdout
