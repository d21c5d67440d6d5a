"""hpcgnn's typed loader vs PyG's NeighborLoader on HeteroData: batches/s on the same typed graph.

    python benchmarks/hetero.py [--scale 1.0] [--batches 20] [--fanouts 25 20] [--batch-size 1024] [--repeat 3]
        [--contended] [--gpu]

The graph has ogbn-mag's shape and size at --scale 1 (736k papers, 1.13M authors, 8.7k
institutions, 60k fields of study; 21.1M edges of writes, cites, has_topic and affiliated_with,
plus their reverses, as in OGB's mag baselines), generated here with heavy-tailed popularity
(some authors write many papers, some fields hold many), 128 features per type (papers given,
the others the mean of their neighbours': hpcgnn's featureless-type rule). Defaults follow OGB's
R-GCN neighbour-sampling baseline: fanouts [25, 20] on every relation, 1024 training papers per
batch. A batch is the sampled subgraph with every type's features gathered (what a step eats).
hpcgnn runs plainly and with its prefetching thread; PyG with 0 and 2 workers in a process of
its own (benchmarks/pyg_hetero.py, run by ``--pyg PYTHON``: this python when it has pyg-lib or
torch-sparse, else benchmarks/pyglib_venv.sh's; without one the line says so), over the same graph
written once to ``--root``/bench, in the user's environment: its memory and its workers' forks stay
out of hpcgnn's process (in one process, hpcgnn's next run after PyG's two workers page-faulted
~180k times, 5-10% of its batches/s). ``--contended``: hpcgnn also with a busy process beside it
taking one core. Medians of ``--repeat`` interleaved runs. Prints one comparison line.
"""

from __future__ import annotations

# isort: off
import hpcgnn  # noqa: F401  (first: its process defaults, OMP_WAIT_POLICY, before torch loads OpenMP)
# isort: on
import argparse
import itertools
import time
from pathlib import Path

import torch
from common import (
    KEEP_FREED_ENV,
    USER_ENV,
    ReferenceServer,
    default_pyg_python,
    interleaved_medians,
    loader_part,
    loader_sides,
)

# ogbn-mag as OGB describes it
MAG_NODES = {"paper": 736_389, "author": 1_134_649, "institution": 8_740, "field_of_study": 59_965}
MAG_EDGES = {("author", "affiliated_with", "institution"): 1_043_998, ("author", "writes", "paper"): 7_145_660,
             ("paper", "cites", "paper"): 5_416_271, ("paper", "has_topic", "field_of_study"): 7_505_078}
MAG_TRAIN = 629_571


def heavy_tailed(n: int, m: int, gen: torch.Generator, skew: float = 2.0) -> torch.Tensor:
    """``m`` ids in [0, n) where low ids are drawn far more often (u ** skew), then shuffled so that
    popular nodes are spread over the id space."""
    ids = (torch.rand(m, generator=gen, dtype=torch.float64).pow(skew) * n).long().clamp_(max=n - 1)
    return torch.randperm(n, generator=gen)[ids]


def mag_shaped(scale: float, num_features: int = 128, seed: int = 0):
    """A typed graph with ogbn-mag's node and edge counts times ``scale``."""
    from hpcgnn.data.typed import TypedGraph

    gen = torch.Generator().manual_seed(seed)
    n = {t: max(int(c * scale), 8) for t, c in MAG_NODES.items()}
    edges = {}
    for (s, name, d), count in MAG_EDGES.items():
        m = int(count * scale)
        dst = torch.randint(n[d], (m,), generator=gen) if d == "paper" else heavy_tailed(n[d], m, gen)
        src = heavy_tailed(n[s], m, gen) if s != "paper" or d == "paper" else torch.randint(n[s], (m,), generator=gen)
        edges[(s, name, d)] = torch.stack([src, dst])
    papers = n["paper"]
    x = {"paper": torch.randn(papers, num_features, generator=gen)}
    y = torch.randint(349, (papers,), generator=gen)
    perm = torch.randperm(papers, generator=gen)
    n_train = int(MAG_TRAIN / MAG_NODES["paper"] * papers)
    return TypedGraph.from_edges(
        n, edges, x, "paper", y, perm[:n_train].sort().values, perm[n_train:].sort().values, perm[:0], 349,
        feature_from={"author": ("paper", "rev_writes", "author"),
                      "institution": ("author", "affiliated_with", "institution"),
                      "field_of_study": ("paper", "has_topic", "field_of_study")})


def batches_per_s(loader, batches: int) -> float:
    it = iter(loader)
    next(it)  # warm-up
    sync()
    t0 = time.perf_counter()
    n = sum(1 for _ in itertools.islice(it, batches))
    sync()
    return n / (time.perf_counter() - t0)


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def hpcgnn_loader(graph, fanouts, batch_size: int, prefetch: int = 0, device: torch.device | None = None):
    """hpcgnn's typed loader; ``device``: where the batches go (a GPU graph: where they are made, too)."""
    from hpcgnn.sampling import BatchLoader, PrefetchLoader
    from hpcgnn.sampling.typed import TypedNeighborSampler

    gen = torch.Generator().manual_seed(0)
    seeds = graph.train_idx.cpu()[torch.randperm(graph.train_idx.numel(), generator=gen)]
    sampler = TypedNeighborSampler(graph, fanouts)
    loader = BatchLoader(graph, sampler, seeds, batch_size, batch_seed=0, device=device)
    return PrefetchLoader(loader, prefetch) if prefetch else loader


def reference_folder(root: str, scale: float) -> Path:
    """Where the graph of ``scale`` is written for PyG's process (benchmarks/pyg_hetero.py): once, then reused."""
    return Path(root).expanduser() / "bench" / f"mag-shaped-{scale:g}-v1"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", type=float, default=1.0, help="times ogbn-mag's node and edge counts")
    ap.add_argument("--batches", type=int, default=20)
    ap.add_argument("--batch-size", type=int, default=1024)
    ap.add_argument("--fanouts", type=int, nargs="+", default=[25, 20])
    ap.add_argument("--no-pyg", action="store_true", help="hpcgnn alone")
    ap.add_argument("--pyg", default=default_pyg_python(),
                    help="python with PyG and pyg-lib or torch-sparse (benchmarks/pyglib_venv.sh)")
    ap.add_argument("--root", default="~/.cache/hpcgnn", help="where the graph is written for PyG's process")
    ap.add_argument("--repeat", type=int, default=3, help="runs; the line prints medians")
    ap.add_argument("--contended", action="store_true", help="also hpcgnn with one core taken by a busy process")
    ap.add_argument("--gpu", action="store_true", help="also hpcgnn with the graph in GPU memory (train.graph_on=device)")
    args = ap.parse_args()

    from hpcgnn.process import keep_freed_memory

    print(f"keep_freed_memory (glibc malloc reuses freed blocks): {keep_freed_memory()}")
    t0 = time.perf_counter()
    graph = mag_shaped(args.scale)
    print(f"graph: {sum(graph.num_nodes.values())} nodes ({graph.num_nodes}), {graph.num_edges()} edges with "
          f"reverses over {len(graph.relations)} relations, built in {time.perf_counter() - t0:.0f} s", flush=True)
    fan = tuple(args.fanouts)
    sides = loader_sides(lambda: batches_per_s(hpcgnn_loader(graph, fan, args.batch_size), args.batches),
                         lambda: batches_per_s(hpcgnn_loader(graph, fan, args.batch_size, prefetch=2), args.batches),
                         args.contended)
    names, missing, servers = {}, "", []
    try:
        if not args.no_pyg and not (args.pyg and Path(args.pyg).exists()):
            missing = (" | PyG reference: none (NeighborLoader needs pyg-lib or torch-sparse: "
                       "benchmarks/pyglib_venv.sh builds pyg-lib; --pyg PYTHON)")
        elif not args.no_pyg:
            folder = reference_folder(args.root, args.scale)
            if not (folder / "meta.json").exists():
                from pyg_hetero import save_typed

                save_typed(graph, folder)
            ref_args = [str(folder), "--batches", str(args.batches), "--batch-size", str(args.batch_size),
                        "--fanouts", *map(str, fan), "--threads", str(torch.get_num_threads())]
            # PyG as its users run it (glibc's malloc as it comes), and with the malloc settings hpcgnn gives itself
            # (keep_freed_memory, through glibc's environment variables): the line's targets count against the faster.
            for tag, extra in (("", {}), (", hpcgnn's malloc settings", KEEP_FREED_ENV)):
                server = ReferenceServer(args.pyg, "pyg_hetero.py", ref_args, {**USER_ENV, **extra})
                servers.append(server)
                for workers in (0, 2):
                    key = f"pyg{workers}{'+' if extra else ''}"
                    names[key] = (workers, f"PyG NeighborLoader on HeteroData ({server.ready['ready']}, {workers} "
                                           f"workers{tag})")
                    sides[key] = (lambda srv, w: lambda: srv.measure(w))(server, workers)
        med = interleaved_medians(sides, args.repeat)
    finally:
        for server in servers:
            server.close()
    plain, ahead = med["plain"], med["ahead"]
    line = (f"hetero ({torch.get_num_threads()} threads, fanouts {list(fan)} per relation, batch {args.batch_size}, "
            f"median of {args.repeat}): {loader_part(med, args.contended)}")
    if args.gpu:
        cuda = torch.device("cuda")
        on_gpu = graph.to(cuda)
        host_to_gpu = batches_per_s(hpcgnn_loader(graph, fan, args.batch_size, 2, cuda), args.batches)
        gpu = batches_per_s(hpcgnn_loader(on_gpu, fan, args.batch_size, 2, cuda), args.batches)
        line += (f" | GPU: sampled on the host and copied {host_to_gpu:.2f} batches/s, sampled on the GPU "
                 f"{gpu:.2f} = {gpu / host_to_gpu:.1f}x")
    for key, (workers, name) in names.items():
        ref = med[key]
        line += f" | {name} {ref:.2f} batches/s, hpcgnn/PyG = {(plain if workers == 0 else max(plain, ahead)) / ref:.2f}x"
    if names:
        best0 = max(med[k] for k, (w, _) in names.items() if w == 0)
        line += (f" | at 0 workers against PyG's faster = {plain / best0:.2f}x, best against best = "
                 f"{max(plain, ahead) / max(med[k] for k in names):.2f}x (target >= 3x against pyg-lib)")
    line += missing
    print(line, flush=True)


if __name__ == "__main__":
    main()
