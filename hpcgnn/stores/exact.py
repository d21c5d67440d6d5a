"""Exact inference: a model's outputs with every node's full neighbourhood, layer by layer (no sampling).

One driver, :func:`exact_outputs`, walks the layers; each store kind gives it its pieces
(:class:`ExactPieces`): where a layer's inputs come from, how a layer is computed for the rows this
rank computes, and how the rows it reads but does not compute arrive:

- :class:`WholeGraphPieces` (a replicated graph): ranks share every node (contiguous ranges), each
  layer's output all-gathered with a tensor collective;
- :class:`WholeTypedPieces` (a replicated typed graph): the same per node type, each layer computing
  the types the next one reads;
- :class:`PartsPieces` (a partitioned graph): each rank computes its own nodes; for each layer it
  fetches its halo's previous outputs (the non-owned sources of its nodes' in-edges) from their owners,
  the same number of exchanges on every rank, on a thread while it computes the nodes that need no halo
  (first in its layer tables' order) on the CSR path, else before the layer;
- :class:`TypedPartsPieces`: the same per type.

A layer runs a chunk of target nodes at a time with all their in-neighbours: on the CPU for sage, gcn, gin, gat
(and R-GCN's relations) straight from the CSR, with no message per edge (:mod:`hpcgnn.models.layerwise`: a
linear map first where it narrows the rows, the sums and means in C; its tables bf16 under bf16 autocast), else
through PyG's own ``inference_per_layer``. Rows are shared out at multiples of the chunk size, so every chunk is
the same rows, and the outputs the same floats, on any number of ranks; the ranks of one node write each layer's
rows into one table they all map (:func:`hpcgnn.dist.node_table`) instead of all-gathering copies of it. The
driver hands back an :class:`Exact`: the outputs of any nodes by global
id (``rows``), and this rank's share of a node split with its labels (``split``); that is all a task
asks (:meth:`hpcgnn.stores.base.Store.exact`).

Memory, partitioned: one layer's input and output tables (own nodes and halo, float32), the rank's
edges in local ids (int32), and bounded temporaries: edges are mapped ``SLICE_EDGES`` at a time,
outputs are written into their table chunk by chunk, and the halo is fetched ``FETCH_ROWS`` rows an
exchange. :func:`check_exact_inference_memory` sizes that at start. The edges in local ids and the halo's
fetch plan (:class:`PartsLayout`) are made at the first evaluation and kept by the store for the next ones
(on the 500k-node synthetic graph, 2 ranks: 0.84 s an evaluation to make them, 0.47 s after). On one node,
the layer tables of a replicated graph come from a pool the store keeps too (:class:`hpcgnn.dist.NodeTables`).
"""

from __future__ import annotations

import abc
import dataclasses
import logging
import math
import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from hpcgnn import dist
from hpcgnn.env import available_memory
from hpcgnn.errors import ConfigError

log = logging.getLogger(__name__)

SLICE_EDGES = 1 << 24  # a rank's edges mapped to local rows at a time (a few hundred MB of temporaries)
FETCH_ROWS = 1 << 18  # halo rows asked in one exchange (its buffers: a few times this many rows)
# A partitioned rank reorders its CSR (one pass over its edges) to compute the nodes that need no halo while the halo
# arrives where they are at least this share of its nodes; else only its linear maps overlap the fetch. (On the 2M-
# node benchmark graph, 95% of a rank's edges are its own but 10% of its nodes need no halo: reordering cost more
# than it hid, 5.7 s against 4.6 for every node's embedding.)
INTERIOR_FIRST = 0.25


@dataclass
class Exact:
    """A model's exact outputs on this rank. ``rows(ids)``: the outputs of any nodes (by global id; a target
    type's own ids on a typed graph); a collective where rows live on other ranks (every rank calls it as
    often, with no ids when it has none). ``split(name)``: this rank's share of a node split, (outputs,
    labels), the shares of all ranks making the split once (``all``: every node, labels -1 where there are
    none); ``share(name)``: their ids."""

    rows: Callable[[Tensor], Tensor]
    split: Callable[[str], tuple[Tensor, Tensor]]
    share: Callable[[str], Tensor]  # the ids of this rank's share of a split, in the order split gives its rows
    # a typed encoder's outputs of several types (an edge task's ends): (node type, its own ids) -> their rows
    typed_rows: Callable[[str, Tensor], Tensor] | None = None


class ExactPieces(abc.ABC):
    """What one store kind gives the driver (see the module)."""

    def __init__(self, device: torch.device, chunk_size: int):
        self.device, self.chunk_size = device, chunk_size

    @abc.abstractmethod
    def without_edges(self, model: torch.nn.Module) -> Tensor:
        """The outputs of a model that reads no edges (the MLP): its rows on the features alone."""

    @abc.abstractmethod
    def inputs(self, model: torch.nn.Module):
        """Layer 0's input table(s)."""

    @abc.abstractmethod
    def layer(self, model: torch.nn.Module, i: int, table, last: bool):
        """Layer ``i`` on ``table``: the rows this rank computes, and those the next layer reads (none after
        the last)."""

    def outputs(self, model: torch.nn.Module, table) -> Tensor:
        return table


@torch.no_grad()
def exact_outputs(model: torch.nn.Module, pieces: ExactPieces, layers: int | None = None, on_layer=None) -> Tensor:
    """The one driver: a model's outputs layer by layer, from the store's pieces (``layers``: after that many;
    None: all of them). ``on_layer(i, of)``: called as each layer ends (progress)."""
    from hpcgnn.models import MLPBaseline, TypedMLP

    model.eval()
    if isinstance(model, (MLPBaseline, TypedMLP)):
        return pieces.without_edges(model)
    table = pieces.inputs(model)
    for i in range(model.num_layers if layers is None else layers):
        table = pieces.layer(model, i, table, last=i == model.num_layers - 1)
        if on_layer is not None:
            on_layer(i + 1, model.num_layers if layers is None else layers)
    return pieces.outputs(model, table)


# --------------------------------------------------------------------------- a whole graph on every rank


class WholeGraphPieces(ExactPieces):
    """A replicated graph: each layer for all nodes, ranks sharing them, all-gathered. ``gcn_degree``: every
    node's in-degree where the model is normalised as GCN by the whole graph's degrees (None: it is not): on the
    CSR path, the nodes' weights; on PyG's path, a chunk's weighted sparse adjacency (GCNNorm), run in fp32 (sparse
    products have no bf16 kernel on CPU)."""

    def __init__(self, graph, device: torch.device, chunk_size: int, rank: int, world_size: int,
                 gcn_degree: Tensor | None = None, tables: dist.NodeTables | None = None, edge_features: bool = False):
        super().__init__(device, chunk_size)
        self.graph, self.rank, self.world_size = graph, rank, world_size
        self.gcn_degree, self.transform = gcn_degree, _gcn_norm(gcn_degree)
        # every rank on this node: the layer tables are one shared copy, from this pool (_sharded)
        self.tables = tables
        # the model reads the edges' features: each chunk's edges carry theirs (PyG's layers, the CSR's order)
        self.edge_attr = graph.edge_attr if edge_features else None

    def _all(self, fn) -> Tensor:
        return _sharded(self.graph.num_nodes, self.chunk_size, self.rank, self.world_size, fn, self.tables)

    def without_edges(self, model):
        x = self.graph.x
        return self._all(lambda a, b: model(x[a:b].float().to(self.device)).float().cpu())

    def inputs(self, model):
        self.csr = _CSRPath.of(model, self.device, self.gcn_degree, self.edge_attr is not None)
        x = self.graph.x
        if self.csr is not None and _narrow() and x.dtype == torch.float32:  # bf16: half the bytes through the edges
            return self._all(lambda a, b: x[a:b].to(torch.bfloat16))  # (each rank converts its share)
        return x

    def layer(self, model, i, table, last):
        src = scores = None
        if self.csr is None:
            out = self._all(lambda a, b: _layer(model, i, table, self.graph, a, b, self.device, self.transform,
                                                self.edge_attr))
        else:
            spec = self.csr.layer(model, i, last)
            src = table if spec.before is None else self._all(
                lambda a, b: _kept(spec.before(_read(table[a:b])), False))
            scores = None if spec.scores is None else self._all(lambda a, b: spec.scores(src[a:b]))
            out = self._all(lambda a, b: _kept(self.csr.rows(spec, table, src, self.graph, a, b, scores), last))
        if self.tables is not None:  # (read by no rank now: the next layers' tables)
            self.tables.give(table, src, scores)
        return out


class WholeTypedPieces(ExactPieces):
    """A replicated typed graph: each layer computes every node of the types the next one reads, ranks sharing
    each type's nodes, all-gathered; the outputs are the target type's."""

    def __init__(self, graph, device: torch.device, chunk_size: int, rank: int, world_size: int,
                 tables: dist.NodeTables | None = None):
        super().__init__(device, chunk_size)
        self.graph, self.rank, self.world_size, self.tables = graph, rank, world_size, tables

    def _all(self, n: int, fn) -> Tensor:
        return _sharded(n, self.chunk_size, self.rank, self.world_size, fn, self.tables)

    def without_edges(self, model):
        x = self.graph.x[self.graph.target]
        return self._all(x.size(0), lambda a, b: model.mlp(x[a:b].float().to(self.device)).float().cpu())

    def inputs(self, model):
        return dict(self.graph.x)

    def layer(self, model, i, table, last):
        here = {k: v.to(self.device) for k, v in table.items()}  # the layer's input, where the model runs
        mapped = {rel: self._all(self.graph.num_nodes[rel[0]], lambda a, b, s=rel[0], lin=lin: lin(here[s][a:b]))
                  for rel, lin in _maps_first(model, i, self.device).items()}
        kw = {"mapped": mapped} if mapped else {}
        out = {t: self._all(self.graph.num_nodes[t], lambda a, b, t=t: model.inference_per_layer(
            i, t, here, self.graph, a, b, **kw).float().cpu()) for t in model.layer_types(i)}
        if self.tables is not None:  # (read by no rank now)
            self.tables.give(*table.values(), *mapped.values())
        return out

    def outputs(self, model, table):
        """The target type's rows; a model with ``outputs`` (an edge task's encoder): those types' rows by type."""
        if getattr(model, "outputs", None):
            return {t: table[t] for t in model.outputs}
        return table[self.graph.target]


# --------------------------------------------------------------------------- a rank's parts


class PartsPieces(ExactPieces):
    """A partitioned graph: each rank computes its own nodes, fetching its halo's rows for each layer. On the CSR
    path its layer tables hold first the nodes whose in-neighbours are all its own, then the rest, then the halo:
    the halo's rows arrive (on a thread) while it computes the first; PyG's path fetches them before the layer.
    The outputs come back in its row order. ``gcn_norm``: the model is normalised as GCN by the whole graph's
    degrees (the parts' own and their halo's, by local id). ``layouts``: where the rank's edges in local ids are
    kept from one evaluation to the next (:class:`PartsLayout`, its store's; None: made anew)."""

    def __init__(self, parts, view, exchange, device: torch.device, chunk_size: int, gcn_norm: bool = False,
                 edge_features: bool = False, layouts: dict | None = None):
        super().__init__(device, chunk_size)
        self.parts, self.view, self.exchange, self.gcn_norm = parts, view, exchange, gcn_norm
        self.own, self.layouts = parts.nodes.numel(), layouts
        # the model reads the edges' features: each chunk's edges carry theirs (the rank's CSR order)
        self.edge_attr = parts.edge_attr if edge_features else None

    def without_edges(self, model):
        x = self.parts.x
        return _chunked(0, self.own, self.chunk_size, lambda a, b: model(x[a:b].float().to(self.device)).float().cpu())

    def inputs(self, model):
        parts, view = self.parts, self.view
        kept = self.layouts if self.layouts is not None else {}
        if "halo" not in kept:
            kept["halo"] = _remote_ids(parts.col, 0, view)
        self.halo = kept["halo"]
        degree = parts.degree.index_select(0, torch.cat([parts.nodes, self.halo])) if self.gcn_norm else None
        self.transform = _gcn_norm(degree)
        self.csr = _CSRPath.of(model, self.device, degree, self.edge_attr is not None)
        key = None if self.csr is None else INTERIOR_FIRST  # (PyG's path: the rank's own row order)
        if key not in kept:
            for old in [k for k in kept if k != "halo"]:  # (one layout at a time: its edges' memory)
                del kept[old]
            kept[key] = PartsLayout.of(parts, view, self.exchange, self.halo, key)
        layout = kept[key]
        self.graph, self.fill, self.inner, self.place = layout.graph, layout.fill, layout.inner, layout.place
        order, place = layout.order, layout.place
        if place is not None and self.csr.dinv is not None:
            self.csr = dataclasses.replace(self.csr, dinv=torch.cat([self.csr.dinv[:self.own][order],
                                                                     self.csr.dinv[self.own:]]))
        table = torch.empty(self.own + self.halo.numel(), parts.num_features,
                            dtype=torch.bfloat16 if self.csr is not None and _narrow() else torch.float32)
        for a in range(0, self.own, FETCH_ROWS):  # (upcast a slice at a time)
            b = min(a + FETCH_ROWS, self.own)
            table[a:b] = parts.x[a:b] if place is None else parts.x.index_select(0, order[a:b])
        self.pending = self.fill.start(table, overlap=self.csr is not None)
        return table

    def layer(self, model, i, table, last):
        own, rows = self.own, 0 if last else self.halo.numel()
        if self.csr is None:
            self.pending.wait()
            out = _into_table(own, rows, self.chunk_size,
                              lambda a, b: _layer(model, i, table, self.graph, a, b, self.device, self.transform,
                                                  self.edge_attr))
            if not last:
                self.pending = self.fill.start(out, overlap=False)
            return out
        # While the halo's rows of ``table`` arrive: the linear map of the own rows, and the rows that read no halo
        # (the first ``inner``); then the halo's, and the rest. (A linear map first applies to the halo's rows too.)
        spec, n, chunk = self.csr.layer(model, i, last), table.size(0), self.chunk_size
        src = table if spec.before is None else _rows_into(None, n, 0, own, chunk, lambda a, b: _kept(
            spec.before(_read(table[a:b])), False))
        scores = None if spec.scores is None else _rows_into(None, n, 0, own, chunk, lambda a, b: spec.scores(src[a:b]))
        out = _rows_into(None, own + rows, 0, self.inner, chunk,
                         lambda a, b: _kept(self.csr.rows(spec, table, src, self.graph, a, b, scores), last))
        self.pending.wait()
        if spec.before is not None:
            _rows_into(src, n, own, n, chunk, lambda a, b: _kept(spec.before(_read(table[a:b])), False))
        if scores is not None:
            _rows_into(scores, n, own, n, chunk, lambda a, b: spec.scores(src[a:b]))
        _rows_into(out, own + rows, self.inner, own, chunk,
                   lambda a, b: _kept(self.csr.rows(spec, table, src, self.graph, a, b, scores), last))
        if not last:
            self.pending = self.fill.start(out, overlap=True)
        return out

    def outputs(self, model, table):
        self.pending.wait()  # (after fewer layers than the model's, the last one's halo was on its way)
        table = table[:self.own]  # (a layer before the last: its halo rows follow)
        return table if self.place is None else table.index_select(0, self.place)  # (in the rank's row order)


@dataclass(frozen=True)
class PartsLayout:
    """A rank's edges as partitioned exact inference reads them: in local ids (its own nodes' rows in ``order``,
    ``inner`` of them first that need no halo, then the rest; ``place``: a row of the rank's -> its place; both
    None where the rows keep the rank's order), and its halo fetch, planned. Made at the first evaluation, kept
    by the store for the next ones (the edges in local ids, int32: 4 bytes an edge)."""

    graph: LocalCSR
    fill: _HaloFill
    inner: int = 0
    order: Tensor | None = None
    place: Tensor | None = None

    @classmethod
    def of(cls, parts, view, exchange, halo: Tensor, interior_first: float | None) -> PartsLayout:
        """``interior_first`` (the CSR path): the rows that need no halo first where they are at least that share
        of the rank's nodes; None (PyG's path, which fetches the halo before a layer): in the rank's order."""
        own = parts.nodes.numel()
        rowptr, col = parts.rowptr, _localized(parts.col, 0, view, view.row, own, halo, torch.int32)
        order, inner = _interior_first(rowptr, col, own) if interior_first is not None else (None, 0)
        if interior_first is None or inner < interior_first * own:
            return cls(LocalCSR(rowptr, col), _HaloFill(exchange, view, own, halo, view.row))
        place = torch.empty_like(order)
        place[order] = torch.arange(own)
        rowptr, col = _reordered(rowptr, col, order, place, own)
        return cls(LocalCSR(rowptr, col), _HaloFill(exchange, view, own, halo, lambda ids: place[view.row(ids)]),
                   inner, order, place)


class TypedPartsPieces(ExactPieces):
    """A partitioned typed graph: each rank computes its own nodes of every type the next layer reads, relation
    by relation, with each read type's halo from its owners (type by type, in the same order on every rank, on a
    thread while it applies the relations' linear maps that come first to its own rows); the outputs are its own
    target-type nodes' (rows: ``parts.typed_rows(target, ids)``). ``layouts``: as :class:`PartsPieces`'."""

    def __init__(self, parts, view, exchange, device: torch.device, chunk_size: int, layouts: dict | None = None):
        super().__init__(device, chunk_size)
        self.parts, self.view, self.exchange, self.layouts = parts, view, exchange, layouts
        self.types = list(parts.typed.schema.node_types)
        self.own = {t: parts.own_of_type(t) for t in self.types}

    def without_edges(self, model):
        x = self.parts.x.index_select(0, self.view.row(self.own[model.target]))
        return _chunked(0, x.size(0), self.chunk_size, lambda a, b: model.mlp(x[a:b].float().to(self.device)).float().cpu())

    def reads(self, model, i: int) -> set[str]:
        """The types whose halo layer ``i`` reads (the sources of its relations; none past the last)."""
        if i >= model.num_layers:
            return set()
        return {rel[0] for t in model.layer_types(i) for rel, _ in model.relations_into(i, t)}

    def inputs(self, model):
        parts, view, typed, own = self.parts, self.view, self.parts.typed, self.own
        kept = self.layouts if self.layouts is not None else {}
        if "typed" not in kept:  # (made at the first evaluation, kept by the store for the next)
            off = typed.schema.offsets()
            halo = {t: torch.unique(torch.cat([torch.empty(0, dtype=torch.long)] + [
                _remote_ids(c, off[t], view) for rel, c in typed.col.items() if rel[0] == t])) for t in self.types}
            row_of = {t: (lambda ids, t=t: parts.typed_rows(t, ids)) for t in self.types}
            graph = LocalTypedCSR(typed.rowptr, {rel: _localized(c, off[rel[0]], view, row_of[rel[0]],
                                                                 own[rel[0]].numel(), halo[rel[0]])
                                                 for rel, c in typed.col.items()})
            fill = {t: _HaloFill(self.exchange, view, own[t].numel(), halo[t], row_of[t])
                    for t in self.types}  # (in type order)
            kept["typed"] = halo, graph, fill
        self.halo, self.graph, self.fill = kept["typed"]
        x = {}
        for t in self.types:  # layer 0's input: own features (upcast), then the halo's rows, where layer 0 reads them
            x[t] = torch.empty(own[t].numel() + (self.halo[t].numel() if t in self.reads(model, 0) else 0),
                               parts.num_features)
            x[t][:own[t].numel()] = parts.x.index_select(0, view.row(own[t]))
        self.pending = self._fetch(x, self.reads(model, 0))
        return x

    def _fetch(self, table: dict, types: set[str]) -> _Pending:
        """The halo's rows of ``types`` into ``table``, in type order (the same exchanges on every rank), on a
        thread: the caller makes no collective call until it waits."""
        fills = [(self.fill[t], table[t]) for t in self.types if t in types and self.fill[t].rounds]
        return _Pending(lambda _: [fill(rows) for fill, rows in fills]) if fills else _Pending(None)

    def layer(self, model, i, table, last):
        computes, wanted, chunk = model.layer_types(i), self.reads(model, i + 1), self.chunk_size
        # While the halo's rows arrive: the linear maps that come first, of the own rows (on the CPU only, in place);
        # then of the halo's
        maps = _maps_first(model, i, self.device)
        mapped = {rel: _rows_into(None, table[rel[0]].size(0), 0, self.own[rel[0]].numel(), chunk,
                                  lambda a, b, s=rel[0], lin=lin: lin(table[s][a:b])) for rel, lin in maps.items()}
        self.pending.wait()
        for rel, lin in maps.items():
            n = table[rel[0]].size(0)
            _rows_into(mapped[rel], n, self.own[rel[0]].numel(), n, chunk,
                       lambda a, b, s=rel[0], lin=lin: lin(table[s][a:b]))
        here = {t: table[t].to(self.device) for t in self.types if t in self.reads(model, i) or t in computes}
        kw = {"mapped": mapped} if mapped else {}
        out = {t: _into_table(self.own[t].numel(), self.halo[t].numel() if t in wanted else 0, self.chunk_size,
                              lambda a, b, t=t, here=here: model.inference_per_layer(i, t, here, self.graph, a, b,
                                                                                     **kw).float().cpu())
               for t in computes}
        del here, mapped
        self.pending = self._fetch(out, wanted)
        return out

    def outputs(self, model, table):
        self.pending.wait()  # (after fewer layers than the model's, the last one's halo was on its way)
        return table[model.target][:self.own[model.target].numel()]


# --------------------------------------------------------------------------- pieces' parts


def _gcn_norm(degree: Tensor | None):
    """PyG's path's per-chunk transform for a model normalised as GCN by these in-degrees (None: none)."""
    if degree is None:
        return None
    from hpcgnn.sampling.transforms import GCNNorm

    return GCNNorm(degree)


@dataclass(frozen=True)
class _CSRPath:
    """A whole-graph or partitioned layer straight from the CSR (:mod:`hpcgnn.models.layerwise`): the model's
    kind, and GCN's inverse square-root degrees by row of the layer tables."""

    kind: str
    dinv: Tensor | None

    @classmethod
    def of(cls, model, device: torch.device, gcn_degree: Tensor | None,
           edge_features: bool = False) -> _CSRPath | None:
        """The path for ``model``, or None (PyG's ``inference_per_layer``; ``edge_features``: the model reads
        them, so its layers read each edge's); ``gcn_degree``: the in-degrees of the table's rows where the model
        is normalised as GCN (None: it is not); the choice logged once."""
        from hpcgnn.models import layerwise

        if edge_features:
            layerwise.say(f"{type(model).__name__} reads edge features: PyG's layers, over each chunk's edges with "
                          "their features")
            return None
        kind, why = layerwise.plan(model, device, gcn_degree is not None)
        layerwise.say(why)
        if kind is None:
            return None
        return cls(kind, (gcn_degree.to(torch.float64) + 1.0).rsqrt() if kind == "GCN" else None)

    def layer(self, model, i: int, last: bool):
        from hpcgnn.models import layerwise

        return layerwise.layer(model, self.kind, i, last)

    def rows(self, spec, table: Tensor, src: Tensor, graph, lo: int, hi: int, scores: Tensor | None) -> Tensor:
        """The layer's outputs of target rows ``lo .. hi``: ``src``'s rows aggregated over their in-edges (GAT:
        weighed by the attention its ``scores`` give), then the rest of the layer with the targets' own rows of
        ``table``."""
        from hpcgnn.kernels.ops import aggregate_rows

        if spec.attention is not None:
            weight, own = spec.attention(graph.rowptr, graph.col, scores, lo, hi)
            agg = aggregate_rows(graph.rowptr, graph.col, src, lo, hi, self_loop=True, edge_weight=weight,
                                 self_weight=own)
        else:
            agg = aggregate_rows(graph.rowptr, graph.col, src, lo, hi, mean=spec.mean,
                                 dinv=self.dinv if spec.gcn else None, self_loop=spec.gcn)
        return spec.after(_read(table[lo:hi]), agg)


def _maps_first(model, i: int, device: torch.device) -> dict:
    """A typed model's relations of layer ``i`` whose linear map comes before their mean (R-GCN's, where it narrows
    the rows): relation -> the map; {} for a model without them."""
    maps_first = getattr(model, "maps_first", None)
    return maps_first(i, device) if callable(maps_first) else {}


def _narrow() -> bool:
    """Whether the CSR path keeps its tables in bfloat16: under bf16 autocast (the layers' linear maps round to it
    anyway), so every edge moves half the bytes; layer 0's features too, converted once where stored as float32."""
    return torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16


def _kept(x: Tensor, last: bool) -> Tensor:
    """A layer's rows as its table keeps them: bfloat16 under bf16 autocast where another layer reads them, else
    float32 (the outputs)."""
    return x.to(torch.bfloat16) if not last and _narrow() else x.float()


def _read(rows: Tensor) -> Tensor:
    """A table's rows as a layer's linear maps read them: as they are under bf16 autocast (which casts them),
    else widened to float32 (features may be stored in 16 bits)."""
    return rows if _narrow() else rows.float()


def _chunked(lo: int, hi: int, chunk_size: int, fn) -> Tensor:
    """``fn(a, b)`` over ``lo .. hi`` in chunks, concatenated (``fn(lo, lo)``'s empty rows when there are none)."""
    outs = [fn(a, min(a + chunk_size, hi)) for a in range(lo, hi, chunk_size)]
    return torch.cat(outs) if outs else fn(lo, lo)


def _sharded(n: int, chunk_size: int, rank: int, world_size: int, fn, tables: dist.NodeTables | None = None) -> Tensor:
    """Rows ``0 .. n`` of ``fn`` in chunks of ``chunk_size`` rows (chunk ``k``: rows from ``k * chunk_size``,
    the same rows on any number of ranks, so the same floats), shared out among the ranks; every rank gets them
    all. ``tables`` (every rank on this node): the ranks write into one table they all map, taken from that
    pool (:class:`hpcgnn.dist.NodeTables`: nothing sent), and take its chunks in turn from a counter there, so
    a rank slowed by its core's neighbours takes fewer; else each computes a contiguous range, all-gathered."""
    chunks = math.ceil(n / chunk_size)
    if tables is not None and world_size > 1:
        table = _shared_chunks(n, chunk_size, chunks, rank, world_size, fn, tables)
        if table is not None:
            return table
    per = math.ceil(chunks / world_size) * chunk_size
    counts = [max(0, min(n, (r + 1) * per) - min(n, r * per)) for r in range(world_size)]
    lo = min(rank * per, n)
    # written chunk by chunk into one buffer of the most rows a rank has, which the all-gather sends as it is
    mine = _into_table(counts[rank], max(counts) - counts[rank], chunk_size, lambda a, b: fn(lo + a, lo + b))
    return dist.all_gather_rows(mine, counts)


def _shared_chunks(n: int, chunk_size: int, chunks: int, rank: int, world_size: int, fn,
                   tables: dist.NodeTables) -> Tensor | None:
    """:func:`_sharded` on one node: rank ``r`` computes chunk ``r`` first (its width sizes the table), then the
    ranks take the chunks after the first ``world_size`` from a shared counter. None where the table or the
    counter cannot be made (the caller all-gathers). Returns with every chunk written (a barrier): a table
    read while computing them may be given back then."""
    from hpcgnn.kernels import ops
    from hpcgnn.kernels.binding import kernels

    def rows(k: int) -> tuple[int, int]:
        return min(k * chunk_size, n), min((k + 1) * chunk_size, n)

    first = fn(*rows(rank))  # (past the last chunk: an empty one, which gives the width)
    counter = tables.take((1,), torch.long)
    if counter is not None and rank == 0:
        counter.zero_()  # (a counter given back holds the last count; the all-reduce below orders this first)
    if int(dist.all_reduce_max(torch.tensor([int(kernels() is None or counter is None)]))):
        tables.give(counter)
        return None  # (a rank without the C kernels has no atomic add: every rank all-gathers)
    table = tables.take((n, *first.shape[1:]), first.dtype)
    if table is None:
        tables.give(counter)
        return None
    a, b = rows(rank)
    table[a:b] = first
    while (k := world_size + ops.take_next(counter)) < chunks:
        a, b = rows(k)
        table[a:b] = fn(a, b)
    dist.all_reduce_max(torch.zeros(1))  # (every chunk written)
    tables.give(counter)
    return table


@dataclass(frozen=True)
class LocalCSR:
    """A rank's own rows of the in-adjacency in local ids: its nodes first (in row order), then the halo."""

    rowptr: Tensor
    col: Tensor


@dataclass(frozen=True)
class LocalTypedCSR:
    """A typed rank's in-adjacency per relation in local ids: rows are its own nodes of the relation's target
    type (in their typed-row order); sources index the source type's table: its own nodes, then its halo."""

    rowptr: dict
    col: dict


def _remote_ids(col: Tensor, offset: int, view) -> Tensor:
    """Sorted distinct global ids ``col + offset`` that other ranks own, ``SLICE_EDGES`` at a time."""
    found = torch.empty(0, dtype=torch.long)
    for a in range(0, col.numel(), SLICE_EDGES):  # (merged slice by slice: never more than the halo and a slice)
        ids = col[a:a + SLICE_EDGES].long() + offset
        found = torch.unique(torch.cat([found, ids[view.owner(ids) != view.rank]]))
    return found


def _localized(col: Tensor, offset: int, view, row_of, own: int, halo: Tensor, dtype=torch.long) -> Tensor:
    """Global ids ``col + offset`` as rows of a rank's table of its ``own`` nodes (at ``row_of(id)``) followed
    by the ``halo`` (sorted global ids), ``SLICE_EDGES`` at a time."""
    out = torch.empty(col.numel(), dtype=dtype)
    for a in range(0, col.numel(), SLICE_EDGES):
        ids = col[a:a + SLICE_EDGES].long() + offset
        remote = view.owner(ids) != view.rank
        local = torch.empty_like(ids)
        local[~remote] = row_of(ids[~remote])
        local[remote] = own + torch.searchsorted(halo, ids[remote])
        out[a:a + SLICE_EDGES] = local
    return out


class _HaloFill:
    """``start(table)``: rows ``own..`` of ``table`` become its owners' rows of the ``halo`` nodes (sorted global
    ids; they read their own rows ``row_of(id)`` of their tables), in as many exchanges of ``FETCH_ROWS`` rows as
    the rank with the largest halo needs; collective. Who asks whom for which rows is settled once, here, so a
    layer's fetch is one exchange of rows a round. ``overlap``: the exchanges run on a thread of their own while
    the caller computes rows that need no halo, and ``wait()`` is where it needs them (the caller makes no other
    collective call in between); else they run before ``start`` returns (``fill(table)``)."""

    def __init__(self, ex, view, own: int, halo: Tensor, row_of):
        self.ex, self.own = ex, own
        rounds = int(dist.all_reduce_max(torch.tensor([math.ceil(halo.numel() / FETCH_ROWS)])).item())
        owner = view.owner(halo)
        self.rounds = []  # (first halo row, the order its rows come in, rows asked of this rank, counts)
        for j in range(rounds):
            a, b = min(j * FETCH_ROWS, halo.numel()), min((j + 1) * FETCH_ROWS, halo.numel())
            asked, order, sent, received = ex.request(halo[a:b], owner[a:b])
            self.rounds.append((a, order, row_of(asked), sent, received))

    def _run(self, table: Tensor) -> None:
        for a, order, rows, sent, received in self.rounds:
            got = self.ex(table.index_select(0, rows), received, sent)
            table[self.own + a:self.own + a + got.size(0)].index_copy_(0, order, got)

    def __call__(self, table: Tensor) -> None:
        self._run(table)

    def start(self, table: Tensor, overlap: bool) -> _Pending:
        if not overlap or not self.rounds:
            self._run(table)
            return _Pending(None)
        return _Pending(self._run, table)


class _Pending:
    """A halo fetch on its way (``fn(table)`` on a thread; None: done already); ``wait()`` raises its error."""

    def __init__(self, fn, table: Tensor | None = None):
        self.error: BaseException | None = None
        self.thread = None
        if fn is not None:
            def run():
                try:
                    fn(table)
                except BaseException as e:  # (raised where the caller waits)
                    self.error = e
            self.thread = threading.Thread(target=run, name="hpcgnn-halo", daemon=True)
            self.thread.start()

    def wait(self) -> None:
        if self.thread is not None:
            self.thread.join()
            self.thread = None
        if self.error is not None:
            raise self.error


def _interior_first(rowptr: Tensor, col: Tensor, own: int) -> tuple[Tensor, int]:
    """A rank's own rows in the order exact inference computes them: first those whose in-neighbours are all its
    own (sources below ``own``: they need no halo), then the rest, each group in row order; and how many of the
    first there are."""
    needs = torch.zeros(own, dtype=torch.bool)
    for a in range(0, col.numel(), SLICE_EDGES):
        far = (col[a:a + SLICE_EDGES] >= own).nonzero().flatten() + a
        needs[torch.searchsorted(rowptr, far, right=True) - 1] = True
    inner = (~needs).nonzero().flatten()
    return torch.cat([inner, needs.nonzero().flatten()]), inner.numel()


def _reordered(rowptr: Tensor, col: Tensor, order: Tensor, place: Tensor, own: int) -> tuple[Tensor, Tensor]:
    """The CSR with its rows in ``order`` and its own sources renamed to their ``place`` (halo sources, from
    ``own`` on, as they are); each row's edges in their order, so each row sums the same floats. Rows are
    copied ``SLICE_EDGES`` edges at a time."""
    degree = (rowptr[1:] - rowptr[:-1]).index_select(0, order)
    new_ptr = torch.zeros(own + 1, dtype=torch.long)
    torch.cumsum(degree, 0, out=new_ptr[1:])
    new_col = torch.empty_like(col)
    p = 0
    while p < own:
        q = max(p + 1, int(torch.searchsorted(new_ptr, new_ptr[p] + SLICE_EDGES, right=True)) - 1)
        q = min(q, own)
        lo, hi = int(new_ptr[p]), int(new_ptr[q])
        if hi > lo:  # each edge's place in the old CSR: its row's old start plus its place in the row
            at = (torch.repeat_interleave(rowptr.index_select(0, order[p:q]) - new_ptr[p:q], degree[p:q],
                                          output_size=hi - lo) + torch.arange(lo, hi))
            c = col.index_select(0, at).long()
            mine = c < own
            c[mine] = place.index_select(0, c[mine])
            new_col[lo:hi] = c
        p = q
    return new_ptr, new_col


def _rows_into(table: Tensor | None, n: int, lo: int, hi: int, chunk_size: int, fn) -> Tensor:
    """``fn(a, b)`` over rows ``lo .. hi`` in chunks, written into ``table`` (None: one of ``n`` rows, allocated
    at the first chunk's width: one empty chunk gives it when there are no rows)."""
    for a in range(lo, max(hi, lo + 1), chunk_size):
        out = fn(a, min(a + chunk_size, hi))
        if table is None:
            table = out.new_empty((n, *out.shape[1:]))
        table[a:a + out.size(0)] = out
    return table


def _into_table(n: int, extra: int, chunk_size: int, fn) -> Tensor:
    """``fn(a, b)`` over rows ``0 .. n`` in chunks, written into one table with ``extra`` rows left after them
    (for the halo), allocated at the first chunk's width."""
    return _rows_into(None, n + extra, 0, n, chunk_size, fn)


def _layer(model, i: int, x: Tensor, graph, lo: int, hi: int, device: torch.device, transform,
           edge_attr: Tensor | None = None) -> Tensor:
    """Layer ``i`` for targets ``lo..hi`` with all their in-neighbours (targets first, as root weights expect);
    ``edge_attr``: the graph's edge features in CSR order, which a model reading them is given for the chunk's."""
    from hpcgnn.sampling.neighbor import SampledSubgraph

    t = hi - lo
    targets = torch.arange(lo, hi)
    nbr = graph.col[graph.rowptr[lo]:graph.rowptr[hi]].long()
    dst = torch.repeat_interleave(torch.arange(t), (graph.rowptr[lo + 1:hi + 1] - graph.rowptr[lo:hi]).long())
    others = torch.unique(nbr)
    others = others[(others < lo) | (others >= hi)]
    n_id = torch.cat([targets, others])
    order = torch.argsort(n_id)
    src = order[torch.searchsorted(n_id[order], nbr)]
    if edge_attr is not None:  # (in CSR order, as nbr and dst are)
        edges = edge_attr[graph.rowptr[lo]:graph.rowptr[hi]].float().to(device)
        return _layer_with_edge_features(model, i, x.index_select(0, n_id).float().to(device),
                                         torch.stack([src, dst]).to(device), t, edges).float().cpu()
    if transform is None:
        return model.inference_per_layer(i, x.index_select(0, n_id).float().to(device), torch.stack([src, dst]).to(device),
                                         t).float().cpu()
    out = transform(SampledSubgraph(n_id, torch.stack([src, dst]), t, (t, others.numel()), (dst.numel(),)))
    # The weighted adjacency of the chunk, rows = targets (CSR, sorted by target then source).
    order = torch.argsort(out.edge_index[1] * n_id.numel() + out.edge_index[0])
    rows, cols, values = out.edge_index[1][order], out.edge_index[0][order], out.edge_weight[order]
    crow = torch.zeros(t + 1, dtype=torch.long)
    crow[1:] = torch.cumsum(torch.bincount(rows, minlength=t), 0)
    with warnings.catch_warnings():  # "sparse CSR support is in beta": the products used here are not
        warnings.simplefilter("ignore", UserWarning)
        # (unchecked: a node's edge to itself and its self-loop are two entries of one column)
        adj = torch.sparse_csr_tensor(crow, cols, values, (t, n_id.numel()))
        with torch.autocast(device.type, enabled=False):
            return model.inference_per_layer(i, x.index_select(0, n_id).float().to(device), adj.to(device),
                                             t).float().cpu()


def _layer_with_edge_features(model, i: int, x: Tensor, edge_index: Tensor, t: int, edge_attr: Tensor) -> Tensor:
    """PyG's ``BasicGNN.inference_per_layer`` whose convolution is given each edge's features (PyG's takes none)."""
    x = model.convs[i](x, edge_index, edge_attr=edge_attr)[:t]
    if i == model.num_layers - 1 and model.jk_mode is None:
        return x
    if model.act is not None and model.act_first:
        x = model.act(x)
    if model.norms is not None:
        x = model.norms[i](x)
    if model.act is not None and not model.act_first:
        x = model.act(x)
    if i == model.num_layers - 1 and hasattr(model, "lin"):
        x = model.lin(x)
    return x


# --------------------------------------------------------------------------- sized at start


def exact_inference_bytes(own: int, halo: int, edges: int, widths, edge_bytes: int = 4, narrow: bool = False,
                          reordered: bool = True) -> int:
    """About the peak bytes exact partitioned inference adds on a rank: the largest layer's tables (``own`` +
    ``halo`` rows each: its input, its output and, for a linear map first, the mapped input; ``widths``: the
    layers' widths, input first; ``narrow``: bfloat16 but the last output, as bf16 autocast keeps them on the
    CSR path, else float32), its ``edges`` in local ids (twice where the CSR is ``reordered``, nodes that need
    no halo first), and the fetch buffers."""
    rows, mid = own + halo, 2 if narrow else 4
    tables = max(rows * (w_in * mid + w_out * (4 if i == len(widths) - 2 else mid) + w_out * mid)
                 for i, (w_in, w_out) in enumerate(zip(widths[:-1], widths[1:], strict=True)))
    return tables + edges * edge_bytes * (2 if reordered else 1) + 4 * min(FETCH_ROWS, halo) * max(widths) * mid


def check_exact_inference_memory(parts, model_cfg, env, layers: int = 2, narrow: bool = False) -> None:
    """train.eval_mode=full on a partitioned graph: fail at start, together, when a rank's layer tables would not
    fit in its share of the node's memory (not at the first evaluation, after an epoch of training). ``layers``:
    the model's; ``narrow``: its tables between layers bfloat16 (bf16 precision on the host)."""
    from hpcgnn.io import human_bytes

    p, m = parts, model_cfg
    edges = sum(c.numel() for c in p.typed.col.values()) if p.typed is not None else p.col.numel()
    widths = (p.num_features, *[m.hidden_channels] * (layers - 1), max(p.num_classes, 1))
    need = exact_inference_bytes(p.nodes.numel(), p.halo_bound, edges, widths, 8 if p.typed else 4,
                                 narrow=narrow and p.typed is None, reordered=p.typed is None)
    room = available_memory() // env.local_world_size
    worst_need, worst_room = dist.all_reduce_max(torch.tensor([need, -room])).tolist()
    if worst_need > -worst_room:
        raise ConfigError(
            f"train.eval_mode=full on this partitioned graph needs about {human_bytes(worst_need)} on a rank (its "
            f"nodes and its halo, x up to {max(widths)} floats: a layer's input and output tables), but a rank "
            f"has {human_bytes(-worst_room)} ({env.local_world_size} rank(s) share a node's available memory). "
            "HINT: train.eval_mode=sampled, or more nodes for the job (cluster.nodes, with graph.num_parts a multiple "
            "of the ranks), or a smaller model.hidden_channels")
    log.info("rank %d: exact evaluation will hold about %s (%s available to the rank); its edges in local ids, %s, "
             "are kept from one evaluation to the next", env.rank, human_bytes(need), human_bytes(room),
             human_bytes(edges * (8 if p.typed else 4)))
