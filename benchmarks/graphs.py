"""Graph tasks: hpcgnn's training on a dataset of many graphs beside PyG's ``DataLoader`` + DDP, on 2 ranks.

The data: hpcgnn's synthetic molecule-like set (``--graphs``, about 25 atoms and 54 bond directions each, OGB's nine
atom and three bond columns). The model, on both sides: the same GIN (``hpcgnn.models.graph.GraphModel``: OGB's
baseline, ``--layers`` 5, ``--hidden`` 300, mean readout, bond embeddings per layer), Adam at 1e-3, the same epochs,
``--batch`` graphs per rank per step. What differs is the data path:

- hpcgnn: ``python -m hpcgnn task=graph`` (``--ranks`` local ranks, 2): the graph set mapped once per node, an epoch dealt
  in equal steps, each batch assembled from offsets in C by the rank's prefetch thread;
- PyG: the same graphs as an ``InMemoryDataset`` (int64 features, as OGB's PyG datasets hold them), which each rank
  loads whole, a ``DistributedSampler``, PyG's ``DataLoader`` (``num_workers`` 0 and each of ``--workers``), DDP; every
  validation graph scored (by every rank, each its share, the counts summed).

Both sides run where ``--device`` says: on the CPU (gloo, a thread a rank), or a GPU a rank (PyG's side: NCCL, pinned
batches copied without blocking, as its multi-GPU examples; ``auto``: GPUs where there are ``--ranks`` of them).

Each side reports training graphs per second (the epochs' graphs over their time, without evaluation), the
validation accuracy after the last epoch, and each rank's peak resident memory (``ru_maxrss``: mapped pages a rank
touched count in it, so hpcgnn's shared graph counts once per rank too; PyG's loader workers' own peaks are added to
their rank's). The line prints medians of ``--repeat`` runs of each side, interleaved.

    python benchmarks/graphs.py                                     # the issue's set-up: 1M graphs, GIN 5 x 300
    python benchmarks/graphs.py --graphs 100000 --hidden 64 --epochs 1 --repeat 3   # a CPU machine's scale
    python benchmarks/graphs.py --graphs 200000 --ranks 1 --repeat 1 --workers 4    # one GPU, a short check

A second line times the data path alone (no model): batches of ``--batch`` graphs made per second from the same
shuffled ids, by hpcgnn's assembly and by PyG's collation (``DataLoader``, no workers), in one process.
"""

from __future__ import annotations

# isort: off
import hpcgnn  # noqa: F401  (first: its process defaults, OMP_WAIT_POLICY, before torch loads OpenMP)
# isort: on
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch_geometric.data import InMemoryDataset

REPO = Path(__file__).resolve().parent.parent


def prepared(args):
    """hpcgnn's graph set of ``args`` (prepared once under ``--root``) and its config."""
    sys.path.insert(0, str(REPO / "tests"))
    from hpcgnn.data import cache_folder, prepare
    from hpcgnn.data.graphs import open_graphs
    from hpcgnn.submit.compose import compose

    cfg = compose(["task=graph", f"dataset.num_graphs={args.graphs}", f"dataset.root={args.root}"]).cfg
    t0 = time.perf_counter()
    prepare(cfg.dataset)
    gs = open_graphs(cache_folder(cfg.dataset))
    print(f"graph set: {gs.num_graphs} graphs, {gs.node_ptr[-1]} nodes, {gs.edge_ptr[-1]} edges "
          f"(ready in {time.perf_counter() - t0:.0f} s)", flush=True)
    return cfg, gs


def pyg_file(args, gs) -> Path:
    """The same graphs as a PyG InMemoryDataset's processed file (int64 features, as OGB's PyG datasets): made once."""
    path = Path(args.root).expanduser() / "bench-graphs" / f"pyg-{args.graphs}.pt"
    if path.exists():
        return path
    from torch_geometric.data import Data, InMemoryDataset

    path.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    graphs = []
    for g in range(gs.num_graphs):
        a, b, c, d = int(gs.node_ptr[g]), int(gs.node_ptr[g + 1]), int(gs.edge_ptr[g]), int(gs.edge_ptr[g + 1])
        graphs.append(Data(x=gs.x[a:b].long(), edge_index=gs.edges[c:d].long().t().contiguous(),
                           edge_attr=gs.edge_attr[c:d].long(), y=gs.y[g:g + 1].clone()))
    InMemoryDataset.save(graphs, str(path))
    print(f"PyG's InMemoryDataset file: {path} ({path.stat().st_size / 2**20:.0f} MB, made in "
          f"{time.perf_counter() - t0:.0f} s)", flush=True)
    return path


class Graphs(InMemoryDataset):
    """PyG's InMemoryDataset of the benchmark's graphs, loaded whole from its processed file (by each rank)."""

    def __init__(self, path: str):
        self.path = path
        super().__init__(None)
        self.load(path)

    @staticmethod
    def of(path: Path) -> Graphs:
        return Graphs(str(path))


def model_of(args, gs_meta: dict):
    from hpcgnn.models.graph import GraphModel

    return GraphModel(9, args.hidden, gs_meta["classes"], args.layers, dropout=0.5, readout="mean",
                      x_vocab=tuple(gs_meta["x_vocab"]), edge_dim=3, edge_vocab=tuple(gs_meta["edge_vocab"]))


def peak_mb() -> float:
    """This process's peak RSS and its waited-for children's (loader workers), in MB."""
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return (own + kids) / 1024


def pyg_rank(rank: int, args, meta: dict, workers: int, out: str) -> None:
    """One rank of PyG's side: DDP (gloo on the CPU; on GPUs NCCL, a GPU a rank, as PyG's multi-GPU examples),
    DistributedSampler, PyG's DataLoader (pinned batches on GPUs, copied to the rank's GPU without blocking)."""
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data.distributed import DistributedSampler
    from torch_geometric.loader import DataLoader

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(args.port))
    cuda = args.device == "cuda"
    dev = torch.device("cuda", rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(dev)
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=args.ranks)
    data = Graphs.of(Path(meta["file"]))
    train, val = torch.tensor(meta["train"]), torch.tensor(meta["val"])
    sampler = DistributedSampler(train, num_replicas=2, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(data[train], batch_size=args.batch, sampler=sampler, num_workers=workers,
                        persistent_workers=workers > 0, pin_memory=cuda)
    torch.manual_seed(0)
    model = DistributedDataParallel(model_of(args, meta).to(dev), device_ids=[rank] if cuda else None)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    train_s, graphs = 0.0, 0
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        model.train()
        t0 = time.perf_counter()
        for b in loader:
            b = b.to(dev, non_blocking=True)
            loss = F.cross_entropy(model(b.x, b.edge_index, b.batch, b.edge_attr, b.num_graphs), b.y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            graphs += b.num_graphs
        if cuda:
            torch.cuda.synchronize(dev)
        train_s += time.perf_counter() - t0
    model.eval()
    right = torch.zeros(2, dtype=torch.float64)
    with torch.no_grad():
        for b in DataLoader(data[val[rank::args.ranks]], batch_size=512):
            b = b.to(dev)
            right += torch.tensor([float((model.module(b.x, b.edge_index, b.batch, b.edge_attr, b.num_graphs)
                                         .argmax(-1) == b.y).sum()), float(b.num_graphs)], dtype=torch.float64)
    right = right.to(dev)
    dist.all_reduce(right)
    total = torch.tensor([float(graphs), train_s], dtype=torch.float64, device=dev)
    dist.all_reduce(total)
    del loader  # (its workers end: their peaks are counted as this rank's children's)
    Path(out, f"rank{rank}.json").write_text(json.dumps({
        "graphs_per_s": float(total[0]) / (float(total[1]) / args.ranks), "val_acc": float(right[0] / right[1]),
        "gpu_peak_mb": torch.cuda.max_memory_allocated(dev) / 2**20 if cuda else 0.0,
        "peak_mb": peak_mb()}))
    dist.destroy_process_group()


def pyg_side(args, meta: dict, workers: int) -> dict:
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as out:
        args.port += 1
        mp.spawn(pyg_rank, args=(args, meta, workers, out), nprocs=args.ranks, join=True)
        ranks = [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(args.ranks)]
    return {"graphs_per_s": ranks[0]["graphs_per_s"], "val_acc": ranks[0]["val_acc"],
            "peak_mb": max(r["peak_mb"] for r in ranks)}


def hpcgnn_side(args, run: Path) -> dict:
    """``python -m hpcgnn task=graph`` on 2 local ranks, the same model and schedule."""
    cmd = [sys.executable, "-m", "hpcgnn", "task=graph", f"dataset.num_graphs={args.graphs}",
           f"dataset.root={args.root}", f"model.hidden_channels={args.hidden}", f"task.layers={args.layers}",
           "model.dropout=0.5", f"train.batch_size={args.batch}", f"train.epochs={args.epochs}", "train.lr=1e-3",
           f"train.precision={args.precision}", "train.eval_batch_size=512", f"launch.procs={args.ranks}", "metrics.tensorboard=false",
           f"train.device={args.device}",
           "checkpoint.every_minutes=0", f"hydra.run.dir={run}"]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode:
        raise SystemExit(res.stdout + res.stderr)
    s = json.loads((run / "summary.json").read_text())
    last = s["history"][-1]
    graphs = sum(r["seeds_per_s"] * r["epoch_s"] for r in s["history"])
    return {"graphs_per_s": graphs / sum(r["epoch_s"] for r in s["history"]), "val_acc": last["val_acc"],
            "peak_mb": max(r["host_peak_mb"] for r in s["history"])}


def data_path(args, gs, meta: dict) -> tuple[float, float]:
    """Batches a second of ``--batch`` graphs, the same shuffled ids: hpcgnn's assembly, PyG's collation."""
    from torch_geometric.loader import DataLoader

    from hpcgnn.stores.graphs import GraphBatcher

    ids = torch.tensor(meta["train"])[torch.randperm(len(meta["train"]), generator=torch.Generator().manual_seed(0))]
    ids = ids[: min(ids.numel(), 200 * args.batch)]
    batcher = GraphBatcher(gs)
    t0 = time.perf_counter()
    n = sum(1 for b in ids.split(args.batch) if batcher.sample(b).num_nodes >= 0)
    ours = n / (time.perf_counter() - t0)
    data = Graphs.of(Path(meta["file"]))
    t0 = time.perf_counter()
    n = sum(1 for b in DataLoader(data[ids], batch_size=args.batch) if b.num_nodes >= 0)
    return ours, n / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--graphs", type=int, default=1_000_000)
    ap.add_argument("--hidden", type=int, default=300)
    ap.add_argument("--layers", type=int, default=5)
    ap.add_argument("--batch", type=int, default=256, help="graphs per rank per step")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--workers", type=int, nargs="*", default=[2], help="PyG DataLoader worker counts besides 0")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--root", default=str(Path("~/.cache/hpcgnn").expanduser()))
    ap.add_argument("--port", type=int, default=29700)
    ap.add_argument("--precision", default="fp32", help="hpcgnn's train.precision (PyG's side runs fp32, as its "
                    "examples do): fp32 compares the data paths alone")
    ap.add_argument("--ranks", type=int, default=2, help="ranks a side (on GPUs: a GPU each)")
    ap.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"),
                    help="both sides: a GPU a rank where CUDA is (auto), or the CPU")
    args = ap.parse_args()
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.device_count() >= args.ranks else "cpu"
    torch.set_num_threads(1)
    cfg, gs = prepared(args)
    meta = {"file": str(pyg_file(args, gs)), "train": gs.train_idx.tolist(), "val": gs.val_idx.tolist(),
            "classes": int(gs.y.max()) + 1, "x_vocab": list(gs.x_vocab), "edge_vocab": list(gs.edge_vocab)}
    ours, theirs = data_path(args, gs, meta)
    print(f"data path, batches of {args.batch} graphs per second, one process: hpcgnn {ours:.1f}, PyG's collation "
          f"{theirs:.1f}: {ours / theirs:.1f}x", flush=True)
    runs: dict[str, list[dict]] = {"hpcgnn": [], **{f"pyg-w{w}": [] for w in (0, *args.workers)}}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeat):
            runs["hpcgnn"].append(hpcgnn_side(args, Path(tmp) / f"run{i}"))
            print("hpcgnn", runs["hpcgnn"][-1], flush=True)
            for w in (0, *args.workers):
                runs[f"pyg-w{w}"].append(pyg_side(args, meta, w))
                print(f"pyg workers={w}", runs[f"pyg-w{w}"][-1], flush=True)
    med = {k: {m: statistics.median(r[m] for r in v) for m in ("graphs_per_s", "val_acc", "peak_mb")}
           for k, v in runs.items()}
    best = max((k for k in med if k.startswith("pyg")), key=lambda k: med[k]["graphs_per_s"])
    h, p0, pb = med["hpcgnn"], med["pyg-w0"], med[best]
    print(f"graphs ({args.graphs} graphs, GIN {args.layers}x{args.hidden}, {args.batch} a rank, {args.epochs} "
          f"epoch(s), {args.ranks} rank(s) on {args.device}, medians of {args.repeat}): hpcgnn {h['graphs_per_s']:.0f} graphs/s, val acc "
          f"{h['val_acc']:.4f}, peak {h['peak_mb']:.0f} MB a rank | PyG workers=0 {p0['graphs_per_s']:.0f} graphs/s, "
          f"val {p0['val_acc']:.4f}, peak {p0['peak_mb']:.0f} MB | PyG best ({best}) {pb['graphs_per_s']:.0f} graphs/s, "
          f"val {pb['val_acc']:.4f}, peak {pb['peak_mb']:.0f} MB | speed {h['graphs_per_s'] / p0['graphs_per_s']:.2f}x "
          f"(best PyG {h['graphs_per_s'] / pb['graphs_per_s']:.2f}x), memory {h['peak_mb'] / p0['peak_mb']:.2f} of "
          f"PyG's", flush=True)


if __name__ == "__main__":
    main()
