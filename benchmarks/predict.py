"""Embeddings for every node at scale: `hpcgnn predict RUN split=all --embeddings` on a partitioned graph, against
the exact evaluation training runs on it (the same layer-wise inference over every node).

    python benchmarks/predict.py [--num-nodes 2000000] [--avg-degree 50] [--ranks 2] [--root DIR]

Trains a short run on the benchmark graph, partitioned over ``--ranks`` local ranks, with exact evaluation
(``train.eval_mode=full``, one epoch over a small training split: the weights do not matter here), then runs
``hpcgnn predict`` for every node's embedding three times (medians). Per rank: the time of inference (the
embeddings: all layers but the last, every node, then each rank's rows written into the shared array) and the
rank's peak memory, against the training run's evaluation (every layer, every node) and its ranks' peak memory
(which includes training's). Prints one comparison line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from common import graph_arguments


def _run(args: list[str], cwd: Path) -> str:
    res = subprocess.run([sys.executable, "-m", "hpcgnn", *args], capture_output=True, text=True, cwd=cwd)
    if res.returncode != 0:
        sys.exit(f"failed: hpcgnn {' '.join(args)}\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}")
    return res.stdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    graph_arguments(ap, num_nodes=2_000_000)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="hpcgnn-predict-bench-"))
    run = work / "run"
    graph = [f"dataset.num_nodes={a.num_nodes}", f"dataset.avg_degree={a.avg_degree}",
             f"dataset.degree_exponent={a.degree_exponent}", f"dataset.root={a.root}", "dataset.train_fraction=0.01",
             "graph=partitioned", "graph.method=lp", f"launch.procs={a.ranks}", f"model.hidden_channels={a.hidden}"]
    _run([*graph, "train.epochs=1", "train.eval_mode=full", "metrics.tensorboard=false", f"hydra.run.dir={run}"], work)
    trained = json.loads((run / "summary.json").read_text())
    eval_s = trained["history"][-1]["eval_s"]
    train_peak = trained["peak_memory_mb"]
    runs = []
    for k in range(a.repeats):
        _run(["predict", str(run), "split=all", "--embeddings", f"out={work / f'emb{k}'}"], work)
        runs.append(json.loads((work / f"emb{k}" / "summary.json").read_text()))
    infer = statistics.median(r["inference_s"] + r["write_s"] for r in runs)
    peak = [statistics.median(r["peak_memory_mb"][i] for r in runs) for i in range(a.ranks)]
    shape = runs[0]["arrays"]["embeddings"]["shape"]
    print(f"embeddings of {shape[0]} nodes x {shape[1]} on {a.ranks} ranks, partitioned (lp), {a.avg_degree:g} avg "
          f"degree: predict {infer:.1f} s (inference {statistics.median(r['inference_s'] for r in runs):.1f} s + "
          f"writing {statistics.median(r['write_s'] for r in runs):.1f} s), peak "
          f"{', '.join(f'{p:.0f}' for p in peak)} MB per rank | training's exact evaluation (all layers, every "
          f"node) {eval_s:.1f} s, training ranks' peak {', '.join(f'{p:.0f}' for p in train_peak)} MB | "
          f"median of {a.repeats}; outputs in {work}")


if __name__ == "__main__":
    main()
