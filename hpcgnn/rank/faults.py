"""Faults on purpose, for tests: ``debug.*`` makes a rank fail, hang, straggle, start late, be preempted, or
diverge at a given step. The trainer meets them at two points of a step, through :class:`Faults` alone;
with the defaults (``debug.*_rank=-1``) none fires."""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import signal
import time

from hpcgnn.config import DebugConfig

log = logging.getLogger(__name__)


class Faults:
    """The faults ``debug`` asks of rank ``rank`` (steps are the run's, 1-based)."""

    def __init__(self, debug: DebugConfig, rank: int, preemption_signal: str):
        self.d, self.rank, self.signal = debug, rank, getattr(signal, f"SIG{preemption_signal}")

    def before_step(self, step: int) -> None:
        """Just before ``step``: fail, hang, be slow (a straggler's sleep counts as its wait), start late, or
        send itself the preemption signal."""
        d, rank = self.d, self.rank
        if rank == d.fail_rank and step == d.fail_step:
            raise RuntimeError(f"injected failure on rank {rank} at step {step} (debug.fail_rank)")
        if rank == d.hang_rank and step == d.hang_step:
            log.warning("rank %d hangs at step %d (debug.hang_rank)", rank, step)
            while True:
                time.sleep(3600)
        if rank == d.slow_rank:
            time.sleep(d.slow_s)
        if rank == d.delay_rank and step == 1:
            time.sleep(d.delay_s)
        if rank == d.signal_rank and step == d.signal_step:
            os.kill(os.getpid(), self.signal)

    def after_forward(self, step: int, out):
        """``step``'s StepResult, its loss made NaN where ``debug.nan_rank`` asks (a diverging run)."""
        if self.rank == self.d.nan_rank and step == self.d.nan_step:
            return dataclasses.replace(out, loss=out.loss * math.nan)
        return out
