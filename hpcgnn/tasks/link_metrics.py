"""Link-prediction metrics with OGB's conventions, computed exactly across ranks.

- ROC-AUC: the probability that a positive outscores a negative, ties counting half (the
  Mann-Whitney statistic; equal to scikit-learn's ``roc_auc_score``).
- AP: average precision over the distinct score thresholds (scikit-learn's ``average_precision_score``).
- Hits@K with shared negatives (ogbl-collab): a positive is a hit when it scores strictly above
  the K-th highest negative of the whole split; 1.0 when the split has fewer than K negatives.
- MRR with per-positive candidates (ogbl-citation2): a positive's rank among its own negatives is
  1 + (optimistic + pessimistic) / 2 (ties counted half); Hits@K per positive is rank <= K.

Ranks hold contiguous shares of a split. Shared-negative metrics need every score: the shares are
all-gathered (a tensor collective) and every rank computes the same numbers. Per-positive metrics
are sums: each rank sums its positives' reciprocal ranks and hits, and one all-reduce gives the totals.
"""

from __future__ import annotations

import torch
from torch import Tensor

from hpcgnn import dist


def roc_auc(pos: Tensor, neg: Tensor) -> float:
    if pos.numel() == 0 or neg.numel() == 0:
        return float("nan")
    scores = torch.cat([pos, neg]).double()
    order = torch.argsort(scores)
    values, inverse, counts = torch.unique_consecutive(scores[order], return_inverse=True, return_counts=True)
    first = torch.cumsum(counts, 0) - counts + 1  # 1-based rank of each distinct value's first copy
    ranks = torch.empty_like(scores)
    ranks[order] = (first + (counts - 1) / 2.0).double()[inverse]  # tied scores share their mean rank
    p, n = pos.numel(), neg.numel()
    return float((ranks[:p].sum() - p * (p + 1) / 2.0) / (p * n))


def average_precision(pos: Tensor, neg: Tensor) -> float:
    if pos.numel() == 0:
        return float("nan")
    scores = torch.cat([pos, neg]).double()
    labels = torch.cat([torch.ones(pos.numel()), torch.zeros(neg.numel())]).double()
    order = torch.argsort(scores, descending=True, stable=True)
    s, y = scores[order], labels[order]
    tp, fp = torch.cumsum(y, 0), torch.cumsum(1 - y, 0)
    last = torch.ones(s.numel(), dtype=torch.bool)  # the last position of each distinct threshold
    last[:-1] = s[1:] != s[:-1]
    tp, fp = tp[last], fp[last]
    precision, recall = tp / (tp + fp), tp / pos.numel()
    return float((torch.diff(recall, prepend=recall.new_zeros(1)) * precision).sum())


def hits_shared(pos: Tensor, neg: Tensor, k: int) -> float:
    """OGB's Hits@K against all negatives of the split (ogbl-collab)."""
    if neg.numel() < k:
        return 1.0
    kth = torch.topk(neg, k).values[-1]
    return float((pos > kth).double().mean())


def ranks_per_positive(pos: Tensor, neg: Tensor) -> Tensor:
    """Rank of ``pos[i]`` among ``neg[i, :]`` (1 = best), ties counted half (OGB's MRR)."""
    pos = pos.reshape(-1, 1)
    optimistic = (neg > pos).sum(1)
    pessimistic = (neg >= pos).sum(1)
    return 0.5 * (optimistic + pessimistic).double() + 1


def shared_negative_metrics(pos_mine: Tensor, neg_mine: Tensor, ks: tuple[int, ...], paired: bool) -> dict[str, float]:
    """AUC, AP, Hits@K (and MRR when negative i belongs to positive i) from every rank's share (collective)."""
    pos = _gather(pos_mine.float().cpu())
    neg = _gather(neg_mine.float().cpu())
    out = {"auc": roc_auc(pos, neg), "ap": average_precision(pos, neg)}
    out.update({f"hits@{k}": hits_shared(pos, neg, k) for k in ks})
    if paired and pos.numel() == neg.numel():
        out["mrr"] = float((1.0 / ranks_per_positive(pos, neg.reshape(-1, 1))).mean())
    return out


def per_positive_metrics(pos_mine: Tensor, neg_mine: Tensor, ks: tuple[int, ...]) -> dict[str, float]:
    """MRR and Hits@K of each positive against its own candidates, summed over ranks exactly (collective)."""
    ranks = ranks_per_positive(pos_mine.float().cpu(), neg_mine.float().cpu())
    sums = torch.tensor([float((1.0 / ranks).sum()), *(float((ranks <= k).sum()) for k in ks), float(ranks.numel())],
                        dtype=torch.float64)
    sums = dist.all_reduce_sum(sums)
    count = max(float(sums[-1]), 1.0)
    out = {"mrr": float(sums[0]) / count}
    out.update({f"hits@{k}": float(sums[1 + i]) / count for i, k in enumerate(ks)})
    return out


def _gather(mine: Tensor) -> Tensor:
    counts = dist.all_gather_object(mine.numel())
    return dist.all_gather_rows(mine.reshape(-1, 1), counts).reshape(-1)
