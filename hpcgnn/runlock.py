"""A run folder holds one running job: a lock that dies with its holder.

Two runs writing one folder at once mix their checkpoints and metrics, and one of them crashes mid-write.
The process that runs a job in a folder holds an exclusive ``flock`` on ``<run_dir>/.lock`` until it ends.
The kernel releases the lock when that process dies, however it dies, so a requeued or resumed run takes it
again, and a crashed one never blocks the folder. Which process holds it:

- a local run: the launcher, for the whole run (its ranks know it holds it);
- a submitted job, or ranks started by hand (``srun python -m hpcgnn``): rank 0, from before the first step
  to its exit; the launcher only checks, before submitting, that no job holds it.

The holder writes who it is into the file (host, pid, job, since when), for the one that is refused.
On NFS, Linux implements ``flock`` with the server's locks (NFSv4, or v3 with lockd), so ranks on
different nodes see one another's.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import fcntl
import json
import logging
import os
import socket
import time
from pathlib import Path

from hpcgnn import paths, trust
from hpcgnn.errors import RunFolderBusy

log = logging.getLogger(__name__)
LOCK_FILE = ".lock"


class RunLock:
    """The held lock of a run folder (released by :meth:`release`, or when the process ends)."""

    def __init__(self, path: Path, fd: int):
        self.path, self.fd = path, fd

    def release(self) -> None:
        if self.fd >= 0:
            with contextlib.suppress(OSError):
                fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = -1


def _written(fd: int) -> dict:
    """What the lock's holder wrote into it (read through the descriptor: the path may have been replaced)."""
    return json.loads(os.pread(fd, 1 << 16, 0))


def _holder(fd: int) -> str:
    """Who holds the lock, as it wrote itself down."""
    try:
        info = _written(fd)
        since = datetime.datetime.fromtimestamp(info["started"]).strftime("%Y-%m-%d %H:%M:%S")
        job = f", job {info['job_id']}" if info.get("job_id") else ""
        return f"{info['who']} (pid {info['pid']} on {info['host']}{job}, since {since})"
    except (OSError, ValueError, KeyError, TypeError):
        return "another process"


def take(run_dir: str | Path, who: str, job_id: str = "") -> RunLock:
    """Hold ``run_dir``'s lock as ``who``; :class:`~hpcgnn.errors.RunFolderBusy` (exit 2) naming the holder when
    another process holds it."""
    folder = Path(run_dir)
    folder.mkdir(parents=True, exist_ok=True)
    trust.run_folder(folder)
    path = folder / LOCK_FILE
    fd = paths.open_nofollow(path, os.O_RDWR | os.O_CREAT, 0o600, "the run folder's lock", private=True)  # (a link, a FIFO: refused at once)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        holder, job = _holder(fd), job_id_of(fd)
        os.close(fd)
        if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            # The file system keeps no locks (Lustre mounted without -o flock, some FUSE): nothing to hold.
            log.warning("the run folder %s cannot be locked (%s): two runs started there at once would not be told "
                        "apart. HINT: use a run folder on a file system with locks (Lustre: mounted with -o flock)",
                        folder, exc.strerror)
            return RunLock(path, -1)
        hint = f"wait for it to end, stop it (scancel {job})" if job else "wait for it to end, stop it"
        raise RunFolderBusy(f"the run folder {folder} is in use by {holder}. HINT: {hint}, or give this run "
                            "another folder (hydra.run.dir=...)") from None
    os.ftruncate(fd, 0)
    os.write(fd, json.dumps({"who": who, "pid": os.getpid(), "host": socket.gethostname(), "job_id": job_id,
                             "started": time.time()}).encode())
    return RunLock(path, fd)


def job_id_of(fd: int) -> str:
    with contextlib.suppress(OSError, ValueError, AttributeError):
        return str(_written(fd).get("job_id") or "")
    return ""


def check_free(run_dir: str | Path) -> None:
    """Before submitting: no running job holds ``run_dir`` (:class:`~hpcgnn.errors.RunFolderBusy` otherwise). Must
    not be called by a process that holds the lock (on NFS, closing any descriptor of the file drops it)."""
    if (Path(run_dir) / LOCK_FILE).exists():
        take(run_dir, "a check").release()
