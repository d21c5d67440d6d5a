"""Uniform neighbour sampling over CSR, hop by hop, vectorised with torch ops.

Per hop, every frontier node keeps all of its neighbours when it has at most
``fanout`` of them, and a uniform sample of ``fanout`` distinct ones otherwise.
Nodes are numbered locally in the order they are first reached: the seeds
first, then the nodes new at hop 1, then at hop 2, ... Edges are grouped by
hop, so PyG's ``trim_to_layer`` can drop the outer hops layer by layer.

:class:`CSRNeighborSampler` is also a PyG sampler (``BaseSampler.sample_from_nodes``
returning PyG's ``SamplerOutput``), so it plugs into ``torch_geometric.loader.NodeLoader``;
hpcgnn's own loader calls :meth:`CSRNeighborSampler.sample` and gets a :class:`SampledSubgraph`.
"""

from __future__ import annotations

import functools
import inspect
import threading
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor
from torch_geometric.sampler import BaseSampler, NodeSamplerInput, SamplerOutput

import hpcgnn.kernels.binding as binding
import hpcgnn.kernels.hashtable as hashtable
import hpcgnn.kernels.ops as ops
import hpcgnn.kernels.twins as twins


@dataclass(frozen=True)
class SampledSubgraph:
    """One sampled mini-batch subgraph, in local ids."""

    n_id: Tensor  # int64 [num_nodes], global id of each local node; seeds first
    edge_index: Tensor  # int64 [2, num_edges], (source, target) in local ids, grouped by hop
    batch_size: int  # the first batch_size nodes of n_id are the seeds (the loss targets)
    num_sampled_nodes: tuple[int, ...] | None = None  # nodes added per hop, seeds as hop 0 (None: not layered)
    num_sampled_edges: tuple[int, ...] | None = None  # edges added per hop, hop 1 first
    node_weight: Tensor | None = None  # float [batch_size]: loss weight of each seed (None: a plain mean)
    edge_weight: Tensor | None = None  # float [num_edges]: per-edge weights a model asked for (GCN's normalisation)
    targets: dict | None = None  # what a task scores besides the seeds (link prediction: the pairs and labels)
    absent_in_degree: Tensor | None = None  # int [num_nodes]: in-edges of the graph the batch leaves out (a link step's target edges), not counted in the degrees GCN normalises by
    e_id: Tensor | None = None  # int64 [num_edges]: each edge's position in the graph's CSR (its features' row), where asked for
    edge_age: Tensor | None = None  # [num_edges]: a timed graph's: each edge's age as of its tree's time (its seed's)
    tree: Tensor | None = None  # int64 [num_nodes]: a timed graph's: each node's tree (its seed's place in the batch)


class OneBatchAtATime:
    """A sampler's guard: its scratch (id maps, marks) holds one batch at a time, so a second batch begun while
    one is being made, in another thread, would mix the two silently. It is refused instead, naming the fix.
    Pickles as a fresh guard (a sampler shipped to another process)."""

    def __init__(self):
        self._lock = threading.Lock()

    def __enter__(self) -> None:
        if not self._lock.acquire(blocking=False):
            raise RuntimeError("this sampler is making a batch in another thread: its id maps hold one batch at a "
                               "time; give each thread its own sampler")

    def __exit__(self, *exc) -> None:
        self._lock.release()

    def __getstate__(self) -> dict:
        return {}

    def __setstate__(self, state: dict) -> None:
        self.__init__()


class IdMap:
    """Global -> batch-local ids of the batch being made; subclasses hold them (``fresh``, ``put``, ``get``)."""

    device: torch.device | str | None

    def get_into(self, ids: Tensor, out: Tensor) -> Tensor:
        """``get(ids)`` written into ``out`` (a slice of a batch's edge index)."""
        return out.copy_(self.get(ids))

    def add_new(self, candidates: list[Tensor], total: int) -> Tensor:
        """The distinct candidates not in the map, sorted, put as ``total``, ``total + 1``, ..."""
        new = self.fresh(torch.cat(candidates) if len(candidates) > 1 else candidates[0])
        self.put(new, torch.arange(total, total + new.numel(), device=self.device))
        return new


class DenseIdMap(IdMap):
    """Global -> batch-local ids in an array over every id: one gather per lookup (a replicated rank,
    which holds the whole graph anyway). ``get`` answers -1 for ids outside the batch: the table's own
    entries are -1 there on torch ops; with the C kernels a state byte per id says which are held, and
    the table's entries outside them are stale, never read."""

    # ``fresh`` scans the whole table (instead of sorting the ids) while it holds at most this many entries per id.
    SCAN_PER_ID = 8

    def __init__(self, size: int, device: torch.device | str | None = None):
        self.table = torch.full((size,), -1, dtype=torch.long, device=device)
        self.device = self.table.device
        self._mark: Tensor | None = None  # bool [size], all False between calls to fresh
        # uint8 [size] of the C kernels (ops.number_new): 2 where an id is in the map, else 0 between calls.
        # Once it exists it says which ids are in the map, and the table is no longer cleared between batches
        # (a fill of 8 bytes per id: ~1 ms a typed batch of ogbn-mag's size), only the state is.
        self._state: Tensor | None = None

    def __getstate__(self) -> dict:
        """An empty map of the same size (a sampler shipped to a sampler process): not the table's bytes."""
        return {"size": self.table.numel(), "device": self.device}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["size"], state["device"])

    def get(self, ids: Tensor) -> Tensor:
        return self._lookup(ids, None)

    def get_into(self, ids: Tensor, out: Tensor) -> Tensor:
        return self._lookup(ids, out)

    def _lookup(self, ids: Tensor, out: Tensor | None) -> Tensor:
        if self._state is not None:  # the state says which entries are held (the others are stale); in C where it can
            get = ops.dense_get if out is None or out.is_contiguous() else twins.dense_get
            return get(self.table, self._state, ids, out)
        found = self.table.index_select(0, ids)
        return found if out is None else out.copy_(found)

    def fresh(self, ids: Tensor) -> Tensor:
        """The distinct ids not in the map, sorted (what ``torch.unique`` of them gives). Many ids against a small
        table: mark them and scan the table, which comes out sorted with no sort (an outer hop, ~1M ids)."""
        if ids.numel() * self.SCAN_PER_ID < self.table.numel():
            return torch.unique(ids[self.get(ids) < 0])
        if self._mark is None:
            self._mark = torch.zeros(self.table.numel(), dtype=torch.bool, device=self.table.device)
        mark = self._mark
        mark.index_fill_(0, ids, True)
        absent = self.table < 0 if self._state is None else self._state == 0
        out = torch.logical_and(mark, absent, out=mark).nonzero().squeeze(1)
        mark.zero_()
        return out

    def put(self, ids: Tensor, local: Tensor) -> None:
        self.table[ids] = local
        if self._state is not None:
            self._state[ids] = 2

    def add_new(self, candidates: list[Tensor], total: int) -> Tensor:
        """:meth:`IdMap.add_new`, in one pass of C on the host where the kernels are (hpcgnn.kernels.ops)."""
        if not binding.usable(self.table):
            return super().add_new(candidates, total)
        if self._state is None:  # the first time: the ids put so far (the seeds) in the state too
            self._state = (self.table >= 0).to(torch.uint8).mul_(2)
        return ops.number_new(self.table, self._state, candidates, total)

    def clear(self, ids: Tensor) -> None:
        """Forget the batch: ``ids`` are every id put since the last clear. Where the state says which ids are
        in the map, only it is cleared (the table's entries go stale: nothing reads them past the state): a byte
        per id, so one fill of it is worth scattered writes to 8x as few ids as the table's."""
        held = self.table if self._state is None else self._state
        if ids.numel() * self.SCAN_PER_ID * (8 // held.element_size()) < self.table.numel():
            held[ids] = -1 if self._state is None else 0
        else:  # a batch over much of the graph: one sequential fill beats scattered writes
            held.fill_(-1 if self._state is None else 0)


class SortedIdMap(IdMap):
    """Global -> batch-local ids of one batch as a sorted array: memory in proportion to the batch, not to
    the graph (a partitioned rank holds nothing of the graph's size). Lookups are binary searches."""

    def __init__(self, device: torch.device | str | None = None):
        self.device = device
        self.clear(None)

    def __len__(self) -> int:
        return self.keys.numel()

    def get(self, ids: Tensor) -> Tensor:
        if self.keys.numel() == 0:
            return torch.full_like(ids, -1)
        pos = torch.searchsorted(self.keys, ids).clamp_(max=self.keys.numel() - 1)
        return torch.where(self.keys.index_select(0, pos) == ids, self.values.index_select(0, pos), -1)

    def fresh(self, ids: Tensor) -> Tensor:
        """The distinct ids not in the map, sorted."""
        return torch.unique(ids[self.get(ids) < 0])

    def put(self, ids: Tensor, local: Tensor) -> None:
        """Add ``ids`` (distinct, not in the map yet)."""
        keys = torch.cat([self.keys, ids])
        order = torch.argsort(keys)
        self.keys, self.values = keys.index_select(0, order), torch.cat([self.values, local]).index_select(0, order)

    def clear(self, ids: Tensor | None) -> None:
        self.keys = torch.empty(0, dtype=torch.long, device=self.device)
        self.values = torch.empty(0, dtype=torch.long, device=self.device)


class BatchIdMap(IdMap):
    """Global -> batch-local ids in memory that follows the batch, not the graph (a partitioned rank's):
    a hash table in C where the kernels are (:class:`hpcgnn.kernels.hashtable.HashTable`), else sorted
    arrays (:class:`SortedIdMap`); the same ids either way. Chosen per process: a sampler pickled to a
    sampler process (maybe on a node with no C compiler) chooses there, the map being empty between batches."""

    def __init__(self, device: torch.device | str | None = None):
        self.device = torch.device(device if device is not None else "cpu")
        self._choose()

    def _choose(self) -> None:
        cpu = self.device.type == "cpu"
        self.impl = hashtable.HashTable() if cpu and binding.kernels() is not None else SortedIdMap(self.device)

    def __getstate__(self) -> dict:
        return {"device": self.device}

    def __setstate__(self, state: dict) -> None:
        self.device = state["device"]
        self._choose()

    def __len__(self) -> int:
        """Ids held (0 between batches)."""
        return len(self.impl)

    def get(self, ids: Tensor) -> Tensor:
        return self.impl.get(ids)

    def put(self, ids: Tensor, local: Tensor) -> None:
        self.impl.put(ids, local)

    def add_new(self, candidates: list[Tensor], total: int) -> Tensor:
        return self.impl.add_new(candidates, total)

    def clear(self, ids: Tensor | None) -> None:
        self.impl.clear(ids)


@functools.cache
def takes_out(hop) -> bool:
    """Whether a sampler's ``hop`` (or ``draw``) takes ``out`` (a subclass's own may not)."""
    return "out" in inspect.signature(hop).parameters


class LastHop:
    """A walk's edge index, its last hop sampled straight into it (its rows are most of a batch's edges): :meth:`out`
    hands the sampler views of an edge index with room for the earlier hops' edges before them, so that only those
    are copied in (:meth:`edge_index`), not the last hop's too. A hop that wrote its edges elsewhere (a subclass that
    samples on other ranks) gets a new edge index, every hop's targets copied in. Both walks (the typed one per
    relation) make their edge index here."""

    def __init__(self, device: torch.device):
        self.device = device
        self.index: Tensor | None = None

    def out(self, before: int) -> Callable[[int], tuple[Tensor, Tensor]]:
        """``sample_neighbors``' ``out`` for the last hop, after ``before`` edges of the earlier hops."""
        def place(slots: int) -> tuple[Tensor, Tensor]:
            self.index = torch.empty(2, before + slots, dtype=torch.long, device=self.device)
            return self.index[1, before:], self.index[0, before:]
        return place

    def edge_index(self, targets: list[Tensor], sources: list[Tensor], local: IdMap) -> Tensor:
        """The [2, E] edge index: every hop's targets (batch-local ids) in row 1, its sources' batch-local ids (their
        ids looked up in ``local``) in row 0; each row written once, in place."""
        index, total = self.index, sum(t.numel() for t in targets)
        if index is None or index.size(1) != total or not targets or \
                targets[-1].data_ptr() != index[1, total - targets[-1].numel():].data_ptr():
            index = torch.empty(2, total, dtype=torch.long, device=self.device)  # the last hop went elsewhere
        at = 0
        for tgt in targets:
            if tgt.numel() and tgt.data_ptr() != index[1, at:].data_ptr():
                index[1, at:at + tgt.numel()] = tgt
            at += tgt.numel()
        at = 0
        for nbr in sources:  # the sources' batch-local ids straight into row 0 (the last hop's: in place)
            local.get_into(nbr, index[0, at:at + nbr.numel()])
            at += nbr.numel()
        return index


class CSRNeighborSampler(BaseSampler):
    """Samples ``fanouts[h]`` neighbours per node at hop ``h``; holds only references to the CSR.

    ``rowptr``/``col``: in-edges (``col[rowptr[v]:rowptr[v + 1]]`` are ``v``'s in-neighbours).
    """

    def __init__(self, rowptr: Tensor, col: Tensor, fanouts: tuple[int, ...] | list[int],
                 num_nodes: int | None = None, method: str | None = None, id_map: str = "dense",
                 edge_ids: bool = False):
        if rowptr.dtype != torch.long or col.dtype not in (torch.long, torch.int32):
            raise TypeError("rowptr must be int64, col int64 or int32")
        self.rowptr, self.col, self.fanouts = rowptr, col, tuple(int(f) for f in fanouts)
        self.method = method  # how a row's subset is drawn (see sample_neighbors); None: by device
        self.edge_ids = edge_ids  # each batch says which CSR edges it holds (e_id: where their features are)
        # Global -> local id scratch map, reset after every batch (one batch at a time: self._guard refuses a second).
        # ``num_nodes``: ids col may hold, when rowptr covers only some of them (a rank's parts);
        # ``id_map="batch"``: a map the size of the batch instead of an array over every id (partitioned ranks:
        # BatchIdMap).
        size = rowptr.numel() - 1 if num_nodes is None else num_nodes
        self._local = DenseIdMap(size, rowptr.device) if id_map == "dense" else BatchIdMap(rowptr.device)
        self._guard = OneBatchAtATime()

    @property
    def device(self) -> torch.device:  # (hpcgnn.sampling.protocol)
        return self.rowptr.device

    def sample(self, seeds: Tensor, generator: torch.Generator | None = None) -> SampledSubgraph:
        """Sample the subgraph around ``seeds``; the generator must live on the graph's device. One batch at a
        time: a second thread sampling with this sampler meanwhile is refused (:class:`OneBatchAtATime`)."""
        with self._guard:
            return self._walk(seeds, generator)

    def _walk(self, seeds: Tensor, generator: torch.Generator | None) -> SampledSubgraph:
        dev = self.rowptr.device
        if torch.unique(seeds).numel() != seeds.numel():  # on the seeds' device (the host's batches: no GPU sync)
            raise ValueError("seeds must be distinct")
        seeds = seeds.long().to(dev)
        local = self._local
        self.begin_batch()
        n_ids = [seeds]
        local.put(seeds, torch.arange(seeds.numel(), device=dev))
        num_nodes, sources, targets, num_edges, e_ids = [seeds.numel()], [], [], [], []
        # The frontier's batch-local ids are always one range: [first, first + len(frontier)).
        frontier, first, total = seeds, 0, seeds.numel()
        n_id = None
        placed = LastHop(dev)
        try:
            for h, fanout in enumerate(self.fanouts):
                last = h == len(self.fanouts) - 1
                into = {"out": placed.out(sum(num_edges))} if last and takes_out(type(self).hop) else {}
                if self.edge_ids:
                    row, nbr, e = self.hop(frontier, fanout, generator, eid=True, **into)
                    e_ids.append(e)
                else:
                    row, nbr = self.hop(frontier, fanout, generator, **into)
                new_nodes = local.add_new([nbr], total)  # sorted: deterministic local order
                sources.append(nbr)  # global ids: looked up once the walk is done
                targets.append(row.add_(first) if first else row)
                num_edges.append(nbr.numel())
                num_nodes.append(new_nodes.numel())
                n_ids.append(new_nodes)
                frontier, first, total = new_nodes, total, total + new_nodes.numel()
            n_id = torch.cat(n_ids)
            edge_index = placed.edge_index(targets, sources, local)
        finally:  # the ids put since the last clear: the batch's (one concatenation of them, not two)
            local.clear(n_id if n_id is not None else torch.cat(n_ids))
        e_id = (torch.cat(e_ids) if e_ids else torch.empty(0, dtype=torch.long, device=dev)) if self.edge_ids \
            else None
        return SampledSubgraph(n_id, edge_index, seeds.numel(), tuple(num_nodes), tuple(num_edges), e_id=e_id)

    # -------------------------------------------------------------------- PyG's sampler protocol

    def sample_from_nodes(self, index: NodeSamplerInput, **kwargs) -> SamplerOutput:
        """PyG's entry: the same walk, as PyG's ``SamplerOutput`` (row = source, col = target)."""
        out = self.sample(index.node)
        return SamplerOutput(node=out.n_id, row=out.edge_index[0], col=out.edge_index[1], edge=None,
                             num_sampled_nodes=list(out.num_sampled_nodes),
                             num_sampled_edges=list(out.num_sampled_edges), metadata=(index.input_id, index.time))

    def sample_from_edges(self, index, neg_sampling=None) -> SamplerOutput:
        # Link batches are made by hpcgnn.sampling.link.LinkSampler around this sampler, not through PyG's loaders.
        raise TypeError("CSRNeighborSampler samples from seed nodes; for edge seeds use task=link "
                        "(hpcgnn.sampling.link.LinkSampler) or PyG's loaders with node seeds")

    def begin_batch(self) -> None:
        """Called before the first hop of every batch (the distributed sampler resets its counters)."""

    def hop(self, frontier: Tensor, fanout: int, generator: torch.Generator | None,
            out: Callable[[int], tuple[Tensor, Tensor]] | None = None, eid: bool = False) -> tuple:
        """``(row, nbr)`` for one hop: see :func:`sample_neighbors` (``out``: where they may go; a subclass that
        samples elsewhere may leave it; ``eid``: the edges' CSR positions too). Subclasses sample elsewhere."""
        return sample_neighbors(self.rowptr, self.col, frontier, fanout, generator, self.method, out=out, eid=eid)


def sample_neighbors(rowptr: Tensor, col: Tensor, nodes: Tensor, fanout: int,
                     generator: torch.Generator | None = None, method: str | None = None,
                     row_start: int = 0, out: Callable[[int], tuple[Tensor, Tensor]] | None = None,
                     eid: bool = False) -> tuple:
    """Up to ``fanout`` distinct uniform neighbours of each node.

    Returns ``(row, nbr)``: ``row[i] - row_start`` indexes ``nodes`` (``row_start``: the batch-local
    id of ``nodes[0]``, a frontier's ids being one range) and ``nbr[i]`` is a global
    neighbour id of ``nodes[row[i] - row_start]``. Rows come out in order. Nodes with at most
    ``fanout`` neighbours keep them all; the others draw ``fanout`` distinct offsets.

    ``method``: ``floyd``, Floyd's algorithm vectorised over rows: ``fanout`` small steps
    whatever the degree, so hubs cost no more than ordinary nodes; ``keys``: every neighbour of
    those rows gets a random key and each row keeps its ``fanout`` smallest, through one sort:
    a fixed dozen kernels whatever the fanout, but work in proportion to the rows' degrees.
    Both draw every ``fanout``-subset with equal probability. Default: Floyd on the host; on a
    GPU, keys while the rows hold at most ``twins.KEYS_PER_SLOT`` neighbours per slot to fill (the
    first hops: few rows, where Floyd's launches would leave the GPU waiting for the host),
    else Floyd (the outer hops: a sort of every neighbour of 100k+ rows costs more GPU time
    than the whole rest of the batch, measured on an H100 in benchmarks/gpu.py).
    ``out(slots)``: two int64 tensors of ``slots`` entries to write ``row`` and ``nbr`` into (the last hop's, views
    of the batch's edge index, which then needs no concatenation); default: new ones. ``eid``: a third tensor,
    each edge's position in ``col`` (the edge's id: the row of its features).
    """
    if method in (None, "floyd") and binding.usable(rowptr, col, nodes):
        return ops.sample_neighbors(rowptr, col, nodes, fanout, generator, row_start, out, eid)  # the same, in C
    return twins.hop(rowptr, col, nodes, fanout, generator, row_start, out, method, eid)  # torch ops

