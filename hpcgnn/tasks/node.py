"""Node tasks: a batch's targets are its seeds' labels, of one of the kinds :mod:`hpcgnn.specs.tasks` declares
(resolved from the labels by :mod:`hpcgnn.labels`):

- **classification**: one class per node; cross-entropy; accuracy;
- **multilabel**: several binary labels per node (unknown entries masked out); binary cross-entropy with logits;
  ROC-AUC averaged over the labels (as OGB's Evaluator) and micro-F1;
- **regression**: one or more values per node (unknown: NaN), standardised by the training split's mean and std;
  MSE (or ``task.loss=l1``, ``huber``); RMSE, MAE and R² in the labels' own units;
- **ordinal**: one of K ordered levels per node (ratings, binned counts); K-1 threshold logits, binary
  cross-entropy over them; MAE in levels and accuracy.

The kind is the store's :attr:`GraphShape.target`, resolved from the labels and ``task.kind`` when the graph was
opened. On a typed graph the seeds are the target type's nodes and batches are ``HeteroData``: the model returns
the target type's outputs and the labels are that type's.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from hpcgnn import dist
from hpcgnn.errors import DatasetError
from hpcgnn.labels import Target
from hpcgnn.models import batch_transform, gcn_norm, node_logits_and_labels
from hpcgnn.specs import load, tasks
from hpcgnn.specs.datasets import single_class
from hpcgnn.tasks import node_metrics
from hpcgnn.tasks.base import StepResult, Task

log = logging.getLogger(__name__)


def known_values(y: Tensor) -> Tensor:
    """Labels as floats [n, C], NaN where unknown (one integer column's -1; integer columns are values, all known)."""
    if not y.is_floating_point():
        y = y.float().masked_fill(y < 0, float("nan")) if y.dim() == 1 else y.float()
    return y.float().reshape(y.size(0), -1)


class Classification:
    """One class per node."""

    train_metric = "acc"  # what correct() counts, reported as train_acc (None: nothing)

    def __init__(self, target: Target, device: torch.device):
        self.target = target

    def loss(self, out: Tensor, y: Tensor) -> Tensor:  # per seed
        return F.cross_entropy(out.float(), y, reduction="none")

    def mean_loss(self, out: Tensor, y: Tensor) -> Tensor:
        return F.cross_entropy(out.float(), y)

    def correct(self, out: Tensor, y: Tensor) -> Tensor:  # per seed: 1 right, 0 wrong
        return (out.detach().argmax(-1) == y).float()

    def scores(self, pairs) -> dict[str, float]:
        """Accuracy from this rank's (outputs, labels) over the nodes whose class is known (a label of -1 is none),
        the counts summed over ranks (collective); NaN where no node's class is known."""
        counts = None
        for out, y in pairs:
            known = y >= 0
            right = ((out.argmax(-1) == y) & known).sum().double() if out.numel() else torch.zeros((), dtype=torch.float64)
            step = torch.stack([right.to(torch.float64), known.sum().to(torch.float64)])
            counts = step if counts is None else counts + step.to(counts.device)
        counts = dist.all_reduce_sum(counts.cpu() if counts is not None else torch.zeros(2, dtype=torch.float64))
        return {"acc": (counts[0] / counts[1]).item()}

    def outputs(self, rows: Tensor) -> dict[str, np.ndarray]:
        """What predict writes of ``rows`` (logits): each class's probability, and the most probable class."""
        probs = F.softmax(rows, dim=-1) if rows.numel() else rows
        return {"probs": probs.numpy().astype(np.float32, copy=False),
                "labels": (rows.argmax(-1) if rows.numel() else torch.empty(0, dtype=torch.long)).numpy()}


class Gathered:
    """A kind scored over a whole split at once: every rank's rows gathered to every rank (collective)."""

    train_metric = "acc"

    def mean_loss(self, out: Tensor, y: Tensor) -> Tensor:
        return self.loss(out, y).mean()

    def columns(self) -> int:
        """Columns of what is scored (:meth:`values`): the target's width."""
        return self.target.width

    def scores(self, pairs) -> dict[str, float]:
        outs, ys = [], []
        for out, y in pairs:
            outs.append(self.values(out.float()).cpu())
            ys.append(known_values(y).cpu())
        width = self.columns()
        mine = torch.cat([torch.cat(outs), torch.cat(ys)], 1) if outs else torch.zeros(0, 2 * width)
        counts = [int(c) for c in dist.all_gather_object(mine.size(0))] if dist.initialized() else [mine.size(0)]
        rows = dist.all_gather_rows(mine.contiguous(), counts)
        return self.metrics(rows[:, :width], rows[:, width:])


class MultiLabel(Gathered):
    """Several binary labels per node; an unknown one (NaN) adds nothing to the loss or the metrics."""

    def __init__(self, target: Target, device: torch.device):
        self.target = target

    def loss(self, out: Tensor, y: Tensor) -> Tensor:
        y = known_values(y)
        known = ~torch.isnan(y)
        each = F.binary_cross_entropy_with_logits(out.float(), torch.nan_to_num(y), reduction="none") * known
        return each.sum(1) / known.sum(1).clamp(min=1)

    def correct(self, out: Tensor, y: Tensor) -> Tensor:  # per seed: its known labels predicted right, a fraction
        y = known_values(y)
        known = ~torch.isnan(y)
        right = ((out.detach() > 0) == (y == 1)) & known
        return right.sum(1) / known.sum(1).clamp(min=1)

    def values(self, out: Tensor) -> Tensor:
        return out

    def metrics(self, pred: Tensor, true: Tensor) -> dict[str, float]:
        return {"rocauc": node_metrics.rocauc(pred, true), "ap": node_metrics.average_precision(pred, true),
                "f1": node_metrics.micro_f1(pred, true)}

    def outputs(self, rows: Tensor) -> dict[str, np.ndarray]:
        """What predict writes of ``rows`` (logits): each label's probability."""
        return {"probs": torch.sigmoid(rows).numpy().astype(np.float32, copy=False)}


class Regression(Gathered):
    """Values per node, learnt standardised (the training split's mean and std), scored in their own units."""

    train_metric = None

    def __init__(self, target: Target, device: torch.device):
        self.target = target
        self.mean = torch.tensor(target.mean, dtype=torch.float32, device=device)
        self.std = torch.tensor(target.std, dtype=torch.float32, device=device)
        self.fn = {"mse": F.mse_loss, "l1": F.l1_loss, "huber": F.huber_loss}[target.loss]

    def loss(self, out: Tensor, y: Tensor) -> Tensor:
        z = (known_values(y) - self.mean) / self.std
        known = ~torch.isnan(z)
        each = self.fn(out.float(), torch.nan_to_num(z), reduction="none") * known
        return each.sum(1) / known.sum(1).clamp(min=1)

    def correct(self, out: Tensor, y: Tensor) -> Tensor:
        return out.new_zeros(out.size(0), dtype=torch.float32)

    def values(self, out: Tensor) -> Tensor:
        return out * self.std.to(out.device) + self.mean.to(out.device)

    def metrics(self, pred: Tensor, true: Tensor) -> dict[str, float]:
        return node_metrics.regression(pred, true)

    def outputs(self, rows: Tensor) -> dict[str, np.ndarray]:
        """What predict writes of ``rows``: the values in the labels' own units (one column: a vector)."""
        values = self.values(rows)
        return {"values": (values.view(-1) if self.target.column else values).numpy().astype(np.float32, copy=False)}


class Ordinal(Gathered):
    """Ordered levels 0..K-1 (ratings, binned counts; -1: none): K-1 outputs, output k the logit of P(level > k),
    one binary classifier per threshold sharing the model (Li and Lin's extended binary classification; CORAL's
    loss); binary cross-entropy summed over the thresholds; the predicted level counts the thresholds passed
    (P > 1/2). Scored in levels: MAE (selects the epoch), and accuracy. A mistake by one level costs less than one
    by four, which classification's cross-entropy does not know."""

    def __init__(self, target: Target, device: torch.device):
        self.target = target

    def loss(self, out: Tensor, y: Tensor) -> Tensor:  # per seed
        known = y >= 0
        above = (y.unsqueeze(1) > torch.arange(out.size(1), device=out.device)).float()
        each = F.binary_cross_entropy_with_logits(out.float(), above, reduction="none").sum(1)
        return each * known

    def correct(self, out: Tensor, y: Tensor) -> Tensor:  # per seed: its level predicted right
        return (self.level(out.detach()) == y).float()

    @staticmethod
    def level(out: Tensor) -> Tensor:
        return (out > 0).sum(1)

    def columns(self) -> int:
        return 1

    def values(self, out: Tensor) -> Tensor:
        return self.level(out).float().unsqueeze(1)

    def metrics(self, pred: Tensor, true: Tensor) -> dict[str, float]:
        known = ~torch.isnan(true)
        if not known.any():
            return {"mae": float("nan"), "acc": float("nan")}
        p, t = pred[known].double(), true[known].double()
        return {"mae": float((p - t).abs().mean()), "acc": float((p == t).double().mean())}

    def outputs(self, rows: Tensor) -> dict[str, np.ndarray]:
        """What predict writes of ``rows`` (logits): P(level > k) for each threshold k, and the predicted level."""
        return {"probs": torch.sigmoid(rows).numpy().astype(np.float32, copy=False),
                "labels": self.level(rows).numpy().astype(np.int64, copy=False)}


def take_target(task: Task, target: Target, cfg, store, device: torch.device) -> None:
    """What a task of ``target``'s kind takes from it (a node or an edge task): the kind's unit (its spec's: loss,
    metrics, what predict writes), the metric that selects an epoch and its direction, the training metric, and the
    model's batch transform."""
    task.kind = load(tasks.KINDS[target.kind].unit)(target, device)
    task.metric, task.lower_is_better = target.metric, target.lower_is_better
    task.train_metric = task.kind.train_metric
    task._transform = batch_transform(cfg.model, store.degree)


class NodeTask(Task):
    """A node task of the store's kind (GraphSAINT batches: each seed's loss weighted, summed)."""

    name = "node"

    def __init__(self, cfg, env, store, device: torch.device):
        self.target: Target = store.shape.target or Target("classification", store.shape.num_classes)
        if self.target.kind == "classification" and self.target.width < 2:
            raise DatasetError(single_class(f"dataset {cfg.dataset.name} has {self.target.width} class"))
        super().__init__(cfg, env, store, device)
        take_target(self, self.target, cfg, store, device)
        if env.is_main:
            log.info("%s", self.target.describe())

    def adopt(self, target: Target) -> None:
        take_target(self, target, self.cfg, self.store, self.device)

    @property
    def transform(self) -> Callable | None:
        return self._transform

    def step(self, model: torch.nn.Module, batch) -> StepResult:
        out, y = node_logits_and_labels(model, batch)
        n = batch.batch_size
        if n == 0:  # a padding batch: forward and backward still run, so DDP hears from this rank
            return StepResult(out.float().sum() * 0.0, out.new_zeros(()), 0)
        if "node_weight" in batch:  # GraphSAINT: each seed weighted by 1 / (lambda_v x train nodes)
            loss = (self.kind.loss(out, y) * batch.node_weight).sum()
        else:
            loss = self.kind.mean_loss(out, y)
        return StepResult(loss, self.kind.correct(out, y).sum(), n)

    @torch.no_grad()
    def evaluate(self, model: torch.nn.Module) -> dict[str, float]:
        """The kind's metrics on val and test: exact (every rank its share of each split, from the store's exact
        outputs) or from sampled batches; combined over ranks."""
        model.eval()
        exact = None
        if self.eval_mode == "full":
            exact = self.store.exact(model, gcn_norm(self.cfg.model))
        out = {}
        for split in self.splits:
            pairs = [exact.split(split)] if exact is not None else self._sampled(model, split)
            out.update({f"{split}_{k}": v for k, v in self.kind.scores(pairs).items()})
        return out

    def _sampled(self, model: torch.nn.Module, split: str):
        """(outputs, labels) of this rank's share of ``split``, batch by batch."""
        for batch in self.store.eval_loader(split, transform=self._transform):
            if batch.batch_size:  # (an empty one: padding, this rank only serves the others' exchanges)
                yield node_logits_and_labels(model, batch)


NodeClassification = NodeTask  # its name before the task kinds
