"""Graph tasks (``task=graph``): a target per graph, over a dataset of many graphs (:mod:`hpcgnn.data.graphs`), of
one of the node task's kinds (classification, multilabel, regression: :mod:`hpcgnn.tasks.node`'s units, their loss,
metrics and what predict writes), NaN unknown as there.

A batch is whole graphs (:mod:`hpcgnn.stores.graphs`); the model reads them out to a row each
(:mod:`hpcgnn.models.graph`). Evaluation scores every validation and test graph once, whole, each rank its
consecutive batches of the split; the kinds' metrics are combined over the ranks (counts summed; rows gathered in the
split's order), so a run's metrics are the same floats on any number of ranks. The metric that selects the epoch is
the dataset's own where it names one (OGB's: ROC-AUC for ogbg-molhiv, AP for ogbg-molpcba, accuracy for ogbg-ppa),
else the kind's, or ``task.metric``.
"""

from __future__ import annotations

import logging

import numpy as np
import torch
from torch import Tensor

from hpcgnn.labels import Target
from hpcgnn.models.graph import graph_outputs
from hpcgnn.tasks.base import StepResult, Task
from hpcgnn.tasks.node import take_target

log = logging.getLogger(__name__)


class GraphTask(Task):
    """A target per graph (see the module)."""

    name = "graph"

    def __init__(self, cfg, env, store, device: torch.device):
        self.target: Target = store.shape.target
        super().__init__(cfg, env, store, device)
        take_target(self, self.target, cfg, store, device)
        if env.is_main:
            log.info("%s; %d layers, %s readout", self.target.describe("graph task"), cfg.task.layers, cfg.task.readout)

    @property
    def eval_mode(self) -> str:
        """Every graph whole: evaluation's batches are its graphs, nothing sampled."""
        return "whole"

    def adopt(self, target: Target) -> None:
        take_target(self, target, self.cfg, self.store, self.device)

    def step(self, model: torch.nn.Module, batch) -> StepResult:
        out, y = graph_outputs(model, batch), batch.y
        return StepResult(self.kind.mean_loss(out, y), self.kind.correct(out, y).sum(), int(batch.batch_size))

    def _outputs(self, model: torch.nn.Module, split: str, embeddings: bool = False):
        """(outputs, labels) of this rank's batches of ``split``, batch by batch."""
        for batch in self.store.eval_loader(split):
            yield graph_outputs(model, batch, embeddings), batch.y

    @torch.no_grad()
    def evaluate(self, model: torch.nn.Module) -> dict[str, float]:
        """The kind's metrics of every graph of val and test, combined over the ranks."""
        model.eval()
        out = {}
        for split in self.splits:
            out.update({f"{split}_{k}": v for k, v in self.kind.scores(self._outputs(model, split)).items()})
        return out

    # ------------------------------------------------------------------ prediction (hpcgnn predict)

    def predict_rows(self, model: torch.nn.Module, mode: str, what: str, split: str):
        """This rank's graphs of ``split`` (``all``: every graph): their outputs (or, ``what=embeddings``, their rows
        read out, before the head), ids and labels."""
        from hpcgnn.tasks.prediction import walk

        loader = self.store.eval_loader(split)
        if what == "embeddings":
            return walk(loader, lambda b: (graph_outputs(model, b, embeddings=True), None))[:2] + (None,)
        return walk(loader, lambda b: (graph_outputs(model, b), b.y))

    def prediction(self, what: str, rows: Tensor) -> dict:
        if what == "embeddings":
            return {what: rows.numpy().astype(np.float32, copy=False)}
        return self.kind.outputs(rows)
