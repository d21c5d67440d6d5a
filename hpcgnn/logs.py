"""Where hpcgnn's log lines go, for every kind of process (a rank, a sampler server, a prepare or a partition), and
the periodic lines of a long step.
"""

from __future__ import annotations

import logging
import sys
import time


def setup_logging(label: str, main: bool) -> None:
    """hpcgnn's loggers write to the process's stdout, each line marked ``[label]``; the main process (rank 0, a
    prepare) tells the story, the others warn only."""
    logger = logging.getLogger("hpcgnn")
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter(f"%(asctime)s [{label}] %(message)s", datefmt="%H:%M:%S"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO if main else logging.WARNING)
    logger.propagate = False


def _count(n: float) -> str:
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if n >= div:
            return f"{n / div:.1f}{suffix}"
    return f"{n:.0f}"


class Progress:
    """How far a long step is (reading a graph's edges, sorting its buckets): a log line every ``every_s`` seconds
    (none for a step shorter than that), with the count, the share of the expected total, the time and the rate,
    on a terminal and in a job's log alike."""

    def __init__(self, what: str, total: float, unit: str, every_s: float = 10.0,
                 log: logging.Logger | None = None):
        self.what, self.total, self.unit, self.every_s = what, max(total, 1), unit, every_s
        self.log = log or logging.getLogger("hpcgnn.progress")
        self.done = 0
        self.t0 = self.last = time.monotonic()

    def advance(self, n: float) -> None:
        self.done += n
        now = time.monotonic()
        if now - self.last >= self.every_s:
            self.last = now
            self.log.info("%s: %s of ~%s %s (%.0f%%) in %.0f s, %s/s", self.what, _count(self.done),
                          _count(self.total), self.unit, min(100.0, 100 * self.done / self.total), now - self.t0,
                          _count(self.done / (now - self.t0)))

    def finish(self) -> None:
        """A last line, where earlier ones were written."""
        now = time.monotonic()
        if now - self.t0 >= self.every_s:
            self.log.info("%s: %s %s in %.0f s", self.what, _count(self.done), self.unit, now - self.t0)
