"""The kernels' C sources, and the hash that a library built from them answers (``hpcgnn_source_hash``).

Standard library only: setup.py loads this file by its path to build the kernels, before the package (and torch)
can be imported; :mod:`hpcgnn.kernels.build` imports it to build and check them.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

HERE = Path(__file__).parent
SOURCES = tuple(sorted(HERE.glob("*.c")))  # one concern each (see kernels.h), compiled together into one library
HEADERS = tuple(sorted(HERE.glob("*.h")))


def recorded_path(library: Path) -> Path:
    """Where a built library's SHA-256 is recorded: beside it (``<library>.sha256``)."""
    return Path(f"{library}.sha256")


def file_hash(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def record_hash(library: Path, built: Path | None = None) -> None:
    """Record a library's SHA-256 as its builder made it (``built``: the file about to become ``library``):
    checked before it is ever loaded (a library is run by loading it: its constructors run at dlopen). Written
    whole (renamed into place)."""
    path = recorded_path(library)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(file_hash(built or library) + "\n")
    os.replace(tmp, path)


def source_hash() -> str:
    """The first 16 hex digits of the SHA-256 of the sources' and the headers' names and bytes, in name order."""
    digest = hashlib.sha256()
    for path in sorted((*SOURCES, *HEADERS), key=lambda p: p.name):
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


_C_TYPES = {"int64_t": "int64", "int": "int", "void": "void", "const char *": "str"}  # (a pointer: "ptr")


def signatures(text: str | None = None) -> dict[str, tuple[str, tuple[str, ...]]]:
    """Each exported function the sources define (``hpcgnn_*``, ``text``: those sources' text, None: the files'),
    its result and its arguments' kinds (int64, int, ptr, void, str), read from its definition: the one
    declaration the ctypes calls are made from (:data:`hpcgnn.kernels.build.SIGNATURES`)."""
    import re

    if text is None:
        text = "\n".join(p.read_text() for p in SOURCES)
    out = {}
    for m in re.finditer(r"^(int64_t|void|int|const char \*) ?(hpcgnn_\w+)\(([^)]*)\)\s*\{", text, re.M):
        result, name, params = m.groups()
        args = []
        for p in " ".join(params.split()).split(","):
            p = p.strip()
            if p in ("void", ""):
                continue
            args.append("ptr" if "*" in p else _C_TYPES[p.rsplit(" ", 1)[0].replace("const ", "")])
        out[name] = (_C_TYPES[result], tuple(args))
    return out
