"""Where a partition lives beside its prepared graph, and making it unless it is there (reuse costs a file stat)."""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import time
from pathlib import Path

import torch

from hpcgnn import env
from hpcgnn.checks import is_typed
from hpcgnn.config import DatasetConfig, GraphConfig
from hpcgnn.data import cache, cache_folder, open_graph, open_typed, prepare
from hpcgnn.data.typed import relation_key
from hpcgnn.errors import ConfigError
from hpcgnn.partition.compute import check_partition_memory, compute_parts, seed_weight
from hpcgnn.partition.multilevel import LOCAL, Comm
from hpcgnn.partition.report import partition_report
from hpcgnn.partition.write import time_arrays, typed_arrays, write_parts

log = logging.getLogger(__name__)

FORMAT_VERSION = 1


def parts_folder(dataset: DatasetConfig, graph: GraphConfig, num_parts: int) -> Path:
    suffix = "-train" if graph.balance_train and graph.method == "metis" else ""
    return cache_folder(dataset) / "parts" / f"{graph.method}-k{num_parts}-s{graph.seed}{suffix}"


def dataset_fingerprint(folder: Path) -> str:
    """Identifies a prepared graph: its folder name (the config key) and its meta.json."""
    return hashlib.sha256(folder.name.encode() + (folder / "meta.json").read_bytes()).hexdigest()[:16]


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

        train = open_link(dataset).train
        edges = {"train_pos": train.pos, **({"train_time": train.time} if train.time is not None else {})}
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
            "num_features": graph.num_features, "num_classes": graph.num_classes, "labels": graph.labels,
            "num_parts": num_parts,
            "method": graph_cfg.method, "seed": graph_cfg.seed, "balance_train": graph_cfg.balance_train,
            "partition_s": round(seconds, 3), "tasks": comm.size, "feature_dtype": dataset.feature_dtype,
            "report": partition_report(graph, part, num_parts, weight, schema, comm), "edge_arrays": sorted(edges)}
    if schema is not None:  # (a relation with edge features: its parts' edge counts, whose sums give its edge ids)
        meta["typed"] = {**schema.to_meta(), "arrays": typed_arrays(typed),
                         "part_edges": typed_part_edges(typed, part, num_parts)}
    if graph.edge_attr is not None:  # each part's edges carry their features; a global edge id is its part's
        #                              first (the parts' edges counted in order) plus its place in the part's CSR
        meta["edge_features"] = graph.edge_dim
        meta["part_edges"] = torch.bincount(part.long(), weights=graph.degree().double(),
                                            minlength=num_parts).long().tolist()
    if graph.timeline is not None:  # each part holds its rows' edges in time (and its nodes' seed times)
        meta["times"] = {"arrays": time_arrays(graph), "dtype": str(graph.timeline.time.dtype).split(".")[-1]}
    elif typed is not None and typed.timelines:  # (each relation's: the typed arrays)
        meta["times"] = {"arrays": [], "typed": True}
    write_parts(graph, part, folder, meta, edges, typed, comm)
    return folder, read_meta(folder) or meta, False


def typed_part_edges(typed, part: torch.Tensor, num_parts: int) -> dict[str, list[int]]:
    """Relation key -> each part's count of its edges (those into the part's nodes), for the relations whose edges
    have features."""
    off, out = typed.offsets(), {}
    for rel in typed.edge_attr or {}:
        t = rel[2]
        owner = part[off[t]:off[t] + typed.num_nodes[t]].long()
        out[relation_key(rel)] = torch.bincount(owner, weights=typed.degree(rel).double(),
                                                minlength=num_parts).long().tolist()
    return out


def parts_ready(dataset: DatasetConfig, graph_cfg: GraphConfig, num_parts: int) -> bool:
    """Whether the artifact for this job exists and was made from the prepared graph (cheap)."""
    data_folder = cache_folder(dataset)
    meta = read_meta(parts_folder(dataset, graph_cfg, num_parts))
    return (meta is not None and cache.is_complete(data_folder)
            and meta["dataset"] == dataset_fingerprint(data_folder))

