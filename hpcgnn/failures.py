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


def record_failure(run_dir: Path, env: RankEnv | None, exc: BaseException, server: int | None = None) -> None:
    """Write this rank's traceback to ``run_dir/failures/rank-<r>.json`` for the launcher's report, and mark
    ``exc.recorded`` when it is on disk (a rank whose environment could not be read is named by its pid;
    ``server``: sampler server k's, ``server-<k>.json``).

    A user error (a corrupt partition, a checkpoint of another job, ...) is marked so, with
    the line that names the fix and its exit code: the launcher reports that line alone and
    leaves with that code (2; 4 for a diverged run).
    """
    user = isinstance(exc, UserError)
    rank = env.rank if env is not None else -1
    who = f"sampler server {server}" if server is not None else f"rank {rank}"
    record = {"rank": rank, "who": who, "host": socket.gethostname(),
              "job_id": env.job_id if env is not None else "", "time": time.time(),
              "error": "".join(traceback.format_exception(exc)),
              "user_error": describe(exc) if user else None, "exit_code": exc.exit_code if user else EXIT_FAILED,
              "echo": isinstance(exc, AnotherRankFailed)}
    name = (f"server-{server}.json" if server is not None else f"rank-{env.rank}.json" if env is not None
            else f"rank-unknown-{os.getpid()}.json")
    with contextlib.suppress(OSError):  # (a full or unwritable disk: the rank's own stderr keeps the traceback)
        write_json(run_dir / "failures" / name, record)
        exc.recorded = True


def read_failures(run_dir: Path) -> list[dict]:
    """The failure records of a run, earliest first; echoes of another rank's failure after every cause."""
    records = []
    for path in (run_dir / "failures").glob("*.json"):
        with contextlib.suppress(OSError, ValueError):
            record = json.loads(path.read_text())
            record.setdefault("who", f"rank {record.get('rank', -1)}")
            records.append(record)
    return sorted(records, key=lambda r: (r.get("echo", False), r["time"], r["who"]))


def server_failure(run_dir: Path, server: int) -> dict | None:
    """Sampler server ``server``'s failure record of this attempt, if it wrote one."""
    with contextlib.suppress(OSError, ValueError):
        return json.loads((run_dir / "failures" / f"server-{server}.json").read_text())
    return None


def set_aside_failures(run_dir: Path) -> Path | None:
    """When a new attempt of a run starts: an earlier attempt's records move to ``failures/previous/<time>/``, so
    that the launcher reports this attempt's failures only (and the old ones stay to read). Where they went, or
    None when there were none."""
    folder = run_dir / "failures"
    old = sorted(folder.glob("*.json")) if folder.is_dir() else []
    if not old:
        return None
    aside = folder / "previous" / time.strftime("%Y%m%d-%H%M%S")
    aside = aside.with_name(f"{aside.name}-{os.getpid()}") if aside.exists() else aside
    aside.mkdir(parents=True, exist_ok=True)
    for path in old:
        with contextlib.suppress(FileNotFoundError):  # (a concurrent attempt moved it first)
            path.replace(aside / path.name)
    return aside
