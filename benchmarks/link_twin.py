"""Sampled link prediction against its full-batch twin: hpcgnn's link run and PyG's full-batch GAE, same split.

The twin is a GAE as PyG's own example trains it: PyG's encoder of the run's model (the same class, width,
depth and dropout), every training edge passing messages, ``GAE.recon_loss`` with one fresh negative per
positive each epoch (``negative_sampling``), Adam at the run's learning rate and weight decay, the epoch with
the best validation AUC selected, its test AUC reported; scored with hpcgnn's metrics on hpcgnn's prepared
split. Prints one comparison line (the mean and every seed of each side, and the difference in points).

    python benchmarks/link_twin.py                               # the embedded link default (task=link)
    python benchmarks/link_twin.py --twin-epochs 600 -- model=gcn train.lr=0.01
    python benchmarks/link_twin.py --seeds 5 --twin-epochs 200 --eval-every 1 -- dataset=pyg \
        dataset._target_=torch_geometric.datasets.Planetoid '+dataset.kwargs={root: ROOT, name: Cora}' \
        model=gcn train.epochs=200 train.lr=0.01 'train.fanouts=[200,200]' model.dropout=0.3
                                      # Cora, whose raw files (kimiyoung/planetoid's data/ind.cora.*) lie in
                                      # ROOT/Cora/raw/: PyG's Planetoid reads them offline
"""

from __future__ import annotations

# isort: off
import hpcgnn  # noqa: F401  (first: its process defaults, OMP_WAIT_POLICY, before torch loads OpenMP)
# isort: on
import argparse
import statistics
import time

import torch


def gae_twin(cfg, seed: int, epochs: int, eval_every: int = 1) -> dict:
    """PyG's full-batch GAE on ``cfg``'s prepared link dataset: {"val_auc", "test_auc", "epoch"} at the best
    validation epoch (evaluated every ``eval_every`` epochs and after the last)."""
    import torch_geometric.nn as pyg
    from torch_geometric.utils import negative_sampling

    from hpcgnn.data import open_link, prepare
    from hpcgnn.tasks import link_metrics as lm

    prepare(cfg.dataset)
    data = open_link(cfg.dataset)
    g, m, t = data.graph, cfg.model, cfg.train
    edge_index, x, train = g.edge_index(), g.x.float(), data.train.pos
    classes = {"sage": pyg.GraphSAGE, "gcn": pyg.GCN, "gin": pyg.GIN, "gat": pyg.GAT}
    torch.manual_seed(seed)
    model = pyg.GAE(classes[m.name](g.num_features, m.hidden_channels, len(t.fanouts), m.hidden_channels,
                                    dropout=m.dropout))
    opt = torch.optim.Adam(model.parameters(), lr=t.lr, weight_decay=t.weight_decay)
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


def hpcgnn_run(overrides: list[str], run_dir: str) -> dict:
    """hpcgnn's link run in this process (one rank), as ``python -m hpcgnn task=link ...`` trains it."""
    from hpcgnn.env import RankEnv
    from hpcgnn.rank.trainer import Trainer
    from hpcgnn.submit.compose import compose

    cfg = compose(["task=link", "metrics.tensorboard=false", *overrides, f"run_dir={run_dir}"]).cfg
    return Trainer(cfg, RankEnv.from_environ({}), torch.device("cpu")).train()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--twin-epochs", type=int, default=600, help="full-batch steps of the twin")
    ap.add_argument("--eval-every", type=int, default=5, help="the twin's evaluation interval (epochs)")
    ap.add_argument("--out", default="/tmp/hpcgnn-link-twin", help="run folders")
    ap.add_argument("overrides", nargs="*", help="hpcgnn overrides for both sides (after --)")
    args = ap.parse_args()
    from hpcgnn.submit.compose import compose

    cfg = compose(["task=link", *args.overrides, f"run_dir={args.out}"]).cfg
    ours, twin, t0 = [], [], time.perf_counter()
    for seed in range(args.seeds):
        s = hpcgnn_run([*args.overrides, f"train.seed={seed}"], f"{args.out}/hpcgnn-{seed}")
        ours.append(s["test_auc"])
    t1 = time.perf_counter()
    for seed in range(args.seeds):
        twin.append(gae_twin(cfg, seed, args.twin_epochs, args.eval_every))
    t2 = time.perf_counter()
    a, b = statistics.mean(ours), statistics.mean(r["test_auc"] for r in twin)
    theirs = ", ".join(f"{r['test_auc']:.4f}@{r['epoch']}" for r in twin)
    from hpcgnn.data import open_link

    nodes = open_link(cfg.dataset).graph.num_nodes  # (the graph's own: dataset.num_nodes is the synthetic size)
    print(f"link, {cfg.dataset.name} {nodes} nodes, model={cfg.model.name}, lr {cfg.train.lr:g}: "
          f"hpcgnn test AUC {a:.4f} ({', '.join(f'{v:.4f}' for v in ours)}; {cfg.train.epochs} epochs, "
          f"{(t1 - t0) / args.seeds:.0f} s a run) | full-batch GAE twin {b:.4f} "
          f"({theirs}; {args.twin_epochs} epochs, "
          f"{(t2 - t1) / args.seeds:.0f} s a run) | hpcgnn - twin {100 * (a - b):+.2f} points")


if __name__ == "__main__":
    main()
