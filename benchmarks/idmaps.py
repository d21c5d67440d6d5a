"""A batch's id map: the dense array of a replicated rank against a partitioned rank's batch-sized map.

    python benchmarks/idmaps.py [--num-nodes 500000] [--avg-degree 50] [--degree-exponent 0] [--batches 20]
        [--repeat 3]

Sampling alone (no features), fanouts [15, 10, 5], batch 1024, on the prepared graph of benchmarks/sampler.py.
A partitioned rank cannot hold an array over every id of a graph larger than a node: its map follows the
batch, a hash table in C (``id_map="batch"``, hpcgnn/kernels/hash.c), or sorted arrays searched by torch
ops where the C kernels are not (``HPCGNN_NATIVE=0``). The three make the same batches (checked here). Medians
of ``--repeat`` interleaved runs; prints one comparison line.
"""

from __future__ import annotations

# isort: off
import hpcgnn  # noqa: F401  (first: its process defaults, OMP_WAIT_POLICY, before torch loads OpenMP)
# isort: on
import argparse
import time

import torch
from common import BATCH, FANOUTS, benchmark_graph, graph_arguments, interleaved_medians

from hpcgnn.kernels import binding, hashtable
from hpcgnn.sampling import CSRNeighborSampler
from hpcgnn.sampling.neighbor import BatchIdMap, SortedIdMap


def sampler(graph, id_map: str, on_torch_ops: bool = False) -> CSRNeighborSampler:
    s = CSRNeighborSampler(graph.rowptr, graph.col, FANOUTS, id_map="dense" if id_map == "dense" else "batch")
    if on_torch_ops:  # the map a process without the C kernels chooses
        s._local.impl = SortedIdMap()
    return s


def batch_ms(s: CSRNeighborSampler, seeds: torch.Tensor, batches: int) -> float:
    gen = torch.Generator().manual_seed(0)
    s.sample(seeds[:BATCH], gen)  # warm-up: the map grows to a batch's size once
    t0 = time.perf_counter()
    for i in range(1, batches + 1):
        s.sample(seeds[i * BATCH:(i + 1) * BATCH], gen)
    return (time.perf_counter() - t0) / batches * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    graph_arguments(ap)
    ap.add_argument("--batches", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=3, help="runs; the line prints medians")
    args = ap.parse_args()
    if binding.kernels() is None:
        raise SystemExit("the C kernels are not available here (no C compiler, or HPCGNN_NATIVE=0): nothing to compare")
    graph = benchmark_graph(args)
    seeds = graph.train_idx[torch.randperm(graph.train_idx.numel(), generator=torch.Generator().manual_seed(0))]
    sides = {"dense": sampler(graph, "dense"), "hash": sampler(graph, "batch"), "sorted": sampler(graph, "batch", True)}
    assert isinstance(sides["hash"]._local, BatchIdMap) and isinstance(sides["hash"]._local.impl, hashtable.HashTable)
    made = {name: s.sample(seeds[:BATCH], torch.Generator().manual_seed(1)) for name, s in sides.items()}
    same = all(torch.equal(made["dense"].n_id, m.n_id) and torch.equal(made["dense"].edge_index, m.edge_index)
               for m in made.values())
    med = interleaved_medians({k: (lambda s=s: batch_ms(s, seeds, args.batches)) for k, s in sides.items()}, args.repeat)
    print(f"id maps ({torch.get_num_threads()} threads, fanouts {list(FANOUTS)}, batch {BATCH}, sampling only, ms per "
          f"batch, median of {args.repeat}): replicated rank's dense array {med['dense']:.1f} | partitioned rank's "
          f"hash table (C) {med['hash']:.1f} | its sorted arrays (torch ops) {med['sorted']:.1f} = "
          f"{med['sorted'] / med['hash']:.1f}x the hash table's | same batches: {same}", flush=True)


if __name__ == "__main__":
    main()
