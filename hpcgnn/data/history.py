"""Each node's past partners: the graph's timed edges by source, in time, for historical negatives (TGB's).

A temporal link task ranks each positive ``src -> dst`` at time t against negatives. Random destinations are easy to
tell apart; TGB adds *historical* ones: destinations the source met before t (an edge ``src -> d`` earlier than t), not
``dst``, which a model that only remembers who met whom cannot tell from the positive. :class:`History` holds every
edge of the timed graph (a reverse too, where the graph holds it) by source, sorted by time: a source's partners before
t are a prefix of its range, found by the timeline's own binary search (:func:`hpcgnn.kernels.ops.time_bounds`) and
drawn from, distinct and uniform, by the hop kernel every sampler uses (its torch twin on a machine without it: the same
draws). :func:`mixed_negatives` is TGB's mix: half historical (where the source has met enough), the rest random
among the nodes some edge reaches.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from hpcgnn.data.graph import Graph
from hpcgnn.data.times import time_order
from hpcgnn.kernels import binding, ops, twins

ARRAYS = ("history_start", "history_dst", "history_time", "history_ends")


@dataclass(frozen=True)
class History:
    start: Tensor  # int64 [N + 1]: each source's range of edges
    dst: Tensor  # int64 [E]: their destinations, by source, then by time
    time: Tensor  # [E] their times (the timeline's dtype), sorted within each source
    ends: Tensor  # int64 [M]: every node some edge reaches (random negatives are drawn among them)

    @classmethod
    def of_graph(cls, g: Graph) -> History:
        """The history of a timed graph ``g``: each of its edges (its timeline's) ``col -> row`` at its time."""
        tl, n = g.timeline, g.num_nodes
        dst = torch.repeat_interleave(torch.arange(n), g.degree())
        src = tl.col.long()
        order = time_order(src, tl.time)
        start = torch.zeros(n + 1, dtype=torch.long)
        start[1:] = torch.cumsum(torch.bincount(src, minlength=n), 0)
        ends = torch.nonzero(g.degree() > 0).squeeze(1)
        return cls(start, dst.index_select(0, order), tl.time.index_select(0, order).contiguous(), ends)

    def arrays(self) -> dict[str, Tensor]:
        return dict(zip(ARRAYS, (self.start, self.dst, self.time, self.ends), strict=True))

    @classmethod
    def from_arrays(cls, arrays: dict[str, Tensor]) -> History:
        return cls(*(arrays[name] for name in ARRAYS))

    def met(self, src: Tensor, at: Tensor, k: int, generator: torch.Generator | None,
            exclude: Tensor | None = None) -> Tensor:
        """int64 [B, k]: up to ``k`` distinct edges' destinations each ``src`` met strictly before its time ``at``,
        uniformly drawn, none equal to its ``exclude`` (the positive's own destination); -1 where it met fewer."""
        b = src.numel()
        out = torch.full((b, k), -1, dtype=torch.long)
        if b == 0 or k == 0:
            return out
        bounds = ops.time_bounds(self.start, self.time, src.long(), at.to(self.time.dtype), strict=True)
        rows = torch.arange(0, 2 * b, 2)
        draw = k + (exclude is not None)  # (one more: the positive's destination may be among them)
        if binding.usable(bounds, self.dst, rows):
            row, nbr = ops.sample_neighbors(bounds, self.dst, rows, draw, generator)
        else:
            row, nbr = twins.hop(bounds, self.dst, rows, draw, generator)
        if exclude is not None:
            keep = nbr != exclude.index_select(0, row)
            row, nbr = row[keep], nbr[keep]
        counts = torch.bincount(row, minlength=b)
        place = torch.arange(row.numel()) - (torch.cumsum(counts, 0) - counts).index_select(0, row)
        fits = place < k
        out[row[fits], place[fits]] = nbr[fits]
        return out

    def random(self, shape: tuple[int, int], generator: torch.Generator | None, exclude: Tensor,
               rounds: int = 8) -> Tensor:
        """int64 ``shape``: nodes some edge reaches, uniformly, each row's redrawn (a few rounds) where it is its
        ``exclude`` (the positive's destination)."""
        pool = self.ends if self.ends.numel() else torch.arange(self.start.numel() - 1)
        out = pool.index_select(0, torch.randint(pool.numel(), shape, generator=generator).reshape(-1)).reshape(shape)
        for _ in range(rounds):
            bad = out == exclude.unsqueeze(1)
            if not bool(bad.any()):
                break
            out[bad] = pool.index_select(0, torch.randint(pool.numel(), (int(bad.sum()),), generator=generator))
        return out


def mixed_negatives(history: History, src: Tensor, dst: Tensor, at: Tensor, k: int,
                    generator: torch.Generator | None) -> Tensor:
    """int64 [B, k]: TGB's negatives of positives ``src -> dst`` at ``at``: ``k // 2`` destinations each source met
    before (historical, :meth:`History.met`; fewer where it met fewer), the rest random (:meth:`History.random`)."""
    hist = history.met(src, at, k // 2, generator, exclude=dst)
    rand = history.random((src.numel(), k), generator, dst)
    out = torch.cat([hist, rand[:, :k - k // 2]], 1)
    missing = out < 0  # (a source that met fewer: random ones in their place)
    out[missing] = rand[:, k - k // 2:][missing[:, :k // 2]] if k // 2 else out[missing]
    return out
