"""Graph partitions as a cached, checked artifact.

A partition of a prepared graph into K parts lives next to the prepared graph, in
``<dataset cache>/parts/<method>-k<K>-s<seed>[-train]/``::

    META.json        format version, dataset fingerprint, K, method, seed, the report,
                     and a sha256 of every file below
    node_part.npy    int16 [num_nodes] (int32 from 32768 parts): the part that owns each node
    node_local.npy   int32 [num_nodes]: the node's row inside its part
    degree.npy       int32 [num_nodes]: every node's in-degree (ranks pick hot remote nodes by it)
    part_<i>/        nodes.npy (owned global ids, sorted), rowptr.npy + col.npy (the owned
                     nodes' full in-adjacency, global ids), x.npy, y.npy, and the owned
                     train_idx/val_idx/test_idx (global ids); a typed graph's parts also hold,
                     per relation, rowptr__<rel>.npy + col__<rel>.npy: the in-adjacency of the
                     part's nodes of the relation's target type (sources in their type's own ids)

A typed graph is partitioned as its homogeneous view (types one after another in the id space),
with every node type balanced across parts as well as the training nodes; META.json records the
types and each part's count of every type.

- :func:`compute_parts`: the node -> part map, METIS (pymetis, fixed seed: byte-identical
  across runs) or random, balancing training nodes as well as nodes;
- :func:`ensure_parts`: partition unless the artifact is there (reuse costs a file stat);
- :func:`open_parts`: verify checksums, K and the dataset, then memory-map a rank's parts.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from hpcgnn import env
from hpcgnn.checks import is_typed
from hpcgnn.config import DatasetConfig, GraphConfig
from hpcgnn.data import cache, cache_folder, open_graph, open_typed, prepare
from hpcgnn.data.graph import Graph
from hpcgnn.data.ooc import NpyAppender, drop_pages, gather_sorted, trim_heap
from hpcgnn.data.typed import Relation, TypedSchema, relation_key
from hpcgnn.errors import ConfigError, PartitionError
from hpcgnn.io import AtomicFolder, sha256_file, stop_cleanly_on_sigterm
from hpcgnn.partition.multilevel import LOCAL, Comm, balance_groups, task_spans
from hpcgnn.rng import generator
from hpcgnn.writers import writer_tag

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
WRITE_ROWS = 1 << 16  # nodes per chunk when a part's columns and features are written
PART_ARRAYS = ("nodes", "rowptr", "col", "x", "y", "train_idx", "val_idx", "test_idx")
# Peak memory of partitioning beyond the mapped graph, per directed edge: METIS itself (pymetis,
# about 66 B) plus our symmetry check; benchmarks/partition.py measured 105 B at 25M edges.
METIS_BYTES_PER_EDGE = 110
METIS_BYTES_PER_NODE = 64


def parts_folder(dataset: DatasetConfig, graph: GraphConfig, num_parts: int) -> Path:
    suffix = "-train" if graph.balance_train and graph.method == "metis" else ""
    return cache_folder(dataset) / "parts" / f"{graph.method}-k{num_parts}-s{graph.seed}{suffix}"


def dataset_fingerprint(folder: Path) -> str:
    """Identifies a prepared graph: its folder name (the config key) and its meta.json."""
    return hashlib.sha256(folder.name.encode() + (folder / "meta.json").read_bytes()).hexdigest()[:16]


# ---------------------------------------------------------------------------------------------
# Computing the node -> part map


def partition_memory(method: str, num_nodes: int, num_edges: int) -> int:
    """Estimated peak bytes partitioning needs beyond the mapped graph."""
    if method == "random":
        return 16 * num_nodes
    if method == "lp":  # O(nodes) state, one chunk of edges, and the first coarse level
        from hpcgnn.partition.multilevel import memory_estimate

        return memory_estimate(num_nodes, num_edges)
    return METIS_BYTES_PER_EDGE * num_edges + METIS_BYTES_PER_NODE * num_nodes


def check_partition_memory(method: str, num_nodes: int, num_edges: int, available: int) -> None:
    need = partition_memory(method, num_nodes, num_edges)
    if need > available:
        raise PartitionError(
            f"partitioning with graph.method={method} needs about {cache.human_bytes(need)} of memory "
            f"for {num_nodes} nodes and {num_edges} directed edges, but only {cache.human_bytes(available)} "
            "are available here. HINT: use graph.method=lp (multilevel, O(nodes) memory, close to METIS's cut) or "
            "graph.method=random (no extra memory, more cut edges), or run "
            "`python -m hpcgnn.partition` on a node with more memory (e.g. +cluster=NAME cluster.mem_gb=...); "
            "set graph.partition_mem_gb if the detected amount is wrong")


def metis_adjacency(rowptr: Tensor, col: Tensor) -> tuple[np.ndarray, np.ndarray]:
    """METIS wants a symmetric adjacency without self-loops; symmetrise only when needed."""
    n = rowptr.numel() - 1
    dst = torch.repeat_interleave(torch.arange(n), rowptr[1:] - rowptr[:-1])
    src = col.long()  # (stored as int32: src * n would overflow)
    loops = src == dst
    key = dst * n + src  # sorted already: CSR rows by target, columns sorted
    rev = src * n + dst
    if not bool(loops.any()) and torch.equal(key, torch.sort(rev).values):
        return rowptr.numpy(), col.numpy()
    keep = ~loops
    both = torch.unique(torch.cat([key[keep], rev[keep]]))
    d, s = both // n, both % n
    xadj = torch.zeros(n + 1, dtype=torch.long)
    xadj[1:] = torch.cumsum(torch.bincount(d, minlength=n), 0)
    return xadj.numpy(), s.contiguous().numpy()


def seed_weight(graph: Graph, train_edges: Tensor | None = None) -> Tensor:
    """int32 [num_nodes] (a partitioning task holds it throughout): the training seeds each node brings: 1
    for a training node, or (link prediction) the training edges it is the source of. Partitions balance
    these as well as nodes."""
    if train_edges is not None:
        return torch.bincount(train_edges[0], minlength=graph.num_nodes).int()  # (a node's edges: < 2^31)
    weight = torch.zeros(graph.num_nodes, dtype=torch.int32)
    weight[graph.train_idx] = 1
    return weight


def compute_parts(graph: Graph, num_parts: int, method: str, seed: int, balance_train: bool = True,
                  weight: Tensor | None = None, node_type: Tensor | None = None, scratch: Path | None = None,
                  comm: Comm = LOCAL) -> Tensor:
    """int32 [num_nodes]: the part of every node; a pure function of its inputs.

    ``weight``: the training seeds of each node (:func:`seed_weight`; default: the training nodes).
    ``node_type``: a typed graph's type of every node (:meth:`TypedSchema.type_of`): each type is
    balanced across parts too (METIS: one constraint per type instead of one for all nodes).
    ``scratch``: where ``lp`` keeps its coarse levels (default: the system's temporary folder); ``comm``:
    the tasks ``lp`` shares its work with (their scratch folder must be one they all see).
    """
    n = graph.num_nodes
    if num_parts == 1:
        return torch.zeros(n, dtype=torch.int32)
    weight = seed_weight(graph) if weight is None else weight
    is_train = weight > 0
    if method == "lp":  # multilevel label propagation over the mapped CSR, chunk by chunk
        from hpcgnn.partition.multilevel import balance_columns, lp_parts

        group = balance_groups(node_type if node_type is not None else torch.zeros(n, dtype=torch.int8), is_train,
                               balance_train)
        part = lp_parts(graph.rowptr, graph.col, num_parts, seed, balance_columns(group, weight, balance_train),
                        scratch=scratch, comm=comm)
        log.debug("lp: parts computed; rebalancing")
        return rebalance(graph, part, group, num_parts)
    types = node_type.long() if node_type is not None else torch.zeros(n, dtype=torch.long)
    num_types = int(types.max()) + 1 if n else 1
    if method == "random":
        gen = generator(seed, "random_parts")
        part = torch.empty(n, dtype=torch.int32)
        group_of = types * 2 + is_train.long()
        for g in range(2 * num_types):  # balanced in every (type, training or not) group
            order = (group_of == g).nonzero().flatten()
            order = order[torch.randperm(order.numel(), generator=gen)]
            part[order] = (torch.arange(order.numel()) % num_parts).int()
        return part
    if method != "metis":
        raise ConfigError(f"graph.method={method!r} is unknown: use metis, lp or random")
    import pymetis

    xadj, adjncy = metis_adjacency(graph.rowptr, graph.col)
    vweights = None
    columns = [torch.nn.functional.one_hot(types, num_types)] if num_types > 1 else []  # one per node type
    if balance_train:  # a constraint per node (1: nodes, or one per type), and its training seeds
        columns = (columns or [torch.ones(n, 1, dtype=torch.long)]) + [weight.long().unsqueeze(1)]
    if columns:
        vweights = torch.cat(columns, 1).numpy().astype(np.int64).reshape(-1)
    opts = pymetis.Options(seed=seed)
    result = pymetis.part_graph(num_parts, pymetis.CSRAdjacency(xadj, adjncy), vweights=vweights, options=opts)
    part = torch.from_numpy(np.asarray(result.vertex_part, dtype=np.int32))
    if num_types > 1:  # METIS meets several constraints only loosely (14% over on a small typed graph): fix it up
        part = rebalance(graph, part, balance_groups(types, is_train, balance_train), num_parts)
    return part


def rebalance(graph: Graph, part: Tensor, group: Tensor, num_parts: int, tolerance: float = 0.03) -> Tensor:
    """Move the fewest nodes so that every group (e.g. a node type's training nodes) has at most
    ``ceil((1 + tolerance) x its mean)`` nodes in any part: from each overfull part, the group's nodes with
    the fewest neighbours at home, each to the part with room where it has the most neighbours. Deterministic."""
    part = part.clone()
    deg = graph.degree()
    for g in torch.unique(group).tolist():
        members = (group == g).nonzero().flatten()
        counts = torch.bincount(part[members].long(), minlength=num_parts)
        cap = math.ceil((1 + tolerance) * members.numel() / num_parts)
        if int(counts.max()) <= cap:
            continue
        room = (cap - counts).clamp(min=0)
        movers = []
        for p in (counts > cap).nonzero().flatten().tolist():
            here = members[part[members] == p]
            nbr_part = part.index_select(0, graph.col[_rows(graph.rowptr, here)[1]]).long()
            owner = torch.repeat_interleave(torch.arange(here.numel()), deg.index_select(0, here))
            home = torch.bincount(owner[nbr_part == p], minlength=here.numel())
            movers.append(here[torch.argsort(home, stable=True)[: int(counts[p]) - cap]])
        movers = torch.cat(movers)
        _rp, pos = _rows(graph.rowptr, movers)
        owner = torch.repeat_interleave(torch.arange(movers.numel()), deg.index_select(0, movers))
        affinity = torch.zeros(movers.numel() * num_parts, dtype=torch.long)  # neighbours in each part
        affinity.index_add_(0, owner * num_parts + part.index_select(0, graph.col[pos]).long(),
                            torch.ones_like(owner))
        affinity = affinity.view(movers.numel(), num_parts)
        left = torch.ones(movers.numel(), dtype=torch.bool)
        while bool(left.any()):  # each round fills a part with room from the movers that like it best
            open_ = room > 0
            score = affinity.masked_fill(~open_, -1).masked_fill(~left.unsqueeze(1), -1)
            best = score.argmax(1)
            p = int(torch.bincount(best[left], minlength=num_parts).argmax())
            want = (left & (best == p)).nonzero().flatten()
            want = want[torch.argsort(-affinity[want, p], stable=True)][: int(room[p])]
            part[movers[want]] = p
            room[p] -= want.numel()
            left[want] = False
    return part


# ---------------------------------------------------------------------------------------------
# Writing, reporting, reading


def partition_report(graph: Graph, part: Tensor, num_parts: int, weight: Tensor | None = None,
                     schema: TypedSchema | None = None, comm: Comm = LOCAL) -> dict:
    """Edge-cut fraction, balance (max/mean) of nodes, edges and training seeds, halo and bytes per part;
    a typed graph's nodes of every type per part, and each type's balance."""
    from hpcgnn.partition.multilevel import CHUNK_EDGES

    trim_heap()  # (the partitioner's freed blocks)
    n = graph.num_nodes
    cut = 0
    edges = torch.zeros(num_parts, dtype=torch.float64)
    halo = torch.zeros(num_parts * n if num_parts <= 64 else 0, dtype=torch.bool)
    halo_sets: list[Tensor] = []
    # edge by edge, a chunk at a time (the graph may not fit); several tasks: each its share of the rows;
    # nothing of 8 bytes a node (part stays int32, degrees are taken per chunk)
    for a, b in task_spans(graph.rowptr, comm, CHUNK_EDGES, n)[comm.rank]:
        deg = graph.rowptr[a + 1:b + 1] - graph.rowptr[a:b]
        edges += torch.bincount(part[a:b], weights=deg.double(), minlength=num_parts)
        dst_part = torch.repeat_interleave(part[a:b], deg)
        src = graph.col[int(graph.rowptr[a]):int(graph.rowptr[b])].long()
        drop_pages(graph.col[int(graph.rowptr[a]):int(graph.rowptr[b])])
        remote = dst_part != part.index_select(0, src)
        cut += int(remote.sum())
        if halo.numel():  # a node is in part i's halo if an edge brings it into part i from elsewhere
            halo[dst_part[remote].long() * n + src[remote]] = True
        else:
            halo_sets.append(torch.unique(dst_part[remote].long() * n + src[remote]))
        del dst_part, src, remote
    cut = int(comm.all_reduce(torch.tensor([cut]))[0])
    edges = comm.all_reduce(edges).long()
    if halo.numel():
        flat = halo.view(torch.uint8)
        for a in range(0, flat.numel(), 1 << 22):  # in slices: the collective's buffers stay small
            comm.all_reduce(flat[a:a + (1 << 22)], "max")
        halo_count = halo.view(num_parts, n).sum(1)
    else:
        keys = torch.unique(torch.cat(comm.gather([torch.cat(halo_sets) if halo_sets else
                                                   torch.zeros(0, dtype=torch.long)])))
        halo_count = torch.bincount(keys // n, minlength=num_parts)
    del halo
    trim_heap()
    nodes = torch.bincount(part, minlength=num_parts)
    train = torch.bincount(part, weights=(seed_weight(graph) if weight is None else weight).double(),
                           minlength=num_parts).long()
    halo = halo_count.tolist()
    row_bytes = graph.x.size(1) * graph.x.element_size() + graph.y.element_size() + 8 * 2
    part_bytes = [int(nodes[i]) * row_bytes + int(edges[i]) * graph.col.element_size() for i in range(num_parts)]

    def balance(t: Tensor) -> float:
        return float(t.max()) / max(float(t.double().mean()), 1e-12)

    report = {"edge_cut": cut, "edge_cut_fraction": cut / max(graph.num_edges, 1),
              "nodes": nodes.tolist(), "edges": edges.tolist(), "train_nodes": train.tolist(),
              "balance": {"nodes": balance(nodes), "edges": balance(edges), "train_nodes": balance(train)},
              "halo_nodes": halo, "bytes": part_bytes}
    if schema is not None:
        off = schema.offsets()
        by_type = {t: torch.bincount(part[off[t]:off[t] + schema.num_nodes[t]].long(), minlength=num_parts)
                   for t in schema.node_types}
        report["nodes_by_type"] = {t: c.tolist() for t, c in by_type.items()}
        report["balance"]["by_type"] = {t: balance(c) for t, c in by_type.items()}
    return report


def _numpy(t: Tensor) -> np.ndarray:
    """A tensor as numpy writes it: bfloat16, which numpy lacks, as its 16 bits (META names the dtype)."""
    return (t.view(torch.uint16) if t.dtype == torch.bfloat16 else t).numpy()


def _rows(rowptr: Tensor, nodes: Tensor) -> tuple[Tensor, Tensor]:
    """(rowptr, positions in col) of the CSR restricted to ``nodes``."""
    start, deg = rowptr.index_select(0, nodes), rowptr.index_select(0, nodes + 1) - rowptr.index_select(0, nodes)
    sub = torch.zeros(nodes.numel() + 1, dtype=torch.long)
    sub[1:] = torch.cumsum(deg, 0)
    pos = torch.arange(int(sub[-1])) + torch.repeat_interleave(start - sub[:-1], deg)
    return sub, pos


def write_parts(graph: Graph, part: Tensor, folder: Path, meta: dict, edges: dict[str, Tensor] | None = None,
                typed=None, comm: Comm = LOCAL) -> None:
    """Write the artifact atomically (temporary folder, fsync'd files, rename).

    ``edges``: edge arrays [2, E] shared out by the part that owns each edge's source (a link task's
    training edges), written as ``part_<i>/<name>.npy``. ``typed``: the :class:`TypedGraph` whose
    homogeneous view ``graph`` is: each part also gets its nodes' in-adjacency per relation.
    Several tasks (``comm``): task t writes parts t, t + tasks, ... into one temporary folder; task 0
    writes the maps and META.json and renames the folder into place.
    """
    edges = edges or {}
    num_parts = meta["num_parts"]
    folder.parent.mkdir(parents=True, exist_ok=True)
    need = sum(getattr(graph, a).numel() * getattr(graph, a).element_size() for a in ("col", "x", "y")) * 1.05
    free = shutil.disk_usage(folder.parent).free
    if need > free:
        raise OSError(f"writing {num_parts} parts needs about {cache.human_bytes(need)} in {folder.parent}, but "
                      f"only {cache.human_bytes(free)} are free: set dataset.root to a larger file system")
    target = AtomicFolder(folder, tag=comm.broadcast_object(writer_tag()))
    tmp = target.tmp
    try:
        if comm.rank == 0:
            target.create()
        comm.barrier()
        files = {}

        def save(rel: str, array: Tensor) -> None:
            path = tmp / rel
            path.parent.mkdir(exist_ok=True)
            with open(path, "wb") as f:  # (bfloat16, which numpy lacks, as its 16 bits; META says which)
                np.save(f, _numpy(array))
            files[rel] = sha256_file(path)

        def save_rows(rel: str, source: Tensor, rows) -> None:
            """``source``'s rows at the ascending indices of each of ``rows``, appended chunk by chunk."""
            path = tmp / rel
            path.parent.mkdir(exist_ok=True)
            out = NpyAppender(path, _numpy(source[:0]).dtype, tuple(source.shape[1:]))
            for index in rows:
                out.append(_numpy(gather_sorted(source, index)))
            out.close()
            files[rel] = sha256_file(path)

        for i in range(comm.rank, num_parts, comm.size):
            mine = part == i
            nodes = mine.nonzero().flatten()
            # rows a chunk of nodes at a time: the part's columns and features never whole in memory
            runs = [nodes[a:a + WRITE_ROWS] for a in range(0, nodes.numel(), WRITE_ROWS)]
            save_rows(f"part_{i}/col.npy", graph.col, (_rows(graph.rowptr, r)[1] for r in runs))
            save_rows(f"part_{i}/x.npy", graph.x, runs)
            rowptr = torch.zeros(nodes.numel() + 1, dtype=torch.long)
            rowptr[1:] = torch.cumsum(graph.rowptr.index_select(0, nodes + 1) - graph.rowptr.index_select(0, nodes), 0)
            arrays = {"nodes": nodes, "rowptr": rowptr,
                      "y": graph.y.index_select(0, nodes) if graph.y.numel() else graph.y}  # a link graph: no labels
            for split in ("train_idx", "val_idx", "test_idx"):
                idx = getattr(graph, split)
                arrays[split] = idx[mine[idx]]
            for name, pairs in edges.items():
                arrays[name] = pairs[:, mine.index_select(0, pairs[0])].contiguous()
            if typed is not None:  # per relation, the rows of the part's nodes of its target type
                off = typed.offsets()
                for rel in typed.relations:
                    t = rel[2]
                    own = nodes[(nodes >= off[t]) & (nodes < off[t] + typed.num_nodes[t])] - off[t]
                    rp, pos = _rows(typed.rowptr[rel], own)
                    arrays[f"rowptr__{relation_key(rel)}"] = rp
                    arrays[f"col__{relation_key(rel)}"] = typed.col[rel].index_select(0, pos)
            for name in [*arrays]:
                save(f"part_{i}/{name}.npy", arrays[name])
            del arrays, rowptr, nodes, mine, runs
            for mapped in (graph.x, graph.col, graph.rowptr):  # a part's rows are all over the graph's pages
                drop_pages(mapped)
            trim_heap()
            log.debug("part %d written", i)
        if comm.rank == 0:
            local = torch.empty(graph.num_nodes, dtype=torch.int32)
            for i in range(num_parts):
                nodes = (part == i).nonzero().flatten()
                local[nodes] = torch.arange(nodes.numel(), dtype=torch.int32)
            save("node_part.npy", part.to(torch.int16) if num_parts < 2**15 else part)  # mapped by every rank
            save("node_local.npy", local)
            save("degree.npy", graph.degree().int())
        for other in comm.gather_objects(files):
            files.update(other)
        if comm.rank == 0:
            (tmp / "META.json").write_text(json.dumps({**meta, "files": dict(sorted(files.items()))}, indent=2))
            target.commit()  # another writer may win the race with the same parts
        comm.barrier()
    finally:
        if comm.rank == 0:
            target.discard()


def typed_arrays(typed) -> list[str]:
    """The per-relation arrays of a typed graph's parts (none for a homogeneous graph)."""
    if typed is None:
        return []
    return [f"{kind}__{relation_key(r)}" for r in typed.relations for kind in ("rowptr", "col")]


def read_meta(folder: Path) -> dict | None:
    try:
        meta = json.loads((folder / "META.json").read_text())
    except (OSError, ValueError):
        return None
    return meta if meta.get("format_version") == FORMAT_VERSION else None


def ensure_parts(dataset: DatasetConfig, graph_cfg: GraphConfig, num_parts: int,
                 available: int | None = None, comm: Comm = LOCAL) -> tuple[Path, dict, bool]:
    """Partition the prepared dataset unless the artifact exists; returns (folder, META, reused).

    ``comm``: the tasks of a multi-task partitioning job (``graph.method=lp`` shares the work; the other
    methods run on task 0); every task returns the same."""
    if num_parts < 1:
        raise ConfigError(f"graph.num_parts={num_parts} must be at least 1")
    if comm.rank == 0:
        prepare(dataset)
    comm.barrier()
    data_folder = prepare(dataset)  # (there now: a file check)
    folder = parts_folder(dataset, graph_cfg, num_parts)
    meta = read_meta(folder)
    if meta is not None and meta["dataset"] == dataset_fingerprint(data_folder):
        return folder, meta, True
    comm.barrier()  # every task has seen that the parts are missing before anything is removed
    if meta is not None and comm.rank == 0:  # made from an older graph under the same key: rebuild
        log.warning("%s was made from another graph; partitioning again", folder)
        shutil.rmtree(folder, ignore_errors=True)
    graph = open_graph(dataset)
    edges = {}
    if dataset.prepared_for == "link":  # parts balance, and hold, the training edges by their source
        from hpcgnn.data import open_link

        edges = {"train_pos": open_link(dataset).train.pos}
    weight = seed_weight(graph, edges.get("train_pos"))
    typed = open_typed(dataset) if is_typed(dataset) else None
    schema = typed.schema if typed is not None else None
    if available is None:
        available = (int(graph_cfg.partition_mem_gb * 2**30) if graph_cfg.partition_mem_gb is not None
                     else env.available_memory())
    check_partition_memory(graph_cfg.method, graph.num_nodes, graph.num_edges, available)
    t0 = time.perf_counter()
    folder.parent.mkdir(parents=True, exist_ok=True)
    node_type = schema.type_of() if schema is not None else None
    if graph_cfg.method == "lp" or comm.size == 1:
        part = compute_parts(graph, num_parts, graph_cfg.method, graph_cfg.seed, graph_cfg.balance_train, weight,
                             node_type, scratch=folder.parent, comm=comm)
    else:  # METIS and random are one process's work: task 0's, shared
        part = (compute_parts(graph, num_parts, graph_cfg.method, graph_cfg.seed, graph_cfg.balance_train, weight,
                              node_type) if comm.rank == 0 else torch.zeros(graph.num_nodes, dtype=torch.int32))
        part = comm.broadcast(part)
    seconds = time.perf_counter() - t0
    log.debug("parts computed in %.1f s; reporting", seconds)
    meta = {"format_version": FORMAT_VERSION, "dataset": dataset_fingerprint(data_folder),
            "dataset_name": dataset.name, "num_nodes": graph.num_nodes, "num_edges": graph.num_edges,
            "num_features": graph.num_features, "num_classes": graph.num_classes, "num_parts": num_parts,
            "method": graph_cfg.method, "seed": graph_cfg.seed, "balance_train": graph_cfg.balance_train,
            "partition_s": round(seconds, 3), "tasks": comm.size, "feature_dtype": dataset.feature_dtype,
            "report": partition_report(graph, part, num_parts, weight, schema, comm), "edge_arrays": sorted(edges)}
    if schema is not None:
        meta["typed"] = {**schema.to_meta(), "arrays": typed_arrays(typed)}
    write_parts(graph, part, folder, meta, edges, typed, comm)
    return folder, read_meta(folder) or meta, False


def format_report(meta: dict) -> str:
    r = meta["report"]
    b = r["balance"]
    lines = [f"{meta['dataset_name']}: {meta['num_parts']} parts ({meta['method']}, seed {meta['seed']}), "
             f"edge-cut {r['edge_cut_fraction']:.1%} of {meta['num_edges']} edges; balance max/mean: "
             f"nodes {b['nodes']:.3f}, edges {b['edges']:.3f}, training seeds {b['train_nodes']:.3f}"]
    if "nodes_by_type" in r:
        lines.append("  balance max/mean by node type: " + ", ".join(f"{t} {v:.3f}" for t, v in b["by_type"].items()))
    for i in range(meta["num_parts"]):
        types = (" (" + ", ".join(f"{c[i]} {t}" for t, c in r["nodes_by_type"].items()) + ")"
                 if "nodes_by_type" in r else "")
        lines.append(f"  part {i}: {r['nodes'][i]} nodes{types}, {r['edges'][i]} edges, {r['train_nodes'][i]} training "
                     f"seeds, halo {r['halo_nodes'][i]} nodes, {cache.human_bytes(r['bytes'][i])}")
    return "\n".join(lines)


@dataclass(frozen=True)
class TypedParts:
    """A typed graph's side of a rank's parts: per relation, the in-adjacency of the owned nodes of its
    target type (rows part by part, in id order; sources in their own type's ids)."""

    schema: TypedSchema
    rowptr: dict[Relation, Tensor]  # int64 [owned nodes of the target type + 1]
    col: dict[Relation, Tensor]  # int64: source ids, local to the source type
    type_base: dict[str, Tensor]  # int64 [num_parts] per type: an owned node v of that type has row
    #                               type_base[part(v)] + node_local(v) in its relations' CSRs (-1: not owned)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in [*self.rowptr.values(), *self.col.values()])


@dataclass(frozen=True)
class Parts:
    """What one rank holds: its parts (concatenated), plus the node -> (part, row) maps."""

    num_parts: int
    owned_parts: tuple[int, ...]
    node_part: Tensor  # int16 [num_nodes] (int32 from 32768 parts), memory-mapped: shared by a node's ranks
    node_local: Tensor  # int32 [num_nodes], row of each node inside its part, memory-mapped
    degree: Tensor  # int32 [num_nodes], in-degree of every node, memory-mapped
    nodes: Tensor  # int64 [owned], global ids, part by part
    rowptr: Tensor  # int64 [owned + 1], over the concatenated owned parts
    col: Tensor  # int64, global ids
    x: Tensor
    y: Tensor
    train_idx: Tensor
    val_idx: Tensor
    test_idx: Tensor
    part_offset: Tensor  # int64 [num_parts]: row of each owned part's first node here (-1: not owned)
    num_classes: int
    num_nodes: int  # of the whole graph
    train_pos: Tensor | None = None  # link prediction: int64 [2, E], the training edges whose source is owned here
    typed: TypedParts | None = None  # a typed graph's per-relation adjacency
    halo_bound: int = 0  # at most this many nodes owned elsewhere are sources of the owned nodes' in-edges

    @property
    def num_features(self) -> int:
        return self.x.size(1)

    def own_of_type(self, node_type: str) -> Tensor:
        """Global ids of the owned nodes of ``node_type`` (a typed graph), in the order of their typed rows."""
        off, n = self.typed.schema.offsets()[node_type], self.typed.schema.num_nodes[node_type]
        ids = self.nodes[(self.nodes >= off) & (self.nodes < off + n)]
        return ids[torch.argsort(self.typed_rows(node_type, ids))]

    def typed_rows(self, node_type: str, ids: Tensor) -> Tensor:
        """Rows of owned nodes (global ``ids``) of ``node_type`` in its relations' CSRs here (a typed graph)."""
        return self.typed.type_base[node_type].index_select(0, self.node_part.index_select(0, ids).long()) + \
            self.node_local.index_select(0, ids).long()

    def nbytes(self) -> int:
        """Bytes of graph data this rank holds (the maps included)."""
        own = sum(t.numel() * t.element_size() for t in (self.node_part, self.node_local, self.degree, self.nodes,
                                                           self.rowptr, self.col, self.x, self.y))
        return own + (self.typed.nbytes() if self.typed is not None else 0)


def open_parts(dataset: DatasetConfig, graph_cfg: GraphConfig, num_parts: int, owned: list[int],
               verify: bool = True) -> Parts:
    """Memory-map ``owned`` parts after checking the artifact fits this job and is intact."""
    data_folder = cache_folder(dataset)
    folder = parts_folder(dataset, graph_cfg, num_parts)
    meta = read_meta(folder)
    hint = (f"HINT: python -m hpcgnn.partition dataset={dataset.name} graph.num_parts={num_parts} "
            f"graph.method={graph_cfg.method} graph.seed={graph_cfg.seed}")
    if meta is None:
        raise PartitionError(f"no {num_parts}-part partition of {dataset.name} in {folder}. {hint}")
    if not cache.is_complete(data_folder) or meta["dataset"] != dataset_fingerprint(data_folder):
        raise PartitionError(f"{folder} was made from another graph than the prepared {dataset.name} in "
                             f"{data_folder}: delete it and partition again. {hint}")
    if meta["num_parts"] != num_parts:
        raise PartitionError(f"{folder} holds {meta['num_parts']} parts, the job needs {num_parts}. {hint}")
    typed_meta = meta.get("typed")
    if (typed_meta is None) == is_typed(dataset):  # the fingerprint covers it; a clear word anyway
        raise PartitionError(f"{folder} does not record the node types of the prepared {dataset.name}: delete it "
                             f"and partition again. {hint}")
    extra = [*meta.get("edge_arrays", []), *(typed_meta["arrays"] if typed_meta else [])]
    need = ["node_part.npy", "node_local.npy", "degree.npy"] + \
        [f"part_{i}/{a}.npy" for i in owned for a in [*PART_ARRAYS, *extra]]
    for rel in need:
        path = folder / rel
        if not path.is_file():
            raise PartitionError(f"{path} is missing: the partition is incomplete; delete {folder}. {hint}")
        if verify and sha256_file(path) != meta["files"].get(rel):
            raise PartitionError(f"{path} is corrupt (sha256 differs from META.json): delete {folder} and "
                                 f"partition again. {hint}")

    def load(rel: str) -> Tensor:
        t = torch.from_numpy(np.load(folder / rel, mmap_mode="c"))
        return t.view(torch.bfloat16) if rel.endswith("/x.npy") and meta.get("feature_dtype") == "bfloat16" else t

    edge_arrays = meta.get("edge_arrays", [])
    per_part = {i: {a: load(f"part_{i}/{a}.npy") for a in [*PART_ARRAYS, *extra]} for i in owned}
    offset = torch.full((num_parts,), -1, dtype=torch.long)
    start = 0
    for i in owned:  # one CSR over the owned parts, one after the other
        offset[i] = start
        start += per_part[i]["nodes"].numel()
    rowptr = concat_rowptr([per_part[i]["rowptr"] for i in owned])

    def cat(name: str, dim: int = 0) -> Tensor:
        tensors = [per_part[i][name] for i in owned]
        return tensors[0] if len(tensors) == 1 else torch.cat(tensors, dim)

    typed = None
    if typed_meta is not None:
        typed = _typed_parts(typed_meta, meta["report"]["nodes_by_type"], per_part, owned, num_parts)

    nodes, num_nodes = cat("nodes"), int(meta["num_nodes"])
    halos = meta["report"]["halo_nodes"]  # (each part's: their sum counts the rank's other parts too)
    return Parts(num_parts=num_parts, owned_parts=tuple(owned), node_part=load("node_part.npy"),
                 node_local=load("node_local.npy"), degree=load("degree.npy"), nodes=nodes, rowptr=rowptr, col=cat("col"),
                 x=cat("x"), y=cat("y"), train_idx=cat("train_idx"), val_idx=cat("val_idx"),
                 test_idx=cat("test_idx"), part_offset=offset,
                 num_classes=int(meta["num_classes"]), num_nodes=num_nodes,
                 train_pos=cat("train_pos", 1) if "train_pos" in edge_arrays else None, typed=typed,
                 halo_bound=min(num_nodes - nodes.numel(), sum(halos[i] for i in owned)))


def concat_rowptr(rowptrs: list[Tensor]) -> Tensor:
    """The rowptr of CSRs stacked one after another (their columns concatenated in the same order)."""
    if len(rowptrs) == 1:
        return rowptrs[0]
    shifted, start = [], 0
    for rp in rowptrs:
        shifted.append(rp[:-1] + start)
        start += int(rp[-1])
    return torch.cat([*shifted, torch.tensor([start])])


def _typed_parts(typed_meta: dict, nodes_by_type: dict[str, list[int]], per_part: dict, owned: list[int],
                 num_parts: int) -> TypedParts:
    """The owned parts' relation CSRs, one after another, and where each type's rows start."""
    schema = TypedSchema.from_meta(typed_meta)
    counts = torch.tensor([nodes_by_type[t] for t in schema.node_types])  # [types, parts]
    first = torch.cumsum(counts, 0) - counts  # a part's first row of each type (types in id order)
    type_base = {}
    for k, t in enumerate(schema.node_types):
        base = torch.full((num_parts,), -1, dtype=torch.long)
        before = 0
        for i in owned:
            base[i] = before - int(first[k, i])
            before += int(counts[k, i])
        type_base[t] = base
    rowptr, col = {}, {}
    for rel in schema.relations:
        key = relation_key(rel)
        rowptr[rel] = concat_rowptr([per_part[i][f"rowptr__{key}"] for i in owned])
        cols = [per_part[i][f"col__{key}"] for i in owned]
        col[rel] = cols[0] if len(cols) == 1 else torch.cat(cols)
    return TypedParts(schema, rowptr, col, type_base)


def parts_ready(dataset: DatasetConfig, graph_cfg: GraphConfig, num_parts: int) -> bool:
    """Whether the artifact for this job exists and was made from the prepared graph (cheap)."""
    data_folder = cache_folder(dataset)
    meta = read_meta(parts_folder(dataset, graph_cfg, num_parts))
    return (meta is not None and cache.is_complete(data_folder)
            and meta["dataset"] == dataset_fingerprint(data_folder))


def run_partition(dataset: DatasetConfig, graph_cfg: GraphConfig, num_parts: int, comm: Comm = LOCAL) -> dict:
    """Partition (or reuse) and print the report; the body of `python -m hpcgnn.partition` and its job."""
    t0 = time.perf_counter()
    folder, meta, reused = ensure_parts(dataset, graph_cfg, num_parts, comm=comm)
    took = time.perf_counter() - t0
    peak = peak_rss()
    if comm.rank == 0:
        print(format_report(meta), flush=True)
        how = (f"reused in {took:.3f} s" if reused else
               f"partitioned in {meta['partition_s']:.1f} s by {comm.size} task(s), written in {took:.1f} s")
        print(f"parts: {folder} ({how})", flush=True)
    print(f"task {comm.rank}/{comm.size}: {torch.get_num_threads()} threads, peak RSS {peak / 2**20:.0f} MB", flush=True)
    return {**meta, "folder": str(folder), "reused": reused, "seconds": took, "peak_rss": peak}


def peak_rss() -> int:
    """This process's peak resident memory in bytes (VmHWM), 0 where /proc is missing."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def run_partition_task(cfg) -> dict:
    """Entry of the partitioning job that submitit runs; importable by reference. Several tasks (lp on
    ``cluster.nodes`` nodes): a gloo process group from SLURM's variables, and the work shared."""
    from hpcgnn.dist import process_group

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    environ = env.current()
    rank_env = env.RankEnv.from_environ(environ, (cfg.dist.port_min, cfg.dist.port_max), cfg.dist.master_port)
    # the CPUs the job asked for (torch would take every core it sees: where SLURM does not bind tasks to
    # their cores, tasks sharing a node would each run a thread per core)
    torch.set_num_threads(rank_env.default_threads(environ))
    with stop_cleanly_on_sigterm("partition task"), process_group(rank_env, cfg.dist, torch.device("cpu")):
        comm = Comm(rank_env.rank, rank_env.world_size) if rank_env.world_size > 1 else LOCAL
        return run_partition(cfg.dataset, cfg.graph, cfg.graph.parts_for(cfg.world_size), comm)
