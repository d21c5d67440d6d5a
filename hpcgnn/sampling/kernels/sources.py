"""The kernels' C sources, and the hash that a library built from them answers (``hpcgnn_source_hash``).

Standard library only: setup.py loads this file by its path to build the kernels, before the package (and torch)
can be imported; :mod:`hpcgnn.sampling.kernels.build` imports it to build and check them.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

HERE = Path(__file__).parent
SOURCES = tuple(sorted(HERE.glob("*.c")))  # one concern each (see kernels.h), compiled together into one library
HEADERS = tuple(sorted(HERE.glob("*.h")))


def source_hash() -> str:
    """The first 16 hex digits of the SHA-256 of the sources' and the headers' names and bytes, in name order."""
    digest = hashlib.sha256()
    for path in sorted((*SOURCES, *HEADERS), key=lambda p: p.name):
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]
