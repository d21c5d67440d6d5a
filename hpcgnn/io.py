"""File helpers shared by the run folder, checkpoints, partitions, prepared graphs and sweeps.

Everything hpcgnn writes for others to read appears whole or not at all: a file through
:func:`atomic_open`, a folder through :class:`AtomicFolder` (a temporary sibling, every file
fsync'd, one rename). Readers never see half a prepared graph, partition or checkpoint,
however the writer died.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np


@contextlib.contextmanager
def atomic_open(path: Path, mode: str = "w") -> Iterator:
    """A file that appears at ``path`` whole or not at all (temporary file, fsync, rename).

    Several writers (ranks, nodes on a shared file system) may race: each writes its own
    temporary file and the last rename wins with a complete file.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        with open(tmp, mode) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def write_json(path: Path, data: dict) -> Path:
    """Write ``path`` atomically: readers never see half a file."""
    with atomic_open(path) as f:
        json.dump(data, f, indent=2)
    return path


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


class AtomicFolder:
    """A folder that appears at ``final`` whole or not at all.

    Fill ``tmp`` (a hidden sibling: ``.<name>.tmp-<id>``), then :meth:`commit`: every file
    is fsync'd and the folder renamed into place. When several writers race (ranks, nodes
    on a shared file system), ``replace=False`` keeps the folder that got there first (the
    writers make the same content: a prepared graph, a partition); ``replace=True`` puts
    this one in place (a checkpoint written again). ``tmp_name`` fixes the temporary name,
    so that several processes can fill one folder (a checkpoint's ranks).
    """

    def __init__(self, final: Path, replace: bool = False, tmp_name: str | None = None):
        self.final, self.replace = Path(final), replace
        self.tmp = self.final.parent / (tmp_name or f".{self.final.name}.tmp-{uuid.uuid4().hex[:8]}")

    def create(self) -> Path:
        self.final.parent.mkdir(parents=True, exist_ok=True)
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
