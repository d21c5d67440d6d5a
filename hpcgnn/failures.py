"""A run's failures, one record per rank in ``<run_dir>/failures/``: written by the ranks, read by the launcher.

A rank that fails writes its traceback there before it leaves (:func:`record_failure`); the launcher
reports the cause (:func:`read_failures`: the earliest record that is not an echo of another rank's
failure), as one line when the cause is a user error.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
import traceback
from pathlib import Path

from hpcgnn.env import RankEnv
from hpcgnn.errors import EXIT_FAILED, AnotherRankFailed, UserError, describe
from hpcgnn.io import write_json


def record_failure(run_dir: Path, env: RankEnv | None, exc: BaseException) -> None:
    """Write this rank's traceback to ``run_dir/failures/rank-<r>.json`` for the launcher's report, and mark
    ``exc.recorded`` when it is on disk (a rank whose environment could not be read is named by its pid).

    A user error (a corrupt partition, a checkpoint of another job, ...) is marked so, with
    the line that names the fix and its exit code: the launcher reports that line alone and
    leaves with that code (2; 4 for a diverged run).
    """
    user = isinstance(exc, UserError)
    record = {"rank": env.rank if env is not None else -1, "host": socket.gethostname(),
              "job_id": env.job_id if env is not None else "", "time": time.time(),
              "error": "".join(traceback.format_exception(exc)),
              "user_error": describe(exc) if user else None, "exit_code": exc.exit_code if user else EXIT_FAILED,
              "echo": isinstance(exc, AnotherRankFailed)}
    name = f"rank-{env.rank}.json" if env is not None else f"rank-unknown-{os.getpid()}.json"
    with contextlib.suppress(OSError):  # (a full or unwritable disk: the rank's own stderr keeps the traceback)
        write_json(run_dir / "failures" / name, record)
        exc.recorded = True


def read_failures(run_dir: Path) -> list[dict]:
    """The failure records of a run, earliest first; echoes of another rank's failure after every cause."""
    records = []
    for path in (run_dir / "failures").glob("rank-*.json"):
        with contextlib.suppress(OSError, ValueError):
            records.append(json.loads(path.read_text()))
    return sorted(records, key=lambda r: (r.get("echo", False), r["time"], r["rank"]))
