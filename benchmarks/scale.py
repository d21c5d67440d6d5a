"""Graphs larger than one node: preparing and partitioning memory, and the partitioners' quality.

    python benchmarks/scale.py                                   # 2M nodes, K = 4 and 8
    python benchmarks/scale.py --degree-exponent 2.5             # heavy-tailed degrees (hubs)
    python benchmarks/scale.py --num-nodes 8000000 --avg-degree 50 --parts 8 --methods lp random \\
        --skip-today --prepare-mem-gb 4                          # a graph today's path cannot take here

Every step runs in a fresh process and reports its peak RSS (``ru_maxrss``, which counts the pages
of the memory-mapped graph it touched) and its wall time:

- **prepare**: today's in-memory path (the whole edge list, ``Graph.from_edge_index``, ``cache.save``:
  ``--skip-today`` leaves it out) against the streamed one (``hpcgnn.data.prepare``);
- **partition**, per method and K: ``ensure_parts`` (compute, report, write), the time of the
  partitioning itself, the edge-cut, the balance, and the remote feature rows per batch (batches of
  1024 of part 0's training seeds, fanouts [15, 10, 5], as in ``benchmarks/partition.py``);
  METIS is first checked against the memory it would need (what ``python -m hpcgnn.partition``
  refuses is reported as refused, not run);
- **rank**, at K=4 (``--rank-parts``): the memory a partitioned rank holds after opening its part,
  building its sampler and sampling (RSS growth over an idle process), against a replicated rank's.

The last lines compare the partitioners and the memory of the paths (one line each).
"""

from __future__ import annotations

# isort: off
import hpcgnn  # noqa: F401  (first: its process defaults, OMP_WAIT_POLICY, before torch loads OpenMP)
# isort: on
import argparse
import dataclasses
import multiprocessing as mp
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from common import BATCH, FANOUTS  # noqa: E402


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _child(fn, args, q) -> None:
    import torch

    torch.set_num_threads(2)
    base = _rss_mb()
    t0 = time.perf_counter()
    try:
        out = fn(*args)
        q.put({"ok": True, "seconds": time.perf_counter() - t0, "peak_mb": _peak_mb(), "base_mb": base, **out})
    except Exception as exc:  # reported, not raised: the parent prints it
        q.put({"ok": False, "error": f"{type(exc).__name__}: {exc}"})


def in_child(fn, *args) -> dict:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_child, args=(fn, args, q))
    p.start()
    out = q.get()
    p.join()
    if p.exitcode:
        out = {"ok": False, "error": f"exit code {p.exitcode} (killed: out of memory?)"}
    return out


# ------------------------------------------------------------------------------------------- steps


def prepare_today(cfg) -> dict:
    """Today's path: the graph built whole in memory, then saved (into a scratch root)."""
    from hpcgnn.data import build_graph, cache

    scratch = Path(tempfile.mkdtemp(prefix="hpcgnn-today-", dir=Path(cfg.root).expanduser()))
    try:
        graph = build_graph(cfg)
        cache.save(graph, scratch / "g", {"dataset": dataclasses.asdict(cfg)})
        return {"edges": graph.num_edges}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def prepare_streamed(cfg) -> dict:
    from hpcgnn.data import cache_folder, prepare
    from hpcgnn.data.cache import is_complete

    if is_complete(cache_folder(cfg)):
        return {"reused": True}
    prepare(cfg)
    return {"reused": False}


def partition(cfg, gcfg, k: int) -> dict:
    from hpcgnn import env
    from hpcgnn.data import open_graph
    from hpcgnn.errors import PartitionError
    from hpcgnn.partition import check_partition_memory, ensure_parts, parts_folder

    graph = open_graph(cfg)
    try:
        check_partition_memory(gcfg.method, graph.num_nodes, graph.num_edges, env.available_memory())
    except PartitionError as exc:
        return {"refused": str(exc).split(". HINT")[0]}
    shutil.rmtree(parts_folder(cfg, gcfg, k), ignore_errors=True)  # measured, not reused
    folder, meta, reused = ensure_parts(cfg, gcfg, k)
    return {"meta": meta, "reused": reused}


def remote_rows(cfg, gcfg, k: int, batches: int) -> dict:
    import torch

    from hpcgnn.data import open_graph
    from hpcgnn.partition import open_parts
    from hpcgnn.sampling import CSRNeighborSampler
    from hpcgnn.sampling.distributed import PartitionView

    graph = open_graph(cfg)
    parts = open_parts(cfg, gcfg, k, [0], verify=False)
    view = PartitionView(parts, 0, 1)
    sampler = CSRNeighborSampler(graph.rowptr, graph.col, FANOUTS)
    gen = torch.Generator().manual_seed(0)
    seeds = parts.train_idx[torch.randperm(parts.train_idx.numel(), generator=gen)][: batches * BATCH].split(BATCH)
    remote = 0
    for s in seeds:
        n_id = sampler.sample(s, gen).n_id
        remote += int((view.owner(n_id) != 0).sum())
    return {"remote": remote / max(len(seeds), 1)}


def rank_memory(cfg, gcfg, k: int, partitioned: bool) -> dict:
    """RSS growth of a rank that opens its graph (part 0 of K, or the whole graph), builds its sampler,
    touches every page it holds and samples a few batches."""
    import torch

    from hpcgnn.data import open_graph
    from hpcgnn.partition import open_parts
    from hpcgnn.sampling import CSRNeighborSampler

    before = _rss_mb()
    if partitioned:
        from hpcgnn.sampling.distributed import PartitionedNeighborSampler, PartitionView

        parts = open_parts(cfg, gcfg, k, [0], verify=False)
        view = PartitionView(parts, 0, 1)
        sampler = PartitionedNeighborSampler(view, FANOUTS, exchange=None)
        held = [parts.rowptr, parts.col, parts.x, parts.y, parts.nodes, parts.node_part, parts.node_local,
                parts.degree]
        seeds = parts.train_idx
        sample = lambda s, g: sample_owned(sampler, view, s, g)  # noqa: E731
    else:
        graph = open_graph(cfg)
        sampler = CSRNeighborSampler(graph.rowptr, graph.col, FANOUTS)
        held = [graph.rowptr, graph.col, graph.x, graph.y]
        seeds = graph.train_idx
        sample = sampler.sample
    for t in held:
        t.float().sum() if t.dtype in (torch.float16, torch.bfloat16) else t.sum()
    gen = torch.Generator().manual_seed(0)
    for s in seeds[torch.randperm(seeds.numel(), generator=gen)][: 4 * BATCH].split(BATCH):
        sample(s, gen)
    return {"held_mb": _rss_mb() - before, "bytes": sum(t.numel() * t.element_size() for t in held)}


def sample_owned(sampler, view, seeds, gen):
    """One hop of the partitioned sampler on owned frontier nodes only (no exchange partner here):
    what the sampler's own state costs, not the remote walk."""
    from hpcgnn.sampling.neighbor import sample_neighbors

    return sample_neighbors(sampler.rowptr, sampler.col, view.row(seeds), FANOUTS[0], gen)


# -------------------------------------------------------------------------------------------- main


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--num-nodes", type=int, default=2_000_000)
    ap.add_argument("--avg-degree", type=float, default=12.0)
    ap.add_argument("--degree-exponent", type=float, default=0.0)
    ap.add_argument("--num-features", type=int, default=32)
    ap.add_argument("--train-fraction", type=float, default=0.3)
    ap.add_argument("--feature-dtype", default="float32")
    ap.add_argument("--prepare-mem-gb", type=float, default=None)
    ap.add_argument("--parts", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--methods", nargs="+", default=["metis", "lp", "random"])
    ap.add_argument("--batches", type=int, default=6)
    ap.add_argument("--rank-parts", type=int, default=4, help="K of the per-rank memory check (0: skip)")
    ap.add_argument("--skip-today", action="store_true", help="do not run today's in-memory prepare")
    ap.add_argument("--root", default="~/.cache/hpcgnn-scale")
    args = ap.parse_args()

    from hpcgnn.config import GraphConfig, dataset_config

    cfg = dataset_config(num_nodes=args.num_nodes, avg_degree=args.avg_degree, degree_exponent=args.degree_exponent,
                        num_features=args.num_features, train_fraction=args.train_fraction,
                        feature_dtype=args.feature_dtype, prepare_mem_gb=args.prepare_mem_gb, root=args.root)
    Path(cfg.root).expanduser().mkdir(parents=True, exist_ok=True)
    print(f"graph: synthetic, {args.num_nodes} nodes, average degree {args.avg_degree}, degree exponent "
          f"{args.degree_exponent}, {args.num_features} {args.feature_dtype} features", flush=True)

    today = None if args.skip_today else in_child(prepare_today, cfg)
    if today is not None:
        print("prepare, today's in-memory path: " + (f"{today['seconds']:.1f} s, peak RSS {today['peak_mb']:.0f} MB"
                                                     if today["ok"] else f"failed: {today['error']}"), flush=True)
    streamed = in_child(prepare_streamed, cfg)
    if not streamed["ok"]:
        raise SystemExit(f"streamed prepare failed: {streamed['error']}")
    print(f"prepare, streamed: {streamed['seconds']:.1f} s, peak RSS {streamed['peak_mb']:.0f} MB"
          + (" (reused: run with a fresh --root to measure)" if streamed.get("reused") else ""), flush=True)

    results: dict[tuple[str, int], dict] = {}
    for k in args.parts:
        for method in args.methods:
            gcfg = GraphConfig(mode="partitioned", method=method)
            res = in_child(partition, cfg, gcfg, k)
            if not res["ok"] or "refused" in res:
                print(f"K={k} {method}: " + (f"refused: {res['refused']}" if res.get("refused") else
                                             f"failed: {res['error']}"), flush=True)
                results[(method, k)] = res
                continue
            meta = res["meta"]
            rr = in_child(remote_rows, cfg, gcfg, k, args.batches)
            res["remote"] = rr.get("remote", float("nan"))
            results[(method, k)] = res
            r = meta["report"]
            print(f"K={k} {method}: partition {meta['partition_s']:.1f} s (with report and writing "
                  f"{res['seconds']:.1f} s{', reused' if res['reused'] else ''}), peak RSS {res['peak_mb']:.0f} MB; "
                  f"edge-cut {r['edge_cut_fraction']:.2%}; balance nodes {r['balance']['nodes']:.3f}, training "
                  f"{r['balance']['train_nodes']:.3f}; remote rows/batch {res['remote']:.0f}", flush=True)

    if args.rank_parts:
        k = args.rank_parts
        method = next((m for m in ("lp", "metis", "random") if results.get((m, k), {}).get("meta")), None)
        if method is not None:
            gcfg = GraphConfig(mode="partitioned", method=method)
            rep = in_child(rank_memory, cfg, gcfg, k, False)
            par = in_child(rank_memory, cfg, gcfg, k, True)
            if rep["ok"] and par["ok"]:
                print(f"rank memory at K={k} ({method}): replicated rank {rep['held_mb']:.0f} MB, partitioned rank "
                      f"{par['held_mb']:.0f} MB = {par['held_mb'] / rep['held_mb']:.3f} of it (bar {1 / k + 0.1:.3f})",
                      flush=True)
            else:
                print(f"rank memory failed: {rep.get('error') or par.get('error')}")

    # The comparisons, one line.
    line = []
    if today is not None and today["ok"] and not streamed.get("reused"):  # (reused: no prepare was measured)
        line.append(f"prepare peak RSS streamed/today = {streamed['peak_mb'] / today['peak_mb']:.2f} (bar <= 0.33)")
    for k in args.parts:
        m, lp = results.get(("metis", k), {}), results.get(("lp", k), {})
        if m.get("meta") and lp.get("meta"):
            cut = lp["meta"]["report"]["edge_cut_fraction"] / m["meta"]["report"]["edge_cut_fraction"]
            line.append(f"K={k}: lp/metis edge-cut {cut:.2f} (<= 1.5), remote rows {lp['remote'] / m['remote']:.2f} "
                        f"(<= 1.3), partition time {lp['meta']['partition_s'] / m['meta']['partition_s']:.2f} (<= 1), "
                        f"peak RSS {lp['peak_mb'] / m['peak_mb']:.2f} (<= 0.33)")
    if line:
        print("scale: " + " | ".join(line), flush=True)


if __name__ == "__main__":
    main()
