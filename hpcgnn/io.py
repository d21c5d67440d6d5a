"""File helpers shared by the run folder, checkpoints, partitions, prepared graphs and sweeps.

Everything hpcgnn writes for others to read appears whole or not at all: a file through
:func:`atomic_open`, a folder through :class:`AtomicFolder` (a temporary sibling, every file
fsync'd, one rename). Readers never see half a prepared graph, partition or checkpoint,
however the writer died.

A writer killed mid-way (a time limit, preemption, SIGKILL) leaves its temporary folder, which for a
large graph holds gigabytes. Temporary folders are named by their writer (host, pid, SLURM job), and
the next writer of the same folder removes those whose writer is gone (:mod:`hpcgnn.writers`).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import math
import os
import shutil
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from hpcgnn import paths
from hpcgnn.writers import sweep_leftovers, writer_tag


@contextlib.contextmanager
def atomic_open(path: Path, mode: str = "w") -> Iterator:
    """A file that appears at ``path`` whole or not at all (temporary file, fsync, rename): the one atomic writer.
    Its folder is guarded (:func:`hpcgnn.paths.guard_parent`: not another user's, nor writable by others, nor a link
    another user made), a link another user planted at ``path`` is refused, and the temporary file is made new,
    following no link.

    Several writers (ranks, nodes on a shared file system) may race: each writes its own
    temporary file and the last rename wins with a complete file.
    """
    path = Path(path)
    paths.make_dirs(path.parent)
    paths.refuse_link(path, path.name)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        with os.fdopen(paths.open_nofollow(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644, path.name), mode) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def save_whole(path: Path, obj) -> Path:
    """``torch.save(obj)`` into ``path``, whole or not at all (:func:`atomic_open`). A write that fails part-way
    (the disk full, a quota) raises its OSError: torch's zip writer, closing after it, often raises a RuntimeError
    of its own ("unexpected pos") that would hide what happened and turn a full disk into a crash."""
    import torch

    with atomic_open(path, "wb") as f:
        try:
            torch.save(obj, f)
        except RuntimeError as exc:
            cause = exc.__context__
            while cause is not None and not isinstance(cause, OSError):
                cause = cause.__context__
            if cause is None:
                raise
            raise cause from None
    return path


def write_json(path: Path, data: dict) -> Path:
    """Write ``path`` atomically: readers never see half a file. Always valid JSON: a NaN or infinite float (a
    loss that diverged, a metric of nothing) is written as null, which every JSON reader takes."""
    with atomic_open(path) as f:
        json.dump(finite(data), f, indent=2, allow_nan=False)
    return path


def finite(obj):
    """``obj`` with every NaN or infinite float (in dicts, lists, tuples) replaced by None."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    return obj


def write_npy(path: Path, array: np.ndarray) -> Path:
    """Write ``array`` to ``path`` (.npy) atomically."""
    with atomic_open(path, "wb") as f:
        np.save(f, array)
    return path


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def fsync_dir(path: Path) -> None:
    """Make a folder's entries (a rename into it) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def ignoring_ctrl_c() -> Iterator[None]:
    """SIGINT ignored inside, in the main thread (elsewhere Python delivers none anyway). Around a submission:
    what it starts inherits the ignored Ctrl-C, so that a terminal's Ctrl-C, which reaches the whole process
    group, stops the waiting but not the job (submitit's local executor runs the job's tasks as children of
    this process; ``sbatch`` is not cut off halfway). Around a local run's end: a second Ctrl-C does not cut
    short the stopping of the ranks."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@contextlib.contextmanager
def stop_cleanly_on_sigterm(what: str, then: str = "removing its temporary files") -> Iterator[None]:
    """While a prepare or a partition runs (hours, for a large graph), or a local run's launcher waits on its
    ranks: SIGTERM (``scancel``, a job's time limit, a plain ``kill``, ``timeout``) raises ``SystemExit(143)``
    in the main thread, so that the ``finally`` blocks remove the temporary folders instead of leaving
    gigabytes behind, or stop the ranks (``then`` says which, on stderr). Ctrl-C likewise, with exit status
    130. The previous handler (submitit's) is put back after; outside the main thread nothing changes."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, frame):
        print(f"hpcgnn: {what} stopped by SIGTERM; {then}", file=sys.stderr, flush=True)
        raise SystemExit(128 + signal.SIGTERM)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    except KeyboardInterrupt:  # Ctrl-C: the finally blocks inside have run; one line, no traceback, exit 130
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the command is ending: a second Ctrl-C changes nothing
        print(f"\nhpcgnn: {what} stopped by Ctrl-C; {then}", file=sys.stderr, flush=True)
        raise SystemExit(128 + signal.SIGINT) from None
    finally:
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)


class AtomicFolder:
    """A folder that appears at ``final`` whole or not at all.

    Fill ``tmp`` (a hidden sibling: ``.<name>.tmp-<writer tag>``; :meth:`create` first removes the
    siblings a killed writer on this host left), then :meth:`commit`: every file
    is fsync'd and the folder renamed into place. When several writers race (ranks, nodes
    on a shared file system), ``replace=False`` keeps the folder that got there first (the
    writers make the same content: a prepared graph, a partition); ``replace=True`` puts
    this one in place (a checkpoint written again). ``tmp_name`` fixes the temporary name,
    so that several processes can fill one folder (a checkpoint's ranks); ``tag``, the writer tag in the
    default name, so that several tasks share one (task 0's :func:`writer_tag`).
    """

    def __init__(self, final: Path, replace: bool = False, tmp_name: str | None = None, tag: str | None = None):
        self.final, self.replace = Path(final), replace
        self.tmp = self.final.parent / (tmp_name or f".{self.final.name}.tmp-{tag or writer_tag()}")

    def create(self) -> Path:
        paths.make_dirs(self.final.parent)  # (as atomic_open's: one rule)
        paths.refuse_link(self.final, self.final.name)
        sweep_leftovers(self.final.parent, f".{self.final.name}.tmp-", keep=self.tmp)
        shutil.rmtree(self.tmp, ignore_errors=True)
        self.tmp.mkdir()
        return self.tmp

    def commit(self) -> Path:
        for path in sorted(self.tmp.rglob("*")):
            if path.is_file():
                with open(path, "rb") as f:
                    os.fsync(f.fileno())
        for folder in [p for p in self.tmp.rglob("*") if p.is_dir()] + [self.tmp]:
            fsync_dir(folder)
        if self.replace:
            shutil.rmtree(self.final, ignore_errors=True)
        try:
            os.rename(self.tmp, self.final)
        except OSError:  # another writer's folder is in place
            if self.replace or not self.final.exists():
                raise
            self.discard()
        fsync_dir(self.final.parent)
        return self.final

    def discard(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)


@contextlib.contextmanager
def atomic_folder(final: Path, replace: bool = False) -> Iterator[Path]:
    """``with atomic_folder(final) as tmp: <write into tmp>``: committed on success, discarded on error."""
    folder = AtomicFolder(final, replace)
    tmp = folder.create()
    try:
        yield tmp
        folder.commit()
    finally:
        folder.discard()


def no_room(exc: BaseException | None) -> bool:
    """Whether ``exc`` says the file system has no room for this user: full, a quota, a file size limit."""
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def human_bytes(n: float) -> str:
    """``n`` bytes as a person reads them: GiB, MiB or KiB with a figure that is not 0.0, or bytes."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.2f} {unit}" if unit == "GiB" else f"{n / size:.1f} {unit}"
    return f"{int(n)} B"
