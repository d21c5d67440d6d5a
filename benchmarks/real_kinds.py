"""Node tasks of every kind on real graphs: hpcgnn's sampled training against PyG's full-batch GraphSAGE twin.

    python benchmarks/real_kinds.py RAW [--out DIR] [--seeds 3] [--only twitch-ml,chameleon-reg]

RAW: a folder holding these files of github.com/benedekrozemberczki/datasets (MUSAE's graphs; they left its newest
tree, its history has them): DE.json, DE_edges.csv, DE_target.csv (twitch/DE), chameleon_edges.csv,
chameleon_features.json, chameleon_target.csv (wikipedia/chameleon), HU_edges.csv, HU_genres.json (deezer/HU). Each
graph becomes a files folder under --out (keep it outside the repository):

  twitch-ml      Twitch DE, 9498 streamers: 2 binary labels (mature, partner); features: the games each liked
                 (3170 columns, reduced to 128 by PCA, standardised)
  twitch-reg     the same graph: log(1 + views)
  chameleon-reg  Wikipedia's chameleon articles: log(monthly traffic); features: the article's words (2325 columns)
  deezer-ml      Deezer HU, 47538 users: the 84 genres each liked; features: log degree and 15 fixed random columns
                 (the data has none)

Random 50/25/25 node splits; edges made undirected (dataset.to_undirected). hpcgnn as a user runs it, one rank
(launch.procs=1): model=sage (2 x 64), exact evaluation every 5 epochs, fp32, seeds 0..N-1 (train.seed). The twin:
PyG's GraphSAGE of the same shape (dropout 0.3) trained on the whole graph, 300 steps of Adam (lr 0.01) with hpcgnn's
loss for the kind (regression: the same standardised targets), the test metric at the best validation step (of
every fifth), seeds 0..2. A multi-label run's predict (mode=full) is scored again by scikit-learn's roc_auc_score
per label over the labels with both classes, as OGB's Evaluator does. One line per graph.
"""

from __future__ import annotations

# isort: off
import hpcgnn  # noqa: F401  (first: its process defaults, OMP_WAIT_POLICY, before torch loads OpenMP)
# isort: on
import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
from common import USER_ENV

GRAPHS = {  # name: (epochs, fanouts, batch size)
    "twitch-ml": (60, "[25,15]", 256),
    "twitch-reg": (60, "[25,15]", 256),
    "chameleon-reg": (100, "[25,15]", 256),
    "deezer-ml": (60, "[15,10]", 256),
}


def multihot(path: Path, n: int) -> np.ndarray:
    rows = json.loads(path.read_text())
    x = np.zeros((n, max(max(v) for v in rows.values() if v) + 1), np.float32)
    for k, v in rows.items():
        x[int(k), v] = 1
    return x


def write_folder(folder: Path, edges: np.ndarray, x: np.ndarray, y: np.ndarray) -> None:
    n = x.shape[0]
    order = np.random.default_rng(1).permutation(n)
    folder.mkdir(parents=True, exist_ok=True)
    for name, a in (("edge_index", edges.astype(np.int64)), ("x", x), ("y", y), ("train_idx", np.sort(order[: n // 2])),
                    ("val_idx", np.sort(order[n // 2: 3 * n // 4])), ("test_idx", np.sort(order[3 * n // 4:]))):
        np.save(folder / f"{name}.npy", a)


def make(name: str, raw: Path, folder: Path) -> None:
    """``folder`` as a files dataset of graph ``name`` from the raw files (once)."""
    import pandas as pd

    if (folder / "test_idx.npy").exists():
        return
    if name.startswith("twitch"):
        t = pd.read_csv(raw / "DE_target.csv").sort_values("new_id")
        n = len(t)
        x = torch.from_numpy(multihot(raw / "DE.json", n))
        torch.manual_seed(0)
        _, _, v = torch.pca_lowrank(x, q=128, center=True)
        z = (x - x.mean(0)) @ v
        y = np.stack([t.mature.values, t.partner.values], 1) if name == "twitch-ml" else np.log1p(t.views.values)
        write_folder(folder, pd.read_csv(raw / "DE_edges.csv").values.T, (z / z.std(0)).numpy().astype(np.float32),
                     y.astype(np.float32))
    elif name == "chameleon-reg":
        t = pd.read_csv(raw / "chameleon_target.csv").sort_values("id")
        write_folder(folder, pd.read_csv(raw / "chameleon_edges.csv").values.T,
                     multihot(raw / "chameleon_features.json", len(t)), np.log(t.target.values).astype(np.float32))
    else:
        genres = json.loads((raw / "HU_genres.json").read_text())
        n = len(genres)
        col = {g: i for i, g in enumerate(sorted({g for v in genres.values() for g in v}))}
        y = np.zeros((n, len(col)), np.float32)
        for k, v in genres.items():
            y[int(k), [col[g] for g in v]] = 1
        edges = pd.read_csv(raw / "HU_edges.csv").values.T
        deg = np.bincount(edges.ravel(), minlength=n)
        x = np.concatenate([np.log1p(deg)[:, None], np.random.default_rng(0).normal(size=(n, 15))], 1)
        write_folder(folder, edges, x.astype(np.float32), y)


def hpcgnn_run(folder: Path, out: Path, seed: int, epochs: int, fanouts: str, batch: int) -> tuple[dict, Path]:
    run = out / "runs" / f"{folder.name}-{seed}"
    cmd = [sys.executable, "-m", "hpcgnn", "dataset=files", f"dataset.path={folder}", "dataset.to_undirected=true",
           f"dataset.root={out / 'root'}", "launch.procs=1", f"train.seed={seed}", f"train.epochs={epochs}",
           f"train.fanouts={fanouts}", f"train.batch_size={batch}", "train.eval_mode=full", "train.eval_every=5",
           "model.hidden_channels=64", "train.lr=0.01", "train.precision=fp32", "metrics.tensorboard=false",
           f"hydra.run.dir={run}"]
    res = subprocess.run(cmd, capture_output=True, text=True, env=USER_ENV)
    if res.returncode:
        sys.exit(f"hpcgnn failed on {folder.name}: {res.stderr.strip().splitlines()[-1:]}")
    return json.loads((run / "summary.json").read_text()), run


def node_twin(folder: Path, seed: int, steps: int = 300, hidden: int = 64, undirected: bool = True) -> float:
    """PyG's GraphSAGE (2 layers of ``hidden``, dropout 0.3: hpcgnn's model=sage) trained on the whole graph of a
    files folder (every edge, every step; ``undirected``: made so, as dataset.to_undirected does) with hpcgnn's loss
    for the kind (multi-label or regression), Adam at lr 0.01: the test metric at the best validation step (of
    every fifth). tests/test_node_kinds.py's twin too."""
    from torch_geometric.nn import GraphSAGE
    from torch_geometric.utils import to_undirected

    from hpcgnn.labels import profile, resolve, stored
    from hpcgnn.tasks.node import MultiLabel, Regression

    a = {k: torch.from_numpy(np.load(folder / f"{k}.npy")) for k in ("edge_index", "x", "y", "train_idx", "val_idx",
                                                                     "test_idx")}
    ei = to_undirected(a["edge_index"]) if undirected else a["edge_index"]
    splits = {s: a[f"{s}_idx"].numpy() for s in ("train", "val", "test")}
    target = resolve(profile(stored(a["y"].numpy(), "y.npy"), splits), "auto", "auto", 0, "y.npy")
    kind = (MultiLabel if target.kind == "multilabel" else Regression)(target, torch.device("cpu"))
    torch.manual_seed(seed)
    model = GraphSAGE(a["x"].size(1), hidden, 2, target.width, dropout=0.3)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    best = None
    for step in range(steps):
        model.train()
        opt.zero_grad()
        kind.mean_loss(model(a["x"], ei)[a["train_idx"]], a["y"][a["train_idx"]]).backward()
        opt.step()
        if step % 5 != 4:
            continue
        model.eval()
        with torch.no_grad():
            out = model(a["x"], ei)
        val, test = (kind.metrics(kind.values(out[a[f"{s}_idx"]]), a["y"][a[f"{s}_idx"]].reshape(-1, target.width))
                     [target.metric] for s in ("val", "test"))
        if best is None or (val < best[0] if target.lower_is_better else val > best[0]):
            best = (val, test)
    return best[1]


def rescored(run: Path, folder: Path) -> tuple[float, float, int]:
    """(predict's ROC-AUC, scikit-learn's per label over the labels with both classes, those labels)."""
    from sklearn.metrics import roc_auc_score

    res = subprocess.run([sys.executable, "-m", "hpcgnn", "predict", str(run), "mode=full"], capture_output=True,
                         text=True, env=USER_ENV)
    if res.returncode:
        sys.exit(f"predict failed: {res.stderr.strip().splitlines()[-1:]}")
    out = max((run / "predict").iterdir(), key=lambda p: p.stat().st_mtime)
    ids, probs = np.load(out / "ids.npy"), np.load(out / "probs.npy")
    y = np.load(folder / "y.npy")[ids]
    both = [i for i in range(y.shape[1]) if 0 < y[:, i].sum() < len(y)]
    value = json.loads((out / "manifest.json").read_text())["value"]
    return value, float(np.mean([roc_auc_score(y[:, i], probs[:, i]) for i in both])), len(both)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("raw", type=Path)
    ap.add_argument("--out", type=Path, default=Path("~/.cache/hpcgnn/real-kinds").expanduser())
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--only", default=",".join(GRAPHS))
    args = ap.parse_args()
    for name in args.only.split(","):
        epochs, fanouts, batch = GRAPHS[name]
        folder = args.out / name
        make(name, args.raw, folder)
        t0 = time.perf_counter()
        runs = [hpcgnn_run(folder, args.out, s, epochs, fanouts, batch) for s in range(args.seeds)]
        took = (time.perf_counter() - t0) / args.seeds
        ours = [s["test"] for s, _ in runs]
        theirs = [node_twin(folder, seed) for seed in range(3)]
        metric = runs[0][0]["metric"].removeprefix("val_")
        line = (f"{name} ({metric}, {'lower' if runs[0][0]['lower_is_better'] else 'higher'} is better): hpcgnn "
                f"{np.mean(ours):.4f} +- {np.std(ours):.4f} ({args.seeds} seeds, {epochs} epochs, fanouts {fanouts}, "
                f"batch {batch}, {took:.0f} s a run) | PyG full-batch twin {np.mean(theirs):.4f} +- {np.std(theirs):.4f} "
                f"(3 seeds, 300 steps)")
        if metric == "rocauc":
            value, sk, labels = rescored(runs[0][1], folder)
            line += f" | predict {value:.6f}, scikit-learn per label {sk:.6f} over {labels} labels"
        print(line, flush=True)


if __name__ == "__main__":
    main()
