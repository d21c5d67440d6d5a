"""A batch's global -> batch-local ids in a hash table of the C kernels: a partitioned rank's id map."""

from __future__ import annotations

import torch
from torch import Tensor

from hpcgnn.kernels.binding import kernels, ptr
from hpcgnn.kernels.scheduler import chunks_for, threads


class HashTable:
    """A batch's global -> batch-local ids in a hash table of the C kernels (open addressing): memory in
    proportion to the batch (a partitioned rank's map, where an array over every id would be the graph's
    size), a lookup in a probe or two. Grown before each insert to at least twice the ids it may hold."""

    MIN_CAPACITY = 1 << 12

    def __init__(self):
        self.keys = torch.full((self.MIN_CAPACITY,), -1, dtype=torch.long)
        self.values = torch.empty(self.MIN_CAPACITY, dtype=torch.long)
        self.count = 0  # ids held

    def __len__(self) -> int:
        return self.count

    @property
    def capacity(self) -> int:
        return self.keys.numel()

    def reserve(self, more: int) -> None:
        """Room for ``more`` ids beside those held, the table at most half full."""
        need = 2 * (self.count + more)
        if need <= self.capacity:
            return
        held = self.keys >= 0
        ids, values = self.keys[held], self.values[held]
        capacity = 1 << (need - 1).bit_length()
        self.keys = torch.full((capacity,), -1, dtype=torch.long)
        self.values = torch.empty(capacity, dtype=torch.long)
        self.count = 0
        self.put(ids, values)

    def _insert(self, ids: Tensor, values: Tensor | None, found: Tensor | None, count: int) -> int:
        ids = ids.long().contiguous()
        chunks = chunks_for(ids.numel())
        scratch = torch.empty(chunks, dtype=torch.long)
        out = kernels().hpcgnn_hash_insert(ptr(self.keys), ptr(self.values), self.capacity, ptr(ids),
                                           ptr(values) if values is not None else None, ids.numel(),
                                           ptr(found) if found is not None else None, count, chunks, ptr(scratch),
                                           threads())
        if out < 0:
            raise IndexError(f"id {int(ids[-1 - out])} is not a node id (ids are 0 or more)")
        return out

    def put(self, ids: Tensor, values: Tensor) -> None:
        """Add ``ids`` (distinct, not held yet) as ``values``."""
        self.reserve(ids.numel())
        try:
            self.count += self._insert(ids, values.long().contiguous(), None, 0)
        except IndexError:
            self.clear()  # some ids went in, uncounted: the map is unusable until cleared
            raise

    def get(self, ids: Tensor) -> Tensor:
        """The values of ``ids``, -1 where an id is not held."""
        ids = ids.long().contiguous()
        out = torch.empty_like(ids)
        kernels().hpcgnn_hash_get(ptr(self.keys), ptr(self.values), self.capacity, ptr(ids), ids.numel(), ptr(out),
                                  chunks_for(ids.numel()), threads())
        return out

    def add_new(self, candidates: list[Tensor], total: int) -> Tensor:
        """The distinct candidates not held, sorted, added as ``total``, ``total + 1``, ..."""
        n = sum(c.numel() for c in candidates)
        self.reserve(n)
        found, count = torch.empty(n, dtype=torch.long), 0
        try:
            for c in candidates:
                count = self._insert(c, None, found, count)
        except IndexError:
            self.clear()  # ids inserted with no value yet: the map is unusable until cleared
            raise
        kernels().hpcgnn_hash_number(ptr(self.keys), ptr(self.values), self.capacity, ptr(found), count, total,
                                     chunks_for(count), threads())
        self.count += count
        return found[:count]

    def clear(self, ids: Tensor | None = None) -> None:
        """Forget every id (``ids``, those put since the last clear, are not needed: one fill)."""
        self.keys.fill_(-1)
        self.count = 0

