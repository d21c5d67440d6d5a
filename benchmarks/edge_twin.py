"""An edge task's sampled runs against their full-batch twin: hpcgnn's ``task=edge`` and PyG's GraphSAGE with the same
decoder trained on the whole graph, on a files folder of an edge task or on Bitcoin OTC's signed ratings.

The twin is the model of ``model=sage task=edge`` (PyG's GraphSAGE, the run's width, two layers, dropout 0.3, and
hpcgnn's ``concat`` or ``hadamard`` decoder) trained every step on every training target with hpcgnn's loss for the
kind (cross-entropy, binary cross-entropy over the known labels, or MSE on standardised values), the training targets'
own edges out of its message passing either way round (as each of hpcgnn's batches leaves its own out), evaluated on
every edge (as hpcgnn's exact evaluation is), Adam at the same learning rate for about as many steps; the test metric
at the best validation step (of one in as many steps as hpcgnn's epoch takes), scored by hpcgnn's metrics (ROC-AUC as OGB's). Prints one comparison
line (the mean, sd and every seed of each side).

    python benchmarks/edge_twin.py --otc bitcoin_otc.csv --out /tmp/otc    # Bitcoin OTC (below), ROC-AUC
    python benchmarks/edge_twin.py --folder GRAPH --out /tmp/g -- train.lr=0.01

``--otc``: the ``id1,id2,sign`` file of SGCN's repository (benedekrozemberczki/SGCN, input/bitcoin_otc.csv: who
rates whom, trusted or not), kept outside the repository. Each rating is a target, labelled 1 for trust (a binary
label: ``task.kind=multilabel``, scored by ROC-AUC, as signed-link prediction is); the graph is the ratings both ways
round, unsigned; a node's features are its in- and out-degree (log) and 30 columns of the unsigned graph's truncated
SVD: nothing that says a rating's sign. A seeded 80/10/10 split of the ratings. ``--signs``: the edges also carry
the training ratings' signs as a feature (0 for the others' and for the reverses of none), which the encoder reads
with ``model=gat model.edge_dim=1`` and the symmetric ``hadamard`` decoder (``concat`` would read each target's own
sign, its label, as its feature); no twin then, but the same run without the signs beside it.
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
import time
from pathlib import Path

import numpy as np
import torch
from common import USER_ENV

SPLITS = ("train", "val", "test")


def edge_twin(folder: Path, seed: int, steps: int = 600, lr: float = 0.003, hidden: int = 32, kind: str = "auto",
              decoder: str = "concat", eval_every: int = 5) -> float:
    """The full-batch twin's test metric on a files folder of an edge task (its ``edge_*_idx`` splits given), at the
    best validation of every ``eval_every``-th step (hpcgnn's runs: of every epoch)."""
    from torch_geometric.nn import GraphSAGE

    from hpcgnn.labels import profile, resolve, stored
    from hpcgnn.models.edge import Concat, Hadamard
    from hpcgnn.specs import load, tasks

    a = {k: np.load(folder / f"{k}.npy") for k in ("x", "edge_index", "edge_label_index", "edge_label")}
    splits = {s: torch.from_numpy(np.load(folder / f"edge_{s}_idx.npy")) for s in SPLITS}
    label = stored(a["edge_label"], "edge_label.npy")
    target = resolve(profile(label, {k: v.numpy() for k, v in splits.items()}), kind, "auto", 0, "edge_label.npy")
    x, edges, pairs, y = (torch.from_numpy(v) for v in (a["x"], a["edge_index"], a["edge_label_index"], label))
    n, train = x.size(0), pairs[:, splits["train"]]
    own = torch.cat([train[0] * n + train[1], train[1] * n + train[0]])
    training_edges = edges[:, ~torch.isin(edges[0] * n + edges[1], own)]
    torch.manual_seed(seed)
    encoder = GraphSAGE(x.size(1), hidden, 2, hidden, dropout=0.3)
    head = Concat(hidden, target.width) if decoder == "concat" else Hadamard(hidden, target.width)
    opt = torch.optim.Adam([*encoder.parameters(), *head.parameters()], lr=lr)
    task = load(tasks.KINDS[target.kind].unit)(target, torch.device("cpu"))
    if target.kind != "classification":
        y = y.float().reshape(y.size(0), -1)

    def outputs(edge_index: torch.Tensor, split: str) -> torch.Tensor:
        h, (u, v) = encoder(x, edge_index), pairs[:, splits[split]]
        return head(h[u], h[v])

    best_val, best_test = None, None
    for step in range(steps):
        encoder.train(), head.train()
        opt.zero_grad()
        task.mean_loss(outputs(training_edges, "train"), y[splits["train"]]).backward()
        opt.step()
        if step % eval_every != eval_every - 1:
            continue
        encoder.eval(), head.eval()
        with torch.no_grad():
            val, test = (task.scores([(outputs(edges, s), y[splits[s]])])[target.metric] for s in ("val", "test"))
        if best_val is None or (val < best_val if target.lower_is_better else val > best_val):
            best_val, best_test = val, test
    return best_test


def otc_folder(raw: Path, folder: Path, signs: bool = False, seed: int = 0) -> Path:
    """Bitcoin OTC's ratings as a files folder of an edge task (see the module)."""
    rows = [line.split(",") for line in raw.read_text().splitlines()[1:]]
    rows = np.array([(int(u), int(v), float(s)) for u, v, s in rows if s.strip()], dtype=np.float64)
    src, dst, sign = rows[:, 0].astype(np.int64), rows[:, 1].astype(np.int64), rows[:, 2]
    n = int(max(src.max(), dst.max())) + 1
    both = np.unique(np.concatenate([np.stack([src, dst]), np.stack([dst, src])], 1), axis=1)
    adj = torch.sparse_coo_tensor(torch.from_numpy(both), torch.ones(both.shape[1]), (n, n),
                                  check_invariants=True).coalesce()
    torch.manual_seed(seed)
    u, s, _ = torch.svd_lowrank(adj, q=30, niter=4)
    deg_in, deg_out = np.bincount(dst, minlength=n), np.bincount(src, minlength=n)
    x = np.concatenate([np.log1p(np.stack([deg_in, deg_out], 1)), (u * s.sqrt()).numpy()], 1).astype(np.float32)
    order = np.random.default_rng(seed).permutation(src.size)
    cut = np.split(order, [int(0.8 * src.size), int(0.9 * src.size)])
    folder.mkdir(parents=True, exist_ok=True)
    arrays = {"x": x, "edge_index": both, "edge_label_index": np.stack([src, dst]),
              "edge_label": (sign > 0).astype(np.float32)[:, None],
              **{f"edge_{name}_idx": np.sort(ids) for name, ids in zip(SPLITS, cut, strict=True)}}
    if signs:  # the training ratings' signs on their edges, either way round (a pair rated twice: the last)
        train = cut[0]
        value = {(int(a), int(b)): sign[i] for i in train for a, b in ((src[i], dst[i]), (dst[i], src[i]))}
        arrays["edge_attr"] = np.array([[value.get((int(a), int(b)), 0.0)] for a, b in both.T], dtype=np.float32)
    for name, a in arrays.items():
        np.save(folder / f"{name}.npy", a)
    return folder


def hpcgnn_run(folder: Path, out: Path, name: str, seed: int, overrides: list[str]) -> dict:
    run = out / "runs" / f"{name}-{seed}"
    cmd = [sys.executable, "-m", "hpcgnn", "task=edge", "dataset=files", f"dataset.path={folder}",
           f"dataset.root={out / 'root'}", "launch.procs=1", f"train.seed={seed}", "train.eval_mode=full",
           "train.eval_every=1", "train.precision=fp32", "metrics.tensorboard=false", *overrides,
           f"hydra.run.dir={run}"]
    res = subprocess.run(cmd, capture_output=True, text=True, env=USER_ENV)
    if res.returncode:
        sys.exit(f"hpcgnn failed ({name}): {res.stderr.strip().splitlines()[-1:]}")
    return json.loads((run / "summary.json").read_text())


def side(values: list[float]) -> str:
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.4f} +- {sd:.4f} ({', '.join(f'{v:.4f}' for v in values)})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--otc", type=Path, help="Bitcoin OTC's id1,id2,sign file")
    src.add_argument("--folder", type=Path, help="a files folder of an edge task, its edge_*_idx splits given")
    ap.add_argument("--out", type=Path, required=True, help="where the folder, the prepared graphs and the runs go")
    ap.add_argument("--signs", action="store_true", help="--otc: the training ratings' signs as edge features")
    ap.add_argument("--seeds", type=int, default=3, help="hpcgnn's seeds")
    ap.add_argument("--twin-seeds", type=int, default=6)
    ap.add_argument("--twin-steps", type=int, default=600)
    ap.add_argument("--batch", type=int, default=1024, help="hpcgnn's targets per step")
    ap.add_argument("--epochs", type=int, default=0, help="hpcgnn's (default: as many steps as the twin's)")
    ap.add_argument("--lr", type=float, default=0.003)
    ap.add_argument("--hidden", type=int, default=32)
    ap.add_argument("overrides", nargs="*", help="hpcgnn's overrides, after --")
    args = ap.parse_args()
    t0 = time.perf_counter()
    folder = otc_folder(args.otc, args.out / args.otc.stem, args.signs) if args.otc else args.folder
    kind = ["task.kind=multilabel"] if args.otc else []
    steps_per_epoch = -(-np.load(folder / "edge_train_idx.npy").size // args.batch)
    epochs = args.epochs or -(-args.twin_steps // steps_per_epoch)  # (as many steps as the twin, or more)
    base = [*kind, f"train.lr={args.lr}", f"model.hidden_channels={args.hidden}", f"train.epochs={epochs}",
            f"train.batch_size={args.batch}", "train.fanouts=[15,10]", *args.overrides]
    if args.signs:
        runs = {"gat, signs": [*base, "model=gat", "model.edge_dim=1", "task.decoder=hadamard"],
                "gat, no signs": [*base, "model=gat", "task.decoder=hadamard"]}
        got = {k: [hpcgnn_run(folder, args.out, k.replace(", ", "-").replace(" ", "_"), s, o)["test"]
                   for s in range(args.seeds)] for k, o in runs.items()}
        print(f"edge task on {folder.name}, test ROC-AUC, {args.seeds} seeds: " +
              " | ".join(f"hpcgnn {k} {side(v)}" for k, v in got.items()) + f" ({time.perf_counter() - t0:.0f} s)")
        return
    ours = [hpcgnn_run(folder, args.out, "sage", s, base) for s in range(args.seeds)]
    metric = ours[0]["metric"].removeprefix("val_")
    twins = [edge_twin(folder, s, args.twin_steps, args.lr, args.hidden, "multilabel" if args.otc else "auto",
                       eval_every=steps_per_epoch) for s in range(args.twin_seeds)]
    print(f"edge task on {folder.name}, test {metric}: hpcgnn (sampled, fanouts [15, 10], batch {args.batch}, {epochs} "
          f"epochs of {steps_per_epoch} steps{', ' + ' '.join(args.overrides) if args.overrides else ''}, {args.seeds} "
          f"seeds) {side([s['test'] for s in ours])} | full-batch "
          f"twin ({args.twin_steps} steps, evaluated every {steps_per_epoch}, {args.twin_seeds} seeds) {side(twins)} "
          f"({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()
