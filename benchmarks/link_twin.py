"""Sampled link prediction against its full-batch twin: hpcgnn's link run and PyG's full-batch GAE, same split.

The twin is a GAE as PyG's own example trains it: PyG's encoder of the run's model (the same class, width,
depth and dropout), every training edge passing messages, ``GAE.recon_loss`` with one fresh negative per
positive each epoch (``negative_sampling``), Adam at the run's learning rate and weight decay (or ``--twin-lr``),
the epoch with the best validation AUC selected, its test AUC reported; scored with hpcgnn's metrics on hpcgnn's
prepared split. Seed s runs with ``train.seed=s dataset.seed=s`` (a split of its own). With ``--planetoid ROOT``
(PyG's Planetoid, Cora unless ``ROOT:NAME``, read offline from ``ROOT/NAME/raw/``) a third side runs: the twin as
PyG's example makes it, on PyG's own ``RandomLinkSplit`` of the graph, and the line says how far hpcgnn is from
it in its standard deviations. Prints one comparison line (the mean, sd and every seed of each side).

    python benchmarks/link_twin.py                               # the embedded link default (task=link)
    python benchmarks/link_twin.py --twin-epochs 600 -- model=gcn train.lr=0.01
    python benchmarks/link_twin.py --seeds 5 --twin-epochs 200 --eval-every 1 --planetoid ROOT -- model=gcn \
        train.epochs=200 train.lr=0.01 'train.fanouts=[200,200]' model.hidden_channels=128 model.dropout=0.3
                                      # Cora, whose raw files (kimiyoung/planetoid's data/ind.cora.*) lie in
                                      # ROOT/Cora/raw/ (results/link-twin-cora-cpu-avx512bf16.txt)
"""

from __future__ import annotations

# isort: off
import hpcgnn  # noqa: F401  (first: its process defaults, OMP_WAIT_POLICY, before torch loads OpenMP)
# isort: on
import argparse
import dataclasses
import random
import statistics
import time

import torch


def _gae(cfg, in_channels: int, seed: int):
    """PyG's GAE over PyG's encoder of the run's model (class, width, depth, dropout), and its Adam; seeded (PyG's
    negative_sampling draws with Python's random too: a twin is the same each time)."""
    import torch_geometric.nn as pyg

    m, t = cfg.model, cfg.train
    torch.manual_seed(seed)
    random.seed(seed)
    classes = {"sage": pyg.GraphSAGE, "gcn": pyg.GCN, "gin": pyg.GIN, "gat": pyg.GAT}
    model = pyg.GAE(classes[m.name](in_channels, m.hidden_channels, len(t.fanouts), m.hidden_channels,
                                    dropout=m.dropout))
    return model, torch.optim.Adam(model.parameters(), lr=t.lr, weight_decay=t.weight_decay)


def gae_twin(cfg, seed: int, epochs: int, eval_every: int = 1) -> dict:
    """PyG's full-batch GAE on ``cfg``'s prepared link dataset: {"val_auc", "test_auc", "epoch"} at the best
    validation epoch (evaluated every ``eval_every`` epochs and after the last)."""
    from torch_geometric.utils import negative_sampling

    from hpcgnn.data import open_link, prepare
    from hpcgnn.tasks import link_metrics as lm

    prepare(cfg.dataset)
    data = open_link(cfg.dataset)
    g = data.graph
    edge_index, x, train = g.edge_index(), g.x.float(), data.train.pos
    model, opt = _gae(cfg, g.num_features, seed)
    best = {"val_auc": -1.0, "test_auc": 0.0, "epoch": 0}
    for epoch in range(1, epochs + 1):
        model.train()
        opt.zero_grad()
        loss = model.recon_loss(model.encode(x, edge_index), train,
                                negative_sampling(edge_index, g.num_nodes, train.size(1)))
        loss.backward()
        opt.step()
        if epoch % eval_every and epoch != epochs:
            continue
        model.eval()
        with torch.no_grad():
            z = model.encode(x, edge_index)
            auc = {split: lm.roc_auc(model.decode(z, data.split(split).pos, sigmoid=False),
                                     model.decode(z, data.split(split).neg, sigmoid=False)) for split in ("val", "test")}
        if auc["val"] > best["val_auc"]:
            best = {"val_auc": auc["val"], "test_auc": auc["test"], "epoch": epoch}
    return best


def pyg_twin(root: str, name: str, cfg, seed: int, epochs: int) -> dict:
    """The twin as PyG's own autoencoder example makes it, on PyG's split: ``Planetoid(root, name)``,
    ``RandomLinkSplit(num_val=0.05, num_test=0.1, is_undirected=True)`` under ``torch.manual_seed(seed)`` (its
    own validation and test negatives, random pairs), the same encoder, ``recon_loss``, Adam; each split's AUC
    with the messages its ``RandomLinkSplit`` output passes (test: the training and validation edges)."""
    import torch_geometric.transforms as T
    from torch_geometric.datasets import Planetoid

    from hpcgnn.tasks import link_metrics as lm

    data = Planetoid(root, name)[0]
    torch.manual_seed(seed)
    random.seed(seed)
    train, val, test = T.RandomLinkSplit(num_val=0.05, num_test=0.1, is_undirected=True, split_labels=True,
                                         add_negative_train_samples=False)(data)
    model, opt = _gae(cfg, data.num_features, seed)
    best = {"val_auc": -1.0, "test_auc": 0.0, "epoch": 0}
    for epoch in range(1, epochs + 1):
        model.train()
        opt.zero_grad()
        model.recon_loss(model.encode(train.x, train.edge_index), train.pos_edge_label_index).backward()
        opt.step()
        model.eval()
        with torch.no_grad():
            auc = {}
            for split, d in (("val", val), ("test", test)):
                z = model.encode(d.x, d.edge_index)
                auc[split] = lm.roc_auc(model.decode(z, d.pos_edge_label_index, sigmoid=False),
                                        model.decode(z, d.neg_edge_label_index, sigmoid=False))
        if auc["val"] > best["val_auc"]:
            best = {"val_auc": auc["val"], "test_auc": auc["test"], "epoch": epoch}
    return best


def hpcgnn_run(overrides: list[str], run_dir: str) -> dict:
    """hpcgnn's link run in this process (one rank), as ``python -m hpcgnn task=link ...`` trains it."""
    from hpcgnn.env import RankEnv
    from hpcgnn.rank.trainer import Trainer
    from hpcgnn.submit.compose import compose

    cfg = compose(["task=link", "metrics.tensorboard=false", *overrides, f"run_dir={run_dir}"]).cfg
    return Trainer(cfg, RankEnv.from_environ({}), torch.device("cpu")).train()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=3, help="seeds s = 0..N-1: a run with train.seed=s and "
                    "dataset.seed=s (its own edge split) on each side")
    ap.add_argument("--twin-epochs", type=int, default=600, help="full-batch steps of the twin")
    ap.add_argument("--eval-every", type=int, default=5, help="the twin's evaluation interval (epochs)")
    ap.add_argument("--planetoid", metavar="ROOT[:NAME]", help="a Planetoid graph (Cora unless NAME) whose raw "
                    "files lie in ROOT/NAME/raw/, read offline, for hpcgnn (dataset=pyg) and both twins; adds PyG's "
                    "own twin on PyG's RandomLinkSplit")
    ap.add_argument("--twin-lr", type=float, help="the twins' Adam learning rate (default: the run's train.lr), to "
                    "hold the full-batch twin at its own while hpcgnn's changes")
    ap.add_argument("--out", default="/tmp/hpcgnn-link-twin", help="run folders")
    ap.add_argument("overrides", nargs="*", help="hpcgnn overrides for both sides (after --)")
    args = ap.parse_args()
    from hpcgnn.data import open_link
    from hpcgnn.submit.compose import compose

    overrides = list(args.overrides)
    root, _, name = (args.planetoid or "").partition(":")
    if args.planetoid:
        overrides = ["dataset=pyg", "dataset._target_=torch_geometric.datasets.Planetoid",
                     f"+dataset.kwargs={{root: '{root}', name: {name or 'Cora'}}}",
                     f"dataset.root={args.out}/prepared", *overrides]
    ours, twin, theirs, took = [], [], [], {"hpcgnn": 0.0, "twin": 0.0, "pyg": 0.0}
    for seed in range(args.seeds):
        each = [*overrides, f"train.seed={seed}", f"dataset.seed={seed}"]
        cfg = compose(["task=link", *each, f"run_dir={args.out}"]).cfg
        twin_cfg = cfg if args.twin_lr is None else dataclasses.replace(
            cfg, train=dataclasses.replace(cfg.train, lr=args.twin_lr))
        t0 = time.perf_counter()
        ours.append(hpcgnn_run(each, f"{args.out}/hpcgnn-{seed}")["test_auc"])
        t1 = time.perf_counter()
        twin.append(gae_twin(twin_cfg, seed, args.twin_epochs, args.eval_every))
        t2 = time.perf_counter()
        if args.planetoid:
            theirs.append(pyg_twin(root, name or "Cora", twin_cfg, seed, args.twin_epochs))
        took["hpcgnn"] += t1 - t0
        took["twin"] += t2 - t1
        took["pyg"] += time.perf_counter() - t2

    def sd(values: list[float]) -> float:
        return statistics.stdev(values) if len(values) > 1 else 0.0

    def side(results: list[dict], key: str) -> str:
        values = [r["test_auc"] for r in results]
        each = ", ".join("{:.4f}@{}".format(r["test_auc"], r["epoch"]) for r in results)
        return (f"{statistics.mean(values):.4f} +- {sd(values):.4f} ({each}; {args.twin_epochs} epochs, "
                f"{took[key] / args.seeds:.0f} s a run)")

    nodes = open_link(cfg.dataset).graph.num_nodes  # (the graph's own: dataset.num_nodes is the synthetic size)
    a, b = statistics.mean(ours), statistics.mean(r["test_auc"] for r in twin)
    line = (f"link, {cfg.dataset.name} {nodes} nodes, model={cfg.model.name}, lr {cfg.train.lr:g}: hpcgnn test AUC "
            f"{a:.4f} +- {sd(ours):.4f} ({', '.join(f'{v:.4f}' for v in ours)}; {cfg.train.epochs} epochs, "
            f"{took['hpcgnn'] / args.seeds:.0f} s a run) | full-batch GAE twin, same split {side(twin, 'twin')} | "
            f"hpcgnn - twin {100 * (a - b):+.2f} points")
    if theirs:
        c = [r["test_auc"] for r in theirs]
        line += (f" | PyG's GAE on RandomLinkSplit {side(theirs, 'pyg')} | hpcgnn - PyG's {100 * (a - statistics.mean(c)):+.2f}"
                 f" points" + (f" ({(a - statistics.mean(c)) / sd(c):+.2f} of its sd)" if sd(c) else ""))
    if args.twin_lr is not None:
        for label in ("full-batch GAE twin", "PyG's GAE on RandomLinkSplit"):
            line = line.replace(f"| {label}", f"| {label} (lr {args.twin_lr:g})")
    print(line)


if __name__ == "__main__":
    main()
