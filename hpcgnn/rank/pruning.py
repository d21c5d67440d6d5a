"""A tune's trial, seen from its ranks (``tune.trial`` set by the worker that runs it; :mod:`hpcgnn.tuning`): each
evaluated epoch's metric reported to the study by rank 0, and the pruner's word shared with every rank, so that a
hopeless trial stops at once, all ranks together, keeping its folder."""

from __future__ import annotations

import logging
import math

import torch

from hpcgnn import dist
from hpcgnn.errors import ConfigError

log = logging.getLogger(__name__)


class TrialReports:
    """Rank 0 reports each evaluated epoch's ``metric`` to trial ``tune.trial`` of the study; :meth:`after_epoch`
    says (the same on every rank) whether the pruner stops it there. Inert where the run is no trial."""

    def __init__(self, cfg, env, metric: str):
        t = cfg.tune
        self.active, self.metric, self.min_epochs = t.trial >= 0, metric, t.min_epochs
        self.trial = None
        if self.active and env.is_main:
            from hpcgnn.tuning import open_study, optuna

            study = open_study(cfg, _sweep_of(t.study))
            trial_id = study._storage.get_trial_id_from_study_id_trial_number(study._study_id, t.trial)
            self.trial = optuna().trial.Trial(study, trial_id)

    def check_metric(self, row: dict) -> None:
        """An evaluated epoch reports the study's metric (a run's task may report others: the study named one)."""
        evaluated = [k for k in row if k.startswith("val_")]
        if self.active and evaluated and self.metric not in row:
            raise ConfigError(f"tune.metric={self.metric}: this run reports {', '.join(sorted(evaluated))}. HINT: one "
                              "of them, or tune.metric=auto")

    def after_epoch(self, epoch: int, row: dict) -> bool:
        """Report ``row``'s metric (an evaluated epoch's); True where the pruner stops the trial (every rank)."""
        if not self.active:
            return False
        self.check_metric(row)
        stop = 0
        value = row.get(self.metric)
        if self.trial is not None and value is not None and not math.isnan(value):
            self.trial.report(float(value), epoch)
            stop = int(epoch >= self.min_epochs and self.trial.should_prune())
        stop = int(dist.all_reduce_max(torch.tensor([stop])).item())
        if stop:
            log.info("tune: trial %d pruned after epoch %d (%s %.4f)", getattr(self.trial, "number", -1), epoch,
                     self.metric, value if value is not None else math.nan)
        return bool(stop)


def _sweep_of(study_file: str):
    from pathlib import Path

    return Path(study_file).parent
