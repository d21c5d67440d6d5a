"""Training techniques at scale: LR scaling and warmup, accumulation, mixed precision,
gradient compression, and exact (full-neighbourhood) layer-wise inference.

Each is a ``train.*`` option; the trainer calls these helpers and records what they did
(effective LR and batch, bytes per all-reduce) in ``summary.json``.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
import warnings
from dataclasses import dataclass

import torch
from torch import Tensor

from hpcgnn import dist
from hpcgnn.env import available_memory
from hpcgnn.errors import ConfigError

log = logging.getLogger(__name__)

# --------------------------------------------------------------------------- LR and its schedule


def effective_lr(lr: float, scaling: str, world_size: int, accumulate: int = 1) -> float:
    """``lr`` is for one rank and one micro-batch; the global batch grows with ranks x accumulation."""
    k = world_size * accumulate
    if scaling == "linear":
        return lr * k
    if scaling == "sqrt":
        return lr * math.sqrt(k)
    return lr


def lr_multiplier(step: int, total: int, warmup: int, schedule: str) -> float:
    """Linear warmup over ``warmup`` optimizer steps, then constant or cosine down to 0 at ``total``."""
    if warmup and step < warmup:
        return (step + 1) / warmup
    if schedule == "cosine":
        done = (step - warmup) / max(total - warmup, 1)
        return 0.5 * (1.0 + math.cos(math.pi * min(done, 1.0)))
    return 1.0


def make_scheduler(opt: torch.optim.Optimizer, schedule: str, total_steps: int, warmup_fraction: float):
    """A LambdaLR (its state is plain numbers: checkpoints load it with weights_only)."""
    warmup = int(warmup_fraction * total_steps)
    return torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_multiplier(s, total_steps, warmup, schedule))


# --------------------------------------------------------------------------- mixed precision


BF16_CPU_FLAGS = ("amx_bf16", "avx512_bf16")  # CPUs whose matrix units or vector units compute in bf16


def resolve_precision(precision: str, device: torch.device, cpu_flags: frozenset[str] | None = None
                      ) -> tuple[str, str]:
    """``train.precision`` with ``auto`` decided: (precision, why). ``auto`` is bf16 autocast where the
    hardware computes bf16 natively (a GPU that supports it; a CPU with AMX or AVX512-BF16: 4x fp32's matrix
    throughput with AMX), fp32 elsewhere. Master weights, optimizer state and the loss stay fp32."""
    if precision != "auto":
        return precision, "train.precision"
    if device.type == "cuda":
        if torch.cuda.is_bf16_supported():
            return "bf16", f"{torch.cuda.get_device_name(device)} computes bf16"
        return "fp32", f"{torch.cuda.get_device_name(device)} has no bf16"
    from hpcgnn import env

    flags = env.cpu_flags() if cpu_flags is None else cpu_flags
    have = [f for f in BF16_CPU_FLAGS if f in flags]
    if have:
        return "bf16", f"the CPU has {', '.join(have)}"
    return "fp32", "the CPU has neither AMX nor AVX512-BF16"


def autocast(precision: str, device: torch.device):
    """bf16 autocast on CPU or GPU, fp16 on GPU; fp32: nothing."""
    if precision == "fp32":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(device_type=device.type, dtype=dtype)


def grad_scaler(precision: str, device: torch.device):
    """fp16 needs loss scaling against underflow; bf16 has fp32's range and does not."""
    if precision != "fp16":
        return None
    if device.type != "cuda":
        raise ConfigError("train.precision=fp16 needs a GPU, and this rank runs on the CPU. HINT: "
                          "train.precision=bf16 (or auto) on CPUs")
    return torch.amp.GradScaler("cuda")


# --------------------------------------------------------------------------- gradient all-reduce


class CommHook:
    """DDP's gradient all-reduce, optionally compressed, with its time span and bytes counted.

    ``none``: the default all-reduce; ``fp16``/``bf16``: buckets cast for the wire and back;
    ``powersgd``: low-rank PowerSGD with error feedback (``powersgd_rank``). ``bytes`` is
    what one rank contributes per all-reduce (PowerSGD: its P and Q factors plus the
    uncompressed vectors, an estimate of what goes on the wire).
    """

    def __init__(self, compression: str = "none", powersgd_rank: int = 2, process_group=None):
        self.compression = compression
        self.lock = threading.Lock()
        self.first: float | None = None
        self.last: float | None = None
        self.sent = 0
        self.state = None
        if compression == "powersgd":
            from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

            self.state = powerSGD_hook.PowerSGDState(process_group=process_group, matrix_approximation_rank=powersgd_rank,
                                                     start_powerSGD_iter=2, use_error_feedback=True, warm_start=True)
            self.rank = powersgd_rank

    def take(self) -> tuple[float, int]:
        """(seconds from the first bucket's launch to the last one's completion, bytes) since the last call."""
        with self.lock:
            span = (self.last - self.first) if self.first is not None and self.last is not None else 0.0
            sent, self.first, self.last, self.sent = self.sent, None, None, 0
        return span, sent

    def _bytes(self, bucket) -> int:
        if self.compression in ("fp16", "bf16"):
            return bucket.buffer().numel() * 2
        if self.compression == "powersgd":
            total = 0
            for g in bucket.gradients():
                if g.dim() > 1:
                    n, m = g.shape[0], g[0].numel()
                    total += (n + m) * min(self.rank, n, m) * g.element_size()
                else:
                    total += g.numel() * g.element_size()
            return total
        return bucket.buffer().numel() * bucket.buffer().element_size()

    def hook(self, state, bucket):
        """The function DDP calls per bucket (register it with ``ddp.register_comm_hook(self.state, self.hook)``)."""
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

        with self.lock:
            if self.first is None:
                self.first = time.perf_counter()
            self.sent += self._bytes(bucket)
        if self.compression == "fp16":
            fut = default_hooks.fp16_compress_hook(None, bucket)
        elif self.compression == "bf16":
            fut = default_hooks.bf16_compress_hook(None, bucket)
        elif self.compression == "powersgd":
            fut = powerSGD_hook.powerSGD_hook(self.state, bucket)
        else:
            fut = default_hooks.allreduce_hook(None, bucket)

        def done(f):
            with self.lock:
                self.last = time.perf_counter()
            value = f.value()
            return value[0] if isinstance(value, list) else value

        return fut.then(done)


# --------------------------------------------------------------------------- accumulation


def step_weights(sizes: list[list[int]], rank: int, accumulate: int) -> list[float]:
    """Loss weight of each of this rank's micro-batches, from every rank's batch sizes.

    ``sizes[r][i]``: seeds (or, for subgraph samplers, 1 per batch) of rank r's batch i.
    Micro-batches are taken ``accumulate`` at a time into optimizer steps. DDP averages
    the ranks' gradients, so weight ``world x size / (all ranks' sizes in the step)`` makes
    each step's gradient the mean over every seed in it, also when ranks' batches differ
    (edge budgets) or a step is short (the last one).
    """
    world, mine = len(sizes), sizes[rank]
    totals = [sum(sum(s[g:g + accumulate]) for s in sizes) for g in range(0, len(mine), accumulate)]
    return [world * n / totals[i // accumulate] if totals[i // accumulate] else 0.0 for i, n in enumerate(mine)]


# --------------------------------------------------------------------------- exact inference


@torch.no_grad()
def layerwise_inference(model: torch.nn.Module, graph, device: torch.device, chunk_size: int, rank: int,
                        world_size: int, transform=None) -> Tensor:
    """Logits of every node with full neighbourhoods, layer by layer (no sampling: exact).

    Each layer is computed for all nodes, in chunks of target nodes with all their
    in-neighbours, through PyG's own ``BasicGNN.inference_per_layer``; ranks share the nodes
    (contiguous ranges) and all-gather each layer's output with a tensor collective, and the
    next layer reads it. ``transform``: the model's batch transform; GCN's (global-degree
    weights and self-loops) turns a chunk into a weighted sparse adjacency, run in fp32
    (sparse products have no bf16 kernel on CPU).
    """
    from hpcgnn.models import MLPBaseline

    model.eval()
    n = graph.num_nodes
    if isinstance(model, MLPBaseline):
        return _sharded(n, chunk_size, rank, world_size, lambda a, b: model(graph.x[a:b].float().to(device)).float().cpu())
    x = graph.x
    for i in range(model.num_layers):
        x = _sharded(n, chunk_size, rank, world_size,
                     lambda a, b, x=x, i=i: _layer(model, i, x, graph, a, b, device, transform))
    return x


def _chunked(lo: int, hi: int, chunk_size: int, fn) -> Tensor:
    """``fn(a, b)`` over ``lo .. hi`` in chunks, concatenated (``fn(lo, lo)``'s empty rows when there are none)."""
    outs = [fn(a, min(a + chunk_size, hi)) for a in range(lo, hi, chunk_size)]
    return torch.cat(outs) if outs else fn(lo, lo)


def _sharded(n: int, chunk_size: int, rank: int, world_size: int, fn) -> Tensor:
    """Rows ``0 .. n`` of ``fn``, each rank computing a contiguous range in chunks; all-gathered."""
    per = math.ceil(n / world_size)
    counts = [max(0, min(n, (r + 1) * per) - min(n, r * per)) for r in range(world_size)]
    return dist.all_gather_rows(_chunked(min(rank * per, n), min((rank + 1) * per, n), chunk_size, fn), counts)


@dataclass(frozen=True)
class LocalCSR:
    """A rank's own rows of the in-adjacency in local ids: its nodes first (in row order), then the halo."""

    rowptr: Tensor
    col: Tensor


SLICE_EDGES = 1 << 24  # a rank's edges mapped to local rows at a time (a few hundred MB of temporaries)
FETCH_ROWS = 1 << 18  # halo rows asked in one exchange (its buffers: a few times this many rows)


def exact_inference_bytes(own: int, halo: int, edges: int, widths, edge_bytes: int = 4) -> int:
    """About the peak bytes exact partitioned inference adds on a rank: the widest layer's input and output
    tables (``own`` + ``halo`` rows of float32), its ``edges`` in local ids, and the fetch buffers."""
    width = max(widths)
    return 2 * (own + halo) * width * 4 + edges * edge_bytes + 4 * min(FETCH_ROWS, halo) * width * 4


def check_exact_inference_memory(parts, model_cfg, env) -> None:
    """train.eval_mode=full on a partitioned graph: fail at start, together, when a rank's layer tables would not
    fit in its share of the node's memory (not at the first evaluation, after an epoch of training)."""
    from hpcgnn.data.cache import human_bytes

    p, m = parts, model_cfg
    edges = sum(c.numel() for c in p.typed.col.values()) if p.typed is not None else p.col.numel()
    need = exact_inference_bytes(p.nodes.numel(), p.halo_bound, edges, (p.num_features, m.hidden_channels,
                                                                       p.num_classes), 8 if p.typed else 4)
    room = available_memory() // env.local_world_size
    worst_need, worst_room = dist.all_reduce_max(torch.tensor([need, -room])).tolist()
    if worst_need > -worst_room:
        raise ConfigError(
            f"train.eval_mode=full on this partitioned graph needs about {human_bytes(worst_need)} on a rank (its "
            f"nodes and its halo, x {max(p.num_features, m.hidden_channels)} floats, twice: a layer's input and "
            f"output), but a rank has {human_bytes(-worst_room)} ({env.local_world_size} rank(s) share a node's "
            "available memory). HINT: train.eval_mode=sampled, or more nodes for the job (cluster.nodes, with "
            "graph.num_parts a multiple of the ranks), or a smaller model.hidden_channels")
    log.info("rank %d: exact evaluation will hold about %s (%s available to the rank)", env.rank, human_bytes(need),
             human_bytes(room))


@torch.no_grad()
def partitioned_layerwise_inference(model: torch.nn.Module, store, device: torch.device, chunk_size: int,
                                    transform_for=None) -> Tensor:
    """Logits of this rank's own nodes (in its row order), exact: layer by layer, each rank computes its own
    nodes with all their in-neighbours; before each layer it fetches the previous layer's outputs of its halo
    (the non-owned sources of its nodes' in-edges) from their owners, through the partitioned store's
    exchanges (the same number of rounds on every rank). ``transform_for(degree)``: the model's batch
    transform for nodes in local ids given their global in-degrees (GCN's normalisation), or None.

    Memory: one layer's input and output tables (own nodes and halo, float32), the rank's edges in local
    ids (int32), and bounded temporaries: edges are mapped ``SLICE_EDGES`` at a time, outputs are written
    into their table chunk by chunk, and the halo is fetched ``FETCH_ROWS`` rows an exchange."""
    from hpcgnn.models import MLPBaseline

    model.eval()
    parts, view, ex = store.parts, store.view, store.exchange
    own = parts.nodes.numel()
    if isinstance(model, MLPBaseline):
        return _chunked(0, own, chunk_size, lambda a, b: model(parts.x[a:b].float().to(device)).float().cpu())
    halo = _remote_ids(parts.col, 0, view)
    graph = LocalCSR(parts.rowptr, _localized(parts.col, 0, view, view.row, own, halo, torch.int32))
    transform = transform_for(parts.degree.index_select(0, torch.cat([parts.nodes, halo]))) if transform_for else None
    fill = _halo_filler(ex, view, own, halo, view.row)
    table = torch.empty(own + halo.numel(), parts.num_features)
    for a in range(0, own, FETCH_ROWS):
        b = min(a + FETCH_ROWS, own)
        table[a:b] = parts.x[a:b]  # (upcast a slice at a time)
    fill(table)
    for i in range(model.num_layers):
        last = i == model.num_layers - 1
        table = _into_table(own, 0 if last else halo.numel(), chunk_size,
                            lambda a, b, x=table, i=i: _layer(model, i, x, graph, a, b, device, transform))
        if not last:
            fill(table)
    return table


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


def _halo_filler(ex, view, own: int, halo: Tensor, row_of):
    """``fill(table)``: rows ``own..`` of ``table`` become its owners' rows of the ``halo`` nodes (they read
    their own rows ``row_of(id)``); collective, in as many exchanges of ``FETCH_ROWS`` rows as the rank
    with the largest halo needs (decided once, here)."""
    from hpcgnn.sampling.distributed import fetch_rows

    rounds = int(dist.all_reduce_max(torch.tensor([math.ceil(halo.numel() / FETCH_ROWS)])).item())
    owner = view.owner(halo)

    def fill(table: Tensor) -> None:
        for j in range(rounds):
            a, b = min(j * FETCH_ROWS, halo.numel()), min((j + 1) * FETCH_ROWS, halo.numel())
            table[own + a:own + b] = fetch_rows(ex, view, table, halo[a:b], owner[a:b], row_of)
    return fill


def _into_table(n: int, extra: int, chunk_size: int, fn) -> Tensor:
    """``fn(a, b)`` over rows ``0 .. n`` in chunks, written into one table with ``extra`` rows left after them
    (for the halo), allocated at the first chunk's width."""
    table = None
    for a in range(0, max(n, 1), chunk_size):  # (one empty chunk gives the width when there are no rows)
        out = fn(a, min(a + chunk_size, n))
        if table is None:
            table = out.new_empty((n + extra, *out.shape[1:]))
        table[a:a + out.size(0)] = out
    return table


@dataclass(frozen=True)
class LocalTypedCSR:
    """A typed rank's in-adjacency per relation in local ids: rows are its own nodes of the relation's target
    type (in their typed-row order); sources index the source type's table: its own nodes, then its halo."""

    rowptr: dict
    col: dict


@torch.no_grad()
def partitioned_typed_layerwise_inference(model: torch.nn.Module, store, device: torch.device,
                                          chunk_size: int) -> Tensor:
    """Logits of this rank's own target-type nodes (rows: ``parts.typed_rows(target, ids)``), exact: layer by
    layer, each type the next layer reads, each rank its own nodes with all their in-neighbours along every
    relation; before each layer it fetches the halo's previous-layer outputs of every type the layer reads
    from their owners (the same exchanges on every rank, type by type). Memory as the homogeneous path's."""
    from hpcgnn.models import TypedMLP

    model.eval()
    parts, view, ex = store.parts, store.view, store.exchange
    typed, off = parts.typed, parts.typed.schema.offsets()
    types = list(typed.schema.node_types)
    own = {t: parts.own_of_type(t) for t in types}
    if isinstance(model, TypedMLP):
        x = parts.x.index_select(0, view.row(own[model.target]))
        return _chunked(0, x.size(0), chunk_size, lambda a, b: model.mlp(x[a:b].float().to(device)).float().cpu())
    halo = {t: torch.unique(torch.cat([torch.empty(0, dtype=torch.long)] + [
        _remote_ids(c, off[t], view) for rel, c in typed.col.items() if rel[0] == t])) for t in types}
    row_of = {t: (lambda ids, t=t: parts.typed_rows(t, ids)) for t in types}
    graph = LocalTypedCSR(typed.rowptr, {rel: _localized(c, off[rel[0]], view, row_of[rel[0]], own[rel[0]].numel(),
                                                         halo[rel[0]]) for rel, c in typed.col.items()})
    fill = {t: _halo_filler(ex, view, own[t].numel(), halo[t], row_of[t]) for t in types}  # (in type order)

    def reads(i: int) -> set[str]:
        """The types whose halo layer ``i`` reads (the sources of its relations; none past the last)."""
        if i >= model.num_layers:
            return set()
        return {rel[0] for t in model.layer_types(i) for rel, _ in model.relations_into(i, t)}

    x = {}
    for t in types:  # layer 0's input: own features (upcast), then the halo's rows, where layer 0 reads them
        x[t] = torch.empty(own[t].numel() + (halo[t].numel() if t in reads(0) else 0), parts.num_features)
        x[t][:own[t].numel()] = parts.x.index_select(0, view.row(own[t]))
        if t in reads(0):
            fill[t](x[t])
    for i in range(model.num_layers):
        computes, wanted = model.layer_types(i), reads(i + 1)
        here = {t: x[t].to(device) for t in types if t in reads(i) or t in computes}
        x = {t: _into_table(own[t].numel(), halo[t].numel() if t in wanted else 0, chunk_size,
                            lambda a, b, t=t, i=i, here=here: model.inference_per_layer(i, t, here, graph, a, b)
                            .float().cpu()) for t in computes}
        del here
        for t in types:  # (type order: the same exchanges on every rank)
            if t in wanted:
                fill[t](x[t])
    return x[model.target][:own[model.target].numel()]


def _layer(model, i: int, x: Tensor, graph, lo: int, hi: int, device: torch.device, transform) -> Tensor:
    """Layer ``i`` for targets ``lo..hi`` with all their in-neighbours (targets first, as root weights expect)."""
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
        adj = torch.sparse_csr_tensor(crow, cols, values, (t, n_id.numel()), check_invariants=True)
        with torch.autocast(device.type, enabled=False):
            return model.inference_per_layer(i, x.index_select(0, n_id).float().to(device), adj.to(device),
                                             t).float().cpu()


@torch.no_grad()
def typed_layerwise_inference(model: torch.nn.Module, graph, device: torch.device, chunk_size: int, rank: int,
                              world_size: int) -> Tensor:
    """Logits of every target-type node of a typed graph with full neighbourhoods, layer by layer (exact).

    Each layer computes the node types the next one reads, every node of each, in chunks of nodes with
    all their in-neighbours along every relation (the model's ``inference_per_layer``); ranks share each
    type's nodes (contiguous ranges) and all-gather the layer's output. A model on the target's own
    features (the MLP) needs no graph.
    """
    from hpcgnn.models import TypedMLP

    model.eval()
    if isinstance(model, TypedMLP):
        x = graph.x[graph.target]
        return _sharded(x.size(0), chunk_size, rank, world_size, lambda a, b: model.mlp(x[a:b].float().to(device)).float().cpu())
    x = dict(graph.x)
    for i in range(model.num_layers):
        here = {k: v.to(device) for k, v in x.items()}  # the layer's input, where the model runs
        x = {t: _sharded(graph.num_nodes[t], chunk_size, rank, world_size, lambda a, b, t=t, i=i, here=here:
                         model.inference_per_layer(i, t, here, graph, a, b).float().cpu())
             for t in model.layer_types(i)}
    return x[graph.target]
