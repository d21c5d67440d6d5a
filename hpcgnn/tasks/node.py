"""Node classification: a batch's targets are its seeds' labels; accuracy is the metric.

On a typed graph the seeds are the target type's nodes and batches are ``HeteroData``: the
model returns the target type's logits and the labels are that type's.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from hpcgnn import dist
from hpcgnn.config import single_class
from hpcgnn.errors import DatasetError
from hpcgnn.models import batch_transform, build_node_model, node_logits_and_labels
from hpcgnn.tasks.base import StepResult, Task


class NodeClassification(Task):
    """Cross-entropy over the seeds (GraphSAINT batches: their normalised weighted sum)."""

    name = "node"
    metric = "acc"

    def __init__(self, cfg, env, store, device: torch.device):
        if store.shape.num_classes < 2:
            raise DatasetError(single_class(f"dataset {cfg.dataset.name} has {store.shape.num_classes} class"))
        super().__init__(cfg, env, store, device)
        self._transform = batch_transform(cfg.model, store.degree)

    def build_model(self) -> torch.nn.Module:
        return build_node_model(self.cfg.model, self.store.shape, len(self.cfg.train.fanouts))

    @property
    def transform(self) -> Callable | None:
        return self._transform

    def step(self, model: torch.nn.Module, batch) -> StepResult:
        logits, y = node_logits_and_labels(model, batch)
        n = batch.batch_size
        if n == 0:  # a padding batch: forward and backward still run, so DDP hears from this rank
            loss = logits.float().sum() * 0.0
        elif "node_weight" in batch:  # GraphSAINT: each seed weighted by 1 / (lambda_v x train nodes)
            loss = (F.cross_entropy(logits.float(), y, reduction="none") * batch.node_weight).sum()
        else:
            loss = F.cross_entropy(logits.float(), y)
        correct = (logits.detach().argmax(-1) == y).sum()
        return StepResult(loss, correct, n)

    @torch.no_grad()
    def evaluate(self, model: torch.nn.Module) -> dict[str, float]:
        """Accuracy on val and test: exact (every rank its share of each split, from the store's exact
        outputs) or from sampled batches; the counts summed over ranks."""
        model.eval()
        exact = None
        if self.cfg.train.eval_mode == "full":
            exact = self.store.exact(model, lambda degree: batch_transform(self.cfg.model, degree))
        out = {}
        for split in self.splits:
            counts = torch.zeros(2, dtype=torch.float64, device=self.device)  # (on the device: no wait per batch)
            for logits, y in [exact.split(split)] if exact is not None else self._sampled(model, split):
                counts[0] += (logits.argmax(-1) == y).sum()
                counts[1] += y.numel()
            counts = dist.all_reduce_sum(counts.cpu())
            out[f"{split}_acc"] = (counts[0] / counts[1]).item()
        return out

    def _sampled(self, model: torch.nn.Module, split: str):
        """(logits, labels) of this rank's share of ``split``, batch by batch."""
        for batch in self.store.eval_loader(split, transform=self._transform):
            if batch.batch_size:  # (an empty one: padding, this rank only serves the others' exchanges)
                yield node_logits_and_labels(model, batch)
