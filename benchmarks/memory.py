"""One graph copy per node: summed PSS of 2 replicated ranks vs 1 rank on the same prepared graph.

    python benchmarks/memory.py [--num-nodes 2000000] [--avg-degree 50] [--root DIR]

Each rank does what a training rank does (hpcgnn.data.open_graph: memory-map the prepared
graph) and then reads every byte of it, so all pages are resident. PSS (proportional set
size, /proc/PID/smaps_rollup) splits shared pages between the processes that map them, so
the sum over ranks is the node's real memory. A "copy per rank" run (each rank reads the
arrays into private memory, as a per-process load does) is the reference. Prints one comparison line.
"""

from __future__ import annotations

# isort: off
import hpcgnn  # noqa: F401  (first: its process defaults, OMP_WAIT_POLICY, before torch loads OpenMP)
# isort: on
import argparse
import multiprocessing as mp
import time

from common import graph_arguments


def _pss_mb() -> float:
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            if line.startswith("Pss:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no Pss in /proc/self/smaps_rollup")


def _rank(cfg, copy: bool, ready, measure, out) -> None:
    import torch

    from hpcgnn.data import cache, cache_folder, open_graph

    torch.set_num_threads(1)
    g = cache.load(cache_folder(cfg), mmap=False) if copy else open_graph(cfg)
    arrays = [g.rowptr, g.col, g.x, g.y, g.train_idx, g.val_idx, g.test_idx]
    checksum = sum(float(a.double().sum()) if a.dtype.is_floating_point else int(a.sum()) for a in arrays)
    ready.wait()
    measure.wait()
    out.put((_pss_mb(), checksum))


def run(cfg, ranks: int, copy: bool) -> float:
    ctx = mp.get_context("spawn")
    ready, measure, out = ctx.Barrier(ranks + 1), ctx.Barrier(ranks + 1), ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(cfg, copy, ready, measure, out)) for _ in range(ranks)]
    for p in procs:
        p.start()
    ready.wait()  # every rank has touched the whole graph
    measure.wait()
    results = [out.get() for _ in procs]
    for p in procs:
        p.join()
    return sum(r[0] for r in results)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    graph_arguments(ap, num_nodes=2_000_000)
    ap.add_argument("--num-features", type=int, default=128)
    args = ap.parse_args()

    from hpcgnn.config import dataset_config
    from hpcgnn.data import cache, prepare

    cfg = dataset_config(num_nodes=args.num_nodes, avg_degree=args.avg_degree, num_features=args.num_features,
                        root=args.root)
    t0 = time.perf_counter()
    folder = prepare(cfg)
    print(f"graph: {args.num_nodes} nodes, avg degree {args.avg_degree}, {args.num_features} features, {cache.human_bytes(cache.size_bytes(folder))} "
          f"prepared in {time.perf_counter() - t0:.0f} s ({folder})")
    one = run(cfg, 1, copy=False)
    two = run(cfg, 2, copy=False)
    two_copies = run(cfg, 2, copy=True)
    print(f"memory: 1 rank PSS {one:.0f} MB | 2 ranks sharing the mapped graph {two:.0f} MB = {two / one:.2f}x | "
          f"2 ranks with a copy each {two_copies:.0f} MB = {two_copies / one:.2f}x")


if __name__ == "__main__":
    main()
