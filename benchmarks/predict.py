"""Embeddings for every node at scale: `hpcgnn predict RUN split=all --embeddings` on a partitioned graph, against
the exact evaluation training runs on it (the same layer-wise inference over every node).

    python benchmarks/predict.py [--num-nodes 2000000] [--avg-degree 50] [--ranks 2] [--root DIR]

Trains a short run on the benchmark graph, partitioned over ``--ranks`` local ranks, with exact evaluation
(``train.eval_mode=full``, one epoch over a small training split: the weights do not matter here), then runs
``hpcgnn predict`` three times (medians) for every node's embedding (all layers but the last) and for every
node's class probabilities by exact inference (all layers: the work of training's exact evaluation). Per
rank: the time of inference and of writing its rows into the shared arrays, and the rank's peak memory,
against the training run's evaluation (every layer, every node) and its ranks' peak memory (which includes
training's). Prints one comparison line.
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
             f"dataset.degree_exponent={a.degree_exponent}", f"dataset.root={Path(a.root).expanduser()}",
             "dataset.train_fraction=0.01",
             "graph=partitioned", "graph.method=lp", f"launch.procs={a.ranks}", f"model.hidden_channels={a.hidden}"]
    _run([*graph, "train.epochs=1", "train.eval_mode=full", "metrics.tensorboard=false", f"hydra.run.dir={run}"], work)
    trained = json.loads((run / "summary.json").read_text())
    eval_s = trained["history"][-1]["eval_s"]
    train_peak = trained["peak_memory_mb"]
    def medians(tag: str, *options: str) -> tuple[dict, float, float, float, list[float]]:
        runs = []
        for k in range(a.repeats):
            out = work / f"{tag}-{k}"
            _run(["predict", str(run), "split=all", *options, f"out={out}"], work)
            runs.append(json.loads((out / "summary.json").read_text()))
        med = statistics.median
        return (runs[0], med(r["inference_s"] + r["write_s"] for r in runs), med(r["inference_s"] for r in runs),
                med(r["write_s"] for r in runs), [med(r["peak_memory_mb"][i] for r in runs) for i in range(a.ranks)])

    def mb(values: list[float]) -> str:
        return ", ".join(f"{v:.0f}" for v in values)

    emb, total, infer, write, peak = medians("embeddings", "--embeddings")
    _, p_total, p_infer, p_write, p_peak = medians("predictions", "mode=full")
    shape = emb["arrays"]["embeddings"]["shape"]
    print(f"{shape[0]} nodes, {a.avg_degree:g} avg degree, {a.ranks} ranks, partitioned (lp), hidden {shape[1]}: "
          f"predict --embeddings (layer 1 of 2) {total:.1f} s (inference {infer:.1f} + writing {write:.1f}), peak "
          f"{mb(peak)} MB per rank | predict mode=full, every node's class probabilities (both layers: training's "
          f"evaluation's work) {p_total:.1f} s (inference {p_infer:.1f} + writing {p_write:.1f}), peak {mb(p_peak)} MB "
          f"| training's exact evaluation (both layers, every node) {eval_s:.1f} s, its ranks' peak {mb(train_peak)} "
          f"MB (training's included) | medians of {a.repeats}; outputs in {work}")


if __name__ == "__main__":
    main()
