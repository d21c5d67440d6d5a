"""The C kernels' library as found and loaded: a planted, stale, lying, truncated or read-only-cached library is
never used, the sources' own is built or found, and the installed package carries its own.
(Checked before loading, by hash and owner: test_kernels_build.py.)
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from hpcgnn.kernels import binding

needs_cc = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler here to make the libraries")


def _cc(tmp_path, name: str, source: str, *flags: str) -> Path:
    """A shared library compiled from ``source`` (C text)."""
    c = tmp_path / f"{name}.c"
    c.write_text(source)
    out = tmp_path / f"{name}.so"
    subprocess.run(["cc", "-O1", "-shared", "-fPIC", "-pthread", *flags, str(c), "-o", str(out)], check=True)
    return out


def _unity() -> str:
    """C text that compiles every source of the kernels as one file."""
    from hpcgnn.kernels import sources

    return "".join(f'#include "{path}"\n' for path in sources.SOURCES)


def _lying(tmp_path) -> Path:
    """The kernels of this very source (the right hash) whose row gathers write zeros: only the self-test tells."""
    from hpcgnn.kernels import build

    return _cc(tmp_path, "lying", _unity() +
               "int64_t lying_gather(const void *s, int64_t r, int64_t b, const int64_t *i, int64_t n, void *o,\n"
               "                     const int64_t *a, int64_t c, int64_t *sc, int t, void *j) {\n"
               "    int64_t res = hpcgnn_gather_rows(s, r, b, i, n, o, a, c, sc, t, j);\n"
               "    memset(o, 0, (size_t)(n * b)); return res; }\n",
               f'-DHPCGNN_SOURCE_HASH="{build.source_hash()}"', "-Dhpcgnn_gather_rows=hidden_gather",
               "-Wl,--defsym=hpcgnn_gather_rows=lying_gather")


@pytest.fixture
def kernels_with(monkeypatch, tmp_path, caplog):
    """``kernels_with(packaged=PATH|None, cache=FOLDER, cc=NAME|None)``: (the kernels this process then loads, the
    warnings it logged), and checks that they (or torch ops) make the torch ops' batches."""
    from hpcgnn.config import dataset_config
    from hpcgnn.data import build_graph
    from hpcgnn.kernels import build
    from hpcgnn.sampling import CSRNeighborSampler

    graph = build_graph(dataset_config(num_nodes=2000, avg_degree=30, seed=1))

    def batch():
        out = CSRNeighborSampler(graph.rowptr, graph.col, (15, 5)).sample(torch.arange(0, 2000, 3),
                                                                         torch.Generator().manual_seed(2))
        return out.edge_index, out.n_id

    monkeypatch.setenv("HPCGNN_NATIVE", "0")
    binding.kernels.cache_clear()
    want = batch()

    def load(packaged=None, cache=None, cc=None):
        monkeypatch.setattr(build, "packaged", lambda: packaged)
        monkeypatch.setenv("HPCGNN_NATIVE_CACHE", str(cache or tmp_path / "cache"))
        monkeypatch.delenv("HPCGNN_NATIVE")
        if cc is not None:
            monkeypatch.setenv("CC", cc)
        binding.kernels.cache_clear()
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="hpcgnn"):
            lib = binding.kernels()
            got = batch()
        assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
        monkeypatch.setenv("HPCGNN_NATIVE", "0")
        return lib, [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]

    yield load
    binding.kernels.cache_clear()


@needs_cc
def test_a_library_planted_in_the_package_is_refused_and_the_sources_own_used(kernels_with, tmp_path):
    from hpcgnn.kernels import sources

    planted = _cc(tmp_path, "planted", "long hpcgnn_hop_plan(void) { return 0; }\n")
    sources.record_hash(planted)  # (planted with its hash: the symbols still tell)
    lib, said = kernels_with(packaged=planted)
    assert lib is not None and len(said) == 1, said
    assert re.search(rf"the installed library {planted} is not this source's \(it lacks (hpcgnn_\w+, )*hpcgnn_hop_fill, .*\): not "
                     r"used; using the ones built into the cache instead", said[0]), said


@needs_cc
@pytest.mark.parametrize("kind", ["stale", "lying", "truncated"])
def test_a_wrong_library_in_the_cache_is_never_used(kind, kernels_with, tmp_path):
    """At the cache's own path: one built from an older source, one of this source whose gathers write zeros (the
    'test accuracy 1.0000' case), one cut short (a full disk, a killed copy: SIGBUS when loaded): each is built
    again, with one warning naming it, and the batches are the torch ops'."""
    from hpcgnn.kernels import build

    cache = tmp_path / "cache"
    path = build.build(cache)
    good = path.read_bytes()
    bad = {"stale": lambda: _cc(tmp_path, "stale", _unity(), '-DHPCGNN_SOURCE_HASH="0123456789abcdef"')
           .read_bytes(), "lying": lambda: _lying(tmp_path).read_bytes(), "truncated": lambda: good[: len(good) // 2]}
    path.unlink()
    path.write_bytes(bad[kind]())
    if kind != "truncated":  # (with its hash recorded, as its builder would: what is inside still tells)
        build.sources.record_hash(path)
    lib, said = kernels_with(cache=cache)
    assert lib is not None and len(said) == 1, said
    why = {"stale": r"built from source 0123456789abcdef, not this one", "lying": r"its row gather does not copy the "
           r"rows torch copies \(self-test\)", "truncated": r"truncated: (its headers reach|a segment ends)"}[kind]
    assert str(path) in said[0] and re.search(why, said[0]), said
    assert build.load(path) is not None  # the one built in its place


@needs_cc
def test_a_cut_short_library_without_a_compiler_ends_on_torch_ops_with_one_warning(kernels_with, tmp_path):
    from hpcgnn.kernels import build

    cache = tmp_path / "cache"
    path = build.build(cache)
    data = path.read_bytes()
    path.unlink()
    path.write_bytes(data[: len(data) // 3])
    lib, said = kernels_with(cache=cache, cc="no-such-cc")
    assert lib is None and len(said) == 1, said
    assert f"{path} is not this source's (truncated" in said[0] and "no C compiler 'no-such-cc'" in said[0]


@needs_cc
def test_without_a_compiler_a_library_built_here_before_is_used(kernels_with, tmp_path):
    from hpcgnn.kernels import build

    cache = tmp_path / "cache"
    path = build.build(cache)
    lib, said = kernels_with(cache=cache, cc="no-such-cc")
    assert lib is not None and said == [] and lib._name == str(path)
    # ... but not one built for a CPU feature this CPU lacks (a wrapper's -march): it would die of SIGILL
    meta = json.loads(path.with_suffix(".json").read_text())
    path.with_suffix(".json").write_text(json.dumps({**meta, "isa": ["sve"]}))
    lib, said = kernels_with(cache=cache, cc="no-such-cc")
    assert lib is None and len(said) == 1 and "no C compiler 'no-such-cc' on PATH" in said[0], said


@needs_cc
def test_a_cache_folder_others_may_write_is_refused(kernels_with, tmp_path):
    cache = tmp_path / "shared-cache"
    cache.mkdir()
    cache.chmod(0o777)
    lib, said = kernels_with(cache=cache)
    assert lib is None and len(said) == 1, said
    assert re.search(rf"the cache folder {cache} is refused: others may write it \(mode 0777\).* HINT: "
                     rf"chmod go-w {cache}, or set HPCGNN_NATIVE_CACHE to a folder of your own", said[0]), said
    assert list(cache.iterdir()) == []  # nothing built there
    if os.getuid() == 0:  # (another user's cache, mode 0755: the reason is its owner, not its mode)
        cache.chmod(0o755)
        os.chown(cache, 65534, 65534)
        lib, said = kernels_with(cache=cache)
        assert lib is None and re.search(rf"the cache folder {cache} is refused: it belongs to another user \(uid "
                                          r"65534\), who could plant a library there\. HINT: set HPCGNN_NATIVE_CACHE",
                                          said[0]) and "others may write" not in said[0], said


def test_the_installed_package_carries_the_kernels_of_its_own_source():
    """An editable install (make setup) and a wheel build the kernels at install time (setup.py): the one beside the
    source loads and answers this source's hash."""
    from hpcgnn.kernels import build

    path = build.packaged()
    if shutil.which("cc") is None:
        pytest.skip("installed without a compiler: no library in the package")
    assert path is not None, "pip install -e . should have built hpcgnn/kernels/_kernels*.so (setup.py)"
    assert build.load(path).hpcgnn_source_hash().decode() == build.source_hash()



@needs_cc
def test_a_cache_folder_that_cannot_be_written_says_so_and_a_library_built_there_still_loads(kernels_with, tmp_path):
    """A read-only cache (a project space mounted read-only on compute nodes): nothing can be built there, and the
    warning names the folder and HPCGNN_NATIVE_CACHE, not a compiler; a library built there before still loads."""
    from hpcgnn.kernels import build

    cache = tmp_path / "ro"
    cache.mkdir(mode=0o700)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m,mode=0700", "tmpfs", str(cache)],
                             capture_output=True, text=True)
    if mounted.returncode:
        pytest.skip(f"cannot mount a file system here to make read-only: {mounted.stderr.strip()}")
    try:
        subprocess.run(["mount", "-o", "remount,ro", str(cache)], check=True)
        lib, said = kernels_with(cache=cache)
        assert lib is None and len(said) == 1, said
        assert f"the cache folder {cache} cannot be written (Read-only file system)" in said[0]
        assert "Set HPCGNN_NATIVE_CACHE to a folder of your own" in said[0] and "C compiler is" not in said[0]
        subprocess.run(["mount", "-o", "remount,rw", str(cache)], check=True)
        path = build.build(cache)
        subprocess.run(["mount", "-o", "remount,ro", str(cache)], check=True)
        lib, said = kernels_with(cache=cache)
        assert lib is not None and lib._name == str(path) and said == []
    finally:
        subprocess.run(["umount", "-l", str(cache)], capture_output=True)  # (lazily: this process maps a library there)
