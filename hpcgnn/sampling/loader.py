"""From seed ids to PyG mini-batches: the per-rank seed schedule and the batch loader.

DDP needs every rank to run the same number of steps per epoch: a rank with
one batch more waits forever in its gradient all-reduce. The seed schedule
pads the shuffled seeds by wrapping around until they split evenly, so every
rank gets exactly ``ceil(num_seeds / world_size)`` seeds and the same step count.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import math
import queue
import threading
import time
from collections.abc import Callable, Iterator

import torch
from torch import Tensor
from torch_geometric.data import Data

from hpcgnn import rng
from hpcgnn.data.graph import Graph
from hpcgnn.metrics import Clock
from hpcgnn.sampling.neighbor import SampledSubgraph


@functools.cache
def keep_freed_memory() -> bool:
    """Let glibc's malloc reuse freed memory instead of handing it back to the kernel.

    Every batch allocates hundreds of MB (features of ~400k nodes, sampler temporaries).
    glibc serves blocks above 32 MB with a fresh mmap and unmaps them on free, so each
    batch page-faults its buffers in again, zeroed by the kernel: that costs more than
    the gather itself (85 ms vs 19 ms for 350k rows of 128 floats here). With mmap off
    and trimming effectively off, freed blocks are reused, at the price of the process
    keeping its high-water mark; what jemalloc or tcmalloc would do, without a dependency.
    Returns whether it took effect (glibc only).
    """
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        m_trim_threshold, m_mmap_max, m_arena_max = -1, -4, -8
        # One arena: blocks freed by the training thread serve the prefetch thread's next batch
        # (a thread's own arena could not grow past 64 MB without mmap).
        return all(libc.mallopt(opt, value) for opt, value in
                   ((m_mmap_max, 0), (m_trim_threshold, 2**40), (m_arena_max, 1)))
    except (OSError, AttributeError):
        return False


def rank_seeds(seeds: Tensor, world_size: int, rank: int, generator: torch.Generator | None = None) -> Tensor:
    """This rank's share of ``seeds``; every rank's share has the same length.

    With a generator (seeded identically on every rank) the seeds are shuffled
    first; padding repeats the first few shuffled seeds, as DistributedSampler does.
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} outside world of size {world_size}")
    if seeds.numel() == 0:
        raise ValueError("no seeds to split")
    order = seeds[torch.randperm(seeds.numel(), generator=generator)] if generator is not None else seeds
    per_rank = math.ceil(order.numel() / world_size)
    padded = order.repeat(math.ceil(per_rank * world_size / order.numel()))[: per_rank * world_size]
    return padded[rank::world_size]


def steps_per_epoch(num_seeds: int, world_size: int, batch_size: int) -> int:
    """Steps every rank runs per epoch for ``num_seeds`` seeds."""
    return math.ceil(math.ceil(num_seeds / world_size) / batch_size)


class LocalFeatures:
    """Features and labels of a graph this process holds whole (replicated mode)."""

    def __init__(self, graph: Graph):
        self.graph = graph

    def gather(self, n_id: Tensor, batch_size: int) -> tuple[Tensor, Tensor]:
        # index_select: a parallel row gather, markedly faster than advanced indexing for features
        y = self.graph.y.index_select(0, n_id) if self.graph.y.numel() else self.graph.y  # a link graph has no labels
        return self.graph.x.index_select(0, n_id), y


class BatchLoader:
    """Yields one PyG ``Data`` per batch of seeds: sampled subgraph, features and labels.

    Where batches are born. ``Data`` fields: ``x``, ``edge_index``, ``y`` (labels; at least of
    the seeds), ``n_id``, ``batch_size`` (seeds are the first nodes), ``num_sampled_nodes`` and
    ``num_sampled_edges`` (per hop, for ``trim_to_layer``), ``node_weight`` (GraphSAINT),
    ``edge_weight`` (from ``transform``, e.g. GCN's global normalisation), and how long the
    batch's making took: ``sample_s``, ``gather_s`` (on the host) and ``h2d`` (the copy to the
    device, as two clock marks: see :class:`hpcgnn.metrics.Clock`).

    ``seeds``: cut into batches of ``batch_size``, or the list of batches itself. ``sampler``:
    anything with ``sample(items, generator) -> SampledSubgraph``. ``features``: a Graph, or
    anything with ``gather(n_id, batch_size) -> (x, y)`` (the partitioned store fetches remote
    rows there). ``num_batches``: yield empty batches after the seeds run out until there
    were this many, so that ranks with fewer seeds still take part in every collective of a
    distributed sampler. ``weigh_by_seeds``: :attr:`sizes` counts a batch's seeds (its share of
    a step's loss); False counts every batch as 1 (a subgraph batch is a whole estimate).

    Randomness: one ``generator`` for the whole walk, or ``batch_seed``: batch i samples with
    its own generator ``rng.generator(batch_seed, i)``, so any batch can be re-made without
    the ones before it; ``start`` skips the first batches (an exact resume).
    """

    def __init__(self, features, sampler, seeds: Tensor | list[Tensor], batch_size: int | None = None, *,
                 generator: torch.Generator | None = None, batch_seed: int | None = None, start: int = 0,
                 num_batches: int | None = None, device: torch.device | None = None, pin_memory: bool = False,
                 transform: Callable[[SampledSubgraph], SampledSubgraph] | None = None, weigh_by_seeds: bool = True):
        self.features = LocalFeatures(features) if isinstance(features, Graph) else features
        self.sampler = sampler
        if isinstance(seeds, (list, tuple)):  # the batches themselves (e.g. cut by an edge budget)
            self.batches, self.empty = list(seeds), (seeds[0][:0] if seeds else torch.empty(0, dtype=torch.long))
        else:
            self.batches, self.empty = list(seeds.split(batch_size)) if seeds.numel() else [], seeds[:0]
        self.generator, self.device = generator, device
        self.pin_memory, self.batch_seed, self.start = pin_memory, batch_seed, start
        self.transform = transform
        self.num_batches = max(num_batches or 0, len(self.batches))
        self.sizes = [b.numel() if weigh_by_seeds else 1 for b in self.batches] + \
            [0] * (self.num_batches - len(self.batches))  # of every step of the walk, also those skipped

    def __len__(self) -> int:
        return self.num_batches - self.start

    def __iter__(self) -> Iterator[Data]:
        for data in self.host_batches():
            yield to_device(data, self.device)

    def host_batches(self) -> Iterator[Data]:
        """The batches in order, still on the host."""
        batches = self.batches + [self.empty] * (self.num_batches - len(self.batches))
        for i in range(self.start, self.num_batches):
            yield self.sample(batches[i], self.batch_generator(i))

    def batch_generator(self, i: int) -> torch.Generator | None:
        if self.batch_seed is None:
            return self.generator
        return rng.generator(self.batch_seed, i, device=self.sampler.rowptr.device)

    def sample(self, seeds: Tensor, generator: torch.Generator | None = None) -> Data:
        """One batch on the host: sampled subgraph, gathered features and labels."""
        t0 = time.perf_counter()
        out = self.sampler.sample(seeds, generator if generator is not None else self.generator)
        if self.transform is not None:
            out = self.transform(out)
        t1 = time.perf_counter()
        x, y = self.features.gather(out.n_id.cpu(), out.batch_size)
        if self.pin_memory:  # page-locked, so the copy to the GPU can run asynchronously
            x, y = x.pin_memory(), y.pin_memory()
        data = Data(x=x, edge_index=out.edge_index, y=y, n_id=out.n_id, batch_size=out.batch_size,
                    sample_s=t1 - t0, gather_s=time.perf_counter() - t1)
        if out.num_sampled_nodes is not None:  # layered: the model may trim the outer hops
            data.num_sampled_nodes, data.num_sampled_edges = list(out.num_sampled_nodes), list(out.num_sampled_edges)
        if out.node_weight is not None:
            data.node_weight = out.node_weight
        if out.edge_weight is not None:
            data.edge_weight = out.edge_weight
        for key, value in (out.targets or {}).items():
            data[key] = value
        return data


def to_device(data: Data, device: torch.device | None) -> Data:
    """The batch on ``device`` (non-blocking from pinned memory); ``data.h2d``: clock marks around the copy.

    On a GPU the marks are CUDA events on the current stream, so they time the copy itself,
    not its launch; the training step that follows waits for it in stream order.
    """
    clock = Clock(device)
    start = clock.mark()
    if device is not None and device.type != "cpu":
        data = data.to(device, non_blocking=True)
    data.h2d = (start, clock.mark())
    return data


_END = object()


class PrefetchLoader:
    """Runs a BatchLoader ``depth`` batches ahead in a background thread.

    Sampling and feature gathering for the next batches overlap the training step on
    the current one (torch's kernels release the GIL). The thread walks the loader
    exactly as a plain loop would, with the same generator, so the batches are the
    same; only the copy to the device happens here, in the consuming thread.
    """

    def __init__(self, loader: BatchLoader, depth: int = 2):
        if depth < 1:
            raise ValueError("prefetch depth must be at least 1")
        self.loader, self.depth = loader, depth
        self.sizes = loader.sizes

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[Data]:
        q: queue.Queue = queue.Queue(maxsize=self.depth)
        stop = threading.Event()
        device = self.loader.device

        def put(item) -> bool:
            while not stop.is_set():
                try:
                    q.put(item, timeout=0.1)
                    return True
                except queue.Full:
                    continue
            return False

        def work() -> None:
            try:
                for batch in self.loader.host_batches():
                    if not put(batch):
                        return
                put(_END)
            except BaseException as exc:  # handed to the consumer, raised there
                put(exc)

        thread = threading.Thread(target=work, name="hpcgnn-prefetch", daemon=True)
        thread.start()
        try:
            while True:
                item = q.get()
                if item is _END:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield to_device(item, device)
        finally:
            stop.set()
            thread.join()
