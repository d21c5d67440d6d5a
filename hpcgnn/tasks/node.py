"""Node classification: a batch's targets are its seeds' labels; accuracy is the metric.

On a typed graph the seeds are the target type's nodes and batches are ``HeteroData``: the
model returns the target type's logits and the labels are that type's.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from hpcgnn import dist
from hpcgnn.models import batch_transform, build_model, build_typed_model, forward_batch, forward_typed_batch
from hpcgnn.rank.techniques import (
    autocast,
    layerwise_inference,
    partitioned_layerwise_inference,
    partitioned_typed_layerwise_inference,
    typed_layerwise_inference,
)
from hpcgnn.tasks.base import StepResult, Task


class NodeClassification(Task):
    """Cross-entropy over the seeds (GraphSAINT batches: their normalised weighted sum)."""

    name = "node"
    metric = "acc"

    def __init__(self, cfg, env, store, device: torch.device):
        super().__init__(cfg, env, store, device)
        self._transform = batch_transform(cfg.model, store.degree)

    def build_model(self) -> torch.nn.Module:
        s, layers = self.store, len(self.cfg.train.fanouts)
        if s.typed:
            g = s.schema
            return build_typed_model(self.cfg.model, g.node_types, g.relations, g.target, s.num_features,
                                     s.num_classes, layers)
        return build_model(self.cfg.model, s.num_features, s.num_classes, layers)

    def logits_and_labels(self, model: torch.nn.Module, batch) -> tuple[torch.Tensor, torch.Tensor]:
        """The seeds' logits and labels (a typed batch: the target type's)."""
        n = batch.batch_size
        if self.store.typed:
            return forward_typed_batch(model, batch), batch[self.store.schema.target].y[:n]
        return forward_batch(model, batch), batch.y[:n]

    @property
    def transform(self) -> Callable | None:
        return self._transform

    def step(self, model: torch.nn.Module, batch) -> StepResult:
        logits, y = self.logits_and_labels(model, batch)
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
        t = self.cfg.train
        model.eval()
        if t.eval_mode == "full" and self.store.mode == "partitioned":
            return self._evaluate_partitioned(model)
        if t.eval_mode == "full":
            g = self.store.graph
            with autocast(t.precision, self.device):
                if self.store.typed:
                    logits = typed_layerwise_inference(model, g, self.device, t.eval_chunk, self.env.rank,
                                                       self.env.world_size)
                else:
                    logits = layerwise_inference(model, g, self.device, t.eval_chunk, self.env.rank,
                                                 self.env.world_size, transform=self._transform)
            pred = logits.argmax(-1)
            return {f"{split}_acc": (pred[idx] == g.y[idx]).double().mean().item()
                    for split, idx in (("val", g.val_idx), ("test", g.test_idx))}
        out = {}
        for split in ("val", "test"):
            counts = torch.zeros(2, dtype=torch.float64, device=self.device)
            for batch in self.store.eval_loader(split, transform=self._transform):
                if batch.batch_size == 0:  # padding: this rank only serves the others' exchanges
                    continue
                with autocast(t.precision, self.device):
                    logits, y = self.logits_and_labels(model, batch)
                counts[0] += (logits.argmax(-1) == y).sum()
                counts[1] += batch.batch_size
            counts = dist.all_reduce_sum(counts.cpu())
            out[f"{split}_acc"] = (counts[0] / counts[1]).item()
        return out

    def _evaluate_partitioned(self, model: torch.nn.Module) -> dict[str, float]:
        """Exact evaluation on a partitioned graph: each rank scores its own val/test nodes."""
        t, s = self.cfg.train, self.store
        with autocast(t.precision, self.device):
            if s.typed:  # logits of the target type's own nodes, in their typed rows
                logits = partitioned_typed_layerwise_inference(model, s, self.device, t.eval_chunk)
            else:
                logits = partitioned_layerwise_inference(model, s, self.device, t.eval_chunk,
                                                         lambda degree: batch_transform(self.cfg.model, degree))
        pred = logits.argmax(-1)
        out = {}
        for split in ("val", "test"):
            ids = getattr(s.parts, f"{split}_idx")
            rows = s.parts.typed_rows(s.schema.target, ids) if s.typed else s.view.row(ids)
            counts = torch.tensor([float((pred[rows] == s.parts.y[s.view.row(ids)]).sum()), float(rows.numel())],
                                  dtype=torch.float64)
            counts = dist.all_reduce_sum(counts)
            out[f"{split}_acc"] = (counts[0] / counts[1]).item()
        return out
