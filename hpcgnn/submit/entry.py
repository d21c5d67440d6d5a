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


class TuneTask(submitit.helpers.Checkpointable):
    """A tune's worker ``k`` in every task of its array element (``hpcgnn tune +cluster=NAME``): trials pulled from
    the study one after another, each trained by the element's tasks as its ranks; requeued as a training job
    is, its trial resumed from its checkpoint (:func:`hpcgnn.submit.tune_worker.array_worker`)."""

    def __call__(self, sweep_dir: str, k: int) -> None:
        from hpcgnn import env
        from hpcgnn.submit.tune_worker import array_worker

        array_worker(sweep_dir, k, env.current())


tune_task = TuneTask()
