"""Small file helpers shared by the run folder, checkpoints, partitions and sweeps."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
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
