"""PyG's NeighborLoader on hpcgnn's prepared graph, as a PyG user runs it: a process of its own, without hpcgnn.

    <python with torch_geometric and pyg-lib>/bin/python benchmarks/pyg_sampler.py FOLDER [--batches 30]
        [--workers 0,2] [--threads 2] [--edge-attr FILE.npy]

benchmarks/pyglib_venv.sh makes such a python. Imports neither hpcgnn nor its process settings (malloc, OpenMP):
it reads the prepared arrays (FOLDER/*.npy) with numpy, holds the features in memory as DGL's reference does,
and walks ``NeighborLoader`` (fanouts [15, 10, 5], 1024 shuffled training seeds, features gathered; with
``--edge-attr``, each sampled edge's features too, as PyG gathers ``edge_attr`` by its edge ids). Prints one
JSON line: batches/s per worker count, and the backend (pyg-lib or torch-sparse).
"""

from __future__ import annotations

import itertools
import json
import time

from reference_graph import BATCH, FANOUTS, arguments, load


def main() -> None:
    args = arguments(__doc__)

    import torch
    import torch_geometric
    from torch_geometric.data import Data
    from torch_geometric.loader import NeighborLoader
    from torch_geometric.typing import WITH_PYG_LIB, WITH_TORCH_SPARSE

    if not (WITH_PYG_LIB or WITH_TORCH_SPARSE):
        raise SystemExit("NeighborLoader needs pyg-lib or torch-sparse, neither is importable "
                         "(benchmarks/pyglib_venv.sh builds pyg-lib)")
    if args.threads:
        torch.set_num_threads(args.threads)
    g = load(args.folder)
    rowptr, col = torch.from_numpy(g["rowptr"]).long(), torch.from_numpy(g["col"]).long()
    dst = torch.repeat_interleave(torch.arange(rowptr.numel() - 1), rowptr.diff())  # in-edges: col -> node
    x = torch.from_numpy(g["x"])
    if g["feature_dtype"] == "bfloat16":
        x = x.view(torch.bfloat16)
    train = torch.from_numpy(g["train"]).long()
    data = Data(x=x, y=torch.from_numpy(g["y"]).long(), edge_index=torch.stack([col, dst]), num_nodes=g["num_nodes"])
    if args.edge_attr is not None:  # each edge's features, in the CSR's order (the edge index's), held in memory
        import numpy as np

        data.edge_attr = torch.from_numpy(np.ascontiguousarray(np.load(args.edge_attr, mmap_mode="r")))
    backend = "pyg-lib" if WITH_PYG_LIB else "torch-sparse"
    out = {"pyg": torch_geometric.__version__, "backend": backend, "torch": torch.__version__,
           "threads": torch.get_num_threads()}
    torch.manual_seed(0)
    for workers in (int(w) for w in args.workers.split(",")):
        loader = NeighborLoader(data, num_neighbors=list(FANOUTS), input_nodes=train, batch_size=BATCH,
                                shuffle=True, num_workers=workers)
        it = iter(loader)
        next(it)  # warm-up (and the workers' start)
        t0, edges = time.perf_counter(), 0
        for batch in itertools.islice(it, args.batches):
            edges += batch.edge_index.size(1)
        elapsed = time.perf_counter() - t0
        out[f"workers_{workers}"] = {"batches_per_s": args.batches / elapsed, "edges_per_batch": edges / args.batches}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
