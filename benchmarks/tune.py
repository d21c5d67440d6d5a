"""hpcgnn tune, by hand: how busy its workers keep their slots, and what ASHA saves against a full grid.

    python benchmarks/tune.py [--num-nodes 20000] [--trials 32] [--workers 4] [--out DIR]

(1) Slot occupancy: ``--trials`` trials of uneven length (``train.epochs`` among 2, 4, 6 and 8, ``train.lr`` drawn
    from an interval so that no trial repeats another, which a tune would not train again; random sampler, no
    pruner) on ``--workers`` local workers: trial busy seconds (each worker's time from asking a trial to telling
    it, as its log says) / (workers x the tune's wall seconds).
(2) ASHA against the grid: every combination of ``train.lr`` (4 values) and ``model.hidden_channels`` (3) trained
    for ``--epochs`` epochs (a ``-m`` sweep, one member at a time), then a tune over the same space with the same
    number of trials, TPE and ASHA: the best validation accuracy of each (points: percent), and the rank-seconds
    each spent (members' and trials' training seconds, one rank each).

Local processes on this machine (one rank each); timings are noisy, the ratios are the figures. Prints one
comparison line.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LR = "0.0003,0.001,0.003,0.01"
HIDDEN = "16,32,64"


def hpcgnn(*args: str, cwd: Path) -> float:
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-m", "hpcgnn", *args], cwd=cwd, check=True, stdout=subprocess.DEVNULL)
    return time.monotonic() - t0


def occupancy(out: Path, common: list[str], trials: int, workers: int) -> tuple[float, float]:
    sweep = out / "occupancy"
    wall = hpcgnn("tune", "train.epochs=choice(2,4,6,8)", "train.lr=interval(0.003,0.01)", *common,
                  f"tune.trials={trials}", f"tune.parallel={workers}", "tune.pruner=none", "tune.sampler=random",
                  f"hydra.sweep.dir={sweep}", cwd=out)
    busy = 0.0
    for log in (sweep / "workers").glob("*.log"):
        busy += sum(float(s) for s in re.findall(r"--- worker \d+: trial \d+ \w+ in ([\d.]+) s", log.read_text()))
    return busy / (workers * wall), wall


def grid(out: Path, common: list[str], epochs: int) -> tuple[float, float]:
    sweep = out / "grid"
    hpcgnn("-m", f"train.lr={LR}", f"model.hidden_channels={HIDDEN}", f"train.epochs={epochs}", *common,
           f"hydra.sweep.dir={sweep}", cwd=out)
    summaries = [json.loads(p.read_text()) for p in sweep.glob("*/summary.json")]
    return max(s["best_val"] for s in summaries), sum(s["wall_time_s"] for s in summaries)


def asha(out: Path, common: list[str], epochs: int, trials: int, workers: int) -> tuple[float, float]:
    sweep = out / "asha"
    hpcgnn("tune", f"train.lr=choice({LR})", f"model.hidden_channels=choice({HIDDEN})", f"train.epochs={epochs}",
           *common, f"tune.trials={trials}", f"tune.parallel={workers}", "tune.pruner=asha", f"hydra.sweep.dir={sweep}",
           cwd=out)
    summaries = [json.loads(p.read_text()) for p in sweep.glob("trials/*/summary.json")]
    return max(s["best_val"] for s in summaries), sum(s["wall_time_s"] for s in summaries)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--num-nodes", type=int, default=20000)
    ap.add_argument("--trials", type=int, default=32)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--out", default=None)
    ap.add_argument("--only", choices=("all", "occupancy", "asha"), default="all", help="measure one part alone")
    args = ap.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="hpcgnn-bench-tune-"))
    out.mkdir(parents=True, exist_ok=True)
    common = [f"dataset.num_nodes={args.num_nodes}", "launch.procs=1", "train.num_threads=1", "train.precision=fp32",
              "metrics.tensorboard=false"]
    parts = []
    if args.only in ("all", "occupancy"):
        occ, wall = occupancy(out, common, args.trials, args.workers)
        parts.append(f"slot occupancy {occ:.1%} ({args.trials} trials of 2-8 epochs on {args.workers} workers, "
                     f"{wall:.0f} s)")
    if args.only in ("all", "asha"):
        best_grid, cost_grid = grid(out, common, args.epochs)
        best_asha, cost_asha = asha(out, common, args.epochs, 12, min(args.workers, 3))
        parts.append(f"best val acc grid {100 * best_grid:.2f} vs ASHA {100 * best_asha:.2f} points "
                     f"({100 * (best_asha - best_grid):+.2f}), rank-seconds ASHA/grid {cost_asha / cost_grid:.0%} "
                     f"({cost_asha:.0f} s / {cost_grid:.0f} s; {args.num_nodes} nodes, {args.epochs} epochs)")
    print(f"tune: {'; '.join(parts)}; folders in {out}", flush=True)


if __name__ == "__main__":
    main()
