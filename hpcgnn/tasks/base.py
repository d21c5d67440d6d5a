"""The task seam: the few things the trainer's loop asks of a workload."""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class StepResult:
    """What one micro-batch's forward gives the loop; tensors stay on the device (no sync)."""

    loss: Tensor  # scalar, the batch's loss (mean over its targets, or their weighted sum)
    correct: Tensor  # scalar, targets predicted right (for the training accuracy)
    count: int  # targets in the batch (seed nodes; scored pairs)
    seeds: int | None = None  # what the step trained on, for throughput (seed nodes; positive edges); None: count


class Task(abc.ABC):
    """A workload the trainer runs: model, loss, metrics and evaluation over a store's batches.

    ``metric``: the evaluation metric that selects the best epoch, read as ``val_<metric>`` (the lowest where
    ``lower_is_better``);
    :meth:`evaluate` returns ``val_<name>`` and ``test_<name>`` for each of its metrics.
    """

    name: str
    metric: str
    lower_is_better: bool = False  # the metric improves downwards (a regression's RMSE)
    train_metric: str | None = "acc"  # what StepResult.correct / count is, reported as train_<name>; None: nothing
    splits: tuple[str, ...] = ("val", "test")  # the splits :meth:`evaluate` scores (the trainer drops empty ones)

    def __init__(self, cfg, env, store, device: torch.device):
        self.cfg, self.env, self.store, self.device = cfg, env, store, device
        if self.eval_mode == "full":  # sized now, not at the first evaluation
            store.check_exact(cfg.model)

    def build_model(self) -> torch.nn.Module:
        """The model, on the CPU, initialised from the current torch seed: the task's spec's builder
        (``TaskSpec.model``, a model file's rebuilder too: :func:`hpcgnn.models.saved.rebuild`)."""
        from hpcgnn.specs import load, tasks

        spec = tasks.SPECS[self.name]
        return load(spec.model)(self.cfg.model, spec.decoder(self.cfg.task), self.store.shape,
                                spec.layers(self.cfg), self.store.items.relation)

    @property
    def eval_mode(self) -> str:
        """How evaluation runs: ``sampled`` (batches like training) or ``full`` (exact, layer-wise):
        ``train.eval_mode``, its ``auto`` exact where the graph is whole and the model runs layer by layer
        (:func:`hpcgnn.checks.eval_mode`)."""
        from hpcgnn.checks import eval_mode

        graph = getattr(self.store, "graph", None)  # (a whole graph's times, known to the rank; else the config's say)
        timed = None if graph is None else any(getattr(graph, name, None) is not None for name in ("timeline",
                                                                                                   "timelines"))
        return eval_mode(self.cfg, timed)

    @property
    def transform(self) -> Callable | None:
        """A per-batch transform the model needs (applied on the host where batches are made)."""
        return None

    @abc.abstractmethod
    def step(self, model: torch.nn.Module, batch) -> StepResult:
        """Forward one micro-batch and compute its loss (the caller handles autocast and backward)."""

    @abc.abstractmethod
    def evaluate(self, model: torch.nn.Module) -> dict[str, float]:
        """``val_*`` and ``test_*`` metrics (of :attr:`splits`), the same on every rank (collective)."""

    # ------------------------------------------------------------------ prediction (hpcgnn predict)

    def adopt(self, target) -> None:
        """Take a model file's target (its kind; a regression's scale, as trained) for prediction: what
        :meth:`prediction` writes and :meth:`prediction_metric` scores. A task without targets takes nothing."""
        return None

    def predict_rows(self, model: torch.nn.Module, mode: str, what: str, split: str):
        """This rank's rows of ``split`` for ``hpcgnn predict``: (outputs, their ids, their labels or None), exact
        (``mode`` full) or from the evaluation's sampled batches; ``what``: predictions or embeddings. A node
        model's here (:mod:`hpcgnn.tasks.prediction`); a table's entries' predictions, from the evaluation's batches
        (each entry as of its time)."""
        from hpcgnn.models import node_logits_and_labels
        from hpcgnn.tasks.prediction import node_rows, walk

        if what != "embeddings" and self.store.items.predicted(split) is not None:
            return walk(self.store.eval_loader(split, transform=self.transform),
                        lambda b: node_logits_and_labels(model, b) if b.batch_size else None)
        return node_rows(self, model, mode, split, embeddings=what == "embeddings")

    def prediction(self, what: str, rows: Tensor) -> dict:
        """The arrays predict writes of this rank's ``rows`` (float32 outputs), by name: ``scores`` and
        ``embeddings`` as they are; ``predictions`` as the task's kind gives them (probabilities and classes,
        values in the labels' units)."""
        import numpy as np

        if what in ("scores", "embeddings"):
            return {what: rows.numpy().astype(np.float32, copy=False)}
        return self.kind.outputs(rows)

    def prediction_metric(self, rows: Tensor, labels: Tensor) -> float | None:
        """The task's metric (:attr:`metric`) of every rank's ``rows`` against their ``labels`` (collective); None
        where it cannot be told (no known label)."""
        import math

        value = self.kind.scores([(rows.float(), labels)])[self.metric]
        return None if math.isnan(value) else value

    def split_sizes(self) -> dict[str, int]:
        """Targets in the val and test splits, over every rank (collective): the nodes each rank evaluates."""
        from hpcgnn import dist

        counts = torch.tensor([self.store.eval_seeds(s)[0].numel() for s in ("val", "test")], dtype=torch.long)
        counts = dist.all_reduce_sum(counts)
        return {"val": int(counts[0]), "test": int(counts[1])}
