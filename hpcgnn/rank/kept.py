"""The run's model files as training goes (rank 0 writes them, :func:`hpcgnn.models.saved.keep`):
``model/best.pt`` at each epoch better than the best so far, ``model/last.pt`` at each checkpoint and at the end.
The best epoch's weights are held here, so that a checkpoint carries them and a resumed run writes ``best.pt``
again as of its checkpoint."""

from __future__ import annotations

from pathlib import Path

import torch

from hpcgnn.config import RunConfig
from hpcgnn.models import saved


class KeptModels:
    """A rank's side of the model files (only rank 0, ``main``, writes or holds anything)."""

    def __init__(self, cfg: RunConfig, shape, checkpointer, main: bool):
        self.cfg, self.shape, self.checkpointer, self.main = cfg, shape, checkpointer, main
        self.best_weights: dict | None = None  # rank 0: the weights of the best epoch so far (model/best.pt)

    def keep(self, model: torch.nn.Module, which: str, weights: dict, epoch: int, step: int, metrics: dict) -> Path:
        """``model/<which>.pt``: the weights and what rebuilds the model (its run, dataset, epoch and metrics)."""
        return saved.keep(self.cfg.run_dir, which, saved.describe(
            model, self.cfg, self.shape, weights, which=which, epoch=epoch, step=step, metrics=dict(metrics),
            run_id=(self.checkpointer.run or {}).get("id"), dataset=self.checkpointer.fingerprint["dataset"]))

    def better(self, model: torch.nn.Module, epoch: int, step: int, metrics: dict) -> None:
        """The epoch just evaluated is the best so far: its weights held and written as ``best.pt``."""
        if self.main:
            self.best_weights = saved.cpu_weights(model)
            self.keep(model, "best", self.best_weights, epoch, step, metrics)

    def last(self, model: torch.nn.Module, epoch: int, step: int, metrics: dict) -> None:
        """The newest weights as ``last.pt`` (at a checkpoint, and at the end of the run)."""
        if self.main:
            self.keep(model, "last", saved.cpu_weights(model), epoch, step, metrics)

    def state_dict(self) -> dict:
        """What a checkpoint carries (rank 0's part): the best epoch's weights, where there is one."""
        return {"best_model": self.best_weights} if self.best_weights is not None else {}

    def load_state_dict(self, model: torch.nn.Module, state: dict, epoch: int, step: int, metrics: dict) -> None:
        """From a checkpoint: the best weights as of it, and ``best.pt`` written again from them."""
        if self.main and state.get("best_model") is not None:
            self.best_weights = state["best_model"]
            self.keep(model, "best", self.best_weights, epoch, step, metrics)
