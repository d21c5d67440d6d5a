"""A rank's own parts of a partitioned graph; remote neighbours and feature rows travel over a second process
group, through the hot-node cache first."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import torch
from torch import Tensor

from hpcgnn import dist
from hpcgnn.checks import check_timed_config
from hpcgnn.config import RunConfig
from hpcgnn.data import cache
from hpcgnn.data.graph import csr_has_edge
from hpcgnn.data.prepared import timed
from hpcgnn.data.times import kept_before
from hpcgnn.env import RankEnv
from hpcgnn.errors import AllocationError, PartitionError
from hpcgnn.models import reads_edge_features
from hpcgnn.rng import generator
from hpcgnn.sampling import subgraph as sub
from hpcgnn.sampling.distributed import CommStats, fetch_rows
from hpcgnn.sampling.loader import shuffled_to
from hpcgnn.sampling.producers import GraphSide
from hpcgnn.sampling.shipping import SamplerState
from hpcgnn.stores.base import GraphViews, Store, fanouts, labels_of, say_times, typed_fanouts
from hpcgnn.stores.exact import (
    Exact,
    PartsPieces,
    TypedPartsPieces,
    check_exact_inference_memory,
    exact_outputs,
)

log = logging.getLogger(__name__)


def owned_has_edge(view):
    """Edge membership where this rank holds the target's row (its own nodes); False elsewhere. Enough for
    strict negatives of an owned source on an undirected graph: its neighbours are its in-neighbours."""
    parts = view.parts
    has = csr_has_edge(parts.rowptr, parts.col)

    def has_edge(src: Tensor, dst: Tensor) -> Tensor:
        out = torch.zeros(dst.numel(), dtype=torch.bool)
        owned = view.owner(dst) == view.rank
        if bool(owned.any()):
            out[owned] = has(src[owned], view.row(dst[owned]))
        return out

    return has_edge


def distinct(batch: Tensor) -> Tensor:
    """``batch`` with each value once, at its first place (itself when its values are distinct already)."""
    values, inverse = torch.unique(batch, return_inverse=True)
    if values.numel() == batch.numel():
        return batch
    first = torch.full((values.numel(),), batch.numel(), dtype=torch.long)
    first.scatter_reduce_(0, inverse, torch.arange(batch.numel()), "amin")
    return batch.index_select(0, first.sort().values)


def parts_as_of(parts, at: float):
    """A rank's parts (:class:`~hpcgnn.partition.parts.Parts` with a timeline, or typed parts with timelines:
    :func:`_typed_parts_as_of`) as of time ``at``: its rows' edges strictly before it, in the CSR's order with their
    features, every node's in-degree and the parts' first edge ids
    counted again over them (collective: each rank's rows add their own), and no timeline. What an exact pass as of
    ``at`` reads (:func:`hpcgnn.data.times.as_of`'s, over parts); a copy of the kept edges, in memory."""
    import dataclasses

    if parts.typed is not None and parts.typed.timelines is not None:
        return dataclasses.replace(parts, typed=_typed_parts_as_of(parts, at))
    rowptr, keep = kept_before(parts.rowptr, parts.timeline, at)
    kept = rowptr[1:] - rowptr[:-1]
    degree = torch.zeros(parts.num_nodes, dtype=torch.long)
    degree[parts.nodes] = kept
    more = {}
    if parts.edge_base is not None:  # a global edge id: its part's first, the parts' kept edges counted in order
        more = {"edge_attr": parts.edge_attr[keep], "edge_base": _edge_base(parts, parts.nodes, kept)}
    return dataclasses.replace(parts, rowptr=rowptr, col=parts.col[keep], degree=dist.all_reduce_sum(degree).int(),
                               timeline=None, **more)


def _edge_base(parts, rows: Tensor, kept: Tensor) -> Tensor:
    """Each part's first global edge id (int64 [num_parts + 1]) over the edges ``kept`` in each of the rank's CSR rows
    (``rows``: their nodes' global ids), the ranks' counts added together (collective)."""
    per_part = torch.bincount(parts.node_part.index_select(0, rows).long(), weights=kept.double(),
                              minlength=parts.num_parts).long()
    base = torch.zeros(parts.num_parts + 1, dtype=torch.long)
    base[1:] = torch.cumsum(dist.all_reduce_sum(per_part), 0)
    return base


def _typed_parts_as_of(parts, at: float):
    """A rank's typed parts as of time ``at``: each relation's rows' edges strictly before it (with their features),
    and each relation's parts' first edge ids counted again over them (collective); no timelines, no seed times."""
    import dataclasses

    typed = parts.typed
    rowptr, col, edge_attr, edge_base = {}, {}, {}, dict(typed.edge_base)
    for rel in typed.schema.relations:
        rowptr[rel], keep = kept_before(typed.rowptr[rel], typed.timelines[rel], at)
        col[rel] = typed.col[rel][keep]
        if rel in typed.edge_attr:
            edge_attr[rel] = typed.edge_attr[rel][keep]
        if rel in typed.edge_base:  # (a relation's rows: its target type's owned nodes, part by part)
            edge_base[rel] = _edge_base(parts, parts.own_of_type(rel[2]), rowptr[rel][1:] - rowptr[rel][:-1])
    return dataclasses.replace(typed, rowptr=rowptr, col=col, edge_attr=edge_attr, edge_base=edge_base,
                               timelines=None, seed_time=None)


@dataclass(frozen=True)
class PartSamplers:
    cache: object  # the rank's rows of any node (PartitionedFeatures): owned, cached, or fetched
    features: object  # what batches' rows are gathered from (the cache, or a typed graph's view of it)
    sampler: object  # evaluation's (and training's around the graph's nodes)
    seed_offset: int  # global id -> sampler seed (a typed graph's sampler takes target-type ids)


def part_samplers(cfg: RunConfig, view, exchange, labels: bool, strict: bool = False) -> PartSamplers:
    """A rank's neighbour sampler across parts and where its rows come from, as a rank and its sampler servers build
    them (the hot-node cache empty: the rank fills it together with the others); ``labels``: the batches carry the
    nodes' labels (the task's items are the graph's nodes). A timed graph's samples as of each seed's time
    (``time.respect``; ``strict``: strictly before it, the task's items say)."""
    from hpcgnn.sampling import distributed as d

    parts, g = view.parts, cfg.graph
    cache = features = d.PartitionedFeatures(view, exchange, labels=labels)
    seed_offset = 0
    if parts.typed is not None:  # batches are HeteroData; seeds are the target type's own ids
        from hpcgnn.sampling.typed import PartitionedTypedFeatures, PartitionedTypedSampler

        schema = parts.typed.schema
        seed_offset = schema.offsets()[schema.target]
        edge_ids = bool(parts.typed.edge_attr) and reads_edge_features(cfg.model)
        if parts.typed.timelines is not None and cfg.time.respect:
            from hpcgnn.sampling.temporal import PartitionedTypedTemporalSampler

            t = cfg.time
            sampler = PartitionedTypedTemporalSampler(view, typed_fanouts(cfg, schema), exchange, g.boundary_fraction,
                                                      edge_ids, t.strategy, t.window, strict)
        else:
            sampler = PartitionedTypedSampler(view, typed_fanouts(cfg, schema), exchange, g.boundary_fraction,
                                              edge_ids=edge_ids)
        features = PartitionedTypedFeatures(cache, sampler)
    else:  # (its batches say which edges they hold where the model reads their features)
        edge_ids = parts.edge_attr is not None and reads_edge_features(cfg.model)
        if parts.timeline is not None and cfg.time.respect:
            from hpcgnn.sampling.temporal import PartitionedTemporalSampler

            t = cfg.time
            sampler = PartitionedTemporalSampler(view, fanouts(cfg), exchange, g.boundary_fraction, edge_ids,
                                                 t.strategy, t.window, strict)
        else:
            sampler = d.PartitionedNeighborSampler(view, fanouts(cfg), exchange, g.boundary_fraction, edge_ids)
    return PartSamplers(cache, features, sampler, seed_offset)


def part_views(view, edge_rows=None) -> GraphViews:
    """What a task's items read of a rank's parts (``view``: a PartitionView): the graph's dimensions, which nodes
    the rank owns, its rows' edges, a link graph's training edges it owns, a typed graph's relations' rows."""
    parts = view.parts
    schema = parts.typed.schema if parts.typed is not None else None
    more = {}
    if schema is not None:
        off = schema.offsets()
        more = {"typed": parts.typed, "typed_rows": lambda node_type, ids: parts.typed_rows(node_type, ids + off[node_type])}
    return GraphViews(parts.num_features, parts.num_classes, parts.num_nodes, parts.labels, schema,
                      max(schema.edge_dims.values(), default=0) if schema else parts.edge_dim, whole=False,
                      has_edge=lambda: owned_has_edge(view), owns=lambda ids: view.owner(ids) == view.rank,
                      row_starts=lambda nodes: view.edge_ids(parts.rowptr.index_select(0, view.row(nodes))),
                      link_train=parts.train_pos, link_train_time=parts.train_time, edge_rows=edge_rows,
                      time_dtype=parts.timeline.time.dtype if parts.timeline is not None else None, **more)


class PartitionedStore(Store):
    """Each rank holds its parts; remote neighbours and features travel over a second process group."""

    def __init__(self, cfg: RunConfig, env: RankEnv, device: torch.device | None = None, items=None):
        super().__init__(cfg, env, device or torch.device("cpu"))
        check_timed_config(cfg, timed=timed(cfg.dataset))  # (before the parts are made: a PyG graph's, once prepared)
        self.layouts: dict = {}  # exact inference's edges in local ids and halo plan, kept between evaluations
        self._hold_parts()
        typed = self.parts.typed
        say_times(cfg, self.parts.timeline if typed is None or typed.timelines is None else
                  next(iter(typed.timelines.values())), env.rank == 0)
        self._make_samplers(items)
        self._count_steps()
        if cfg.graph.cache_mb > 0:
            self._warm_cache()
        self._log_holdings()

    def _hold_parts(self) -> None:
        """This rank's parts (its share of ``graph.num_parts``), the group its exchanges run on, and its nodes'
        degrees."""
        from hpcgnn.partition.cache import parts_folder
        from hpcgnn.partition.parts import open_parts
        from hpcgnn.sampling import distributed as d

        cfg, env = self.cfg, self.env
        self.num_parts = num_parts = cfg.graph.parts_for(env.world_size)
        if num_parts % env.world_size:  # the config check knew only the configured world size
            raise AllocationError(f"graph.num_parts={num_parts} cannot be shared by the {env.world_size} ranks started. "
                                  f"HINT: use a multiple of {env.world_size}, or graph.num_parts=0 (one part per rank)")
        per_rank = num_parts // env.world_size
        self.owned = list(range(env.rank * per_rank, (env.rank + 1) * per_rank))
        self.parts = parts = open_parts(cfg.dataset, cfg.graph, num_parts, self.owned)
        timeline, typed = parts.timeline, parts.typed
        timed_typed = typed is not None and typed.timelines is not None  # (a typed graph's: every relation's)
        if timed_typed:
            check_timed_config(cfg, True, typed.seed_time is not None)
        else:
            check_timed_config(cfg, timeline is not None, timeline is not None and timeline.seed_time is not None)
        if cfg.predict.at is not None and (timeline is not None or timed_typed):  # (predict at=T: exact, before T)
            self.parts = parts = parts_as_of(parts, cfg.predict.at)
            log.info("the parts as of %g: %s", cfg.predict.at, "each relation's edges before it" if timed_typed else
                     f"their {parts.col.numel()} edges before it (of {timeline.col.numel()})")
        if parts.edge_features_dropped and reads_edge_features(cfg.model):
            raise PartitionError(f"the {num_parts}-part partition of {cfg.dataset.name} was written without its edges' "
                                 "features (by an older hpcgnn), and the model reads them. HINT: delete "
                                 f"{parts_folder(cfg.dataset, cfg.graph, num_parts)} and partition again")
        self.stats_ = d.CommStats()
        self.exchange = d.Exchange(dist.new_group(cfg.dist), env.rank, env.world_size, dist.comm_device(), self.stats_)
        self.view = d.PartitionView(parts, env.rank, per_rank)
        self.degree = parts.degree
        self.weigh_by_seeds = True

    def _make_samplers(self, items) -> None:
        """Where batches' rows come from (the hot-node cache first, over every node type), the neighbour sampler
        across parts (evaluation's), the task's items over the rank's parts (``items``: their unit) and training's
        sampler (the neighbour sampler, or the items' around their seeds)."""
        s = part_samplers(self.cfg, self.view, self.exchange, items.own_sampler, items.strict_times)
        self.cache, self.features, self.sampler = s.cache, s.features, s.sampler
        self.seed_offset = s.seed_offset  # global id -> sampler seed (a typed graph's sampler takes target-type ids)
        self.open_items(items, part_views(self.view, s.cache))
        self.train_sampler = s.sampler if self.items.own_sampler else self.items.train_sampler(s.sampler)

    def sampler_state(self) -> SamplerState:
        """The rank's place, its parts, and its hot-node cache (the ids a warm-up chose, their rows as fetched)."""
        return SamplerState("parts", self.env.rank, self.env.world_size, {"num_parts": self.num_parts},
                            {"cache_ids": self.cache.cache_ids, "cache_x": self.cache.cache_x})

    @staticmethod
    def server_side(cfg: RunConfig, state: SamplerState, items) -> tuple[GraphSide, Tensor]:
        """A rank's training sampler built on a sampler server as the rank built it: its parts opened there (their
        files checked when the rank opened them), its cache as the rank filled it, an exchange that joins the group
        of every rank's sampler where its batches are made (:mod:`hpcgnn.sampling.relay`), and the task's items'
        sampler around their seeds (``items``: their unit)."""
        from hpcgnn.partition.parts import open_parts
        from hpcgnn.sampling import distributed as d

        rank, world, num_parts = state.rank, state.world_size, int(state.values["num_parts"])
        per_rank = num_parts // world
        parts = open_parts(cfg.dataset, cfg.graph, num_parts, list(range(rank * per_rank, (rank + 1) * per_rank)),
                           verify=False)
        exchange = d.Exchange(None, rank, world, torch.device("cpu"), d.CommStats())
        view = d.PartitionView(parts, rank, per_rank)
        s = part_samplers(cfg, view, exchange, items.own_sampler, items.strict_times)
        s.cache.cache_ids, s.cache.cache_x = state.arrays["cache_ids"], state.arrays["cache_x"]
        sampler = s.sampler if items.own_sampler else items.server_sampler(cfg, part_views(view, s.cache), s.sampler)
        return GraphSide(s.features, sampler, exchange), parts.degree

    def _count_steps(self) -> None:
        """Steps per epoch, the same on every rank (collective): the largest rank's seeds in batches, or (an
        edge budget) as many as the rank with the costliest seeds needs."""
        t, parts = self.cfg.train, self.parts
        self.own_seeds = own = self._own_train().numel()
        most, fewest = dist.all_reduce_max(torch.tensor([own, -own])).tolist()
        what = self.items.noun
        if -fewest == 0:  # decided together: one rank failing alone would leave the others in an exchange
            raise PartitionError(f"a rank owns no training {what} in the "
                                 f"{self.num_parts}-part partition. HINT: use fewer parts, or graph.balance_train=true "
                                 "with graph.method=metis")
        self.seeds_per_rank = most
        self.steps = math.ceil(self.seeds_per_rank / t.batch_size)
        self.row_cost: Tensor | None = None
        if t.edge_budget and self.items.own_sampler:  # (a budget of nodes' sampling cost)
            self.row_cost = sub.expected_edges_of_rows(parts.rowptr, parts.col, parts.degree, t.fanouts)
            cost = self.row_cost.index_select(0, self._rows(parts.train_idx)).double()
            need = sub.batches_for_budget(float(cost.mean()) * self.seeds_per_rank, 1, t.edge_budget,
                                          self.seeds_per_rank)
            self.steps = int(dist.all_reduce_max(torch.tensor([need])).item())

    def _warm_cache(self) -> None:
        """The hot-node cache filled (``graph.cache_mb``), from a few warm-up batches' sampling (``graph.cache_policy``)."""
        from hpcgnn.sampling import distributed as d

        g, t, parts = self.cfg.graph, self.cfg.train, self.parts
        budget = int(g.cache_mb * 2**20) // (parts.num_features * parts.x.element_size() + 8)
        gen = generator(t.seed, "cache_warmup", self.env.rank)
        warm = self.train_seeds(0).split(t.batch_size)[: g.warmup_batches]
        sampler = self.sampler
        if getattr(sampler, "timeline", None) is not None and not self.items.own_sampler:
            sampler = self.train_sampler  # (a timed graph's items carry their times: their own batches)
        elif not self.items.own_sampler:  # the warm-up samples around the items' ends (edges', targets')
            warm = [self.items.ends(ids) for ids in warm]
        warm = list(warm) + [warm[0][:0]] * (g.warmup_batches - len(warm))
        self.cache.fill_cache(d.hot_nodes(self.view, budget, g.cache_policy, sampler, warm, gen))

    def _log_holdings(self) -> None:
        parts, env = self.parts, self.env
        log.info("rank %d: parts %s of %d: %d nodes, %d edges, %d train seeds (padded to %d), cache %s rows "
                 "(%s), holds %s", env.rank, self.owned, self.num_parts, parts.nodes.numel(), parts.col.numel(),
                 self.own_seeds, self.seeds_per_rank, self.cache.cache_ids.numel(), self.cfg.graph.cache_policy,
                 cache.human_bytes(self.resident_bytes()))
        if not self.items.own_sampler:  # (the task's items: what they are)
            log.info("rank %d: %s", env.rank, self.items.describe(self.shape))
        if parts.typed is not None:
            schema, cached = parts.typed.schema, self.cache.cache_ids
            off = schema.offsets()
            log.info("rank %d: cached rows by node type: %s", env.rank,
                     {t: int(((cached >= off[t]) & (cached < off[t] + n)).sum()) for t, n in schema.num_nodes.items()})

    def train_seeds(self, epoch: int) -> Tensor:
        """The rank's own training seeds (nodes, or the task's items: ids of its edges, of its targets), shuffled and
        padded (wrapping) to the largest rank's count."""
        return shuffled_to(self._own_train(), self.seeds_per_rank, generator(self.cfg.train.seed, "epoch", epoch))

    def _own_train(self) -> Tensor:
        """The rank's own training items: the task's (the ids of its edges, of its targets), or its nodes (in the
        sampler's ids)."""
        ids = self.items.train_ids()
        return self.parts.train_idx - self.seed_offset if ids is None else ids

    def _rows(self, ids: Tensor) -> Tensor:
        """Rows of owned nodes (global ``ids``) in this rank's CSR."""
        p = self.parts
        return p.part_offset.index_select(0, p.node_part.index_select(0, ids).long()) + \
            p.node_local.index_select(0, ids).long()

    def train_batches(self, epoch: int) -> list[Tensor]:
        """The rank's seeds in ``steps`` batches; a seed the padding repeated inside one batch (a rank with fewer
        seeds than a batch holds) is in it once: a sampler takes distinct seeds."""
        seeds = self.train_seeds(epoch)
        if self.row_cost is not None:
            batches = sub.split_by_cost(seeds, self.row_cost.index_select(0, self._rows(seeds)), self.steps)
        else:
            batches = list(seeds.split(self.cfg.train.batch_size))
        return [distinct(b) for b in batches]

    def _own(self, split: str) -> Tensor:
        """The global ids of this rank's own nodes in ``split`` (``all``: every one; a typed graph: of its
        labelled type)."""
        parts = self.parts
        if split != "all":
            return getattr(parts, f"{split}_idx")
        return parts.nodes if parts.typed is None else parts.own_of_type(parts.typed.schema.target)

    def padded(self, ids: Tensor, batch_size: int) -> tuple[Tensor, int]:
        """This rank's ``ids`` and the batch count every rank walks (the most any rank needs: collective)."""
        return self._padded(ids, batch_size)

    def node_share(self, split: str) -> tuple[Tensor, int | None]:
        """Its own nodes of the split, and the batch count every rank walks."""
        return self._padded(self._own(split) - self.seed_offset, self.cfg.train.eval_batch_size)

    @staticmethod
    def _padded(mine: Tensor, batch_size: int) -> tuple[Tensor, int]:
        batches = math.ceil(mine.numel() / batch_size)
        return mine, int(dist.all_reduce_max(torch.tensor([batches])).item())

    def counters(self) -> CommStats:
        return self.stats_.snapshot()

    def comm(self, before: CommStats) -> dict:
        return (self.counters() - before).per_batch()

    def exact(self, model: torch.nn.Module, gcn_norm: bool = False, layers: int | None = None,
              on_layer=None) -> Exact:
        """Each rank computes its own nodes' outputs (in its row order; a typed graph: its own target-type nodes,
        in their typed rows); other nodes' rows come from their owners (a collective)."""
        t, parts, view, ex = self.cfg.train, self.parts, self.view, self.exchange
        if parts.typed is None:
            pieces, row_of = PartsPieces(parts, view, ex, self.device, t.eval_chunk, gcn_norm,
                                         edge_features=self.shape.edge_dim > 0, layouts=self.layouts), view.row
        else:
            target = parts.typed.schema.target
            pieces, row_of = TypedPartsPieces(parts, view, ex, self.device, t.eval_chunk, self.layouts), \
                (lambda ids: parts.typed_rows(target, ids))
        table = exact_outputs(model, pieces, layers, on_layer)

        def rows(ids: Tensor) -> Tensor:  # (the task's ids: a typed graph's are the target type's own)
            uniq, inv = torch.unique(ids + self.seed_offset, return_inverse=True)
            return fetch_rows(ex, view, table, uniq, view.owner(uniq), row_of).index_select(0, inv)

        def split(name: str) -> tuple[Tensor, Tensor]:
            ids = self._own(name)
            return table.index_select(0, row_of(ids)), labels_of(parts.y, view.row(ids))

        return Exact(rows, split, lambda name: self._own(name) - self.seed_offset)

    def check_exact(self, model_cfg) -> None:
        t = self.cfg.train  # (bf16 on the host: the CSR path's tables between layers are bf16)
        check_exact_inference_memory(self.parts, model_cfg, self.env, len(t.fanouts),
                                     narrow=t.precision == "bf16" and self.device.type == "cpu")

    def resident_bytes(self) -> int:
        return self.parts.nbytes() + self.cache.cache_bytes()
