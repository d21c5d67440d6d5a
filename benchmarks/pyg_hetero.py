"""PyG's NeighborLoader on HeteroData over hpcgnn's typed benchmark graph, as a PyG user runs it: a process of its
own, without hpcgnn.

    <python with torch_geometric and pyg-lib>/bin/python benchmarks/pyg_hetero.py FOLDER [--batches 20]
        [--fanouts 25 20] [--batch-size 1024] [--threads 2]

benchmarks/hetero.py writes FOLDER (the typed graph's arrays, :func:`save_typed`) and starts this script once, then
asks it for one measurement at a time, so that its runs interleave with hpcgnn's: a line on standard input holding
a worker count (0, 2) is answered by a JSON line on standard output, ``{"workers": w, "batches_per_s": v}``; an
empty line or the end of input ends it. Imports neither hpcgnn nor its process settings (malloc, OpenMP): its
memory, its worker processes' forks and its allocator's state stay out of hpcgnn's process, and hpcgnn's out of
its own. Prints ``{"ready": backend}`` once the graph is loaded.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from pathlib import Path

import numpy as np


def save_typed(graph, folder: Path) -> None:
    """Write a TypedGraph's arrays for this script (numpy files and meta.json, the latter last: its presence says
    the folder is whole)."""
    folder.mkdir(parents=True, exist_ok=True)
    rels = [list(r) for r in graph.relations]
    for t in graph.node_types:
        np.save(folder / f"x.{t}.npy", graph.x[t].float().numpy())
    for i, rel in enumerate(graph.relations):
        np.save(folder / f"rowptr.{i}.npy", graph.rowptr[rel].numpy())
        np.save(folder / f"col.{i}.npy", graph.col[rel].long().numpy())
    np.save(folder / "y.npy", graph.y.numpy())
    np.save(folder / "train_idx.npy", graph.train_idx.numpy())
    (folder / "meta.json").write_text(json.dumps({"num_nodes": graph.num_nodes, "relations": rels,
                                                  "target": graph.target}))


def load_hetero(folder: Path):
    """The saved graph as PyG's ``HeteroData`` (every type's features, the target's labels, every relation's edges
    as (source, target) pairs), and the target type and its training ids."""
    import torch
    from torch_geometric.data import HeteroData

    meta = json.loads((folder / "meta.json").read_text())
    data = HeteroData()
    for t, n in meta["num_nodes"].items():
        data[t].x = torch.from_numpy(np.load(folder / f"x.{t}.npy"))
        data[t].num_nodes = n
    target = meta["target"]
    data[target].y = torch.from_numpy(np.load(folder / "y.npy"))
    for i, rel in enumerate(meta["relations"]):
        rowptr = torch.from_numpy(np.load(folder / f"rowptr.{i}.npy"))
        col = torch.from_numpy(np.load(folder / f"col.{i}.npy"))
        dst = torch.repeat_interleave(torch.arange(rowptr.numel() - 1), rowptr.diff())  # in-edges: col -> node
        data[tuple(rel)].edge_index = torch.stack([col, dst])
    return data, target, torch.from_numpy(np.load(folder / "train_idx.npy"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("--batches", type=int, default=20)
    ap.add_argument("--batch-size", type=int, default=1024)
    ap.add_argument("--fanouts", type=int, nargs="+", default=[25, 20])
    ap.add_argument("--threads", type=int, default=0)
    args = ap.parse_args()

    import torch
    from torch_geometric.loader import NeighborLoader
    from torch_geometric.typing import WITH_PYG_LIB, WITH_TORCH_SPARSE

    if not (WITH_PYG_LIB or WITH_TORCH_SPARSE):
        raise SystemExit("NeighborLoader needs pyg-lib or torch-sparse, neither is importable "
                         "(benchmarks/pyglib_venv.sh builds pyg-lib)")
    if args.threads:
        torch.set_num_threads(args.threads)
    data, target, train = load_hetero(args.folder)
    print(json.dumps({"ready": "pyg-lib" if WITH_PYG_LIB else "torch-sparse"}), flush=True)
    for line in sys.stdin:
        if not line.strip():
            break
        workers = int(line)
        torch.manual_seed(0)
        loader = NeighborLoader(data, num_neighbors=list(args.fanouts), input_nodes=(target, train),
                                batch_size=args.batch_size, shuffle=True, num_workers=workers)
        it = iter(loader)
        next(it)  # warm-up (and the workers started)
        t0 = time.perf_counter()
        n = sum(1 for _ in itertools.islice(it, args.batches))
        rate = n / (time.perf_counter() - t0)
        del it, loader
        print(json.dumps({"workers": workers, "batches_per_s": rate}), flush=True)


if __name__ == "__main__":
    main()
