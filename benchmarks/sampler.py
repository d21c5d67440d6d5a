"""hpcgnn's sampler + loader vs PyG's NeighborLoader and DGL's: batches/s on the same graph, and the memory limit.

    python benchmarks/sampler.py [--num-nodes 500000] [--avg-degree 50] [--degree-exponent 2.5] [--batches 30]
        [--repeat 3] [--contended] [--dgl PYTHON] [--pyg PYTHON]

Fanouts [15, 10, 5], batch 1024, one process. A batch is a sampled subgraph with its
features gathered (what a training step consumes). hpcgnn is measured plainly and with
its prefetching thread. The references run as users run them, each in a process and environment
of its own on the same prepared graph, with 0 and 2 workers: PyG's NeighborLoader with pyg-lib
or torch-sparse (``--pyg``: this python when it has one, else the venv ``benchmarks/pyglib_venv.sh``
makes) and DGL 2.1 (``--dgl``: the venv ``benchmarks/dgl_venv.sh`` makes; GraphBolt's sampler too where it
runs). Each reference runs twice: as its users run it, and with the malloc settings hpcgnn gives itself
(glibc's environment variables: freed batch buffers reused instead of faulted in again); the targets
count against the faster. Each side's runs are interleaved and the line prints medians.

The limit: the bytes a batch must move (its feature rows read and written, one 8-byte read
per sampled edge, its index arrays written: edge_index and n_id), divided by this machine's
copy bandwidth measured in the same run (a large copy, as many threads: the faster of torch's and
one with stores past the caches), against the batch's measured time; and where hpcgnn's batch time
goes: sampling, and the feature gather with the bandwidth it reaches. Prints one comparison line.
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
    KEEP_FREED_ENV,
    USER_ENV,
    benchmark_config,
    benchmark_graph,
    busy_core,
    default_pyg_python,
    graph_arguments,
    hpcgnn_loader,
)


def batches_per_s(loader, batches: int) -> float:
    it = iter(loader)
    next(it)  # warm-up
    t0 = time.perf_counter()
    n = sum(1 for _ in itertools.islice(it, batches))
    return n / (time.perf_counter() - t0)


def copy_bandwidth(nbytes: int = 512 * 2**20, reps: int = 5) -> float:
    """Bytes per second a large copy moves here (read + write), with torch's threads: the faster of torch's
    copy (ordinary stores, which read each line before writing it: bytes moved that this does not count) and
    a copy by hpcgnn's row gather of 512-byte rows in order (stores past the caches, where the CPU has them)."""
    from hpcgnn.kernels import binding, ops

    src = torch.ones(nbytes // 512, 128, dtype=torch.float32)
    dst = torch.empty_like(src)
    rows = torch.arange(src.size(0))
    copies = [lambda: dst.copy_(src)]
    if binding.usable(src):
        copies.append(lambda: ops.gather_rows(src, rows, dst))
    best = 0.0
    for copy in copies:
        copy()
        t0 = time.perf_counter()
        for _ in range(reps):
            copy()
        best = max(best, 2 * nbytes * reps / (time.perf_counter() - t0))
    return best


def batch_floor_bytes(graph, batches: int = 10) -> tuple[float, float, float, float, float]:
    """Per batch, on average over a few batches (after one): the bytes a batch must move, hpcgnn's seconds
    sampling and gathering features, the bytes the gather moves, and the sampled edges."""
    total = sample_s = gather_s = gathered = edges = n = 0
    for batch in itertools.islice(hpcgnn_loader(graph), 1, batches + 1):
        n += 1  # a small graph's epoch may hold fewer
        sample_s += batch.sample[1] - batch.sample[0]
        gather_s += batch.gather[1] - batch.gather[0]
        rows = batch.n_id.numel() * graph.x.size(1)
        features = rows * graph.x.element_size() + rows * batch.x.element_size()  # feature rows read and written
        gathered += features
        edges += batch.edge_index.size(1)
        total += features + batch.edge_index.size(1) * 8  # and one read of the CSR per sampled edge
        total += batch.edge_index.numel() * batch.edge_index.element_size() + batch.n_id.numel() * 8  # indices written
    return total / n, sample_s / n, gather_s / n, gathered / n, edges / n


def reference(script: str, python: str, graph_folder: Path, batches: int, why_none: str,
              extra_env: dict | None = None) -> dict | str:
    """A reference's batches/s from its own process and environment (``script`` in ``python``; ``extra_env``
    added to it), or why none."""
    if not python or not Path(python).exists():
        return why_none
    res = subprocess.run([python, str(Path(__file__).with_name(script)), str(graph_folder),
                          "--batches", str(batches), "--threads", str(torch.get_num_threads())],
                         capture_output=True, text=True, env={**USER_ENV, "DGLBACKEND": "pytorch", **(extra_env or {})})
    if res.returncode:
        return f"{script} failed: {res.stderr.strip().splitlines()[-1] if res.stderr.strip() else res.returncode}"
    return json.loads(res.stdout.strip().splitlines()[-1])


# Each reference runs twice: as its users run it (glibc's malloc as it comes), and with the malloc settings hpcgnn
# gives itself (``+``: its freed batch buffers reused, not faulted in again). The targets count against the faster.
VARIANTS = (("", {}, ""), ("+", KEEP_FREED_ENV, ", hpcgnn's malloc settings"))

REFERENCES = (  # (argument and name, script, why there is none)
    ("dgl", "dgl_sampler.py", "DGL reference: none (benchmarks/dgl_venv.sh sets it up; --dgl PYTHON)"),
    ("pyg", "pyg_sampler.py", "PyG reference: none (NeighborLoader needs pyg-lib or torch-sparse: "
                              "benchmarks/pyglib_venv.sh builds pyg-lib; --pyg PYTHON)"),
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    graph_arguments(ap)
    ap.add_argument("--batches", type=int, default=30)
    ap.add_argument("--repeat", type=int, default=3, help="runs; the line prints medians")
    ap.add_argument("--contended", action="store_true", help="with a busy process beside, taking one core")
    default_dgl = Path("~/.cache/hpcgnn/dgl-venv/bin/python").expanduser()
    ap.add_argument("--dgl", default=str(default_dgl) if default_dgl.exists() else "",
                    help="python of the DGL reference environment (benchmarks/dgl_venv.sh)")
    ap.add_argument("--pyg", default=default_pyg_python(),
                    help="python with PyG and pyg-lib or torch-sparse (benchmarks/pyglib_venv.sh)")
    args = ap.parse_args()

    from hpcgnn.data import cache_folder

    graph = benchmark_graph(args)
    runs: dict[str, list[float]] = {"plain": [], "ahead": [], "bandwidth": []}
    names, edges, missing = {}, {}, []
    folder = cache_folder(benchmark_config(args))
    with busy_core(args.contended):
        for r in range(args.repeat):  # interleaved, so that a noisy minute hits every side alike
            runs["plain"].append(batches_per_s(hpcgnn_loader(graph), args.batches))
            runs["ahead"].append(batches_per_s(hpcgnn_loader(graph, prefetch=2), args.batches))
            runs["bandwidth"].append(copy_bandwidth())
            for (ref, script, why), (tag, extra, _) in itertools.product(REFERENCES, VARIANTS):
                res = reference(script, getattr(args, ref), folder, args.batches, why, extra)
                if isinstance(res, str):
                    if r == 0 and not tag:
                        missing.append(res)
                    continue
                gb = res.get("graphbolt_0")
                if isinstance(gb, dict):
                    runs.setdefault(f"graphbolt{tag}", []).append(gb["batches_per_s"])
                elif gb and r == 0 and not tag:
                    missing.append(f"GraphBolt did not run: {gb}")
                for workers in (0, 2):
                    runs.setdefault(f"{ref}{workers}{tag}", []).append(res[f"workers_{workers}"]["batches_per_s"])
                names[ref] = (f"DGL {res['dgl']}", "") if ref == "dgl" else \
                    (f"PyG {res['pyg']} NeighborLoader", f"{res['backend']}, ")
                edges[ref] = res["workers_0"]["edges_per_batch"]
            print(f"run {r + 1}: " + ", ".join(f"{k} {v[-1]:.2f}" for k, v in runs.items()), flush=True)
    med = {k: statistics.median(v) for k, v in runs.items()}
    plain, ahead, bandwidth = med["plain"], med["ahead"], med["bandwidth"]
    floor, sample_s, gather_s, gathered, edges["hpcgnn"] = batch_floor_bytes(graph)
    limit = bandwidth / floor  # batches/s if moving the bytes were all a batch cost
    line = (f"sampler ({torch.get_num_threads()} threads, fanouts {list(FANOUTS)}, batch {BATCH}, median of "
            f"{args.repeat}{', one core taken by a busy process' if args.contended else ''}"
            f"{f', degree exponent {args.degree_exponent}' if args.degree_exponent else ''}): "
            f"hpcgnn {plain:.2f} batches/s, with prefetch thread {ahead:.2f} | limit: {floor / 2**20:.0f} MB per "
            f"batch at {bandwidth / 1e9:.1f} GB/s copy bandwidth = {limit:.2f} batches/s, hpcgnn at "
            f"{max(plain, ahead) / limit:.0%} of it; a batch: sampling {sample_s * 1e3:.1f} ms, feature gather "
            f"{gather_s * 1e3:.1f} ms at {gathered / gather_s / 1e9:.1f} GB/s ({gathered / gather_s / bandwidth:.0%} "
            f"of the copy bandwidth)")
    for ref, (name, backend) in names.items():
        tags = [(tag, label) for tag, _, label in VARIANTS if f"{ref}0{tag}" in med]
        line += " | " + ", ".join(f"{name} ({backend}{w} workers{label}) {med[f'{ref}{w}{tag}']:.2f}"
                                  for tag, label in tags for w in (0, 2))
        zero = max(med[f"{ref}0{tag}"] for tag, _ in tags)
        best = max(med[f"{ref}{w}{tag}"] for tag, _ in tags for w in (0, 2))
        line += (f" batches/s: hpcgnn/{'DGL' if ref == 'dgl' else 'PyG'} with 0 workers = {plain / zero:.2f}x, "
                 f"best against best = {max(plain, ahead) / best:.2f}x (target >= {2 if ref == 'dgl' else 3}x, "
                 f"against the faster of each)")
    for tag, _, label in VARIANTS:
        if f"graphbolt{tag}" in med:
            line += (f" | DGL GraphBolt (0 workers{label}) {med[f'graphbolt{tag}']:.2f} batches/s, hpcgnn/GraphBolt = "
                     f"{plain / med[f'graphbolt{tag}']:.2f}x")
    line += " | sampled edges per batch: " + ", ".join(f"{k} {v:.0f}" for k, v in edges.items())
    for why in missing:
        line += f" | {why}"
    print(line)


if __name__ == "__main__":
    main()
