"""Who filled a temporary folder, and whether it is gone: the writer tags that temporary folders' names end
with, and the sweep that removes the folders of writers gone (a killed prepare, partition or lp scratch):
a process on this host, or a SLURM job that ended, on another (asked of sacct)."""

from __future__ import annotations

import contextlib
import glob
import os
import re
import shutil
import socket
import sys
import time
import uuid
from pathlib import Path

from hpcgnn import env
from hpcgnn.slurm import ended_state

LEFTOVER_WARN_S = 3600  # another host's temporary folder untouched this long is named in a warning
_TAG = re.compile(r"(?P<host>[A-Za-z0-9._]+)-(?P<pid>[0-9]+)-[0-9a-f]{8}(?:-j(?P<job>[0-9]+))?$")


def writer_tag() -> str:
    """``host-pid-random``, and ``-j<job id>`` inside a SLURM job: a temporary folder's name ends with it,
    so that a later writer can tell whether the process that filled it is gone (:func:`sweep_leftovers`)."""
    tag = f"{_host()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    job = env.read("slurm_job_id") or ""
    return f"{tag}-j{job}" if job.isdigit() else tag


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9.]", "_", socket.gethostname()) or "host"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _tree_bytes_and_mtime(folder: Path) -> tuple[int, float]:
    size, newest = 0, folder.stat().st_mtime
    for path in folder.rglob("*"):
        with contextlib.suppress(OSError):
            st = path.stat()
            size += st.st_size if path.is_file() else 0
            newest = max(newest, st.st_mtime)
    return size, newest


def sweep_leftovers(parent: Path, prefix: str, keep: Path | None = None) -> list[Path]:
    """Remove the folders ``parent/<prefix><writer_tag>`` whose writer is gone (a killed prepare, partition
    or lp scratch): its process, on this host, or its SLURM job, on another (sacct says the job ended);
    returns them. Others (a live writer's, another host's outside SLURM or not known to have ended, names
    without a tag) are left, and named on stderr when untouched for ``LEFTOVER_WARN_S``: only a person can
    tell whether something elsewhere still fills them."""
    removed, here = [], _host()
    for folder in sorted(parent.glob(f"{glob.escape(prefix)}*")):
        if folder == keep or not folder.is_dir():
            continue
        m = _TAG.fullmatch(folder.name[len(prefix):])
        try:
            gone = None
            if m is not None and m["host"] == here and not _alive(int(m["pid"])):
                gone = f"process {m['pid']}, which is gone"
            elif m is not None and m["host"] != here and m["job"] and (state := ended_state(m["job"])):
                gone = f"job {m['job']} on {m['host']}, which ended {state}"
            if gone is not None:
                size, _ = _tree_bytes_and_mtime(folder)
                shutil.rmtree(folder, ignore_errors=True)
                print(f"hpcgnn: removed {folder} ({size / 2**30:.1f} GiB), left by {gone}", file=sys.stderr, flush=True)
                removed.append(folder)
                continue
            size, newest = _tree_bytes_and_mtime(folder)
        except OSError:  # removed meanwhile by another writer's sweep
            continue
        if time.time() - newest > LEFTOVER_WARN_S:
            who = (f"process {m['pid']} on {m['host']}" + (f" (SLURM job {m['job']})" if m["job"] else "")
                   if m is not None else "an unknown writer")
            print(f"hpcgnn: WARNING: {folder} ({size / 2**30:.1f} GiB) is a temporary folder left by {who}, "
                  f"untouched for {(time.time() - newest) / 3600:.1f} h; delete it if no job is writing it",
                  file=sys.stderr, flush=True)
    return removed
