"""After starting a run: waiting for it, following its log lines, forwarding the user's signals, the result line, and
the report of a failed run (one line per failed process, from the failure records).
"""

from __future__ import annotations

import contextlib
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from hpcgnn import env
from hpcgnn.config import RunConfig
from hpcgnn.errors import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_USER_ERROR
from hpcgnn.failures import read_failures
from hpcgnn.results import result_words


@contextlib.contextmanager
def forwarding(signame: str, forward) -> Iterator[None]:
    """While a launcher waits on its ranks or job: the preemption signal (``checkpoint.signal``, USR2), sent to the
    launcher as a wrapper or ``kill`` would, is handed on by ``forward()`` (which says where it went) instead of
    killing the launcher. Outside the main thread nothing changes."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    signum = getattr(signal, f"SIG{signame}")

    def handle(sig, frame) -> None:
        print(f"hpcgnn: SIG{signame} received: {forward()}", file=sys.stderr, flush=True)

    previous = signal.signal(signum, handle)
    try:
        yield
    finally:
        signal.signal(signum, previous if previous is not None else signal.SIG_DFL)


def print_result(summary: dict) -> None:
    ranks = f"{summary['world_size']} rank{'s' if summary['world_size'] != 1 else ''} on {', '.join(summary['hostnames'])}"
    if summary.get("kind") == "predict":  # hpcgnn predict RUN_DIR
        print(f"{result_words(summary)}, {ranks}, {summary['wall_time_s']:.1f} s", flush=True)
        print(f"outputs: {summary['run_dir']} (manifest.json)", flush=True)
        return
    print(f"{result_words(summary)}, {ranks}, {summary['seeds_per_s']:.0f} {summary.get('seeds_unit', 'seeds')}/s, "
          f"{summary['wall_time_s']:.1f} s", flush=True)
    if summary.get("nonfinite_skipped"):
        print(f"hpcgnn: WARNING: {summary['nonfinite_skipped']} optimizer step(s) were skipped for NaN/inf gradients "
              "(train.nonfinite=skip)", flush=True)
    print(f"summary: {Path(summary['run_dir']) / 'summary.json'}", flush=True)


def wait_for(job, cfg: RunConfig, after=None) -> int:
    """Follow rank 0's log until the job ends, then print its result, its error or its cancellation.

    Result files are checked every ``launch.poll_s``; the scheduler is asked every
    ``launch.state_poll_s``, so a job that ends without results (cancelled, killed,
    node failure) is noticed promptly, not only by submitit's slowing poll. The preemption signal sent to this
    process goes to a SLURM job's ranks (:func:`forwarding`).
    """
    from submitit.slurm.slurm import SlurmJob

    on_slurm = isinstance(job, SlurmJob)

    def forward() -> str:
        if not on_slurm:
            return ("not passed on: submitit's local executor forwards only SIGTERM to its tasks; the job goes on "
                    "(signal its tasks themselves to have them checkpoint)")
        subprocess.run(["scancel", f"--signal={cfg.checkpoint.signal}", str(job.job_id)], capture_output=True)
        return (f"passed to job {job.job_id} (scancel --signal={cfg.checkpoint.signal}): its ranks checkpoint and "
                "the job is requeued")

    with forwarding(cfg.checkpoint.signal, forward):
        return _follow_job(job, cfg, after, on_slurm)


def _follow_job(job, cfg: RunConfig, after, on_slurm: bool) -> int:
    from submitit.core.utils import FailedJobError, UncompletedJobError

    offset, last_asked = 0, time.monotonic()
    try:
        while not job.done():
            offset = _follow(job.paths.stdout, offset)
            if on_slurm and time.monotonic() - last_asked >= cfg.launch.state_poll_s:
                last_asked = time.monotonic()
                if job.watcher.is_done(job.job_id, mode="force"):
                    break
            time.sleep(cfg.launch.poll_s)
        _follow(job.paths.stdout, offset)
        state = job.watcher.get_state(job.job_id, mode="force") if on_slurm else job.state
        if state.upper().startswith("CANCELLED"):
            why = ""
            if after is not None and after.state not in ("COMPLETED", "RUNNING", "PENDING"):
                why = f": partitioning job {after.job_id} ended {after.state}\n{after.stderr() or ''}"
            print(f"job {job.job_id} was cancelled ({state}){why}; output folder: {cfg.run_dir}", file=sys.stderr,
                  flush=True)
            return EXIT_FAILED
        if read_failures(Path(cfg.run_dir)):
            return report_failure(Path(cfg.run_dir), "", f"job {job.job_id} failed (state {state})")
        results = job.results()
    except (KeyboardInterrupt, FailedJobError, UncompletedJobError) as exc:
        return stopped_or_failed(job, "job", f" (output folder: {cfg.run_dir})", exc)
    print_result(results[0])
    return 0


def stopped_or_failed(job, what: str, where: str, exc: BaseException) -> int:
    """The line and exit code of a wait the user stopped (Ctrl-C: the job goes on) or of a job that failed."""
    if isinstance(exc, KeyboardInterrupt):
        print(f"\nstopped waiting; {what} {job.job_id} goes on{where}", file=sys.stderr)
        return EXIT_INTERRUPTED
    print(f"{what} {job.job_id} failed (state {job.state}):\n{exc}", file=sys.stderr, flush=True)
    return EXIT_FAILED


def failure_report(run_dir: Path, fallback: str) -> str:
    """Which ranks failed, and the full error of the one that failed first; a user error, its one line.

    When one rank dies, the others fail next with communication errors
    ("Connection closed by peer"); the earliest failure record is the cause. When that cause
    is something to fix (a user error), its line is the whole report (and the last line): the
    traceback and the other ranks' echoes only with ``HYDRA_FULL_ERROR=1``.
    """
    records = read_failures(run_dir)
    if not records:
        return fallback
    first = records[0]
    if first.get("user_error") and not env.full_error():
        return first["user_error"]
    lines = ["failed ranks:"]
    lines += [f"  {r['who']} on {r['host']}: {_last_line(r['error'])}" for r in sorted(records, key=_by_process)]
    lines += [f"first failure, {first['who']} on {first['host']}:", first["error"].rstrip()]
    if first.get("user_error"):  # the cause is something to fix, not a bug: say it plainly last
        lines.append(first["user_error"])
    return "\n".join(lines)


def _by_process(record: dict) -> tuple:
    """Ranks in rank order, then the sampler servers."""
    return record["who"].startswith("sampler"), record.get("rank", -1), record["who"]


def report_failure(run_dir: Path, fallback: str, headline: str = "") -> int:
    """Print the failure report of a run; the exit code: the user error's (2; 4 diverged) when the first
    failure was one, else 1."""
    report = failure_report(run_dir, fallback)
    print(f"{headline}\n{report}" if headline else report, file=sys.stderr, flush=True)
    records = read_failures(run_dir)
    if records and records[0].get("user_error"):
        return records[0].get("exit_code", EXIT_USER_ERROR)
    return EXIT_FAILED


def _last_line(text: str) -> str:
    """The exception line of a traceback dump (the last line that names an error)."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not set(ln.strip()) <= {"-"}]
    errs = [ln for ln in lines if re.match(r"^[\w.]+(Error|Exception|Interrupt|Exit)\b", ln)]
    return (errs or lines or ["(no message)"])[-1][:300]


def _follow(path: Path, offset: int) -> int:
    """Print what ``path`` gained since ``offset``; returns the new offset."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            chunk = f.read()
    except FileNotFoundError:
        return offset
    if chunk:
        sys.stdout.write(chunk.decode(errors="replace"))
        sys.stdout.flush()
    return offset + len(chunk)

