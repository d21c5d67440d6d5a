"""Randomness: one seed-derivation scheme for every generator, and the process RNG states.

Every generator hpcgnn makes is seeded with ``derive_seed(train.seed, <purpose>, ...)``:
a hash of the parts, so streams for different purposes, epochs, ranks and steps never
overlap, are the same on every machine and in every run, and any one of them can be
re-made without the others (an exact resume re-makes batch i of epoch e from its seed).
"""

from __future__ import annotations

import hashlib
import random

import numpy as np
import torch


def derive_seed(*parts: object) -> int:
    """A 63-bit seed from ``parts`` (ints and short strings), stable across processes and runs."""
    digest = hashlib.sha256(repr(parts).encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def generator(*parts: object, device: torch.device | str | None = None) -> torch.Generator:
    """A torch generator on ``device`` seeded with ``derive_seed(*parts)``."""
    return torch.Generator(device=device or "cpu").manual_seed(derive_seed(*parts))


def rng_state() -> dict:
    """The process's global RNG states (torch, CUDA, numpy, python), as plain containers and tensors."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    state = {"torch": torch.get_rng_state(), "python": random.getstate(),
             "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                       "has_gauss": int(has_gauss), "gauss": float(gauss)}}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    n = state["numpy"]
    np.random.set_state((n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# Counter-based uniform numbers: SplitMix64 (Steele, Lea and Flood, 2014) of a key and an index, so that any piece
# of a block can be made on its own, in any order, by any thread (hpcgnn/kernels/hops.c makes each number as it
# uses it) and comes out the same as torch's whole block here; the link split hashes edges with the same mix. The
# constants as int64 (torch's int64 products wrap, as C's uint64 ones do).
GAMMA, _MIX1, _MIX2 = (c - 2**64 for c in (0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB))


def shift_right(z: torch.Tensor, s: int) -> torch.Tensor:
    """Logical right shift of int64's bits (torch's ``>>`` keeps the sign)."""
    return (z >> s) & ((1 << (64 - s)) - 1)


def _finalise(z: torch.Tensor) -> torch.Tensor:
    z = (z ^ shift_right(z, 30)).mul_(_MIX1)
    z = (z ^ shift_right(z, 27)).mul_(_MIX2)
    return z ^ shift_right(z, 31)


def mix64(x: torch.Tensor) -> torch.Tensor:
    """SplitMix64's output for state ``x`` (int64, elementwise): a counter-based hash, so a value drawn for an item
    depends on the item and the seed alone, not on how the items were cut into chunks."""
    return _finalise(x + GAMMA)


def draw_key(generator: torch.Generator | None, device: torch.device) -> torch.Tensor:
    """One draw's key for :func:`counter_uniform`: 62 random bits from a batch's generator (a 0-d tensor on
    ``device``: no wait for a GPU)."""
    return torch.randint(0, 2**62, (), generator=generator, device=device)


def counter_uniform(key: torch.Tensor | int, count: int, device: torch.device | None = None) -> torch.Tensor:
    """``count`` float64 numbers uniform in [0, 1): the i-th is SplitMix64's output for state key + (i + 1) * gamma,
    its top 53 bits over 2 ** 53."""
    z = _finalise(torch.arange(1, count + 1, dtype=torch.long, device=device).mul_(GAMMA).add_(key))
    return shift_right(z, 11).double().mul_(2.0**-53)
