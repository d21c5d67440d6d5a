"""Temporal link prediction against its PyG twin: hpcgnn's ``task=link`` on a timed graph and the same model trained
by PyG with pyg-lib's temporal sampling, on the same chronological split, ranked against the same negatives.

hpcgnn's side: ``python -m hpcgnn task=link`` on a files folder of timed events (``model=sage``, dot decoder,
fanouts [10, 10], 64 wide, batches of 200 positives each with one uniform negative, fp32, ``--epochs`` epochs; the
split 70/15/15 in time order; validation and test positives each ranked against 20 negatives, TGB's mix, drawn from
``dataset.seed``), the test MRR at the best validation MRR. The twin (run by ``--pyg``'s python, a venv with pyg-lib:
benchmarks/pyglib_venv.sh): PyG's GraphSAGE of the same width, depth and dropout with the same dot decoder and loss
(the positives' mean BCE plus the negatives'), Adam at the same rate, the same batches' size and epochs; each end of
each pair sampled by ``torch_geometric.sampler.NeighborSampler`` (pyg-lib's temporal disjoint sampling, uniform) as of
its link's time minus 1 (integer times: strictly before the link, hpcgnn's bound); the graph the events both ways
round; the split, its times and the evaluation negatives read from what hpcgnn prepared (written here to
``OUT/splits.npz``). Prints one comparison line: each side's mean, standard deviation and every seed.

    python benchmarks/temporal_link_twin.py --collegemsg CollegeMsg.txt --out /tmp/college   # SNAP's CollegeMsg
    python benchmarks/temporal_link_twin.py --folder EVENTS --out /tmp/ev --seeds 3 --epochs 10

``--collegemsg``: SNAP's CollegeMsg (``SRC DST UNIXTS`` per line, 59,835 messages among 1,899 users; a header line
is skipped), kept outside the repository: written as a files folder of its events, ``dataset.to_undirected=true``,
each node's features 64 fixed random columns (the data has none: they tell nodes apart).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HIDDEN, FANOUTS, BATCH, NEGATIVES, EVAL_ITEMS = 64, (10, 10), 200, 20, 2048 // 21


def collegemsg_folder(text: Path, out: Path) -> Path:
    """SNAP's CollegeMsg as a files folder (ids from 0; 64 random feature columns; placeholder node labels and
    splits, which a link task does not read)."""
    folder = out / "collegemsg"
    if (folder / "edge_time.npy").exists():
        return folder
    rows = np.loadtxt(text, dtype=np.int64, comments=("#", "src"))
    src, dst, t = rows[:, 0] - 1, rows[:, 1] - 1, rows[:, 2]
    n = int(max(src.max(), dst.max())) + 1
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    arrays = {"edge_index": np.stack([src, dst]), "edge_time": t, "x": rng.normal(size=(n, 64)).astype(np.float32),
              "y": np.zeros(n, dtype=np.int64)}
    arrays.update(zip(("train_idx", "val_idx", "test_idx"), np.array_split(np.arange(n), 3), strict=True))
    for name, a in arrays.items():
        np.save(folder / f"{name}.npy", a)
    return folder


def overrides(folder: Path, root: Path, epochs: int) -> list[str]:
    return ["dataset=files", f"dataset.path={folder}", f"dataset.root={root}", "dataset.to_undirected=true",
            "dataset.edge_split=[0.7,0.15,0.15]", "task=link", "model=sage", f"model.hidden_channels={HIDDEN}",
            f"train.fanouts=[{','.join(map(str, FANOUTS))}]", f"train.batch_size={BATCH}", "train.precision=fp32",
            f"train.epochs={epochs}", "launch.procs=1", f"task.eval_negatives={NEGATIVES}", "task.hits_k=[1,3,10]",
            "metrics.tensorboard=false"]


def export_splits(folder: Path, root: Path, out: Path) -> Path:
    """hpcgnn's prepared split and its evaluation negatives, for the twin."""
    from hpcgnn.config import dataset_config
    from hpcgnn.data import open_link_splits, prepare
    from hpcgnn.data.link import with_eval_negatives

    cfg = dataset_config(name="files", path=str(folder), root=str(root), prepared_for="link", to_undirected=True,
                         edge_split=(0.7, 0.15, 0.15))
    prepare(cfg)
    data = with_eval_negatives(open_link_splits(cfg), NEGATIVES, cfg.seed)
    arrays = {}
    for s in ("train", "val", "test"):
        split = data.split(s)
        arrays[f"{s}_pos"], arrays[f"{s}_time"] = split.pos.numpy(), split.time.numpy()
        if split.neg is not None:
            arrays[f"{s}_neg"] = split.neg.numpy()
    np.savez(out / "splits.npz", **arrays)
    return out / "splits.npz"


def twin(folder: Path, splits: Path, seed: int, epochs: int) -> dict:
    """The PyG side, in a python with pyg-lib (see the module)."""
    import torch
    import torch.nn.functional as F
    from torch_geometric.data import Data
    from torch_geometric.nn import GraphSAGE
    from torch_geometric.sampler import NeighborSampler, NodeSamplerInput

    torch.manual_seed(seed)
    ei = torch.from_numpy(np.load(folder / "edge_index.npy"))
    t = torch.from_numpy(np.load(folder / "edge_time.npy"))
    x = torch.from_numpy(np.load(folder / "x.npy"))
    n = x.size(0)
    data = Data(x=x, edge_index=torch.cat([ei, ei.flip(0)], 1), time=torch.cat([t, t]), num_nodes=n)
    s = np.load(splits)
    split = {k: torch.from_numpy(s[k]) for k in s.files}
    sampler = NeighborSampler(data, num_neighbors=list(FANOUTS), time_attr="time", temporal_strategy="uniform",
                              disjoint=True)
    model = GraphSAGE(x.size(1), HIDDEN, len(FANOUTS), HIDDEN, dropout=0.3)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)

    def embed(seeds, times):
        out = sampler.sample_from_nodes(NodeSamplerInput(input_id=None, node=seeds, time=times - 1))
        return model(data.x[out.node], torch.stack([out.row, out.col]))[:seeds.numel()]

    def train_epoch(gen):
        model.train()
        pos, tt = split["train_pos"], split["train_time"]
        order = torch.randperm(pos.size(1), generator=gen)
        for i in range(0, order.numel(), BATCH):
            idx = order[i:i + BATCH]
            src, dst, bt, b = pos[0, idx], pos[1, idx], tt[idx], idx.numel()
            neg = torch.randint(0, n, (b,), generator=gen)
            h = embed(torch.cat([src, dst, neg]), torch.cat([bt, bt, bt]))
            loss = F.binary_cross_entropy_with_logits((h[:b] * h[b:2 * b]).sum(-1), torch.ones(b)) + \
                F.binary_cross_entropy_with_logits((h[:b] * h[2 * b:]).sum(-1), torch.zeros(b))
            opt.zero_grad()
            loss.backward()
            opt.step()

    @torch.no_grad()
    def mrr(name):
        model.eval()
        pos, tt, neg = split[f"{name}_pos"], split[f"{name}_time"], split[f"{name}_neg"]
        k, rr = neg.size(1), []
        for i in range(0, pos.size(1), EVAL_ITEMS):
            sl = slice(i, i + EVAL_ITEMS)
            src, ends, bt = pos[0, sl], torch.cat([pos[1, sl].unsqueeze(1), neg[sl]], 1), tt[sl]
            b = src.numel()
            h = embed(torch.cat([src, ends.reshape(-1)]), torch.cat([bt, bt.repeat_interleave(k + 1)]))
            scores = (h[:b].unsqueeze(1) * h[b:].view(b, k + 1, -1)).sum(-1)
            p, q = scores[:, :1], scores[:, 1:]
            rr.append(1.0 / (1 + 0.5 * ((q > p).sum(1) + (q >= p).sum(1)).double()))  # (ties half: hpcgnn's, OGB's)
        return float(torch.cat(rr).mean())

    gen = torch.Generator().manual_seed(seed)
    best = (-1.0, 0.0)
    for _ in range(epochs):
        train_epoch(gen)
        val = mrr("val")
        if val > best[0]:
            best = (val, mrr("test"))
    return {"best_val": best[0], "test": best[1]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--folder", help="a files folder of timed events (edge_index, edge_time, x, ...)")
    ap.add_argument("--collegemsg", help="SNAP's CollegeMsg.txt instead of --folder")
    ap.add_argument("--out", required=True, help="where the data root, the runs and the split go")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=10)
    default_pyg = Path("~/.cache/hpcgnn/pyg-venv/bin/python").expanduser()
    ap.add_argument("--pyg", default=str(default_pyg), help="python with pyg-lib (benchmarks/pyglib_venv.sh)")
    ap.add_argument("--side", choices=["pyg"], help="(internal) run the twin of --folder, --splits, --seed")
    ap.add_argument("--splits")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if args.side == "pyg":
        print(json.dumps(twin(Path(args.folder), Path(args.splits), args.seed, args.epochs)))
        return
    out = Path(args.out).expanduser().resolve()
    out.mkdir(parents=True, exist_ok=True)
    folder = collegemsg_folder(Path(args.collegemsg), out) if args.collegemsg else Path(args.folder).resolve()
    root = out / "root"
    splits = export_splits(folder, root, out)
    ours, theirs, seconds = [], [], {"hpcgnn": 0.0, "pyg": 0.0}
    for seed in range(args.seeds):
        run = out / f"hpcgnn-s{seed}"
        t0 = time.perf_counter()
        res = subprocess.run([sys.executable, "-m", "hpcgnn", *overrides(folder, root, args.epochs),
                              f"train.seed={seed}", f"run_dir={run}"], capture_output=True, text=True)
        seconds["hpcgnn"] += time.perf_counter() - t0
        if res.returncode:
            sys.exit(f"hpcgnn's run failed: {res.stderr.strip()[-2000:]}")
        ours.append(json.loads((run / "summary.json").read_text())["test"])
        t0 = time.perf_counter()
        res = subprocess.run([args.pyg, __file__, "--side", "pyg", "--folder", str(folder), "--splits", str(splits),
                              "--seed", str(seed), "--epochs", str(args.epochs), "--out", str(out)],
                             capture_output=True, text=True)
        seconds["pyg"] += time.perf_counter() - t0
        if res.returncode:
            sys.exit(f"the PyG twin failed: {res.stderr.strip()[-2000:]}")
        theirs.append(json.loads(res.stdout.strip().splitlines()[-1])["test"])

    def said(v: list[float]) -> str:
        sd = statistics.pstdev(v) if len(v) > 1 else 0.0
        return f"{statistics.mean(v):.4f} +- {sd:.4f} ({', '.join(f'{x:.4f}' for x in v)})"

    sd = statistics.pstdev(theirs) if len(theirs) > 1 else 0.0
    gap = abs(statistics.mean(ours) - statistics.mean(theirs))
    print(f"temporal link prediction, test MRR against {NEGATIVES} negatives, {args.epochs} epochs, "
          f"{args.seeds} seed(s): hpcgnn {said(ours)} in {seconds['hpcgnn']:.0f} s | PyG twin (pyg-lib temporal "
          f"sampling) {said(theirs)} in {seconds['pyg']:.0f} s | gap {gap:.4f} = "
          f"{gap / sd if sd else float('inf'):.2f} of the twin's sd (target <= 1)")


if __name__ == "__main__":
    main()
