"""Time-respecting sampling: hpcgnn's temporal sampler beside pyg-lib's ``neighbor_sample`` with edge times.

The same graph (``--num-nodes`` nodes, ``--avg-degree`` in-edges each, every edge a random time, each row's edges
sorted by time as both samplers need), the same seeds with the same times, fanouts [15, 10, 5], batches of 1024
seeds, disjoint trees (a tree per seed), uniform among the edges at or before each seed's time, in one process with
no workers. Each side's runs are interleaved; the line prints medians of ``--repeat``.

    python benchmarks/temporal.py [--pyg PYTHON]      # PYTHON: a venv with pyg-lib (benchmarks/pyglib_venv.sh)

The reference runs this same file in its own python (``--side pyg FOLDER``), on the arrays this one saved.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

FANOUTS, BATCH = (15, 10, 5), 1024


def make_graph(folder: Path, n: int, avg_degree: float) -> None:
    """A random graph whose edges have random times, each row's edges sorted by time; a time per node."""
    if (folder / "done").exists():
        return
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    deg = rng.poisson(avg_degree, n).astype(np.int64)
    rowptr = np.zeros(n + 1, dtype=np.int64)
    rowptr[1:] = np.cumsum(deg)
    m = int(rowptr[-1])
    col = rng.integers(0, n, m, dtype=np.int64)
    t = rng.integers(0, 1_000_000, m, dtype=np.int64)
    row = np.repeat(np.arange(n, dtype=np.int64), deg)
    order = np.lexsort((t, row))  # by row, then time
    for name, a in (("rowptr", rowptr), ("col", col[order]), ("time", t[order]),
                    ("seed_time", rng.integers(0, 1_000_000, n, dtype=np.int64))):
        np.save(folder / f"{name}.npy", a)
    (folder / "done").touch()


def batches(folder: Path, count: int):
    """The benchmark's seeds and their times: the same on both sides."""
    g = torch.Generator().manual_seed(1)
    seed_time = torch.from_numpy(np.load(folder / "seed_time.npy"))
    n = seed_time.numel()
    for _ in range(count):
        seeds = torch.randint(0, n, (BATCH,), generator=g)
        yield seeds, seed_time.index_select(0, seeds)


def load(folder: Path) -> dict:
    return {k: torch.from_numpy(np.load(folder / f"{k}.npy")) for k in ("rowptr", "col", "time")}


def run_hpcgnn(folder: Path, count: int) -> dict:
    from hpcgnn.data.graph import Timeline
    from hpcgnn.sampling.temporal import TemporalSampler

    a = load(folder)
    sampler = TemporalSampler(a["rowptr"], Timeline(a["col"], a["time"], torch.arange(a["col"].numel())), FANOUTS)
    work = list(batches(folder, count + 2))
    gen = torch.Generator().manual_seed(0)
    for seeds, times in work[:2]:  # warm-up (the kernels' threads, the pages)
        sampler.sample(seeds, gen, times)
    edges = 0
    t0 = time.perf_counter()
    for seeds, times in work[2:]:
        edges += sampler.sample(seeds, gen, times).edge_index.size(1)
    return {"batches_per_s": count / (time.perf_counter() - t0), "edges_per_batch": edges / count}


def run_pyg(folder: Path, count: int) -> dict:
    import pyg_lib
    from pyg_lib.sampler import neighbor_sample

    a = load(folder)
    work = list(batches(folder, count + 2))

    def one(seeds, times):
        return neighbor_sample(a["rowptr"], a["col"], seeds, list(FANOUTS), edge_time=a["time"], seed_time=times,
                               disjoint=True, temporal_strategy="uniform", return_edge_id=True)

    for seeds, times in work[:2]:
        one(seeds, times)
    edges = 0
    t0 = time.perf_counter()
    for seeds, times in work[2:]:
        edges += one(seeds, times)[0].numel()
    return {"batches_per_s": count / (time.perf_counter() - t0), "edges_per_batch": edges / count,
            "pyg_lib": pyg_lib.__version__}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--num-nodes", type=int, default=500_000)
    ap.add_argument("--avg-degree", type=float, default=20)
    ap.add_argument("--batches", type=int, default=30)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--root", default="~/.cache/hpcgnn")
    default_pyg = Path("~/.cache/hpcgnn/pyg-venv/bin/python").expanduser()
    ap.add_argument("--pyg", default=str(default_pyg) if default_pyg.exists() else "",
                    help="python with pyg-lib (benchmarks/pyglib_venv.sh)")
    ap.add_argument("--side", choices=["pyg"], help="(internal) run the reference on FOLDER's arrays")
    ap.add_argument("folder", nargs="?")
    args = ap.parse_args()
    if args.side == "pyg":
        print(json.dumps(run_pyg(Path(args.folder), args.batches)))
        return
    folder = Path(args.root).expanduser() / f"temporal-bench-{args.num_nodes}-{args.avg_degree:g}"
    make_graph(folder, args.num_nodes, args.avg_degree)
    runs: dict[str, list[float]] = {"hpcgnn": [], "hpcgnn-1": [], "pyg-lib": []}
    threads = torch.get_num_threads()
    edges, version, missing = {}, "", ""
    for r in range(args.repeat):  # interleaved: a noisy minute hits both alike
        ours = run_hpcgnn(folder, args.batches)
        runs["hpcgnn"].append(ours["batches_per_s"])
        edges["hpcgnn"] = ours["edges_per_batch"]
        torch.set_num_threads(1)  # (pyg-lib's disjoint temporal sampling runs on one thread)
        runs["hpcgnn-1"].append(run_hpcgnn(folder, args.batches)["batches_per_s"])
        torch.set_num_threads(threads)
        if args.pyg:
            res = subprocess.run([args.pyg, __file__, "--side", "pyg", "--batches", str(args.batches), str(folder)],
                                 capture_output=True, text=True)
            if res.returncode:
                missing = f"pyg-lib failed: {res.stderr.strip().splitlines()[-1] if res.stderr.strip() else ''}"
            else:
                theirs = json.loads(res.stdout.strip().splitlines()[-1])
                runs["pyg-lib"].append(theirs["batches_per_s"])
                edges["pyg-lib"], version = theirs["edges_per_batch"], theirs["pyg_lib"]
        else:
            missing = "pyg-lib reference: none (benchmarks/pyglib_venv.sh builds it; --pyg PYTHON)"
        print(f"run {r + 1}: " + ", ".join(f"{k} {v[-1]:.2f}" for k, v in runs.items() if v), flush=True)
    med = {k: statistics.median(v) for k, v in runs.items() if v}
    line = (f"temporal sampling ({args.num_nodes} nodes, {args.avg_degree:g} timed in-edges each, fanouts "
            f"{list(FANOUTS)}, batch {BATCH}, disjoint, uniform, 0 workers, median of {args.repeat}): hpcgnn "
            f"{med['hpcgnn']:.2f} batches/s on {threads} threads, {med['hpcgnn-1']:.2f} on 1")
    if "pyg-lib" in med:
        line += (f" | pyg-lib {version} neighbor_sample {med['pyg-lib']:.2f} batches/s: hpcgnn/pyg-lib = "
                 f"{med['hpcgnn'] / med['pyg-lib']:.2f}x (target >= 3x), on one thread each "
                 f"{med['hpcgnn-1'] / med['pyg-lib']:.2f}x")
    line += " | sampled edges per batch: " + ", ".join(f"{k} {v:.0f}" for k, v in edges.items())
    if missing:
        line += f" | {missing}"
    print(line)


if __name__ == "__main__":
    sys.exit(main())
