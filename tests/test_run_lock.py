"""One job per run folder: a second run where one runs is refused naming it, at submission and on its ranks; a
rerun after a failure reports its own result.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time

import pytest
from conftest import DATA_ROOT, TINY, one_line, run_cli, summary_of


def test_a_second_run_in_a_folder_where_one_runs_is_refused_naming_it(tmp_path):
    """Run A trains; run B is started in A's folder: B exits 2 naming A, and A ends as it would have alone (its
    checkpoints its own)."""
    folder = tmp_path / "a"
    folder.mkdir()
    log = folder / "out.txt"
    args = [sys.executable, "-m", "hpcgnn", *TINY, "train.epochs=12", "launch.procs=1", "debug.slow_rank=0",
            "debug.slow_s=0.05",
            "checkpoint.every_steps=5", "checkpoint.keep=2",
            "metrics.tensorboard=false", f"dataset.root={DATA_ROOT}", f"hydra.run.dir={folder / 'run'}"]
    a = subprocess.Popen(args, stdout=log.open("w"), stderr=subprocess.STDOUT, cwd=folder)
    deadline = time.monotonic() + 120
    while "epoch 1/12" not in log.read_text() and a.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    b = run_cli(*TINY, "train.epochs=1", "launch.procs=1", cwd=folder, timeout=120)
    assert b.returncode == 2, b.stdout + b.stderr
    line = one_line(b, "run folder in use")
    assert re.search(rf"the run folder {folder / 'run'} is in use by a local run's launcher \(pid {a.pid} on \S+, since "
                     r"[\d-]+ [\d:]+\)\. HINT: wait for it to end, stop it, or give this run another folder "
                     r"\(hydra.run.dir=\.\.\.\)", line), line
    assert a.wait(timeout=180) == 0, log.read_text()
    summary = summary_of(folder)
    assert summary["resumes"] == 0 and summary["history"][-1]["epoch"] == 12


@pytest.mark.slow
def test_a_job_whose_folder_is_held_is_refused_at_submission_and_on_its_ranks(tmp_path):
    """The folder's lock held (by this test, as a running job's rank 0 would): a submission is refused before it is
    made, and ranks started by hand (srun's way: launch.mode=rank) refuse on their own, with exit 2 and one line."""
    from hpcgnn import runlock

    held = runlock.take(tmp_path / "run", "rank 0 of 2", job_id="4242")
    try:
        res = run_cli("+cluster=local", *TINY, cwd=tmp_path)
        assert res.returncode == 2 and not (tmp_path / "run" / "submitit").exists(), res.stdout + res.stderr
        assert "in use by rank 0 of 2 (pid" in one_line(res, "run folder in use") and ", job 4242, since" in res.stderr
        assert "HINT: wait for it to end, stop it (scancel 4242)" in res.stderr
        res = run_cli("launch.mode=rank", *TINY, cwd=tmp_path)
        assert res.returncode == 2, res.stdout + res.stderr
        assert "in use by rank 0 of 2" in one_line(res, "run folder in use")
        assert not (tmp_path / "run" / "failures").exists()  # the running job's records are not touched
    finally:
        held.release()
    runlock.check_free(tmp_path / "run")  # its holder gone, the folder is free again


@pytest.mark.slow
def test_a_successful_rerun_after_a_failure_reports_its_own_result(tmp_path):
    failed = run_cli("+cluster=local", *TINY, "debug.fail_rank=0", "debug.fail_step=2", cwd=tmp_path)
    assert failed.returncode == 1 and "injected failure" in failed.stderr, failed.stdout + failed.stderr
    again = run_cli("+cluster=local", *TINY, cwd=tmp_path)  # the same command, without the fault
    assert again.returncode == 0, again.stdout + again.stderr
    assert re.search(r"^test accuracy \d\.\d{4} ", again.stdout, re.M) and "Traceback" not in again.stderr
    assert "an earlier attempt's failure records were moved to" in again.stdout
    (aside,) = (tmp_path / "run" / "failures" / "previous").iterdir()
    assert (aside / "rank-0.json").is_file() and not list((tmp_path / "run" / "failures").glob("*.json"))
