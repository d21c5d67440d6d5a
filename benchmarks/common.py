"""Shared by the benchmarks: the benchmark graph, and PyG's reference loader when it can run here."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

from hpcgnn import env

# The environment without hpcgnn's process defaults (OMP_WAIT_POLICY): the references run in it. (hpcgnn's
# own processes get them: a benchmark imports hpcgnn before torch, as `python -m hpcgnn` does.)
USER_ENV = {k: v for k, v in os.environ.items() if k not in env.APPLIED}
# hpcgnn.process.keep_freed_memory's malloc settings, as glibc reads them from the environment: a reference
# process given them reuses its freed batch buffers as hpcgnn's processes do.
KEEP_FREED_ENV = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(2**31 - 1), "MALLOC_ARENA_MAX": "1"}


def graph_arguments(ap: argparse.ArgumentParser, num_nodes: int = 500_000) -> None:
    ap.add_argument("--num-nodes", type=int, default=num_nodes)
    ap.add_argument("--avg-degree", type=float, default=50)
    ap.add_argument("--degree-exponent", type=float, default=0.0, help="0: default tail; >2: power law (hubs)")
    ap.add_argument("--root", default="~/.cache/hpcgnn", help="where the prepared graph is cached")


# The benchmark batches: three hops, fanouts [15, 10, 5], 1024 seeds (the comparisons in results/).
FANOUTS, BATCH = (15, 10, 5), 1024


def hpcgnn_loader(graph, prefetch: int = 0):
    """hpcgnn's loader over the shuffled training seeds, with ``prefetch`` batches sampled ahead (0: none)."""
    from hpcgnn.sampling import BatchLoader, CSRNeighborSampler, PrefetchLoader

    seeds = graph.train_idx[torch.randperm(graph.train_idx.numel(), generator=torch.Generator().manual_seed(0))]
    loader = BatchLoader(graph, CSRNeighborSampler(graph.rowptr, graph.col, FANOUTS), seeds, BATCH,
                         generator=torch.Generator().manual_seed(0))
    return PrefetchLoader(loader, prefetch) if prefetch else loader


def benchmark_config(args):
    from hpcgnn.config import dataset_config

    return dataset_config(num_nodes=args.num_nodes, avg_degree=args.avg_degree, num_features=128, root=args.root,
                         degree_exponent=getattr(args, "degree_exponent", 0.0))


def benchmark_graph(args):
    """Prepare (once) and memory-map the synthetic graph of ``args``, as a training rank does."""
    from hpcgnn.data import open_graph, prepare
    from hpcgnn.process import keep_freed_memory

    cfg = benchmark_config(args)
    # Process-wide, as in a training rank; PyG's reference in the same process gets it too.
    print(f"keep_freed_memory (glibc malloc reuses freed blocks): {keep_freed_memory()}")
    t0 = time.perf_counter()
    prepare(cfg)
    graph = open_graph(cfg)
    print(f"graph: {graph.num_nodes} nodes, {graph.num_edges} edges, {graph.num_features} features "
          f"(ready in {time.perf_counter() - t0:.0f} s)")
    return graph


def pyg_backend(loader: str = "NeighborLoader") -> tuple[str | None, str]:
    """PyG's sampling backend here, ``("pyg-lib" or "torch-sparse", "")``, or ``(None, why)`` when PyG's
    ``loader`` cannot run (benchmarks/pyglib_venv.sh makes a python with pyg-lib)."""
    try:
        from torch_geometric.typing import WITH_PYG_LIB, WITH_TORCH_SPARSE
    except ImportError as exc:
        return None, f"torch_geometric.typing unavailable ({exc})"
    if not (WITH_PYG_LIB or WITH_TORCH_SPARSE):
        return None, f"PyG reference unavailable: {loader} needs pyg-lib or torch-sparse, neither is importable"
    return ("pyg-lib" if WITH_PYG_LIB else "torch-sparse"), ""


def default_pyg_python() -> str:
    """This python when it has pyg-lib or torch-sparse, else benchmarks/pyglib_venv.sh's when it exists."""
    if pyg_backend()[0] is not None:
        return sys.executable
    venv = Path("~/.cache/hpcgnn/pyg-venv/bin/python").expanduser()
    return str(venv) if venv.exists() else ""


class ReferenceServer:
    """A reference's loader in a process of its own (``script`` run by ``python`` in the user's environment,
    :data:`USER_ENV`), asked for one measurement at a time so that its runs interleave with hpcgnn's while its
    memory, its allocator and its workers' forks stay out of hpcgnn's process. The script prints a JSON line once
    ready, then answers each line it reads (the measurement's key) with a JSON line holding ``batches_per_s``.
    ``environ``: the process's environment instead."""

    def __init__(self, python: str, script: str, args: list[str], environ: dict | None = None):
        self.proc = subprocess.Popen([python, str(Path(__file__).with_name(script)), *args], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=USER_ENV if environ is None else environ)
        self.ready = self._answer()

    def _answer(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the reference process ended (exit status {self.proc.wait()}); its errors are above")
        return json.loads(line)

    def measure(self, key) -> float:
        self.proc.stdin.write(f"{key}\n")
        self.proc.stdin.flush()
        return float(self._answer()["batches_per_s"])

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.proc.stdin.write("\n")
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def pyg_loader(graph, fanouts, batch_size: int, num_workers: int, seed: int = 0):
    """PyG's NeighborLoader on the same graph, or None with the reason when it cannot run here."""
    backend, why = pyg_backend()
    if backend is None:
        return None, why
    from torch_geometric.data import Data
    from torch_geometric.loader import NeighborLoader

    data = Data(x=graph.x, y=graph.y, edge_index=graph.edge_index(), num_nodes=graph.num_nodes)
    torch.manual_seed(seed)
    loader = NeighborLoader(data, num_neighbors=list(fanouts), input_nodes=graph.train_idx, batch_size=batch_size,
                            shuffle=True, num_workers=num_workers)
    return loader, f"PyG NeighborLoader ({backend}, {num_workers} workers)"


@contextlib.contextmanager
def busy_core(enabled: bool = True, limit_s: float = 3600.0):
    """A process beside the benchmark that keeps one core busy (``--contended``), for at most ``limit_s``."""
    if not enabled:
        yield
        return
    busy = subprocess.Popen([sys.executable, "-c", f"import time\nend = time.time() + {limit_s}\nwhile time.time() < end: pass"])
    try:
        time.sleep(0.5)
        yield
    finally:
        busy.kill()
        busy.wait()


def interleaved_medians(sides: dict, repeat: int) -> dict[str, float]:
    """Each side's figure (a callable's return), median of ``repeat`` runs, taken in turn so that a noisy
    minute hits every side alike. Prints each run."""
    import statistics

    runs: dict[str, list[float]] = {name: [] for name in sides}
    for r in range(repeat):
        for name, measure in sides.items():
            runs[name].append(measure())
        print(f"run {r + 1}: " + ", ".join(f"{k} {v[-1]:.2f}" for k, v in runs.items()), flush=True)
    return {name: statistics.median(v) for name, v in runs.items()}


def contended(measure):
    """``measure`` run with a busy process beside it taking one core (``--contended``)."""
    def run():
        with busy_core():
            return measure()
    return run


def loader_sides(plain, ahead, with_contended: bool) -> dict:
    """hpcgnn's sides of a loader benchmark: ``plain`` and ``ahead`` (the prefetch thread) batches/s, and
    both again with one core taken when ``with_contended``."""
    sides = {"plain": plain, "ahead": ahead}
    if with_contended:
        sides["plain contended"], sides["ahead contended"] = contended(plain), contended(ahead)
    return sides


def loader_part(med: dict, with_contended: bool) -> str:
    """hpcgnn's figures of a loader benchmark's line: quiet, and contended against quiet in the same run."""
    line = f"hpcgnn {med['plain']:.2f} batches/s, with prefetch thread {med['ahead']:.2f}"
    return line + (contended_part(med) if with_contended else "")


def contended_part(med: dict) -> str:
    """The contended figures against the quiet ones of the same run."""
    return (f" | one core taken by a busy process: {med['plain contended']:.2f}, with prefetch thread "
            f"{med['ahead contended']:.2f} = {med['plain'] / med['plain contended']:.2f}x and "
            f"{med['ahead'] / med['ahead contended']:.2f}x slower than quiet (target <= 2.5x)")


def in_child(target, *args):
    """``target(*args, queue)`` in a fresh spawned process (a rank, a partitioner): what it put in the queue."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    p = ctx.Process(target=target, args=(*args, out))
    p.start()
    result = out.get()
    p.join()
    return result
