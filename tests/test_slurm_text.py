"""Reading SLURM's answers: sacct and squeue output recorded on the dev cluster, and sinfo's.

The recorded files in tests/golden/slurm/ are what SLURM 22.05 printed for a 4-member array
job limited to one running member (``--array=0-3%1``, each member running ``srun sleep 4``),
a job whose step failed, and a job cancelled with scancel; sacct_raw_states.txt is sacct's answer
by raw job id (``-o JobIDRaw,State``) for jobs in each state. The live counterparts run in
tests/test_slurm.py (status of a sweep's job array) and below (marked slurm).
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpcgnn.slurm import (
    JobState,
    ended_state,
    expand_array_ids,
    job_states,
    parse_sacct,
    parse_sinfo,
    parse_squeue,
)

RECORDED = Path(__file__).parent / "golden" / "slurm"
ARRAY, FAILED, CANCELLED = "46387651", "46387652", "46387653"


@pytest.mark.parametrize("text, ids", [
    ("123_[0-3]", ["123_0", "123_1", "123_2", "123_3"]),
    ("123_[1-3%1]", ["123_1", "123_2", "123_3"]),
    ("7_[1,4-5]", ["7_1", "7_4", "7_5"]),
    ("7_[0-8:4]", ["7_0", "7_4", "7_8"]),
    ("123_4", ["123_4"]),
    ("123", ["123"]),
])
def test_array_ranges_expand_to_their_members(text, ids):
    assert expand_array_ids(text) == ids


def test_sacct_while_an_array_runs():
    states = parse_sacct((RECORDED / "sacct_array_running.txt").read_text())
    assert states[f"{ARRAY}_0"] == JobState("COMPLETED", "0:0")
    # sacct lists 46387651_1 as RUNNING and, in the same answer, the range _[1-3%1] as PENDING:
    # a member's own row wins.
    assert states[f"{ARRAY}_1"].state == "RUNNING"
    assert states[f"{ARRAY}_2"].state == states[f"{ARRAY}_3"].state == "PENDING"
    assert states[FAILED] == JobState("FAILED", "1:0")
    assert states[CANCELLED].state == "CANCELLED"  # "CANCELLED by 0"
    assert not states[f"{ARRAY}_1"].final and states[FAILED].final and states[CANCELLED].final


def test_sacct_step_rows_do_not_override_the_jobs_own():
    """Without -X sacct adds .batch, .extern and .0 rows; the batch step of a cancelled job says CANCELLED
    with signal 15 and its srun step of a failed job FAILED: only the job's own row counts."""
    with_steps = parse_sacct((RECORDED / "sacct_array_running_steps.txt").read_text())
    assert with_steps == parse_sacct((RECORDED / "sacct_array_running.txt").read_text())
    assert not any("." in jid for jid in with_steps)


def test_sacct_when_the_array_is_done():
    states = parse_sacct((RECORDED / "sacct_array_done.txt").read_text())
    assert [states[f"{ARRAY}_{i}"].state for i in range(4)] == ["COMPLETED"] * 4
    assert all(states[f"{ARRAY}_{i}"].final for i in range(4))


def test_squeue_lists_pending_ranges_and_running_members():
    states = parse_squeue((RECORDED / "squeue_array_running.txt").read_text())
    assert states == {f"{ARRAY}_1": JobState("RUNNING"), f"{ARRAY}_2": JobState("PENDING"),
                      f"{ARRAY}_3": JobState("PENDING")}


def test_unknown_and_odd_states_are_kept_by_name_and_not_final():
    states = parse_sacct("9|RESIZING|0:0\n10||\n11|SOMETHING_NEW|0:0\n12|CANCELLED+|0:9\n")
    assert states["9"] == JobState("RESIZING", "0:0") and not states["9"].final
    assert states["10"].state == "UNKNOWN" and not states["10"].final
    assert states["11"].state == "SOMETHING_NEW" and not states["11"].final
    assert states["12"].state == "CANCELLED" and states["12"].final


def _replay(answers: dict[str, str | None]):
    """A command runner that answers with recorded text (None: the command exited non-zero)."""
    asked = []

    def run(args: list[str]) -> str | None:
        asked.append(args[0])
        return answers[args[0]]

    return run, asked


def test_sacct_failing_falls_back_to_squeue_then_unknown():
    """sacct exits non-zero (accounting storage down or disabled: `sacct: error: ...`): the states
    come from squeue for the jobs still queued, and the others are UNKNOWN, never COMPLETED."""
    run, asked = _replay({"sacct": None, "squeue": (RECORDED / "squeue_array_running.txt").read_text()})
    ids = [f"{ARRAY}_{i}" for i in range(4)] + [FAILED]
    states = job_states(ids, run=run)
    assert asked == ["sacct", "squeue"]
    assert [states[i].state for i in ids] == ["UNKNOWN", "RUNNING", "PENDING", "PENDING", "UNKNOWN"]
    run, asked = _replay({"sacct": (RECORDED / "sacct_array_done.txt").read_text(), "squeue": None})
    states = job_states([f"{ARRAY}_3", FAILED], run=run)
    assert asked == ["sacct"] and states[FAILED] == JobState("FAILED", "1:0")


def test_a_job_has_ended_only_when_accounting_says_so():
    """``sacct -n -P -X -j ID -o JobIDRaw,State`` as the dev cluster answered it (sacct_raw_states.txt: a job
    that completed, one that failed, one running, one cancelled, and the two members of an array whose second
    member's raw id is the array's own): the job's final state, or None while it may still run, when sacct
    does not list it, or when sacct fails (a leftover folder is removed only for a job known to have ended)."""
    answers, job = {}, None
    for line in (RECORDED / "sacct_raw_states.txt").read_text().splitlines():
        if line.startswith("== "):
            job = line[3:]
            answers[job] = ""
        else:
            answers[job] += line + "\n"

    def sacct(args):
        return answers.get(args[args.index("-j") + 1], "")

    assert [ended_state(j, run=sacct) for j in answers] == ["COMPLETED", "FAILED", None, "CANCELLED", "COMPLETED"]
    assert ended_state("46474234", run=lambda args: answers["46474233"]) == "COMPLETED"  # a member's own row
    assert ended_state("46474235", run=sacct) is None  # not listed
    assert ended_state("46474229", run=lambda args: None) is None  # sacct failing
    assert ended_state("46474231", run=lambda args: "46474231|REQUEUED\n") is None


def test_sinfo_of_the_dev_cluster():
    (part,) = parse_sinfo((RECORDED / "sinfo_devcluster.txt").read_text())
    assert (part.name, part.default, part.nodes, part.cpus, part.mem_mb, part.gpus, part.time_min) == \
        ("debug", True, 2, 4, 8000, 0, None)


@pytest.mark.slurm
@pytest.mark.slow
def test_live_array_job_states_follow_the_scheduler(devcluster_up, tmp_path):
    """The same parser on the live dev cluster: a small array goes PENDING/RUNNING -> COMPLETED."""
    job = subprocess.run(["sbatch", "--parsable", "--array=0-2%1", "-N1", "-n1", f"--output={tmp_path}/%A_%a.out",
                          "--wrap", "sleep 1"], capture_output=True, text=True, check=True).stdout.strip()
    ids = [f"{job}_{i}" for i in range(3)]
    seen: set[str] = set()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        states = job_states(ids)
        seen |= {s.state for s in states.values()}
        if all(s.final for s in states.values()):
            break
        time.sleep(1)
    assert [states[i].state for i in ids] == ["COMPLETED"] * 3, states
    assert seen <= {"PENDING", "RUNNING", "COMPLETING", "COMPLETED", "UNKNOWN"}, seen


@pytest.mark.slurm
@pytest.mark.slow
def test_another_hosts_leftover_is_removed_once_its_slurm_job_ended(devcluster_up, tmp_path, capsys):
    """A temporary folder written inside a SLURM job carries the job id; from another host, the next writer
    removes it once sacct says the job ended, and leaves it while the job is queued or running, or unknown."""
    from hpcgnn.writers import sweep_leftovers

    def sbatch(*args: str) -> str:
        return subprocess.run(["sbatch", "--parsable", "-N1", "-n1", f"--output={tmp_path}/%j.out", *args],
                              capture_output=True, text=True, check=True, timeout=120).stdout.strip()

    tag_job = sbatch("--wait", "--wrap", f"{sys.executable} -c 'from hpcgnn.writers import writer_tag; print(writer_tag())'")
    tag = (tmp_path / f"{tag_job}.out").read_text().strip()
    assert tag.endswith(f"-j{tag_job}"), tag  # inside a job, the writer tag names it
    running = sbatch("--wrap", "sleep 300")
    try:
        deadline = time.monotonic() + 60
        while ended_state(tag_job) is None and time.monotonic() < deadline:  # (accounting may lag a moment)
            time.sleep(1)
        prefix = ".synthetic-0123.tmp-"
        ended, live, unknown = (tmp_path / f"{prefix}othernode-4242-0badc0de-j{job}"
                                for job in (tag_job, running, "999999999"))
        for folder in (ended, live, unknown):
            folder.mkdir()
        assert sweep_leftovers(tmp_path, prefix) == [ended]
        assert live.exists() and unknown.exists()
        err = capsys.readouterr().err
        assert f"hpcgnn: removed {ended} (0.0 GiB), left by job {tag_job} on othernode, which ended COMPLETED" in err
    finally:
        subprocess.run(["scancel", running], timeout=60)
