"""Sampler processes per rank (train.sampler_procs): throughput, training speed and memory, in one run.

    python benchmarks/samplers.py [--num-nodes 2000000] [--avg-degree 50] [--batches 30] [--train-nodes 200000]
                                  [--procs 1,2] [--root DIR]

(1) Sampling alone, on the prepared graph (fanouts [15, 10, 5], 1024 seeds, features gathered): batches/s a
    rank receives from N sampler processes of one thread each, against sampling in the rank itself (one
    thread, no prefetch). Each setting runs in a fresh process (a rank) that keeps the batches in index order,
    as training does.
(2) Memory: summed PSS (/proc/PID/smaps_rollup; shared pages split between the processes that map them) of the
    rank and its sampler processes at the last batch, against a rank alone (today's path: the prefetch thread,
    depth 2, all cores).
(3) Transport: batches/s from one sampler server (a local process; the batches cross TCP) against one sampler
    process (shared-memory slots).
(4) Training: seeds/s of the last of 2 epochs of `python -m hpcgnn` (one rank, GraphSAGE, the same fanouts and
    batch) on a --train-nodes graph, with the prefetch thread (train.sampler_procs=0) and with 1 sampler process.

Timings on shared machines are noisy: compare the ratios within one run. Prints one comparison line.
"""

from __future__ import annotations

# isort: off
import hpcgnn  # noqa: F401  (first: its process defaults, OMP_WAIT_POLICY, before torch loads OpenMP)
# isort: on
import argparse
import json
import multiprocessing as mp
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import BATCH, FANOUTS, benchmark_config, graph_arguments, in_child


def pss_mb(pid: int | str = "self", kind: str = "Pss:") -> float:
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith(kind):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {kind} in smaps_rollup")


def pss_file_mb(pid: int | str = "self") -> float:
    """PSS of file-backed pages: the mapped graph (and the libraries)."""
    return pss_mb(pid, "Pss_File:")


def cpu_s(pid: int | str = "self") -> float:
    """CPU seconds (user + system) of a process so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


SERVER = -2  # _rank's procs for: one local sampler server


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _build(cfg, state):
    """The server's sampler, built as the rank's below (a neighbour sampler of FANOUTS over the graph it opens)."""
    from hpcgnn.data import open_graph
    from hpcgnn.sampling import CSRNeighborSampler
    from hpcgnn.sampling.shipping import Recipe

    graph = open_graph(cfg)
    return Recipe(graph, CSRNeighborSampler(graph.rowptr, graph.col, FANOUTS))


def _server(port: int, run_dir: str, cfg) -> None:
    import functools

    from hpcgnn.sampling.server import run_server
    from hpcgnn.trust import run_secret

    run_server(0, port, 1, 1, run_dir, run_secret(run_dir), functools.partial(_build, cfg), host="127.0.0.1")


def _rank(cfg, procs: int, batches: int, out) -> None:
    """One rank's loop over ``batches`` batches (after a warm-up), with ``procs`` sampler processes (0: in the
    rank, one thread, no prefetch; -1: today's rank, the prefetch thread and every core)."""
    import torch

    from hpcgnn.data import open_graph
    from hpcgnn.process import keep_freed_memory
    from hpcgnn.sampling import BatchLoader, CSRNeighborSampler, PrefetchLoader
    from hpcgnn.sampling.procs import SamplerPool
    from hpcgnn.sampling.shipping import Recipe, SamplerState

    keep_freed_memory()
    torch.set_num_threads(len(os.sched_getaffinity(0)) if procs < 0 else 1)
    graph = open_graph(cfg)
    sampler = CSRNeighborSampler(graph.rowptr, graph.col, FANOUTS)
    seeds = graph.train_idx[torch.randperm(graph.train_idx.numel(), generator=torch.Generator().manual_seed(0))]
    warm = max(procs, 1) * 2
    loader = BatchLoader(graph, sampler, seeds[: (warm + batches) * BATCH], BATCH, batch_seed=1)
    pool = server = None
    if procs > 0:
        pool = SamplerPool(Recipe(graph, sampler), procs, 2, 1, torch.device("cpu"), rank=0)
        pool.start()
        walk = pool.epoch(loader.plan)
    elif procs == SERVER:  # one sampler server, a local process over TCP
        from hpcgnn.sampling.client import RemotePool
        from hpcgnn.trust import run_secret

        port, run_dir = free_port(), tempfile.mkdtemp(prefix="hpcgnn-bench-server-")
        server = mp.get_context("spawn").Process(target=_server, args=(port, run_dir, cfg))
        server.start()
        pool = RemotePool(SamplerState("whole", 0, 1), [("127.0.0.1", port)], 2, torch.device("cpu"), rank=0,
                          key=run_secret(run_dir), run_dir=run_dir)
        pool.start()
        walk = pool.epoch(loader.plan)
    else:
        walk = PrefetchLoader(loader, 2) if procs < 0 else loader
    pids = ["self", *(pool.pids() if isinstance(pool, SamplerPool) else []), *([server.pid] if server is not None else [])]
    edges, t0, c0 = 0, 0.0, 0.0
    for i, batch in enumerate(walk):
        if i == warm:
            t0, c0 = time.perf_counter(), sum(cpu_s(p) for p in pids)
        if i >= warm:
            edges += batch.edge_index.size(1)
        if i == warm + batches - 1:
            elapsed = time.perf_counter() - t0
            cores = (sum(cpu_s(p) for p in pids) - c0) / elapsed
            pss = sum(pss_mb(p) for p in pids)
            graph = sum(pss_file_mb(p) for p in pids)
    if pool is not None:
        pool.close(done=True)
    if server is not None:
        server.join()
    out.put({"batches_per_s": (batches - 1) / elapsed, "edges_per_batch": edges / batches, "pss_mb": pss,
             "graph_pss_mb": graph, "cores": cores})


def sampling(cfg, procs: int, batches: int) -> dict:
    return in_child(_rank, cfg, procs, batches)


def training(args, procs: int, root: str) -> float:
    """seeds/s of the last epoch of a one-rank run."""
    with tempfile.TemporaryDirectory() as run:
        res = subprocess.run([sys.executable, "-m", "hpcgnn", "launch.procs=1", "train.epochs=2",
                              f"dataset.num_nodes={args.train_nodes}", f"dataset.avg_degree={args.avg_degree}",
                              "dataset.num_features=128", f"dataset.root={root}", f"train.batch_size={BATCH}",
                              f"train.fanouts=[{','.join(map(str, FANOUTS))}]", "model=sage", "model.hidden_channels=256",
                              f"train.sampler_procs={procs}", "metrics.tensorboard=false", "train.eval_every=100",
                              f"hydra.run.dir={run}"], capture_output=True, text=True)
        if res.returncode:
            raise SystemExit(res.stdout + res.stderr)
        return json.loads((Path(run) / "summary.json").read_text())["history"][-1]["seeds_per_s"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    graph_arguments(ap, num_nodes=2_000_000)
    ap.add_argument("--batches", type=int, default=30)
    ap.add_argument("--procs", default="1,2", help="sampler process counts to measure")
    ap.add_argument("--train-nodes", type=int, default=200_000, help="graph of the training comparison (0: skip)")
    args = ap.parse_args()
    args.root = os.path.expanduser(args.root)

    from hpcgnn.data import cache, prepare

    cfg = benchmark_config(args)
    t0 = time.perf_counter()
    folder = prepare(cfg)
    print(f"graph: {args.num_nodes} nodes, avg degree {args.avg_degree}, 128 features, "
          f"{cache.human_bytes(cache.size_bytes(folder))} ({time.perf_counter() - t0:.0f} s); "
          f"{len(os.sched_getaffinity(0))} cores", flush=True)
    alone = sampling(cfg, -1, args.batches)
    one_thread = sampling(cfg, 0, args.batches)
    print(f"rank alone (prefetch thread, all cores): {alone['batches_per_s']:.2f} batches/s, {alone['cores']:.2f} "
          f"cores busy, PSS {alone['pss_mb']:.0f} MB (file-backed {alone['graph_pss_mb']:.0f}); in the rank, 1 "
          f"thread: {one_thread['batches_per_s']:.2f} batches/s, {one_thread['cores']:.2f} cores busy", flush=True)
    counts = [int(n) for n in args.procs.split(",")]
    pools = {}
    for n in counts:
        pools[n] = sampling(cfg, n, args.batches)
        print(f"{n} sampler process(es): {pools[n]['batches_per_s']:.2f} batches/s, {pools[n]['cores']:.2f} cores "
              f"busy, PSS rank + samplers {pools[n]['pss_mb']:.0f} MB (file-backed {pools[n]['graph_pss_mb']:.0f})",
              flush=True)
    served = sampling(cfg, SERVER, args.batches)
    print(f"1 sampler server (local, TCP): {served['batches_per_s']:.2f} batches/s, {served['cores']:.2f} cores busy, "
          f"PSS {served['pss_mb']:.0f} MB", flush=True)
    trained = {}
    if args.train_nodes:
        for procs in (0, 1):
            trained[procs] = training(args, procs, args.root)
            print(f"training, train.sampler_procs={procs}: {trained[procs]:.0f} seeds/s", flush=True)
    first = counts[0]
    rates = " | ".join(f"{n} procs {pools[n]['batches_per_s']:.2f}" for n in counts)
    line = [f"sampling: {rates} batches/s (in-rank 1 thread {one_thread['batches_per_s']:.2f})"]
    line += [f"{n}/{first} procs {pools[n]['batches_per_s'] / pools[first]['batches_per_s']:.2f}x"
             for n in counts[1:]]
    line += [f"PSS {n} procs / rank alone {pools[n]['pss_mb'] / alone['pss_mb']:.2f}x (file-backed "
             f"{pools[n]['graph_pss_mb'] / alone['graph_pss_mb']:.2f}x)" for n in counts]
    line.append(f"1 server (TCP) / 1 proc (shared memory) {served['batches_per_s'] / pools[1]['batches_per_s']:.2f}x"
                if 1 in pools else f"1 server {served['batches_per_s']:.2f} batches/s")
    if trained:
        line.append(f"training 1 proc / prefetch thread {trained[1] / trained[0]:.2f}x")
    print("; ".join(line))


if __name__ == "__main__":
    main()
