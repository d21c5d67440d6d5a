"""Sampling with edge features: hpcgnn's sampler and gather with each sampled edge's features (D = 8 and 64), against
the same without them; PyG's NeighborLoader with edge_attr as the reference where pyg-lib is.

    python benchmarks/edge_features.py [--num-nodes 500000] [--avg-degree 50] [--batches 30] [--repeat 3]
        [--edge-dims 8,64] [--edge-dtype float32|bfloat16] [--pyg PYTHON]

The benchmark graph of benchmarks/sampler.py (fanouts [15, 10, 5], batch 1024, 128 node features), its edges given
random float32 features of each width (a file per width beside the prepared graph, made once, memory-mapped as a
prepared graph's edge_attr.npy is). A batch: the sampled subgraph, its nodes' features and, with edge features, its
edges' (gathered by the C kernels from the sampled edges' CSR positions). Each is measured as a rank's loader makes
batches by default (train.prefetch=2: one thread samples the next batch while another gathers this one's rows, the
sampling thread helping the gather once its batch waits) and in the loop that asks for them (no thread). Runs are
interleaved; the line prints medians and the bars: with edge features >= 70% of the batches/s without (the rank's
loader; the loop's beside it), and >= 3x PyG's NeighborLoader with edge_attr (pyg-lib; ``--pyg``,
benchmarks/pyglib_venv.sh makes one; in the loop, as PyG's runs with num_workers=0).
"""

from __future__ import annotations

# isort: off
import hpcgnn  # noqa: F401  (first: its process defaults, OMP_WAIT_POLICY, before torch loads OpenMP)
# isort: on
import argparse
import dataclasses
import itertools
import json
import statistics
import subprocess
import time
from pathlib import Path

import numpy as np
import torch
from common import (
    BATCH,
    FANOUTS,
    USER_ENV,
    benchmark_config,
    benchmark_graph,
    default_pyg_python,
    graph_arguments,
)


def edge_features(folder: Path, num_edges: int, width: int, dtype: str = "float32") -> Path:
    """``folder/bench-edge-attr-<width>[-bfloat16].npy``: [E, width] of a fixed seed in ``dtype`` (bfloat16 as its
    bits, as a prepared graph stores it), written once a block at a time."""
    path = folder / f"bench-edge-attr-{width}{'' if dtype == 'float32' else '-' + dtype}.npy"
    if not path.exists():
        tmp = path.with_suffix(".tmp.npy")
        stored = np.float32 if dtype == "float32" else np.uint16
        out = np.lib.format.open_memmap(tmp, mode="w+", dtype=stored, shape=(num_edges, width))
        rng = np.random.default_rng(width)
        for a in range(0, num_edges, 1 << 20):
            block = torch.from_numpy(rng.standard_normal((min(1 << 20, num_edges - a), width), dtype=np.float32))
            out[a:a + (1 << 20)] = (block if dtype == "float32" else block.bfloat16().view(torch.uint16)).numpy()
        out.flush()
        del out
        tmp.rename(path)
    return path


def loader(graph, with_edges: bool, prefetch: int = 0):
    """The batches in the loop that asks for them (``prefetch`` 0), or as a rank's loader makes them by default
    (train.prefetch=2: a thread samples the next batch while another gathers this one's rows)."""
    from hpcgnn.sampling import BatchLoader, CSRNeighborSampler, PrefetchLoader

    seeds = graph.train_idx[torch.randperm(graph.train_idx.numel(), generator=torch.Generator().manual_seed(0))]
    sampler = CSRNeighborSampler(graph.rowptr, graph.col, FANOUTS, edge_ids=with_edges)
    plain = BatchLoader(graph, sampler, seeds, BATCH, generator=torch.Generator().manual_seed(0))
    return PrefetchLoader(plain, prefetch) if prefetch else plain


def batches_per_s(it_loader, batches: int) -> tuple[float, float]:
    """(batches/s, mean edge-feature bytes per batch) over ``batches`` after a warm-up batch."""
    it = iter(it_loader)
    next(it)
    t0, nbytes = time.perf_counter(), 0
    for batch in itertools.islice(it, batches):
        if "edge_attr" in batch:
            nbytes += batch.edge_attr.numel() * 4
    return batches / (time.perf_counter() - t0), nbytes / batches


def pyg_reference(python: str, folder: Path, edge_file: Path | None, batches: int) -> dict | str:
    if not python or not Path(python).exists():
        return "PyG reference: none (NeighborLoader needs pyg-lib: benchmarks/pyglib_venv.sh; --pyg PYTHON)"
    cmd = [python, str(Path(__file__).with_name("pyg_sampler.py")), str(folder), "--batches", str(batches),
           "--workers", "0", "--threads", str(torch.get_num_threads())]
    if edge_file is not None:
        cmd += ["--edge-attr", str(edge_file)]
    res = subprocess.run(cmd, capture_output=True, text=True, env=USER_ENV)
    if res.returncode:
        return f"pyg_sampler.py failed: {(res.stderr.strip().splitlines() or [res.returncode])[-1]}"
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    graph_arguments(ap)
    ap.add_argument("--batches", type=int, default=30)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--edge-dims", default="8,64")
    ap.add_argument("--edge-dtype", default="float32", choices=("float32", "bfloat16"),
                    help="how the edge features are stored (dataset.feature_dtype); batches carry float32")
    ap.add_argument("--pyg", default=default_pyg_python())
    args = ap.parse_args()

    from hpcgnn.data import cache_folder
    from hpcgnn.data.ooc import load_features

    graph = benchmark_graph(args)
    folder = cache_folder(benchmark_config(args))
    dims = [int(d) for d in args.edge_dims.split(",")]
    graphs = {0: graph}
    files = {}
    for d in dims:
        t0 = time.perf_counter()
        files[d] = edge_features(folder, graph.num_edges, d, args.edge_dtype)
        graphs[d] = dataclasses.replace(graph, edge_attr=load_features(files[d], args.edge_dtype))
        print(f"edge features of width {d}: {files[d]} ({time.perf_counter() - t0:.0f} s)", flush=True)
    runs: dict[str, list[float]] = {}
    moved: dict[int, float] = {}
    missing = []
    for r in range(args.repeat):  # interleaved: a noisy minute hits every side alike
        for d, g in graphs.items():
            rate, moved[d] = batches_per_s(loader(g, d > 0), args.batches)
            runs.setdefault(f"hpcgnn{d}", []).append(rate)
            runs.setdefault(f"ahead{d}", []).append(batches_per_s(loader(g, d > 0, prefetch=2), args.batches)[0])
            res = pyg_reference(args.pyg, folder, files.get(d), args.batches) if args.edge_dtype == "float32" else \
                "PyG reference: float32 edge features only"
            if isinstance(res, str):
                if r == 0 and d == 0:
                    missing.append(res)
            else:
                runs.setdefault(f"pyg{d}", []).append(res["workers_0"]["batches_per_s"])
        print(f"run {r + 1}: " + ", ".join(f"{k} {v[-1]:.2f}" for k, v in runs.items()), flush=True)
    med = {k: statistics.median(v) for k, v in runs.items()}
    base, ahead = med["hpcgnn0"], med["ahead0"]
    line = (f"edge features ({torch.get_num_threads()} threads, fanouts {list(FANOUTS)}, batch {BATCH}, "
            f"{graph.num_edges} edges, stored as {args.edge_dtype}, median of {args.repeat}; batches/s as a rank's "
            f"loader makes them (train.prefetch=2: sampling and gathering in two threads) and in the asking loop): "
            f"without {ahead:.2f}, in the loop {base:.2f}")
    for d in dims:
        line += (f" | D={d}: {med[f'ahead{d}']:.2f}, {med[f'ahead{d}'] / ahead:.0%} of without (bar >= 70%); "
                 f"in the loop {med[f'hpcgnn{d}']:.2f}, {med[f'hpcgnn{d}'] / base:.0%}; "
                 f"{moved[d] / 2**20:.0f} MB of edge features per batch")
        if f"pyg{d}" in med:
            line += (f"; PyG NeighborLoader with edge_attr (num_workers=0) {med[f'pyg{d}']:.2f}: "
                     f"hpcgnn/PyG = {med[f'hpcgnn{d}'] / med[f'pyg{d}']:.2f}x in the loop (bar >= 3x)")
    for why in missing:
        line += f" | {why}"
    print(line)


if __name__ == "__main__":
    main()
