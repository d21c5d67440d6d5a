"""Link batches: edge seeds, negatives, and the subgraph around every endpoint.

A training step's items are ids of positive edges. :class:`LinkSampler` draws each positive's
negatives (corrupting the target), samples the neighbourhood of every endpoint with a node
sampler (replicated or across parts), and leaves the step's target edges and their reverse
out of the sampled message passing, so the model cannot read the answer. The batch's seeds
(its first ``batch_size`` nodes) are the distinct endpoints; the targets say which pairs of
them to score:

- ``form="binary"``: ``edge_label_index`` [2, P] (local ids; positives first), ``edge_label`` [P]
  (1 or 0) and ``edge_label_weight`` [P] (0 for a padded negative);
- ``form="triplet"``: ``src_index`` [B], ``dst_pos_index`` [B], ``dst_neg_index`` [B, k] and
  ``neg_weight`` [B, k].

Negatives (``task.negatives``): ``uniform`` (any node), ``strict`` (no edge between the source
and the negative in either direction: redrawn up to ``task.neg_retries`` times, then padding,
counted in ``padded``), ``in_batch`` (the targets of the batch's other positives), ``historical`` (a timed graph's:
TGB's mix, half destinations the source met before the positive's time; :func:`hpcgnn.data.history.mixed_negatives`).
All draws use the step's own generator, so a step is the same whenever it is made (an exact resume).

A timed graph's positives each have a time (``times``): every end of a step's pairs, the negatives too, is a seed of
its own, sampled strictly before its positive's time (a tree per seed: :class:`hpcgnn.sampling.temporal.TemporalSampler`
made ``strict``), so no edge of the step's targets or after them is seen, and nothing needs leaving out.

:class:`PairSampler` makes evaluation batches: given pairs to score, no negatives, nothing left out.
:class:`EdgeTargetSampler` makes an edge task's batches (``task=edge``): labelled pairs, no negatives.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import torch
from torch import Tensor

from hpcgnn.data.graph import HasEdge
from hpcgnn.data.history import History, mixed_negatives
from hpcgnn.sampling.neighbor import SampledSubgraph


def _local(seeds: Tensor, ids: Tensor) -> Tensor:
    """Positions of ``ids`` among the sorted distinct ``seeds``."""
    return torch.searchsorted(seeds, ids)


def _without_targets(out: SampledSubgraph, pairs: Tensor, absent_in_degree: Tensor) -> SampledSubgraph:
    """``out`` without its edges that join a target pair (local ids [2, B]), in either direction, and with the
    graph's in-edges of each local node that the pairs take away (``absent_in_degree``, sampled or not)."""
    out = replace(out, absent_in_degree=absent_in_degree)
    b = out.batch_size  # the pairs join seeds, the first b local nodes: only edges between seeds can be targets
    src, dst = out.edge_index
    among = torch.logical_and(src < b, dst < b).nonzero().squeeze(1)  # a few thousand of ~2M edges
    targets = torch.cat([pairs[0] * b + pairs[1], pairs[1] * b + pairs[0]])
    drop = among[torch.isin(src.index_select(0, among) * b + dst.index_select(0, among), targets)]
    if drop.numel() == 0:
        return out
    keep = torch.ones(src.numel(), dtype=torch.bool, device=src.device)
    keep[drop] = False
    num_edges = None
    if out.num_sampled_edges is not None:  # per-hop counts of what is kept, for trim_to_layer
        per_hop = torch.tensor(out.num_sampled_edges)
        hop = torch.searchsorted(per_hop.cumsum(0), drop.cpu(), right=True)
        num_edges = tuple((per_hop - torch.bincount(hop, minlength=per_hop.numel())).tolist())
    return replace(out, edge_index=out.edge_index[:, keep], num_sampled_edges=num_edges,
                   e_id=out.e_id[keep] if out.e_id is not None else None)


class LinkSampler:
    """Training batches of positive edges (by id), their negatives and their endpoints' neighbourhoods."""

    def __init__(self, node_sampler, edges: Tensor, num_nodes: int, negatives: str = "uniform",
                 num_negatives: int = 1, retries: int = 3, form: str = "binary", has_edge: HasEdge | None = None,
                 drop_targets: bool = True, times: Tensor | None = None, history: History | None = None):
        self.node_sampler, self.edges, self.num_nodes = node_sampler, edges, num_nodes
        self.drop_targets = drop_targets and times is None  # (a timed step samples before its targets' times)
        self.negatives, self.k, self.retries, self.form = negatives, num_negatives, retries, form
        self.has_edge, self.times, self.history = has_edge, times, history
        if (negatives == "strict" or self.drop_targets) and has_edge is None:
            raise ValueError("strict negatives and dropped targets need the graph's edge membership (has_edge)")
        if negatives == "historical" and (history is None or times is None):
            raise ValueError("historical negatives need the positives' times and the graph's history")

    @property
    def device(self) -> torch.device:  # (hpcgnn.sampling.protocol)
        return self.node_sampler.device

    def draw_negatives(self, src: Tensor, dst: Tensor, gen: torch.Generator | None) -> tuple[Tensor, Tensor]:
        """``[B, k]`` negative targets and their weights (0: padding) for positives ``src -> dst``."""
        b, k = src.numel(), self.k
        if self.negatives == "in_batch":  # positive i takes the targets of positives i+1 .. i+k (wrapping)
            shift = torch.arange(1, k + 1, device=src.device)
            idx = (torch.arange(b, device=src.device).unsqueeze(1) + shift) % max(b, 1)
            neg = dst.index_select(0, idx.reshape(-1)).reshape(b, k)
            return neg, (shift < b).float().expand(b, k).contiguous()  # a batch of b has b - 1 others
        neg = torch.randint(self.num_nodes, (b, k), generator=gen, device=src.device)
        weight = torch.ones(b, k)
        if self.negatives == "strict":
            s = src.unsqueeze(1).expand(b, k).reshape(-1)
            flat = neg.reshape(-1)
            for attempt in range(self.retries + 1):
                bad = (flat == s) | self.has_edge(s, flat) | self.has_edge(flat, s)
                if attempt == self.retries or not bool(bad.any()):
                    break
                flat[bad] = torch.randint(self.num_nodes, (int(bad.sum()),), generator=gen, device=src.device)
            weight = (~bad).float().reshape(b, k)
            neg = flat.reshape(b, k)
        return neg, weight

    def sample(self, items: Tensor, generator: torch.Generator | None = None) -> SampledSubgraph:
        items = items.long()
        edges = self.edges[:, items]
        src, dst = edges[0], edges[1]
        if self.times is not None:
            return self._sample_timed(items, src, dst, generator)
        neg, neg_weight = self.draw_negatives(src, dst, generator)
        seeds = torch.unique(torch.cat([src, dst, neg.reshape(-1)]))
        out = self.node_sampler.sample(seeds, generator)
        s, d, n = _local(seeds, src), _local(seeds, dst), _local(seeds, neg)
        if self.drop_targets:  # the positive src -> dst is an edge of the graph; its reverse may be
            reverse = self.has_edge(dst, src).long()
            absent = torch.bincount(d, minlength=seeds.numel()) + torch.bincount(s, weights=reverse.double(),
                                                                                  minlength=seeds.numel()).long()
            absent = torch.cat([absent, absent.new_zeros(out.n_id.numel() - seeds.numel())])
            out = _without_targets(out, torch.stack([s, d]), absent)
        return replace(out, targets=self._targets(s, d, n, neg_weight))

    def _sample_timed(self, items: Tensor, src: Tensor, dst: Tensor, generator: torch.Generator | None):
        """A timed step: each end of each pair (sources, destinations, negatives) a seed of its own, as of its
        positive's time."""
        t, b, k = self.times.index_select(0, items), src.numel(), self.k
        if self.negatives == "historical":
            neg = mixed_negatives(self.history, src, dst, t, k, generator)
            neg_weight = torch.ones(b, k)
        else:
            neg, neg_weight = self.draw_negatives(src, dst, generator)
        seeds = torch.cat([src, dst, neg.reshape(-1)])
        out = self.node_sampler.sample(seeds, generator, torch.cat([t, t, t.repeat_interleave(k)]))
        local = torch.arange(seeds.numel())
        return replace(out, targets=self._targets(local[:b], local[b:2 * b], local[2 * b:].reshape(b, k), neg_weight))

    def _targets(self, s: Tensor, d: Tensor, n: Tensor, neg_weight: Tensor) -> dict:
        """A step's pairs to score (local ids of its sources ``s``, destinations ``d`` and negatives ``n`` [B, k]),
        in ``form``'s shape."""
        b, k = s.numel(), self.k
        if self.form == "triplet":
            return {"src_index": s, "dst_pos_index": d, "dst_neg_index": n, "neg_weight": neg_weight,
                    "padded": int((neg_weight == 0).sum()), "positives": b}
        index = torch.cat([torch.stack([s, d]), torch.stack([s.repeat_interleave(k), n.reshape(-1)])], 1)
        return {"edge_label_index": index,
                "edge_label": torch.cat([torch.ones(b), torch.zeros(b * k)]),
                "edge_label_weight": torch.cat([torch.ones(b), neg_weight.reshape(-1)]),
                "padded": int((neg_weight == 0).sum()), "positives": b}


class EdgeTargetSampler:
    """Batches of an edge task's targets (by id; ``targets``: :class:`hpcgnn.data.edges.EdgeTargets`): the
    neighbourhood of both ends of each (targets with times, around a temporal ``node_sampler``: each end a tree of
    its own sampled strictly before its target's time), the targets' labels, and (``drop_targets``) the batch's
    target pairs left out of its message passing in either direction, so that no label leaks through its own edge
    (the graph's edges they take away from each end's in-degree: the targets' ``place`` and ``reverse``). The pairs
    to score are ``edge_label_index`` [2, B] (local ids of the batch's seeds) and their labels
    ``edge_label``; ``positives``: B, the step's targets. ``pair_ids(items)``: the targets' own edges' ids where
    their features are (-1: a pair that is no edge), where the decoder reads them: then ``edge_label_e_id`` [B]
    (the loader gathers them), or, where the targets keep their own apart (``targets.own``: parallel edges, one
    in the graph), ``edge_label_attr`` [B, D] itself."""

    def __init__(self, node_sampler, targets, drop_targets: bool = True,
                 pair_ids: Callable[[Tensor], Tensor] | None = None):
        self.node_sampler, self.targets, self.pair_ids = node_sampler, targets, pair_ids
        # a timed graph's targets, each asked at its time: both ends sampled strictly before it (nothing to leave out)
        self.times = targets.time if getattr(node_sampler, "timeline", None) is not None else None
        self.drop_targets = drop_targets and self.times is None

    @property
    def device(self) -> torch.device:  # (hpcgnn.sampling.protocol)
        return self.node_sampler.device

    def sample(self, items: Tensor, generator: torch.Generator | None = None) -> SampledSubgraph:
        items, t = items.long(), self.targets
        pairs = t.index[:, items]
        src, dst = pairs[0], pairs[1]
        if self.times is not None:  # each end a tree of its own, as of its target's time
            at = self.times.index_select(0, items)
            out = self.node_sampler.sample(pairs.reshape(-1), generator, torch.cat([at, at]))
            s, d = torch.arange(items.numel()), items.numel() + torch.arange(items.numel())
        else:
            seeds = torch.unique(pairs.reshape(-1))
            out = self.node_sampler.sample(seeds, generator)
            s, d = _local(seeds, src), _local(seeds, dst)
        if self.drop_targets and items.numel():  # a target pair need not be an edge: count what the graph has
            forward, reverse = (t.place.index_select(0, items) >= 0).double(), t.reverse.index_select(0, items).double()
            absent = torch.bincount(d, weights=forward, minlength=seeds.numel()) + \
                torch.bincount(s, weights=reverse, minlength=seeds.numel())
            absent = torch.cat([absent.long(), absent.new_zeros(out.n_id.numel() - seeds.numel(), dtype=torch.long)])
            out = _without_targets(out, torch.stack([s, d]), absent)
        targets = {"edge_label_index": torch.stack([s, d]), "edge_label": t.label.index_select(0, items),
                   "positives": items.numel()}
        if self.pair_ids is not None:  # the decoder reads the targets' own features: kept apart, or their edges'
            own = t.own_features(items)
            if own is not None:
                targets["edge_label_attr"] = own
            else:
                targets["edge_label_e_id"] = self.pair_ids(items)
        return replace(out, targets=targets)


def share(n: int, rank: int, world_size: int) -> tuple[int, int]:
    """Rank ``rank``'s contiguous range of ``n`` items (the first ranks take one more when uneven)."""
    per, extra = divmod(n, world_size)
    lo = rank * per + min(rank, extra)
    return lo, lo + per + (rank < extra)


class PairSampler:
    """Evaluation batches: the pairs of the given items, in their endpoints' subgraph; nothing left out.

    ``pairs_of(items) -> [2, P]``; ``pairs_per_item``: pairs each item stands for (a positive with its
    K candidate targets: 1 + K).
    """

    def __init__(self, node_sampler, pairs_of: Callable[[Tensor], Tensor], pairs_per_item: int = 1):
        self.node_sampler, self.pairs_of, self.pairs_per_item = node_sampler, pairs_of, pairs_per_item

    @property
    def device(self) -> torch.device:  # (hpcgnn.sampling.protocol)
        return self.node_sampler.device

    def sample(self, items: Tensor, generator: torch.Generator | None = None) -> SampledSubgraph:
        pairs = self.pairs_of(items.long())
        seeds = torch.unique(pairs.reshape(-1))
        out = self.node_sampler.sample(seeds, generator)
        return replace(out, targets={"edge_label_index": _local(seeds, pairs)})


class TimedPairSampler:
    """Evaluation batches of a chronological split (its negatives ``targets``): item i is positive i and its K
    candidates, each end a seed of its own as of the positive's time (strictly before it: every earlier edge, the
    split's earlier positives too, and none of its own time or after)."""

    def __init__(self, node_sampler, split):
        self.node_sampler, self.split = node_sampler, split
        self.pairs_per_item = 1 + split.neg.size(1)

    @property
    def device(self) -> torch.device:  # (hpcgnn.sampling.protocol)
        return self.node_sampler.device

    def sample(self, items: Tensor, generator: torch.Generator | None = None) -> SampledSubgraph:
        s, items = self.split, items.long()
        src, t = s.pos[0].index_select(0, items), s.time.index_select(0, items)
        ends = torch.cat([s.pos[1].index_select(0, items).unsqueeze(1), s.neg.index_select(0, items)], 1)  # [P, 1+K]
        p, c = ends.shape
        seeds = torch.cat([src, ends.reshape(-1)])
        out = self.node_sampler.sample(seeds, generator, torch.cat([t, t.repeat_interleave(c)]))
        index = torch.stack([torch.arange(p).repeat_interleave(c), p + torch.arange(p * c)])
        return replace(out, targets={"edge_label_index": index})


def pair_sampler(node_sampler, split) -> PairSampler | TimedPairSampler:
    """The evaluation sampler of a link split (a :class:`hpcgnn.data.link.LinkSplit`).

    ``pairs`` negatives: items ``0..P-1`` are the positives, ``P..P+M-1`` the negatives; ``targets``:
    item i is positive i followed by its K candidates, as ``[2, 1 + K]`` pairs from its source.
    """
    pos, neg = split.pos, split.neg
    if split.time is not None:
        return TimedPairSampler(node_sampler, split)
    if split.neg_kind == "targets":
        def of_targets(items: Tensor) -> Tensor:
            src = pos[0].index_select(0, items)
            dst = torch.cat([pos[1].index_select(0, items).unsqueeze(1), neg.index_select(0, items)], 1)
            return torch.stack([src.unsqueeze(1).expand_as(dst).reshape(-1), dst.reshape(-1)])

        return PairSampler(node_sampler, of_targets, 1 + neg.size(1))
    p = pos.size(1)

    def of_pairs(items: Tensor) -> Tensor:
        is_pos = items < p
        out = torch.empty(2, items.numel(), dtype=torch.long)
        out[:, is_pos] = pos[:, items[is_pos]]
        if neg is not None:
            out[:, ~is_pos] = neg[:, items[~is_pos] - p]
        return out

    return PairSampler(node_sampler, of_pairs)
