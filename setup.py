"""Builds hpcgnn's C sampling kernels into the package at install time (``pip install .``, ``pip install -e .``, a
wheel): a plain C extension of ``hpcgnn/kernels/*.c``, with no Python or torch header, loaded through ctypes
(hpcgnn/kernels/build.py), so a compute node needs no compiler. Where no compiler is, hpcgnn installs without it
and builds the kernels on first use, or samples on torch ops (the same batches, slower).

Everything else about the package is in pyproject.toml.
"""

import importlib.util
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
# The sources and their hash, as the package computes them (kernels/sources.py, read by its path: neither the
# package nor torch can be imported yet). The library answers the hash from hpcgnn_source_hash(); it is used only
# where that matches the installed sources.
_spec = importlib.util.spec_from_file_location("_hpcgnn_kernel_sources", ROOT / "hpcgnn/kernels/sources.py")
kernels = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(kernels)
SOURCE_HASH = kernels.source_hash()


class OptionalKernels(build_ext):
    """The kernels' build, retried without F16C's intrinsics (an older compiler does not know them); a build that
    still fails is a warning (``optional``): the package installs, and the kernels are built on first use."""

    def build_extension(self, ext):
        try:
            super().build_extension(ext)
        except Exception:  # (a compiler error of any kind: retry once without F16C)
            ext.define_macros = [*ext.define_macros, ("HPCGNN_NO_F16C", None)]
            super().build_extension(ext)
        # its SHA-256 beside it, in the package: the library is checked against it before it is loaded
        built = Path(self.get_ext_fullpath(ext.name))
        if built.is_file():
            kernels.record_hash(built)

    def copy_extensions_to_source(self):
        """An editable install's library, copied beside the sources, with its record."""
        super().copy_extensions_to_source()
        build_py = self.get_finalized_command("build_py")
        for ext in self.extensions:
            inplace, _ = self._get_inplace_equivalent(build_py, ext)
            if Path(inplace).is_file():
                kernels.record_hash(Path(inplace))


setup(
    ext_modules=[Extension(
        "hpcgnn.kernels._kernels", sources=[str(p.relative_to(ROOT)) for p in kernels.SOURCES],
        depends=[str(p.relative_to(ROOT)) for p in kernels.HEADERS], optional=True,
        define_macros=[("HPCGNN_SOURCE_HASH", f'"{SOURCE_HASH}"')],
        extra_compile_args=["-O3", "-std=gnu11", "-pthread"], extra_link_args=["-pthread"],
    )],
    cmdclass={"build_ext": OptionalKernels},
)
