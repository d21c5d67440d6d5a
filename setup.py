"""Builds hpcgnn's C sampling kernels into the package at install time (``pip install .``, ``pip install -e .``, a
wheel): a plain C extension of ``hpcgnn/sampling/kernels/*.c``, with no Python or torch header, loaded through ctypes
(hpcgnn/sampling/kernels/build.py), so a compute node needs no compiler. Where no compiler is, hpcgnn installs without it
and builds the kernels on first use, or samples on torch ops (the same batches, slower).

Everything else about the package is in pyproject.toml.
"""

import hashlib
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

KERNELS = Path(__file__).parent / "hpcgnn" / "sampling" / "kernels"
SOURCES = sorted(KERNELS.glob("*.c"))
# What the library answers from hpcgnn_source_hash(): it is used only where this matches the installed sources (the
# sources' and the header's names and bytes, in name order, as hpcgnn.sampling.kernels.build.hash_sources hashes them).
_digest = hashlib.sha256()
for _path in sorted([*SOURCES, *KERNELS.glob("*.h")], key=lambda p: p.name):
    _digest.update(_path.name.encode() + b"\0" + _path.read_bytes() + b"\0")
SOURCE_HASH = _digest.hexdigest()[:16]


class OptionalKernels(build_ext):
    """The kernels' build, retried without F16C's intrinsics (an older compiler does not know them); a build that
    still fails is a warning (``optional``): the package installs, and the kernels are built on first use."""

    def build_extension(self, ext):
        try:
            super().build_extension(ext)
        except Exception:  # (a compiler error of any kind: retry once without F16C)
            ext.define_macros = [*ext.define_macros, ("HPCGNN_NO_F16C", None)]
            super().build_extension(ext)


setup(
    ext_modules=[Extension(
        "hpcgnn.sampling.kernels._kernels", sources=[str(p.relative_to(Path(__file__).parent)) for p in SOURCES],
        depends=[str(p.relative_to(Path(__file__).parent)) for p in KERNELS.glob("*.h")], optional=True,
        define_macros=[("HPCGNN_SOURCE_HASH", f'"{SOURCE_HASH}"')],
        extra_compile_args=["-O3", "-std=gnu11", "-pthread"], extra_link_args=["-pthread"],
    )],
    cmdclass={"build_ext": OptionalKernels},
)
