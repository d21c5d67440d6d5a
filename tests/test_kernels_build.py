"""The C kernels' library is checked before it is loaded: its SHA-256 against the one its builder
recorded, its owner and mode; and, once loaded, a self-test that a hop draws what its torch twin draws.

(As found and loaded: a planted, stale, lying or truncated library, test_kernels_load.py.)
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

needs_cc = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler here to make the libraries")


def _compile(tmp_path: Path, name: str, sources: list[Path], *flags: str) -> Path:
    out = tmp_path / f"{name}.so"
    subprocess.run(["cc", "-O1", "-shared", "-fPIC", "-pthread", *flags, *map(str, sources), "-o", str(out)],
                   check=True)
    return out


@needs_cc
def test_a_library_whose_recorded_hash_differs_is_never_loaded(tmp_path):
    """Loading a library runs its constructors: the check comes first, so its marker is never written."""
    from hpcgnn.kernels import build, sources

    marker = tmp_path / "constructor-ran"
    c = tmp_path / "planted.c"
    c.write_text(f'#include <stdio.h>\n__attribute__((constructor)) static void run(void) {{\n'
                 f'    FILE *f = fopen("{marker}", "w"); if (f) fclose(f); }}\nlong hpcgnn_hop_plan(void) {{ return 0; }}\n')
    lib = _compile(tmp_path, "planted", [c])
    sources.recorded_path(lib).write_text("0" * 64 + "\n")
    with pytest.raises(build.Rejected, match=r"its SHA-256 is not the one recorded when it was built"):
        build.load(lib)
    sources.recorded_path(lib).unlink()
    with pytest.raises(build.Rejected, match=r"no SHA-256 recorded beside it \(planted.so.sha256: it was not built by "
                                             r"hpcgnn's builder\)"):
        build.load(lib)
    sources.record_hash(lib)
    lib.chmod(0o777)
    with pytest.raises(build.Rejected, match=r"it can be written by others \(mode 0777\)"):
        build.load(lib)
    assert not marker.exists()
    lib.chmod(0o755)
    with pytest.raises(build.Rejected, match="it lacks"):  # (recorded and private: now it loads, and is refused)
        build.load(lib)
    assert marker.exists()  # (the marker can be written: it was the check that kept it from running)


@needs_cc
def test_a_library_of_this_source_whose_hops_draw_differently_fails_the_self_test(tmp_path):
    """This source's hash, its record, every symbol, gathers that copy the right rows, a hop that takes every
    neighbour where it draws none: only a hop that draws tells (before: test accuracy 0.549 against 0.550)."""
    from hpcgnn.kernels import build, sources

    copy = tmp_path / "src"
    copy.mkdir()
    for path in (*sources.SOURCES, *sources.HEADERS):
        text = path.read_text()
        if path.name == "hops.c":
            drawn = "* (double)(top + 1));"
            assert drawn in text
            text = text.replace(drawn, "* (double)(top));")  # (never draws the last candidate at a step)
        (copy / path.name).write_text(text)
    lib = _compile(tmp_path, "drifting", sorted(copy.glob("*.c")), "-std=gnu11",
                   f'-DHPCGNN_SOURCE_HASH="{build.source_hash()}"')
    sources.record_hash(lib)
    with pytest.raises(build.Rejected, match=r"its hop does not draw the neighbours \(and edges\) the torch twin draws "
                                             r"from the same key \(self-test\)"):
        build.load(lib)
    honest = _compile(tmp_path, "honest", list(sources.SOURCES), "-std=gnu11",
                      f'-DHPCGNN_SOURCE_HASH="{build.source_hash()}"')
    sources.record_hash(honest)
    assert build.load(honest).hpcgnn_source_hash().decode() == build.source_hash()
