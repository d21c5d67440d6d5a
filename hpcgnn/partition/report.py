"""What a partition is like: edge cut, balance of nodes, edges and training nodes, halo sizes; in META.json and in
words.
"""

from __future__ import annotations

import torch
from torch import Tensor

from hpcgnn.data import cache
from hpcgnn.data.graph import Graph
from hpcgnn.data.ooc import drop_pages, trim_heap
from hpcgnn.data.typed import TypedSchema
from hpcgnn.partition.compute import seed_weight
from hpcgnn.partition.multilevel import LOCAL, Comm, task_spans

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
    label_bytes = graph.y.element_size() * (graph.y[0].numel() if graph.y.dim() > 1 and graph.y.size(0) else 1)
    row_bytes = graph.x.size(1) * graph.x.element_size() + label_bytes + 8 * 2  # (a node's labels: several, or one)
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

