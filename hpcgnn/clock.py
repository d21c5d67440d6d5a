"""Marks on the device's timeline, read later: how the loader and the trainer time their phases without
waiting for a GPU (:class:`hpcgnn.rank.metrics.StepMetrics` reads them on logging steps)."""

from __future__ import annotations

import time

import torch


class Clock:
    """Marks on the device's timeline: CUDA events on a GPU, host time elsewhere.

    Recording an event does not wait for the GPU; the time between two marks is read later
    (:meth:`seconds`), on logging steps, after one wait for the last mark. So a step's phases
    cost no host-device synchronisation, and on a GPU they time the work itself, not its launch.
    """

    def __init__(self, device: torch.device | None):
        self.cuda = device is not None and device.type == "cuda"

    def mark(self):
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    @staticmethod
    def seconds(start, end) -> float:
        if isinstance(start, float):
            return end - start
        return start.elapsed_time(end) / 1000.0

    @staticmethod
    def wait(mark) -> None:
        """Until the work before ``mark`` is done (a GPU sync; nothing on the host clock)."""
        if not isinstance(mark, float):
            mark.synchronize()
