"""What a rank and the producers of its batches say to each other: one small frozen dataclass per kind.

The same messages travel over both transports: a pipe to a sampler process of the rank's own
(:mod:`hpcgnn.sampling.procs`: batches written into shared slots the rank grants) and a socket to a sampler
server (:mod:`hpcgnn.sampling.server`: each batch's bytes after its message, once both ends proved they hold the
run's secret). ``kind`` names a message in errors ("before the rank could send it 'epoch'").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar


@dataclass(frozen=True)
class Hello:
    """Trainer -> server, first: who it is and what to make its batches with."""

    kind: ClassVar[str] = "hello"
    rank: int
    recipe: str  # the SHA-256 of its recipe, which it wrote into the run folder (shipping.publish)
    depth: int  # batches in flight
    group: dict | None  # a partitioned graph: the sampler group's rendezvous (the server relays a sampler process)


@dataclass(frozen=True)
class Ready:
    """Producer -> rank: started (its sampler built, its group joined)."""

    kind: ClassVar[str] = "ready"


@dataclass(frozen=True)
class Epoch:
    """Rank -> producer: batches to make, ``(index, seeds as a numpy array)`` in index order."""

    kind: ClassVar[str] = "epoch"
    batch_seed: int
    jobs: list


@dataclass(frozen=True)
class Grant:
    """Rank -> sampler process: batch ``index`` may be written into slot ``slot``."""

    kind: ClassVar[str] = "grant"
    index: int
    slot: int


@dataclass(frozen=True)
class Slot:
    """Rank -> every sampler process: slot ``slot`` is now ``tensor`` (grown; shared memory)."""

    kind: ClassVar[str] = "slot"
    slot: int
    tensor: Any


@dataclass(frozen=True)
class Grow:
    """Sampler process -> rank: batch ``index`` needs ``needed`` bytes, more than slot ``slot`` holds."""

    kind: ClassVar[str] = "grow"
    index: int
    slot: int
    needed: int


@dataclass(frozen=True)
class Batch:
    """Producer -> rank: batch ``index`` is made: its layout (``meta``: shipping.pack's), in slot ``slot`` (a
    sampler process) or in the bytes that follow (a server: ``slot`` -1), and the exchange counts it added."""

    kind: ClassVar[str] = "batch"
    index: int
    meta: Any
    delta: Any = None
    slot: int = -1


@dataclass(frozen=True)
class Free:
    """Trainer -> server: the slot a batch came into is copied out: one more batch may be in flight."""

    kind: ClassVar[str] = "free"
    slot: int


@dataclass(frozen=True)
class Stop:
    """Rank -> producer: no more batches (a server: this trainer is done and will not come back)."""

    kind: ClassVar[str] = "stop"


@dataclass(frozen=True)
class Failed:
    """Producer -> rank: it raised making batch ``index`` (-1: at its start)."""

    kind: ClassVar[str] = "error"
    index: int
    line: str
    trace: str
