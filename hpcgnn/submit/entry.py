"""What submitit runs in every task of a job: a light object, pickled by reference.

The submitting process needs the function object to pickle it, so it lives here, away
from torch: submitting a job or a sweep imports no torch, and the job imports it when it
starts (:func:`hpcgnn.rank.job.run_rank`).
"""

from __future__ import annotations

import submitit


class TrainTask(submitit.helpers.Checkpointable):
    """Checkpointable, so that submitit's own USR2 handler requeues the job; the state itself is saved by
    all ranks together, before (trainer)."""

    def __call__(self, cfg) -> dict:
        from hpcgnn import env
        from hpcgnn.rank.job import run_rank

        return run_rank(cfg, env.current())


run_task = TrainTask()
