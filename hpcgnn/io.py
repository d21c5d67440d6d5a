"""Small file helpers shared by the run folder, checkpoints, partitions and sweeps."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path


def write_json(path: Path, data: dict) -> Path:
    """Write ``path`` atomically (temporary file, fsync, rename): readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    with open(tmp, "w") as f:
        json.dump(data, f, indent=2)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()
