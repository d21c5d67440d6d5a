"""A node task's metrics over a whole split, from every rank's rows: multi-label ROC-AUC (as OGB's Evaluator
computes it) and micro-F1, regression's RMSE, MAE and R².

Each function takes the split's rows gathered from every rank in any order and returns the same floats whatever
the order (the rows are sorted by their values first), so the metrics of a partitioned run equal a replicated
run's bit for bit where their predictions do.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def _canonical(pred: Tensor, true: Tensor) -> tuple[Tensor, Tensor]:
    """The pairs sorted by (pred, true): an order that depends on the values alone (sums in it are the same
    floats whichever rank held which row)."""
    order = torch.argsort(true, stable=True)
    pred, true = pred[order], true[order]
    order = torch.argsort(pred, stable=True)
    return pred[order], true[order]


def _auc(pred: Tensor, true: Tensor) -> float:
    """ROC-AUC of one label (``true`` 0/1, both present): the Mann-Whitney statistic with tied scores counted
    half, which is the area under the ROC curve's trapezoids (scikit-learn's ``roc_auc_score``)."""
    pred, true = _canonical(pred.double(), true.double())
    n = pred.numel()
    # average ranks (1-based) of tied runs: a run from i to j gets (i + j) / 2 + 1
    _, inverse, counts = torch.unique_consecutive(pred, return_inverse=True, return_counts=True)
    ends = torch.cumsum(counts, 0).double()
    average = ends - (counts.double() - 1) / 2
    ranks = average[inverse]
    pos = int(true.sum())
    neg = n - pos
    return float(((ranks * true).sum() - pos * (pos + 1) / 2) / (pos * neg))


def _per_label(pred: Tensor, true: Tensor, score) -> float:
    """``score(pred, true)`` of each label with both a 0 and a 1 among its known entries, over those entries
    (``true`` NaN: unknown), averaged (OGB's rule); NaN when no label has both."""
    scores = []
    for c in range(true.size(1)):
        t, p = true[:, c], pred[:, c]
        known = ~torch.isnan(t)
        t, p = t[known], p[known]
        if (t == 1).any() and (t == 0).any():
            scores.append(score(p, t))
    return sum(scores) / len(scores) if scores else math.nan


def rocauc(pred: Tensor, true: Tensor) -> float:
    """Mean ROC-AUC over the labels with both a 0 and a 1 among their known entries, each over its known
    entries (``true`` NaN: unknown), as ``ogb.nodeproppred.Evaluator`` computes it for ogbn-proteins; NaN when no
    label has both."""
    return _per_label(pred, true, _auc)


def _ap(pred: Tensor, true: Tensor) -> float:
    """Average precision of one label (``true`` 0/1, a 1 present): the precision at each distinct score, from the
    highest down, weighted by the recall it adds (scikit-learn's ``average_precision_score``, no interpolation)."""
    pred, true = _canonical(pred.double(), true.double())
    pred, true = pred.flip(0), true.flip(0)  # highest score first
    _, counts = torch.unique_consecutive(pred, return_counts=True)
    ends = torch.cumsum(counts, 0) - 1  # the last row of each run of tied scores
    tp = torch.cumsum(true, 0)[ends]
    seen = (ends + 1).double()
    precision, recall = tp / seen, tp / tp[-1]
    gained = torch.diff(recall, prepend=recall.new_zeros(1))
    return float((gained * precision).sum())


def average_precision(pred: Tensor, true: Tensor) -> float:
    """Mean average precision over the labels with both a 0 and a 1 among their known entries (NaN: unknown), as
    ``ogb.graphproppred.Evaluator`` computes it for ogbg-molpcba; NaN when no label has both."""
    return _per_label(pred, true, _ap)


def micro_f1(pred: Tensor, true: Tensor) -> float:
    """Micro-averaged F1 over every known entry, a label predicted where its logit is positive."""
    known = ~torch.isnan(true)
    hit, truth = (pred > 0) & known, (true == 1) & known
    tp = int((hit & truth).sum())
    fp, fn = int((hit & ~truth).sum()), int((~hit & truth).sum())
    return 2 * tp / (2 * tp + fp + fn) if tp + fp + fn else math.nan


def regression(pred: Tensor, true: Tensor) -> dict[str, float]:
    """RMSE and MAE over every known value (NaN: unknown), and R² averaged over the columns (1 - the squared
    error over the squares about the column's mean; NaN for a column whose known values are all equal)."""
    se = ae = 0.0
    count = 0
    r2 = []
    for c in range(true.size(1)):
        known = ~torch.isnan(true[:, c])
        p, t = _canonical(pred[known, c].double(), true[known, c].double())
        if not t.numel():
            continue
        err = p - t
        sse = float((err * err).sum())
        se, ae, count = se + sse, ae + float(err.abs().sum()), count + t.numel()
        sst = float(((t - t.mean()) ** 2).sum())
        r2.append(1 - sse / sst if sst > 0 else math.nan)
    if not count:
        return {"rmse": math.nan, "mae": math.nan, "r2": math.nan}
    return {"rmse": math.sqrt(se / count), "mae": ae / count, "r2": sum(r2) / len(r2)}
