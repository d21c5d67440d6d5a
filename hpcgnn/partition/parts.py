"""Reading a partition: checksums, K and the dataset verified, then a rank's parts memory-mapped (:class:`Parts`,
:class:`TypedParts`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from hpcgnn.checks import is_typed
from hpcgnn.config import DatasetConfig, GraphConfig
from hpcgnn.data import cache, cache_folder
from hpcgnn.data.graph import Timeline
from hpcgnn.data.ooc import rows_as_stored
from hpcgnn.data.prepared import timed
from hpcgnn.data.typed import Relation, TypedSchema, relation_key
from hpcgnn.errors import PartitionError
from hpcgnn.io import sha256_file
from hpcgnn.partition.cache import dataset_fingerprint, parts_folder, read_meta
from hpcgnn.partition.write import EDGE_FEATURES, PART_ARRAYS


@dataclass(frozen=True)
class TypedParts:
    """A typed graph's side of a rank's parts: per relation, the in-adjacency of the owned nodes of its
    target type (rows part by part, in id order; sources in their own type's ids)."""

    schema: TypedSchema
    rowptr: dict[Relation, Tensor]  # int64 [owned nodes of the target type + 1]
    col: dict[Relation, Tensor]  # int64: source ids, local to the source type
    type_base: dict[str, Tensor]  # int64 [num_parts] per type: an owned node v of that type has row
    #                               type_base[part(v)] + node_local(v) in its relations' CSRs (-1: not owned)
    # per relation with edge features: [owned edges, D] in its CSR's order here, and each part's first global edge
    # id of the relation (int64 [num_parts + 1]: a global id is its part's first plus its place in the part's CSR)
    edge_attr: dict[Relation, Tensor] = field(default_factory=dict)
    edge_base: dict[Relation, Tensor] = field(default_factory=dict)
    # a timed graph's: per relation, the owned rows' in-edges in time (places in this rank's CSR of the relation),
    # and the owned target-type nodes' seed times in their typed rows' order (None: not given); None: no times
    timelines: dict[Relation, Timeline] | None = None
    seed_time: Tensor | None = None

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in [*self.rowptr.values(), *self.col.values(),
                                                           *self.edge_attr.values()])


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
    train_time: Tensor | None = None  # a timed graph's link prediction: [E], each of ``train_pos``' times
    typed: TypedParts | None = None  # a typed graph's per-relation adjacency
    halo_bound: int = 0  # at most this many nodes owned elsewhere are sources of the owned nodes' in-edges
    labels: dict | None = None  # what the labels are (hpcgnn.labels.profile; None: class ids)
    edge_attr: Tensor | None = None  # [owned edges, D]: each edge's features, in this rank's CSR order (None: none)
    edge_base: Tensor | None = None  # int64 [num_parts + 1]: each part's first global edge id (its edges in CSR order)
    edge_features_dropped: bool = False  # the graph's edges have features this partition was written without
    # a timed graph's: the owned rows' in-edges in time (their places in this rank's CSR), and the owned nodes' seed
    # times in row order (``seed_time[row]``; None: not given); None: the graph's edges have no times
    timeline: Timeline | None = None

    @property
    def num_features(self) -> int:
        return self.x.size(1)

    @property
    def edge_dim(self) -> int:
        return self.edge_attr.size(1) if self.edge_attr is not None else 0

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
        tl = self.timeline
        timed = sum(t.numel() * t.element_size() for t in (tl.col, tl.time, tl.edge)) if tl is not None else 0
        return own + timed + (self.typed.nbytes() if self.typed is not None else 0)


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
    if timed(dataset) and "times" not in meta:  # (written by a version whose parts carried no times)
        raise PartitionError(f"{folder} was written without its edges' times (by an older hpcgnn): delete it and "
                             f"partition again. {hint}")
    times = meta.get("times", {}).get("arrays", [])
    extra = [*meta.get("edge_arrays", []), *(typed_meta["arrays"] if typed_meta else []),
             *([EDGE_FEATURES] if meta.get("edge_features") else []), *times]
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
        rows = rel.endswith("/x.npy") or f"/{EDGE_FEATURES}" in rel  # (stored in the feature dtype)
        return rows_as_stored(t, meta.get("feature_dtype")) if rows else t

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
                 train_time=cat("train_time") if "train_time" in edge_arrays else None,
                 halo_bound=min(num_nodes - nodes.numel(), sum(halos[i] for i in owned)), labels=meta.get("labels"),
                 timeline=_timeline(times, per_part, owned, cat), **_edge_features(meta, data_folder, cat))


def _timeline(times: list[str], per_part: dict, owned: list[int], cat) -> Timeline | None:
    """The owned parts' rows of a timed graph's timeline, one part after another as their CSRs are: each edge's place
    in the rank's CSR (a part's own, shifted by the edges of the rank's parts before it), and the owned nodes' seed
    times in their rows' order (None: the graph's edges have no times)."""
    if not times:
        return None
    edge, start = [], 0
    for i in owned:
        edge.append(per_part[i]["time_edge"] + start if start else per_part[i]["time_edge"])
        start += int(per_part[i]["rowptr"][-1])
    return Timeline(cat("time_col"), cat("time_sorted"), edge[0] if len(edge) == 1 else torch.cat(edge),
                    cat("seed_time") if "seed_time" in times else None)


def _edge_features(meta: dict, data_folder, cat) -> dict:
    """A rank's edges' features and the parts' first edge ids, where the partition holds them; else whether the
    prepared graph has edge features the partition was written without (by a version that dropped them)."""
    if meta.get("edge_features"):
        base = torch.zeros(meta["num_parts"] + 1, dtype=torch.long)
        base[1:] = torch.tensor(meta["part_edges"], dtype=torch.long).cumsum(0)
        return {"edge_attr": cat(EDGE_FEATURES), "edge_base": base}
    if "typed" in meta:  # a typed graph's relations' (written by a version that kept them: part_edges)
        return {"edge_features_dropped": "part_edges" not in meta["typed"] and
                any(data_folder.glob(f"{EDGE_FEATURES}__*.npy"))}
    return {"edge_features_dropped": (data_folder / f"{EDGE_FEATURES}.npy").is_file()}


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
    rowptr, col, edge_attr, edge_base = {}, {}, {}, {}
    for rel in schema.relations:
        key = relation_key(rel)
        rowptr[rel] = concat_rowptr([per_part[i][f"rowptr__{key}"] for i in owned])
        cols = [per_part[i][f"col__{key}"] for i in owned]
        col[rel] = cols[0] if len(cols) == 1 else torch.cat(cols)
        if key in typed_meta.get("part_edges", {}):
            rows = [per_part[i][f"{EDGE_FEATURES}__{key}"] for i in owned]
            edge_attr[rel] = rows[0] if len(rows) == 1 else torch.cat(rows)
            edge_base[rel] = torch.zeros(num_parts + 1, dtype=torch.long)
            edge_base[rel][1:] = torch.tensor(typed_meta["part_edges"][key], dtype=torch.long).cumsum(0)
    timelines, seed_time = None, None
    if f"time_col__{relation_key(schema.relations[0])}" in per_part[owned[0]]:
        timelines = {}
        for rel in schema.relations:
            key, edge, start = relation_key(rel), [], 0
            for i in owned:  # (a part's places, shifted by the relation's edges of the rank's parts before it)
                edge.append(per_part[i][f"time_edge__{key}"] + start)
                start += int(per_part[i][f"rowptr__{key}"][-1])
            timelines[rel] = Timeline(*(_cat([per_part[i][f"{kind}__{key}"] for i in owned])
                                        for kind in ("time_col", "time_sorted")), _cat(edge))
        name = f"seed_time__{schema.target}"
        seed_time = _cat([per_part[i][name] for i in owned]) if name in per_part[owned[0]] else None
    return TypedParts(schema, rowptr, col, type_base, edge_attr, edge_base, timelines, seed_time)


def _cat(tensors: list[Tensor]) -> Tensor:
    return tensors[0] if len(tensors) == 1 else torch.cat(tensors)

