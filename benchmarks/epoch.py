"""Training throughput: hpcgnn's pipeline vs a plain loop, GraphSAGE (3 layers, hidden 256).

    python benchmarks/epoch.py [--num-nodes 500000] [--avg-degree 50] [--steps 8]

hpcgnn's pipeline: neighbour sampling in a prefetching thread, PyG's trim_to_layer (each
layer computes only the nodes the next one needs). The plain loop: the same batches and
model without overlap or trimming; plus PyG's NeighborLoader with the same model when
pyg-lib or torch-sparse is importable. For each: seeds/s and the split of a step into
waiting for the loader and compute (forward, backward, optimizer). Prints one line each,
then the ratio.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F
from common import BATCH, FANOUTS, benchmark_graph, graph_arguments, hpcgnn_loader, pyg_loader
from torch_geometric.nn import GraphSAGE


def run(name: str, loader, model, steps: int, trim: bool) -> float:
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    wait = compute = 0.0
    seeds = 0
    it = iter(loader)
    for step in range(steps + 1):
        t0 = time.perf_counter()
        data = next(it)
        t1 = time.perf_counter()
        opt.zero_grad()
        kwargs = {"num_sampled_nodes_per_hop": data.num_sampled_nodes,
                  "num_sampled_edges_per_hop": data.num_sampled_edges} if trim else {}
        out = model(data.x, data.edge_index, **kwargs)[: data.batch_size]
        F.cross_entropy(out, data.y[: data.batch_size]).backward()
        opt.step()
        t2 = time.perf_counter()
        if step:  # the first step warms up
            wait, compute, seeds = wait + t1 - t0, compute + t2 - t1, seeds + data.batch_size
    rate = seeds / (wait + compute)
    print(f"{name}: {rate:.0f} seeds/s | per step: loader wait {wait / steps:.2f} s, compute {compute / steps:.2f} s")
    return rate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    graph_arguments(ap)
    ap.add_argument("--steps", type=int, default=8)
    args = ap.parse_args()

    graph = benchmark_graph(args)

    def model():
        torch.manual_seed(0)
        return GraphSAGE(graph.num_features, 256, 3, graph.num_classes)

    ours = run("hpcgnn (prefetch + trim_to_layer)", hpcgnn_loader(graph, prefetch=2), model(), args.steps, trim=True)
    plain = run("plain loop (same batches, no overlap, no trim)", hpcgnn_loader(graph), model(), args.steps,
                trim=False)
    ref_loader, ref_name = pyg_loader(graph, FANOUTS, BATCH, num_workers=0)
    line = f"epoch: hpcgnn / plain loop = {ours / plain:.2f}x"
    if ref_loader is None:
        line += f" | {ref_name}"
    else:
        ref = run(ref_name, ref_loader, model(), args.steps, trim=False)
        line += f" | hpcgnn / {ref_name} = {ours / ref:.2f}x"
    print(line)


if __name__ == "__main__":
    main()
