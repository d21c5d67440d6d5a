"""Partitioning: time, peak memory, edge-cut, and remote feature rows per batch, METIS vs random.

    python benchmarks/partition.py [--num-nodes 500000] [--avg-degree 50] [--parts 2 4]
    python benchmarks/partition.py --degree-exponent 2.5      # heavy-tailed degrees (hubs)

For each K and method: the partitioning time and its peak memory (measured in a fresh
process: peak RSS, reset just before partitioning, minus the RSS then; the mapped graph
already touched),
the edge-cut fraction, and, for ``--batches`` batches of 1024 seeds with fanouts
[15, 10, 5] drawn from part 0's own training nodes, the feature rows that part 0 does not
own (what it must fetch), without a cache and with a cache of 10% of the non-owned nodes
chosen by degree or by frequency (``hpcgnn.sampling.distributed.hot_nodes``, warm-up on
other batches than the measured ones). Batches are sampled with hpcgnn's sampler on the
whole graph, which draws from the same distribution as the distributed sampler.
Also: the bytes a rank of the partitioned job holds vs the replicated graph.
"""

from __future__ import annotations

# isort: off
import hpcgnn  # noqa: F401  (first: its process defaults, OMP_WAIT_POLICY, before torch loads OpenMP)
# isort: on
import argparse
import time

from common import BATCH, FANOUTS, benchmark_config, benchmark_graph, graph_arguments, in_child


def _status_mb(field: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def _partition_in_child(cfg, k: int, method: str, out) -> None:
    """Partition in a fresh process so that its peak RSS is partitioning's alone."""
    import torch

    from hpcgnn.data import open_graph
    from hpcgnn.partition import compute_parts

    torch.set_num_threads(1)
    graph = open_graph(cfg)
    for t in (graph.rowptr, graph.col, graph.train_idx):  # touch what partitioning reads
        t.sum()
    with open("/proc/self/clear_refs", "w") as f:  # resets the peak (VmHWM) to the current RSS
        f.write("5")
    before = _status_mb("VmRSS")
    t0 = time.perf_counter()
    compute_parts(graph, k, method, seed=0)
    seconds = time.perf_counter() - t0
    peak = _status_mb("VmHWM")
    out.put((seconds, max(peak - before, 0.0)))


def partition_cost(cfg, k: int, method: str) -> tuple[float, float]:
    return in_child(_partition_in_child, cfg, k, method)


def remote_rows(graph, cfg, gcfg, k: int, batches: int) -> dict:
    import torch

    from hpcgnn.partition import ensure_parts, open_parts
    from hpcgnn.sampling import CSRNeighborSampler
    from hpcgnn.sampling.distributed import PartitionView, hot_nodes

    meta = ensure_parts(cfg, gcfg, k)[1]
    parts = open_parts(cfg, gcfg, k, [0], verify=False)
    view = PartitionView(parts, 0, 1)
    sampler = CSRNeighborSampler(graph.rowptr, graph.col, FANOUTS)
    gen = torch.Generator().manual_seed(0)
    seeds = parts.train_idx[torch.randperm(parts.train_idx.numel(), generator=gen)].split(BATCH)
    warm, measured = list(seeds[:batches]), list(seeds[batches:2 * batches])
    non_owned = graph.num_nodes - parts.nodes.numel()
    budget = non_owned // 10
    caches = {policy: hot_nodes(view, budget, policy, sampler, warm, gen) for policy in ("degree", "frequency")}
    remote, hits = 0, dict.fromkeys(caches, 0)
    for s in measured:
        n_id = sampler.sample(s, gen).n_id
        r = n_id[view.owner(n_id) != 0]
        remote += r.numel()
        for policy, ids in caches.items():
            hits[policy] += int(torch.isin(r, ids).sum())
    n = len(measured)
    return {"edge_cut": meta["report"]["edge_cut_fraction"], "remote": remote / n,
            "cached": {p: (remote - h) / n for p, h in hits.items()},
            "hit_rate": {p: h / max(remote, 1) for p, h in hits.items()},
            "held": parts.nbytes()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    graph_arguments(ap)
    ap.add_argument("--parts", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--batches", type=int, default=6, help="warm-up batches, then as many measured")
    args = ap.parse_args()

    from hpcgnn.config import GraphConfig

    graph = benchmark_graph(args)
    cfg = benchmark_config(args)
    replicated = sum(t.numel() * t.element_size() for t in (graph.rowptr, graph.col, graph.x, graph.y))
    for k in args.parts:
        res = {}
        for method in ("metis", "random"):
            seconds, peak = partition_cost(cfg, k, method)
            res[method] = remote_rows(graph, cfg, GraphConfig(mode="partitioned", method=method), k, args.batches)
            r = res[method]
            print(f"K={k} {method}: partition {seconds:.1f} s, peak +{peak:.0f} MB; edge-cut {r['edge_cut']:.1%}; "
                  f"remote rows/batch {r['remote']:.0f}, with a 10% cache: degree {r['cached']['degree']:.0f} "
                  f"(hit rate {r['hit_rate']['degree']:.0%}), frequency {r['cached']['frequency']:.0f} "
                  f"(hit rate {r['hit_rate']['frequency']:.0%}); rank holds {r['held'] / replicated:.2f} of the "
                  f"replicated graph (budget {1 / k + 0.25:.2f})", flush=True)
        m, rnd = res["metis"], res["random"]
        best = min(m["cached"].values())
        print(f"K={k}: edge-cut METIS/random = {m['edge_cut'] / rnd['edge_cut']:.2f}; remote rows METIS/random = "
              f"{m['remote'] / rnd['remote']:.2f}, METIS + 10% cache / random without = {best / rnd['remote']:.2f}",
              flush=True)


if __name__ == "__main__":
    main()
