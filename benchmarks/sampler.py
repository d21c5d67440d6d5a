"""hpcgnn's sampler + loader vs PyG's NeighborLoader: batches/s on the same graph.

    python benchmarks/sampler.py [--num-nodes 500000] [--avg-degree 50] [--batches 30]

Fanouts [15, 10, 5], batch 1024, one process. A batch is a sampled subgraph with its
features gathered (what a training step consumes). hpcgnn is measured plainly and with
its prefetching thread; PyG when pyg-lib or torch-sparse is importable (else it says so).
Prints one comparison line.
"""

from __future__ import annotations

import argparse
import itertools
import time

import torch
from common import BATCH, FANOUTS, benchmark_graph, graph_arguments, hpcgnn_loader, pyg_loader


def batches_per_s(loader, batches: int) -> float:
    it = iter(loader)
    next(it)  # warm-up
    t0 = time.perf_counter()
    n = sum(1 for _ in itertools.islice(it, batches))
    return n / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    graph_arguments(ap)
    ap.add_argument("--batches", type=int, default=30)
    args = ap.parse_args()

    graph = benchmark_graph(args)
    plain = batches_per_s(hpcgnn_loader(graph), args.batches)
    ahead = batches_per_s(hpcgnn_loader(graph, prefetch=2), args.batches)
    line = (f"sampler ({torch.get_num_threads()} threads, fanouts {list(FANOUTS)}, batch {BATCH}): "
            f"hpcgnn {plain:.2f} batches/s, with prefetch thread {ahead:.2f}")
    for workers in (0, 2):
        loader, name = pyg_loader(graph, FANOUTS, BATCH, workers)
        if loader is None:
            line += f" | {name}"
            break
        ref = batches_per_s(loader, args.batches)
        line += f" | {name} {ref:.2f} batches/s, hpcgnn/PyG = {max(plain, ahead) / ref:.2f}x"
    print(line)


if __name__ == "__main__":
    main()
