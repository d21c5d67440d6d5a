"""From seed ids to PyG mini-batches: the per-rank seed schedule and the batch loader.

DDP needs every rank to run the same number of steps per epoch: a rank with
one batch more waits forever in its gradient all-reduce. The seed schedule
pads the shuffled seeds by wrapping around until they split evenly, so every
rank gets exactly ``ceil(num_seeds / world_size)`` seeds and the same step count.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import math
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch_geometric.data import Data

import hpcgnn.kernels.ops as ops
import hpcgnn.kernels.scheduler as scheduler
from hpcgnn import rng
from hpcgnn.clock import Clock
from hpcgnn.data.graph import Graph
from hpcgnn.data.typed import TypedGraph
from hpcgnn.sampling.neighbor import SampledSubgraph


def rank_seeds(seeds: Tensor, world_size: int, rank: int, generator: torch.Generator | None = None) -> Tensor:
    """This rank's share of ``seeds``; every rank's share has the same length.

    With a generator (seeded identically on every rank) the seeds are shuffled
    first; padding repeats the first few shuffled seeds, as DistributedSampler does.
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} outside world of size {world_size}")
    if seeds.numel() == 0:
        raise ValueError("no seeds to split")
    return shuffled_to(seeds, math.ceil(seeds.numel() / world_size) * world_size, generator)[rank::world_size]


def shuffled_to(seeds: Tensor, length: int, generator: torch.Generator | None = None) -> Tensor:
    """``seeds`` shuffled by ``generator`` (None: in order), repeated from the start up to ``length``."""
    order = seeds[torch.randperm(seeds.numel(), generator=generator)] if generator is not None else seeds
    return order.repeat(math.ceil(length / max(order.numel(), 1)))[:length]


def steps_per_epoch(num_seeds: int, world_size: int, batch_size: int) -> int:
    """Steps every rank runs per epoch for ``num_seeds`` seeds."""
    return math.ceil(math.ceil(num_seeds / world_size) / batch_size)


class LocalFeatures:
    """Features and labels of a graph this process holds whole (replicated mode), on the host or a GPU."""

    def __init__(self, graph: Graph):
        self.graph = graph

    def gather(self, n_id: Tensor, batch_size: int, pin_memory: bool = False, alloc=None) -> tuple[Tensor, Tensor]:
        """Rows ``n_id`` of the features and labels, where the graph lives (every node's label: a whole graph's
        batches carry them all, though the loss reads the first ``batch_size``, the seeds'; a partitioned rank's
        carry the seeds' alone); ``pin_memory``: straight into page-locked buffers (a host graph bound for a GPU), so
        the copy can run asynchronously; ``alloc(shape, dtype)``: the features straight into memory it hands out (a
        sampler process's shared slot)."""
        g = self.graph
        n_id = n_id.to(g.x.device)
        if alloc is not None:  # upcast on the way in (features stored as float16/bfloat16), as below
            x = ops.gather_rows(g.x, n_id, alloc((n_id.numel(), *g.x.shape[1:]), torch.float32))
            return x, (g.y.index_select(0, n_id) if g.y.numel() else g.y)
        x = gather_rows(g.x, n_id, pin_memory, torch.float32)  # features stored as float16/bfloat16: upcast per batch
        y = gather_rows(g.y, n_id, pin_memory) if g.y.numel() else g.y  # a link graph has no labels
        return x, y

    def gather_edges(self, e_id: Tensor, pin_memory: bool = False, alloc=None) -> Tensor:
        """Rows ``e_id`` of the edges' features (their CSR positions), as float32 (``alloc``: into its memory)."""
        g = self.graph
        e_id = e_id.to(g.edge_attr.device)
        if alloc is not None:
            return ops.gather_rows(g.edge_attr, e_id, alloc((e_id.numel(), g.edge_attr.size(1)), torch.float32))
        return gather_rows(g.edge_attr, e_id, pin_memory, torch.float32)


class LocalTypedFeatures:
    """Features and labels of a typed graph this process holds whole, per node type (replicated mode)."""

    gathers_pinned = True  # gather_types(..., pin_memory): rows straight into page-locked buffers

    def __init__(self, graph: TypedGraph):
        self.graph, self.target = graph, graph.target
        self.edge_relations = tuple(graph.edge_attr or ())  # the relations whose edges have features

    def gather_edges(self, rel, e_id: Tensor, pin_memory: bool = False) -> Tensor:
        """Rows ``e_id`` of ``rel``'s edge features (their places in its CSR), as float32."""
        rows = self.graph.edge_attr[rel]
        return gather_rows(rows, e_id.to(rows.device), pin_memory, torch.float32)

    def gather_types(self, n_id: dict[str, Tensor], batch_size: int,
                     pin_memory: bool = False) -> tuple[dict[str, Tensor], Tensor]:
        """:meth:`TypedGraph.gather_types`, each type's rows by :func:`gather_rows` (``pin_memory``: straight into
        page-locked buffers, as a homogeneous batch's)."""
        g = self.graph
        x = {t: gather_rows(g.x[t], ids.to(g.x[t].device), pin_memory, torch.float32) for t, ids in n_id.items()}
        return x, gather_rows(g.y, n_id[g.target][:batch_size].to(g.y.device), pin_memory)


def gather_rows(src: Tensor, index: Tensor, pin_memory: bool = False, dtype: torch.dtype | None = None) -> Tensor:
    """``src.index_select(0, index)``, as ``dtype`` (default ``src``'s): on the host by the C kernels where they are
    (each row asked for from memory ahead of its copy; bfloat16 or float16 rows widened to float32 in the same pass:
    :func:`hpcgnn.kernels.ops.gather_rows`); with ``pin_memory`` written into a page-locked buffer from the
    CUDA host allocator's cache, with no second copy."""
    dtype = dtype or src.dtype
    if src.is_cuda:
        return src.index_select(0, index).to(dtype)
    out = torch.empty((index.numel(), *src.shape[1:]), dtype=dtype, pin_memory=pin_memory)
    return ops.gather_rows(src, index, out)


@dataclass(frozen=True)
class Drawn:
    """A batch sampled, its features not yet gathered: the subgraph and the clock marks around its sampling."""

    out: Any  # SampledSubgraph, or a typed sampler's TypedSubgraph
    start: Any
    end: Any


@dataclass(frozen=True)
class EpochPlan:
    """One walk's description, made once and handed to whichever producer makes its batches: each batch's seeds
    (``batches``, then empty ones up to ``num_batches``: a rank with fewer seeds still takes part in every
    collective of a distributed sampler), the seed of each batch's own generator (``rng.generator(batch_seed,
    i)``), the batches' weights in a step's loss (``sizes``, of every batch, also those skipped) and the first
    batch to make (``start``: an exact resume)."""

    batches: tuple[Tensor, ...]
    empty: Tensor
    num_batches: int
    sizes: tuple[int, ...]
    batch_seed: int | None = None
    start: int = 0

    @classmethod
    def cut(cls, seeds: Tensor | list[Tensor], batch_size: int | None = None, *, batch_seed: int | None = None,
            start: int = 0, num_batches: int | None = None, weigh_by_seeds: bool = True) -> EpochPlan:
        """``seeds`` cut into batches of ``batch_size``, or the list of batches itself (e.g. cut by an edge budget);
        ``weigh_by_seeds``: a batch weighs its seeds (False: every batch 1, a subgraph batch is a whole estimate)."""
        if isinstance(seeds, (list, tuple)):
            batches, empty = list(seeds), (seeds[0][:0] if seeds else torch.empty(0, dtype=torch.long))
        else:
            batches, empty = list(seeds.split(batch_size)) if seeds.numel() else [], seeds[:0]
        total = max(num_batches or 0, len(batches))
        sizes = [b.numel() if weigh_by_seeds else 1 for b in batches] + [0] * (total - len(batches))
        return cls(tuple(batches), empty, total, tuple(sizes), batch_seed, start)

    def __len__(self) -> int:
        return self.num_batches - self.start

    def seeds(self, i: int) -> Tensor:
        return self.batches[i] if i < len(self.batches) else self.empty

    def jobs(self) -> list[tuple[int, np.ndarray]]:
        """(index, seeds) of the batches to make, in order: what a producer outside the rank is sent."""
        return [(i, self.seeds(i).numpy()) for i in range(self.start, self.num_batches)]


class BatchLoader:
    """Yields one PyG ``Data`` per batch of seeds: sampled subgraph, features and labels.

    Where batches are born. ``Data`` fields: ``x``, ``edge_index``, ``y`` (labels; at least of
    the seeds), ``n_id``, ``batch_size`` (seeds are the first nodes), ``num_sampled_nodes`` and
    ``num_sampled_edges`` (per hop, for ``trim_to_layer``), ``node_weight`` (GraphSAINT),
    ``edge_weight`` (from ``transform``, e.g. GCN's global normalisation), and how long the
    batch's making took: ``sample_s``, ``gather_s`` (on the host) and ``h2d`` (the copy to the
    device, as two clock marks: see :class:`hpcgnn.clock.Clock`).

    ``seeds``: cut into batches of ``batch_size``, or the list of batches itself, or an epoch's
    :class:`EpochPlan` (then its own batch seeds, start and sizes). ``sampler``:
    anything with ``sample(items, generator) -> SampledSubgraph``. ``features``: a Graph, or
    anything with ``gather(n_id, batch_size) -> (x, y)`` (the partitioned store fetches remote
    rows there); a typed sampler's batches (``TypedSubgraph``, per-type ids) become ``HeteroData``
    and need features with ``gather_types`` (a TypedGraph, or a partitioned rank's). ``num_batches``: yield empty batches after the seeds run out until there
    were this many, so that ranks with fewer seeds still take part in every collective of a
    distributed sampler. ``weigh_by_seeds``: :attr:`sizes` counts a batch's seeds (its share of
    a step's loss); False counts every batch as 1 (a subgraph batch is a whole estimate).

    Randomness: one ``generator`` for the whole walk, or ``batch_seed``: batch i samples with
    its own generator ``rng.generator(batch_seed, i)``, so any batch can be re-made without
    the ones before it; ``start`` skips the first batches (an exact resume).
    """

    def __init__(self, features, sampler, seeds: Tensor | list[Tensor] | EpochPlan, batch_size: int | None = None, *,
                 generator: torch.Generator | None = None, batch_seed: int | None = None, start: int = 0,
                 num_batches: int | None = None, device: torch.device | None = None, pin_memory: bool = False,
                 transform: Callable[[SampledSubgraph], SampledSubgraph] | None = None, weigh_by_seeds: bool = True):
        self.features = LocalFeatures(features) if isinstance(features, Graph) else \
            LocalTypedFeatures(features) if isinstance(features, TypedGraph) else features
        self.sampler = sampler
        self.plan = seeds if isinstance(seeds, EpochPlan) else \
            EpochPlan.cut(seeds, batch_size, batch_seed=batch_seed, start=start, num_batches=num_batches,
                          weigh_by_seeds=weigh_by_seeds)
        self.generator, self.device, self.pin_memory, self.transform = generator, device, pin_memory, transform

    def __len__(self) -> int:
        return len(self.plan)

    @property
    def sizes(self) -> tuple[int, ...]:
        return self.plan.sizes

    @property
    def graph_device(self) -> torch.device:
        """Where batches are made: the sampler's graph's device (:class:`hpcgnn.sampling.protocol.Sampler`)."""
        return self.sampler.device

    @functools.cached_property
    def clock(self) -> Clock:
        return Clock(self.graph_device)

    def __iter__(self) -> Iterator[Data]:
        for data in self.host_batches():
            yield to_device(data, self.device)

    def host_batches(self) -> Iterator[Data]:
        """The batches in order, still on the host."""
        for drawn in self.drawn_batches():
            yield self.assemble(drawn)

    def drawn_batches(self) -> Iterator[Drawn]:
        """The sampled subgraphs in order, features not yet gathered (:meth:`assemble` does)."""
        plan = self.plan
        for i in range(plan.start, plan.num_batches):
            yield self.draw(plan.seeds(i), self.batch_generator(i))

    @property
    def two_stage(self) -> bool:
        """Whether sampling and gathering may run in two threads (:class:`PrefetchLoader`): the graph is on
        the host and the gather reads this process's memory only. A partitioned rank's gather and sampling
        both run collectives, whose order must be the same on every rank: they stay in one thread."""
        return self.graph_device.type == "cpu" and isinstance(self.features, (LocalFeatures, LocalTypedFeatures))

    def batch_generator(self, i: int) -> torch.Generator | None:
        if self.plan.batch_seed is None:
            return self.generator
        return rng.generator(self.plan.batch_seed, i, device=self.graph_device)

    def sample(self, seeds: Tensor, generator: torch.Generator | None = None, alloc=None) -> Data:
        """One batch where the graph lives (the host, or the GPU of a device graph): sampled subgraph,
        gathered features and labels; ``data.sample`` and ``data.gather``: clock marks around both. ``alloc``:
        where a whole graph's feature rows go (see :meth:`LocalFeatures.gather`)."""
        return self.assemble(self.draw(seeds, generator), alloc)

    def draw(self, seeds: Tensor, generator: torch.Generator | None = None) -> Drawn:
        """A batch's sampled subgraph (transformed), and the clock marks around its making."""
        clock = self.clock
        m0 = clock.mark()
        out = self.sampler.sample(seeds, generator if generator is not None else self.generator)
        if self.transform is not None:
            out = self.transform(out)
        return Drawn(out, m0, clock.mark())

    def assemble(self, drawn: Drawn, alloc=None) -> Data:
        """The batch of a sampled subgraph: its features and labels gathered (``alloc``: see :meth:`sample`)."""
        clock, out, m0, m1 = self.clock, drawn.out, drawn.start, drawn.end
        g0 = clock.mark()  # not m1: a batch sampled in another thread may wait between the two stages
        if isinstance(out, Data):  # made whole by its sampler (a graph set's whole graphs: nothing to gather)
            out.sample, out.gather = (m0, m1), (g0, clock.mark())
            return out
        if isinstance(out.n_id, dict):  # a typed batch: HeteroData, features per node type
            from hpcgnn.sampling.typed import to_hetero_data

            data = to_hetero_data(self.features, out, self.pin_memory)
            data.sample, data.gather = (m0, m1), (g0, clock.mark())
            return data
        x, y = gather_features(self.features, out.n_id, out.batch_size, self.pin_memory, alloc)
        data = Data(x=x, edge_index=out.edge_index, y=y, n_id=out.n_id, batch_size=out.batch_size)
        if out.e_id is not None:  # the model reads the edges' features: each sampled edge's, by its CSR position
            data.edge_attr = self.features.gather_edges(out.e_id, self.pin_memory, alloc)
        data.sample, data.gather = (m0, m1), (g0, clock.mark())
        if out.num_sampled_nodes is not None:  # layered: the model may trim the outer hops
            data.num_sampled_nodes, data.num_sampled_edges = list(out.num_sampled_nodes), list(out.num_sampled_edges)
        if out.node_weight is not None:
            data.node_weight = out.node_weight
        if out.edge_age is not None:  # a timed graph's: each edge's age, for a model that reads it; each node's tree
            data.edge_age, data.tree = out.edge_age.float(), out.tree
        if out.edge_weight is not None:
            data.edge_weight = out.edge_weight
        for key, value in (out.targets or {}).items():
            if key == "edge_label_e_id":  # an edge task's targets: their own edges' features, for its decoder
                data.edge_label_attr = target_edge_features(self.features, value)
            else:
                data[key] = value
        return data


def target_edge_features(features, e_id: Tensor) -> Tensor:
    """Rows ``e_id`` of the edges' features as float32 (``features.gather_edges``), zeros where the id is -1 (a
    target pair that is no edge of the graph)."""
    rows = features.gather_edges(e_id.clamp(min=0))
    return rows.masked_fill_((e_id < 0).unsqueeze(1).to(rows.device), 0.0)


def gather_features(features, n_id: Tensor, batch_size: int, pin_memory: bool, alloc=None) -> tuple[Tensor, Tensor]:
    """``features.gather``: a local graph's rows where it lives (into pinned buffers, or ``alloc``'s, if asked),
    or a partitioned store's (fetched on the host, then pinned)."""
    if isinstance(features, LocalFeatures):
        return features.gather(n_id, batch_size, pin_memory, alloc)
    x, y = features.gather(n_id.cpu(), batch_size)
    return (x.pin_memory(), y.pin_memory()) if pin_memory else (x, y)


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


class DeviceCopy:
    """The one way a batch reaches the device, whichever producer made it (the rank's prefetch thread, its sampler
    processes, its sampler servers): copied on a side stream (high priority: its copies get the copy engine as
    soon as it frees, instead of queueing behind the training step), with an event the consumer's stream waits
    for; so on a GPU the copy of batch i + 1 overlaps the step on batch i. On the host: the batch as it is.

    ``copy(batch) -> (batch, ready)`` on the side stream (``ready``: its event, None on the host); ``hand_over(batch,
    ready)`` makes it safe on the current stream (it waits for the event; the batch's tensors are marked as used
    there, so the allocator keeps them until that stream is done); ``close()``: the side stream's last work comes
    before whatever the current stream does next."""

    def __init__(self, device: torch.device | None):
        self.device = device
        self.cuda = device is not None and device.type == "cuda"
        self.side = torch.cuda.Stream(device, priority=-1) if self.cuda else None
        if self.cuda:  # what the current stream did before (the sampler's scratch map, say) comes first
            self.side.wait_stream(torch.cuda.current_stream(device))

    def stream(self):
        """The side stream as the current one (a producer's thread works in it), or nothing on the host."""
        return torch.cuda.stream(self.side) if self.cuda else contextlib.nullcontext()

    def copy(self, batch):
        if not self.cuda:
            return to_device(batch, self.device), None
        with torch.cuda.device(self.device), torch.cuda.stream(self.side):
            batch = to_device(batch, self.device)
            ready = torch.cuda.Event()
            ready.record(self.side)
        return batch, ready

    def hand_over(self, batch, ready):
        if ready is None:
            return batch
        here = torch.cuda.current_stream(self.device)
        here.wait_event(ready)
        for store in batch.stores:  # one for Data; one per node type and relation for HeteroData
            for value in store.values():
                if isinstance(value, Tensor) and value.is_cuda:
                    value.record_stream(here)
        return batch

    def close(self) -> None:
        if self.cuda:
            torch.cuda.current_stream(self.device).wait_stream(self.side)


_END = object()
# The walks of PrefetchLoaders under way: their stop event and threads (see _stop_walks_left_open).
_walks: dict[int, tuple[threading.Event, list[threading.Thread]]] = {}


@atexit.register
def _stop_walks_left_open(timeout_s: float = 10.0) -> None:
    """At exit, stop the threads of walks left open (an iterator kept in a global to the end of a script) and
    wait for them. A daemon thread still inside torch when the interpreter ends is killed there, which aborts
    the process ("terminate called without an active exception", exit status 134: a finished job marked
    failed). Bounded: a thread stuck in a collective that another rank left is not waited for past ``timeout_s``."""
    walks = list(_walks.values())
    for stop, _ in walks:
        stop.set()
    deadline = time.monotonic() + timeout_s
    for _, threads in walks:
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))


class PrefetchLoader:
    """Runs a BatchLoader ``depth`` batches ahead in a background thread.

    Sampling and feature gathering for the next batches overlap the training step on
    the current one (torch's kernels release the GIL). The thread walks the loader
    exactly as a plain loop would, with the same generator, so the batches are the
    same. Where the loader allows it (:attr:`BatchLoader.two_stage`: a host graph whose
    features this process holds), a second thread samples the next batch while the
    first gathers this one's features (a typed batch of ogbn-mag's size on 2 cores, in
    benchmarks/hetero.py: 29.93-31.37 batches/s in one thread, 38.69-44.66 in two).
    On a GPU the gathering thread works on a stream of its own: a device graph's sampling
    kernels and a host batch's copy from pinned memory (non-blocking) overlap the
    training step's kernels on the default stream, which waits for each batch's
    ready event before using it (and marks its tensors as used there, so the caching
    allocator does not hand their memory to the thread too early).
    """

    def __init__(self, loader: BatchLoader, depth: int = 2):
        if depth < 1:
            raise ValueError("prefetch depth must be at least 1")
        self.loader, self.depth = loader, depth
        self.sizes = loader.sizes

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[Data]:
        yield from _Walk(self.loader, self.depth).batches()  # (set up at the first batch asked for, not before)


class InRank:
    """The rank's own batches (:class:`~hpcgnn.sampling.protocol.BatchSource`): each epoch's plan walked by a loader
    of the graph side's features and sampler, ``depth`` batches ahead in a :class:`PrefetchLoader` (0: made as the
    step asks for them), on ``device``."""

    def __init__(self, features, sampler, transform, device: torch.device, depth: int):
        self.features, self.sampler, self.transform, self.device, self.depth = features, sampler, transform, device, depth

    def start(self) -> None:
        pass

    def epoch(self, plan: EpochPlan) -> PrefetchLoader | BatchLoader:
        loader = BatchLoader(self.features, self.sampler, plan, device=self.device,
                             pin_memory=self.device.type == "cuda", transform=self.transform)
        return PrefetchLoader(loader, self.depth) if self.depth else loader

    def close(self, done: bool = False) -> None:
        pass


class _Walk:
    """One walk of a :class:`PrefetchLoader`: its threads, the queues between them, and the consumer's end.

    Two stages where they may (see BatchLoader.two_stage): one thread samples the next batch (:meth:`draw`)
    while another gathers this one's features (:meth:`work`), so a batch costs about the longer of the two,
    not their sum. The stages split the threads of the C kernels (sampling, the row gather) between them: two
    teams of all of them would take turns on the cores (typed batches on 2 cores, by hand: 35-39 batches/s with
    a team of 2 in each stage, 40-45 with one thread each). The sampling stage is the quicker one (a typed batch
    of ogbn-mag's size: ~16 ms of sampling, ~21 of gathering, one thread each, by hand): once its next batch is
    made and waits for room, the sampling thread takes chunks of the running gather (scheduler.GatherShare)
    instead of sleeping.
    """

    def __init__(self, loader: BatchLoader, depth: int):
        self.loader = loader
        self.q: queue.Queue = queue.Queue(maxsize=depth)  # the gathering thread -> the consumer
        self.drawn: queue.Queue = queue.Queue(maxsize=1)  # the sampling thread -> the gathering thread
        self.stop = threading.Event()
        self.device = loader.device
        self.cuda = self.device is not None and self.device.type == "cuda"
        # The side stream is high priority: the thread's small kernels (and the syncs between them) get SMs as
        # soon as they free up, instead of queueing behind the training step's large kernels.
        self.copies = DeviceCopy(self.device)
        budget = scheduler.threads()
        self.sample_threads = max(1, budget // 2)
        self.gather_threads = max(1, budget - self.sample_threads)
        self.share = scheduler.GatherShare()
        self.two_stage = loader.two_stage

    def put(self, item) -> bool:
        """``item`` into the consumer's queue, waiting for room unless the walk stops."""
        while not self.stop.is_set():
            try:
                self.q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def take(self) -> Iterator:
        """What :meth:`draw` handed on, in order, until its end (its exception raised here)."""
        while not self.stop.is_set():
            try:
                item = self.drawn.get(timeout=0.1)
            except queue.Empty:
                continue
            with self.share.changed:  # room for draw's next batch
                self.share.changed.notify_all()
            if item is _END:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    def hand_on(self, item) -> bool:
        """put(item, drawn), helping the running gather while there is no room for it."""
        share = self.share
        while not self.stop.is_set():
            try:
                self.drawn.put_nowait(item)
                return True
            except queue.Full:
                pass
            job = share.job
            if job is not None and share.help():
                continue
            with share.changed:  # woken when the next gather starts or the gathering thread takes a batch
                if share.job is job and self.drawn.full():
                    share.changed.wait(0.1)
        return False

    def draw(self) -> None:
        """The sampling thread (two stages only)."""
        scheduler.thread_budget(self.sample_threads)
        try:
            for item in self.loader.drawn_batches():
                if not self.hand_on(item):
                    return
            self.hand_on(_END)
        except BaseException as exc:  # handed to the gathering thread, which hands it on
            self.hand_on(exc)

    def work(self) -> None:
        """The gathering thread: whole batches (on a GPU: copied on the side stream, with their ready event)."""
        if self.two_stage:
            scheduler.thread_budget(self.gather_threads)
            scheduler.share_gathers(self.share)
        cuda, device = self.cuda, self.device
        try:
            with torch.cuda.device(device) if cuda else contextlib.nullcontext(), self.copies.stream():
                batches = (self.loader.assemble(item) for item in self.take()) if self.two_stage \
                    else self.loader.host_batches()
                for batch in batches:
                    if not self.put(self.copies.copy(batch) if cuda else (batch, None)):
                        return
            self.put(_END)
        except BaseException as exc:  # handed to the consumer, raised there
            self.put(exc)

    def batches(self) -> Iterator[Data]:
        """The consumer's end: the batches in order, each ready on the current stream; the threads stopped and
        joined however the walk ends (finished, broken off, or failed)."""
        threads = [threading.Thread(target=self.draw, name="hpcgnn-sample", daemon=True)] if self.two_stage else []
        threads.append(threading.Thread(target=self.work, name="hpcgnn-prefetch", daemon=True))
        _walks[id(self.stop)] = (self.stop, threads)
        for thread in threads:
            thread.start()
        device = self.device
        try:
            while True:
                item = self.q.get()
                if item is _END:
                    return
                if isinstance(item, BaseException):
                    raise item
                batch, ready = item
                yield to_device(batch, device) if ready is None else self.copies.hand_over(batch, ready)
        finally:
            self.stop.set()
            for thread in threads:
                thread.join()
            _walks.pop(id(self.stop), None)
            self.copies.close()  # the thread's last kernels come before whatever the default stream does next
