"""hpcgnn's sampler + loader vs PyG's NeighborLoader and DGL's: batches/s on the same graph, and the memory limit.

    python benchmarks/sampler.py [--num-nodes 500000] [--avg-degree 50] [--batches 30] [--dgl PYTHON]

Fanouts [15, 10, 5], batch 1024, one process. A batch is a sampled subgraph with its
features gathered (what a training step consumes). hpcgnn is measured plainly and with
its prefetching thread; PyG when pyg-lib or torch-sparse is importable (else it says so);
DGL 2.1 in its own environment (``benchmarks/dgl_venv.sh`` makes it; ``--dgl`` names its
python, default ~/.cache/hpcgnn/dgl-venv/bin/python when it exists), as a subprocess on the
same prepared graph, with 0 and 2 workers.

The limit: the bytes a batch must move (its feature rows read and written, one 8-byte read
per sampled edge, its index arrays written: edge_index and n_id), divided by this machine's
copy bandwidth measured in the same run (a large tensor copy, as many threads), against the
batch's measured time. Prints one comparison line.
"""

from __future__ import annotations

# isort: off
import hpcgnn  # noqa: F401  (first: its process defaults, OMP_WAIT_POLICY, before torch loads OpenMP)
# isort: on
import argparse
import itertools
import json
import statistics
import subprocess
import time
from pathlib import Path

import torch
from common import (
    BATCH,
    FANOUTS,
    USER_ENV,
    benchmark_config,
    benchmark_graph,
    busy_core,
    graph_arguments,
    hpcgnn_loader,
    pyg_loader,
)


def batches_per_s(loader, batches: int) -> float:
    it = iter(loader)
    next(it)  # warm-up
    t0 = time.perf_counter()
    n = sum(1 for _ in itertools.islice(it, batches))
    return n / (time.perf_counter() - t0)


def copy_bandwidth(nbytes: int = 512 * 2**20, reps: int = 5) -> float:
    """Bytes per second a large copy moves here (read + write), with torch's threads."""
    src = torch.ones(nbytes // 4, dtype=torch.float32)
    dst = torch.empty_like(src)
    dst.copy_(src)
    t0 = time.perf_counter()
    for _ in range(reps):
        dst.copy_(src)
    return 2 * nbytes * reps / (time.perf_counter() - t0)


def batch_floor_bytes(graph, batches: int = 5) -> float:
    """The bytes a batch must move, on average over a few batches."""
    total = 0
    for i, batch in enumerate(hpcgnn_loader(graph)):
        if i == batches:
            break
        rows = batch.n_id.numel() * graph.x.size(1)
        total += rows * graph.x.element_size() + rows * batch.x.element_size()  # feature rows read and written
        total += batch.edge_index.size(1) * 8  # one read of the CSR per sampled edge
        total += batch.edge_index.numel() * batch.edge_index.element_size() + batch.n_id.numel() * 8  # indices written
    return total / batches


def dgl_reference(python: str, graph_folder: Path, batches: int) -> dict | str:
    """DGL's batches/s from its own environment, or why there is none."""
    if not python or not Path(python).exists():
        return "DGL reference: none (benchmarks/dgl_venv.sh sets it up; --dgl PYTHON)"
    res = subprocess.run([python, str(Path(__file__).with_name("dgl_sampler.py")), str(graph_folder),
                          "--batches", str(batches), "--threads", str(torch.get_num_threads())],
                         capture_output=True, text=True, env={**USER_ENV, "DGLBACKEND": "pytorch"})
    if res.returncode:
        return f"DGL reference failed: {res.stderr.strip().splitlines()[-1] if res.stderr.strip() else res.returncode}"
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    graph_arguments(ap)
    ap.add_argument("--batches", type=int, default=30)
    ap.add_argument("--repeat", type=int, default=3, help="runs; the line prints medians")
    ap.add_argument("--contended", action="store_true", help="with a busy process beside, taking one core")
    default_dgl = Path("~/.cache/hpcgnn/dgl-venv/bin/python").expanduser()
    ap.add_argument("--dgl", default=str(default_dgl) if default_dgl.exists() else "",
                    help="python of the DGL reference environment (benchmarks/dgl_venv.sh)")
    args = ap.parse_args()

    from hpcgnn.data import cache_folder

    graph = benchmark_graph(args)
    runs: dict[str, list[float]] = {"plain": [], "ahead": [], "bandwidth": []}
    names, missing = {}, []
    contended = busy_core(args.contended)
    contended.__enter__()
    for r in range(args.repeat):  # interleaved, so that a noisy minute hits every side alike
        runs["plain"].append(batches_per_s(hpcgnn_loader(graph), args.batches))
        runs["ahead"].append(batches_per_s(hpcgnn_loader(graph, prefetch=2), args.batches))
        runs["bandwidth"].append(copy_bandwidth())
        dgl = dgl_reference(args.dgl, cache_folder(benchmark_config(args)), args.batches)
        if isinstance(dgl, dict):
            for workers in (0, 2):
                runs.setdefault(f"dgl{workers}", []).append(dgl[f"workers_{workers}"]["batches_per_s"])
                names[f"dgl{workers}"] = f"DGL {dgl['dgl']} ({workers} workers)"
        elif r == 0:
            missing.append(dgl)
        for workers in (0, 2):
            loader, name = pyg_loader(graph, FANOUTS, BATCH, workers)
            if loader is None:
                if r == 0:
                    missing.append(name)
                break
            runs.setdefault(f"pyg{workers}", []).append(batches_per_s(loader, args.batches))
            names[f"pyg{workers}"] = name
        print(f"run {r + 1}: " + ", ".join(f"{k} {v[-1]:.2f}" for k, v in runs.items()), flush=True)
    contended.__exit__(None, None, None)
    med = {k: statistics.median(v) for k, v in runs.items()}
    plain, ahead, bandwidth = med["plain"], med["ahead"], med["bandwidth"]
    floor = batch_floor_bytes(graph)
    limit = bandwidth / floor  # batches/s if moving the bytes were all a batch cost
    line = (f"sampler ({torch.get_num_threads()} threads, fanouts {list(FANOUTS)}, batch {BATCH}, median of "
            f"{args.repeat}{', one core taken by a busy process' if args.contended else ''}"
            f"{f', degree exponent {args.degree_exponent}' if args.degree_exponent else ''}): "
            f"hpcgnn {plain:.2f} batches/s, with prefetch thread {ahead:.2f} | limit: {floor / 2**20:.0f} MB per "
            f"batch at {bandwidth / 1e9:.1f} GB/s copy bandwidth = {limit:.2f} batches/s, hpcgnn at "
            f"{max(plain, ahead) / limit:.0%} of it")
    for ref in ("dgl", "pyg"):
        if f"{ref}0" not in med:
            continue
        zero, two = med[f"{ref}0"], med.get(f"{ref}2", 0.0)
        target = 2 if ref == "dgl" else 3
        line += (f" | {names[f'{ref}0']} {zero:.2f}, {names.get(f'{ref}2', '2 workers')} {two:.2f} batches/s: "
                 f"hpcgnn/{ref.upper()} with 0 workers = {plain / zero:.2f}x, best against best = "
                 f"{max(plain, ahead) / max(zero, two):.2f}x (target >= {target}x)")
    for why in missing:
        line += f" | {why}"
    print(line)


if __name__ == "__main__":
    main()
