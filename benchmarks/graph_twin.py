"""A real dataset of many graphs, by hand: hpcgnn's graph task beside a PyG twin with the same model, split and
epochs (the accuracy check of docs/graph-tasks.md; real data never enters the repository or CI).

The data: a TU dataset's public raw files (PROTEINS, ENZYMES, MUTAG, ...) under ``<root>/pyg/TUDataset/<NAME>/raw``,
as PyG's ``TUDataset`` reads them offline. hpcgnn: ``python -m hpcgnn task=graph dataset=pyg_graphs`` on 2 local
ranks, ``--batch`` graphs per rank, its seeded split (``dataset.seed=0``), each ``train.seed`` a run. The twin: one
process, PyG's ``TUDataset`` and ``DataLoader`` (batches of 2 x ``--batch``, the same global batch), hpcgnn's split
(read from its prepared graph set), the same model (``hpcgnn.models.graph.GraphModel``: GIN, ``--layers``,
``--hidden``, mean readout), Adam at the same rate, the same epochs; both report the test accuracy at the epoch of
the best validation accuracy. The line prints each side's mean and standard deviation over ``--seeds``.

    python benchmarks/graph_twin.py --name PROTEINS --root /data/tu [--epochs 30] [--seeds 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F


def hpcgnn_run(args, seed: int, run: Path) -> float:
    cmd = [sys.executable, "-m", "hpcgnn", "task=graph", "dataset=pyg_graphs",
           "dataset._target_=torch_geometric.datasets.TUDataset", f"+dataset.kwargs.name={args.name}",
           f"dataset.root={args.root}", f"model.hidden_channels={args.hidden}", f"task.layers={args.layers}",
           f"model.dropout={args.dropout}", f"train.batch_size={args.batch}", f"train.epochs={args.epochs}",
           f"train.lr={args.lr}", f"train.seed={seed}", "train.precision=fp32", "launch.procs=2",
           "metrics.tensorboard=false", f"hydra.run.dir={run}"]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode:
        raise SystemExit(res.stdout + res.stderr)
    return json.loads((run / "summary.json").read_text())["test_acc"]


def splits(args) -> dict[str, torch.Tensor]:
    """hpcgnn's split of the dataset (its prepared graph set's, made by the first run)."""
    from hpcgnn.data import cache_folder
    from hpcgnn.data.graphs import open_graphs
    from hpcgnn.submit.compose import compose

    cfg = compose(["task=graph", "dataset=pyg_graphs", "dataset._target_=torch_geometric.datasets.TUDataset",
                   f"+dataset.kwargs.name={args.name}", f"dataset.root={args.root}"]).cfg
    gs = open_graphs(cache_folder(cfg.dataset))
    return {s: gs.split(s).clone() for s in ("train", "val", "test")}


def twin_run(args, seed: int, split: dict) -> float:
    """PyG's TUDataset and DataLoader, the same model and schedule, one process."""
    from torch_geometric.datasets import TUDataset
    from torch_geometric.loader import DataLoader

    from hpcgnn.models.graph import GraphModel

    torch.set_num_threads(2)
    data = TUDataset(str(Path(args.root) / "pyg" / "TUDataset"), args.name)
    torch.manual_seed(seed)
    model = GraphModel(data.num_features, args.hidden, data.num_classes, args.layers, dropout=args.dropout)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    train = DataLoader(data[split["train"]], batch_size=2 * args.batch, shuffle=True)

    def accuracy(ids) -> float:
        model.eval()
        right = 0
        with torch.no_grad():
            for b in DataLoader(data[ids], batch_size=512):
                right += int((model(b.x, b.edge_index, b.batch, None, b.num_graphs).argmax(-1) == b.y).sum())
        return right / ids.numel()

    best_val, test = -1.0, 0.0
    for _ in range(args.epochs):
        model.train()
        for b in train:
            loss = F.cross_entropy(model(b.x, b.edge_index, b.batch, None, b.num_graphs), b.y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        val = accuracy(split["val"])
        if val > best_val:
            best_val, test = val, accuracy(split["test"])
    return test


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--name", default="PROTEINS")
    ap.add_argument("--root", required=True)
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--batch", type=int, default=32, help="graphs per rank (the twin: twice this)")
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=5)
    ap.add_argument("--dropout", type=float, default=0.2)
    ap.add_argument("--lr", type=float, default=1e-3)
    args = ap.parse_args()
    ours, theirs = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(args.seeds):
            ours.append(hpcgnn_run(args, seed, Path(tmp) / f"run{seed}"))
            theirs.append(twin_run(args, seed, splits(args)))
            print(f"seed {seed}: hpcgnn {ours[-1]:.4f}, PyG twin {theirs[-1]:.4f}", flush=True)
    m, s = statistics.mean(ours), statistics.stdev(ours)
    tm, ts = statistics.mean(theirs), statistics.stdev(theirs)
    print(f"{args.name} ({args.epochs} epochs, GIN {args.layers}x{args.hidden}, {args.seeds} seeds): test accuracy "
          f"hpcgnn {m:.4f} +- {s:.4f} | PyG twin {tm:.4f} +- {ts:.4f} | {abs(m - tm) / ts:.2f} of the twin's sd apart")


if __name__ == "__main__":
    main()
