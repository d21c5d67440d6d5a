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
