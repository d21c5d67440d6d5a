"""A real dataset of many graphs, by hand: hpcgnn's graph task beside a PyG twin with the same model, split and
epochs (the accuracy check of docs/graph-tasks.md; real data never enters the repository or CI).

The data, either
- a TU dataset's public raw files (PROTEINS, ENZYMES, MUTAG, ...) under ``<root>/pyg/TUDataset/<NAME>/raw``, as
  PyG's ``TUDataset`` reads them offline; hpcgnn: ``dataset=pyg_graphs``, its seeded split (``dataset.seed=0``);
  scored by accuracy; or
- an OGB graph property dataset's raw folder (``--name ogbg-molhiv``: ``<root>/ogb/ogbg_molhiv/{raw,split}``);
  hpcgnn: ``dataset=ogbg-molhiv``; the twin reads the same files with ``ogb.io.read_graph_pyg``; OGB's split, its
  metric by OGB's ``Evaluator`` (ROC-AUC for molhiv), its categorical columns embedded on both sides.

hpcgnn: ``python -m hpcgnn task=graph`` on ``--ranks`` local ranks (2), ``--batch`` graphs per rank, each
``train.seed`` a run. The twin: one process, PyG's ``DataLoader`` of ``--batch`` graphs, a step every ``--ranks``
batches with their losses averaged (what DDP computes: the same global batch, batch norm over each rank's graphs),
hpcgnn's split (read from its prepared graph set), the same model (``hpcgnn.models.graph.GraphModel``: GIN, or GINE
where the edges have features, ``--layers``, ``--hidden``, mean readout), Adam at the same rate, the same epochs;
both report the test metric at the epoch of the best validation metric. The line prints each side's mean and standard deviation over
``--seeds``.

    python benchmarks/graph_twin.py --name PROTEINS --root /data/tu [--epochs 30] [--seeds 5]
    python benchmarks/graph_twin.py --name ogbg-molhiv --root /data --epochs 10 --hidden 64
"""

from __future__ import annotations

# isort: off
import hpcgnn  # noqa: F401  (first: its process defaults, OMP_WAIT_POLICY, before torch loads OpenMP)
# isort: on
import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F


def is_ogb(args) -> bool:
    return args.name.startswith("ogbg-")


def dataset_args(args) -> list[str]:
    """hpcgnn's dataset overrides for ``--name``."""
    if is_ogb(args):
        return [f"dataset={args.name}", f"dataset.root={args.root}"]
    return ["dataset=pyg_graphs", "dataset._target_=torch_geometric.datasets.TUDataset",
            f"+dataset.kwargs.name={args.name}", f"dataset.root={args.root}"]


def hpcgnn_run(args, seed: int, run: Path) -> float:
    cmd = [sys.executable, "-m", "hpcgnn", "task=graph", *dataset_args(args), f"model.hidden_channels={args.hidden}", f"task.layers={args.layers}",
           f"model.dropout={args.dropout}", f"train.batch_size={args.batch}", f"train.epochs={args.epochs}",
           f"train.lr={args.lr}", f"train.seed={seed}", "train.precision=fp32", f"launch.procs={args.ranks}",
           "metrics.tensorboard=false", f"hydra.run.dir={run}"]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode:
        raise SystemExit(res.stdout + res.stderr)
    return json.loads((run / "summary.json").read_text())["test"]


def graph_set(args):
    """hpcgnn's prepared graph set of the dataset (made by the first run)."""
    from hpcgnn.data import cache_folder
    from hpcgnn.data.graphs import open_graphs
    from hpcgnn.submit.compose import compose

    return open_graphs(cache_folder(compose(["task=graph", *dataset_args(args)]).cfg.dataset))


def twin_data(args, gs):
    """The twin's dataset, read by PyG's (TUDataset) or OGB's own reader (``ogb.io``: raw files, labels as
    ``[graphs, tasks]`` floats), and its metric: ``score(logits, y) -> float``."""
    if not is_ogb(args):
        from torch_geometric.datasets import TUDataset

        data = TUDataset(str(Path(args.root) / "pyg" / "TUDataset"), args.name)
        return data, data.num_features, data.num_classes, lambda out, y: float((out.argmax(-1) == y).float().mean())
    import numpy as np
    import pandas as pd
    from ogb.graphproppred import Evaluator
    from ogb.io.read_graph_pyg import read_graph_pyg

    from hpcgnn.data.ogb import ogb_meta

    meta, folder = ogb_meta(args.name), Path(args.root) / "ogb" / args.name.replace("-", "_")
    data = read_graph_pyg(str(folder / "raw"), add_inverse_edge=meta["add_inverse_edge"] == "True")
    y = pd.read_csv(folder / "raw" / "graph-label.csv.gz", header=None).values.astype(np.float32)
    for g, label in zip(data, y, strict=True):
        g.y = torch.from_numpy(label).view(1, -1)
    evaluator, key = Evaluator(args.name), meta["eval metric"]

    def score(out, y) -> float:
        return float(evaluator.eval({"y_true": y.numpy(), "y_pred": out.float().numpy()})[key])

    return data, gs.num_features, y.shape[1], score


def loss_of(args, out, y):
    if not is_ogb(args):
        return F.cross_entropy(out, y)
    known = ~torch.isnan(y)  # OGB's unknown labels
    return F.binary_cross_entropy_with_logits(out[known], y[known])


def twin_run(args, seed: int, gs, twin) -> float:
    """PyG's DataLoader over the twin's dataset, the same model and schedule, one process."""
    from torch_geometric.loader import DataLoader

    from hpcgnn.models.graph import GraphModel

    torch.set_num_threads(2)
    data, features, outputs, score = twin
    split = {s: gs.split(s).clone() for s in ("train", "val", "test")}
    torch.manual_seed(seed)
    model = GraphModel(features, args.hidden, outputs, args.layers, dropout=args.dropout, x_vocab=gs.x_vocab,
                       edge_dim=gs.edge_dim, edge_vocab=gs.edge_vocab)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    subset = (lambda ids: [data[int(i)] for i in ids]) if is_ogb(args) else (lambda ids: data[ids])
    train = DataLoader(subset(split["train"]), batch_size=args.batch, shuffle=True)

    def forward(b):
        return model(b.x, b.edge_index, b.batch, getattr(b, "edge_attr", None) if gs.edge_dim else None, b.num_graphs)

    def metric(ids) -> float:
        model.eval()
        outs, ys = [], []
        with torch.no_grad():
            for b in DataLoader(subset(ids), batch_size=512):
                outs.append(forward(b))
                ys.append(b.y)
        return score(torch.cat(outs), torch.cat(ys))

    best_val, test = -1.0, 0.0
    for _ in range(args.epochs):
        model.train()
        for i, b in enumerate(train):  # (a step every --ranks batches: DDP's ranks, one after another)
            (loss_of(args, forward(b), b.y) / args.ranks).backward()
            if (i + 1) % args.ranks == 0 or i + 1 == len(train):
                opt.step()
                opt.zero_grad()
        val = metric(split["val"])
        if val > best_val:
            best_val, test = val, metric(split["test"])
    return test


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--name", default="PROTEINS")
    ap.add_argument("--root", required=True)
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--first-seed", type=int, default=0, help="the seeds run: --first-seed onwards")
    ap.add_argument("--batch", type=int, default=32, help="graphs per rank per step")
    ap.add_argument("--ranks", type=int, default=2, help="hpcgnn's ranks; the twin's batches a step")
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=5)
    ap.add_argument("--dropout", type=float, default=0.2)
    ap.add_argument("--lr", type=float, default=1e-3)
    args = ap.parse_args()
    ours, theirs, twin = [], [], None
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            ours.append(hpcgnn_run(args, seed, Path(tmp) / f"run{seed}"))
            gs = graph_set(args)
            twin = twin or twin_data(args, gs)
            theirs.append(twin_run(args, seed, gs, twin))
            print(f"seed {seed}: hpcgnn {ours[-1]:.4f}, PyG twin {theirs[-1]:.4f}", flush=True)
    m, s = statistics.mean(ours), statistics.stdev(ours)
    tm, ts = statistics.mean(theirs), statistics.stdev(theirs)
    what = "accuracy"
    if is_ogb(args):
        from hpcgnn.data.ogb import ogb_meta

        what = ogb_meta(args.name)["eval metric"]
    print(f"{args.name} ({args.epochs} epochs, GIN {args.layers}x{args.hidden}, {args.ranks} x {args.batch} graphs a step, {args.seeds} seeds): test {what} "
          f"hpcgnn {m:.4f} +- {s:.4f} | PyG twin {tm:.4f} +- {ts:.4f} | {abs(m - tm) / ts:.2f} of the twin's sd apart")


if __name__ == "__main__":
    main()
