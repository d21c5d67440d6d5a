"""How many threads the C kernels run on, and who helps whom: a thread's budget (two loader stages split the rank's
threads instead of each starting a team of all of them), the chunks a kernel's threads take in turn, and a row gather
that another thread may help with (:class:`GatherShare`)."""

from __future__ import annotations

import threading

import torch
from torch import Tensor

from hpcgnn.kernels.binding import kernels, ptr

CHUNK = 4096  # items per chunk of work (at most MAX_CHUNKS chunks), which the kernels' threads take in turn
MAX_CHUNKS = 256
_budget = threading.local()


def threads() -> int:
    """Threads a kernel called from this thread runs on: this thread's budget (:func:`thread_budget`), else
    torch's thread count."""
    return getattr(_budget, "threads", None) or torch.get_num_threads()


def thread_budget(n: int | None) -> None:
    """The kernels called from this thread from now on run on ``n`` threads (None: torch's count). Two
    loader stages running at once (sampling, gathering) split the rank's threads this way instead of each
    starting a team of all of them."""
    _budget.threads = n


class GatherShare:
    """Row gathers that another thread may help with: the gathering thread of a two-stage loader hands each of
    its row gathers here while it runs (:func:`share_gathers`), and the sampling thread, its next batch made
    and waiting for room, takes chunks of it (:meth:`help`). The stages then meet where their times differ
    (a typed batch's gather takes longer than its sampling), with no thread more than the cores."""

    def __init__(self) -> None:
        self.job: Tensor | None = None  # the running gather's job buffer (C's struct job), or None
        self.changed = threading.Condition()  # notified when a gather starts, and by the caller when room opens

    def help(self) -> int:
        """Chunks of the running gather until none is left; how many this thread did (0: none was left, or
        no gather is running)."""
        job = self.job  # held here: the buffer lives while this thread may still read it
        return 0 if job is None else int(kernels().hpcgnn_job_help(ptr(job)))

    def _run(self, job: Tensor, fn, *args) -> int:
        with self.changed:
            self.job = job
            self.changed.notify_all()
        try:
            return fn(*args, ptr(job))
        finally:
            self.job = None


def shared_gather() -> GatherShare | None:
    """Where this thread's row gathers are handed while they run (:func:`share_gathers`), or None."""
    return getattr(_budget, "share", None)


def share_gathers(share: GatherShare | None) -> None:
    """Row gathers called from this thread from now on are handed to ``share`` while they run (None: not)."""
    _budget.share = share


def chunks_for(n: int) -> int:
    return max(1, min(MAX_CHUNKS, n // CHUNK))

