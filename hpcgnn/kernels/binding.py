"""The kernels of the C kernels loaded through ctypes, checked before anything calls them (:mod:`hpcgnn.kernels.build`),
or None where none is usable (``HPCGNN_NATIVE=0``, no C compiler): every caller then runs its torch twin."""

from __future__ import annotations

import ctypes
import functools

from torch import Tensor

from hpcgnn import env


@functools.lru_cache(maxsize=1)
def kernels() -> ctypes.CDLL | None:
    """The loaded kernels, checked (:func:`hpcgnn.kernels.build.find`), or None (``HPCGNN_NATIVE=0``, or none
    here is usable: logged once, with the fix)."""
    if env.read("native") == "0":
        return None
    from hpcgnn.kernels.build import find

    return find()


def usable(*tensors: Tensor) -> bool:
    """Whether the kernels can run on these tensors (host memory) and are available."""
    return all(t.device.type == "cpu" for t in tensors) and kernels() is not None


def ptr(t: Tensor) -> int:
    return t.data_ptr()

