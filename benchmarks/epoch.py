"""Training throughput: hpcgnn's pipeline (CSR aggregation, fp32 and precision=auto) vs today's path, a plain
loop and PyG's NeighborLoader; GraphSAGE (3 layers, hidden 256).

    python benchmarks/epoch.py [--num-nodes 500000] [--avg-degree 50] [--steps 8]

hpcgnn's pipeline: neighbour sampling in a prefetching thread, each layer computing only the nodes the
next one needs, aggregation as sorted-CSR products (hpcgnn.models.aggregation), in fp32 and with
``train.precision=auto`` (bf16 autocast where the CPU has AMX or AVX512-BF16). Today's path (before
the CSR aggregation): the same with PyG's gather/scatter aggregation in fp32. The plain loop: the same
batches and model without overlap or trimming; PyG's NeighborLoader with the same model when pyg-lib or
torch-sparse is importable (``benchmarks/pyglib_venv.sh`` makes a venv with pyg-lib), and PyG as an expert
runs it: the same loader, ``trim_to_layer``, SAGEConv's fused CSR aggregation (``torch.sparse.mm``) and bf16
autocast where the CPU has it (``--compile``: also under ``torch.compile``). For each: seeds/s and a step's loader wait, forward + backward, optimizer.
Prints one line each, then one comparison line.
"""

from __future__ import annotations

# isort: off
import hpcgnn  # noqa: F401  (first: its process defaults, OMP_WAIT_POLICY, before torch loads OpenMP)
# isort: on
import argparse
import time

import torch
import torch.nn.functional as F
from common import BATCH, FANOUTS, benchmark_graph, graph_arguments, hpcgnn_loader, pyg_loader
from torch_geometric import EdgeIndex
from torch_geometric.nn import GraphSAGE
from torch_geometric.utils import trim_to_layer


def run(name: str, loader, model, steps: int, trim: bool, precision: str = "fp32") -> tuple[float, float]:
    """(seeds/s, forward + backward seconds per step) over ``steps`` steps after one warm-up step."""
    from hpcgnn.rank.techniques import autocast

    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    wait = fwd_bwd = optim = 0.0
    seeds = 0
    it = iter(loader)
    for step in range(steps + 1):
        t0 = time.perf_counter()
        data = next(it)
        t1 = time.perf_counter()
        opt.zero_grad()
        kwargs = {"num_sampled_nodes_per_hop": data.num_sampled_nodes,
                  "num_sampled_edges_per_hop": data.num_sampled_edges} if trim else {}
        with autocast(precision, torch.device("cpu")):
            out = model(data.x, data.edge_index, **kwargs)[: data.batch_size]
        F.cross_entropy(out.float(), data.y[: data.batch_size]).backward()
        t2 = time.perf_counter()
        opt.step()
        t3 = time.perf_counter()
        if step:  # the first step warms up
            wait, fwd_bwd, optim = wait + t1 - t0, fwd_bwd + t2 - t1, optim + t3 - t2
            seeds += data.batch_size
    rate = seeds / (wait + fwd_bwd + optim)
    print(f"{name}: {rate:.0f} seeds/s | per step: loader wait {wait / steps:.2f} s, forward + backward "
          f"{fwd_bwd / steps:.2f} s, optimizer {optim / steps:.3f} s", flush=True)
    return rate, fwd_bwd / steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    graph_arguments(ap)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--compile", action="store_true", help="also the expert PyG model under torch.compile")
    args = ap.parse_args()

    from hpcgnn.models.aggregation import csr_model
    from hpcgnn.rank.techniques import resolve_precision

    graph = benchmark_graph(args)
    auto, why = resolve_precision("auto", torch.device("cpu"))
    print(f"train.precision=auto picks {auto} here ({why}); {torch.get_num_threads()} threads", flush=True)

    def model(aggregation: str):
        torch.manual_seed(0)
        m = csr_model("GraphSAGE")(graph.num_features, 256, 3, graph.num_classes)
        m.aggregation = aggregation
        return m

    today, today_fb = run("today's pipeline (prefetch + trim, PyG aggregation, fp32)", hpcgnn_loader(graph, prefetch=2),
                          model("pyg"), args.steps, trim=True)
    fp32, fp32_fb = run("hpcgnn (prefetch + trim, CSR aggregation, fp32)", hpcgnn_loader(graph, prefetch=2),
                        model("csr"), args.steps, trim=True)
    ours, _ = run(f"hpcgnn (prefetch + trim, CSR aggregation, precision=auto: {auto})",
                  hpcgnn_loader(graph, prefetch=2), model("csr"), args.steps, trim=True, precision=auto)
    plain, _ = run("plain loop (same batches, no overlap, no trim, PyG aggregation, fp32)", hpcgnn_loader(graph),
                   model("pyg"), args.steps, trim=False)
    line = (f"epoch: hpcgnn auto / today = {ours / today:.2f}x (target >= 2x) | forward + backward per step, fp32: "
            f"today {today_fb:.2f} s, CSR {fp32_fb:.2f} s = {today_fb / fp32_fb:.2f}x (target >= 2x) | "
            f"hpcgnn auto / plain loop = {ours / plain:.2f}x")
    ref_loader, ref_name = pyg_loader(graph, FANOUTS, BATCH, num_workers=0)
    if ref_loader is None:
        line += f" | {ref_name}"
    else:
        ref, _ = run(ref_name, ref_loader, model("pyg"), args.steps, trim=False)
        line += f" | hpcgnn auto / {ref_name} = {ours / ref:.2f}x (target >= 3x)"
        expert_loader, _ = pyg_loader(graph, FANOUTS, BATCH, num_workers=0)
        expert, _ = run(f"expert PyG ({ref_name}, trim_to_layer, CSR spmm, precision {auto})", expert_loader,
                        ExpertSAGE(graph.num_features, 256, 3, graph.num_classes), args.steps, trim=True,
                        precision=auto)
        line += f" | hpcgnn auto / expert PyG = {ours / expert:.2f}x"
        if args.compile:
            expert_loader, _ = pyg_loader(graph, FANOUTS, BATCH, num_workers=0)
            try:
                compiled, _ = run("expert PyG + torch.compile(dynamic=True)", expert_loader,
                                  torch.compile(ExpertSAGE(graph.num_features, 256, 3, graph.num_classes),
                                                dynamic=True), args.steps, trim=True, precision=auto)
                line += f" | hpcgnn auto / expert PyG compiled = {ours / compiled:.2f}x"
            except Exception as exc:  # noqa: BLE001 (what compile makes of PyG's sparse path is the finding)
                line += f" | expert PyG under torch.compile does not run: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
    print(line)


class ExpertSAGE(GraphSAGE):
    """PyG's GraphSAGE run the way PyG's own speed guides advise: ``trim_to_layer`` drops each layer's outer
    hop, the aggregation is SAGEConv's fused sparse path (the edges sorted into a CSR adjacency through
    ``EdgeIndex``, ``torch.sparse.mm`` with reduce="mean"), and the caller adds bf16 autocast where the CPU has it. Parameters as PyG's GraphSAGE."""

    def forward(self, x, edge_index, num_sampled_nodes_per_hop, num_sampled_edges_per_hop):
        for i, conv in enumerate(self.convs):
            x, edge_index, _ = trim_to_layer(i, num_sampled_nodes_per_hop, num_sampled_edges_per_hop, x, edge_index)
            # Rows: the targets; duplicate edges stay (a multigraph's mean counts them, as PyG's scatter does).
            n = x.size(0)
            adj_t = EdgeIndex(edge_index.flip(0), sparse_size=(n, n)).sort_by("row")[0].to_sparse_csr(
                x.new_ones(edge_index.size(1)))
            x = conv(x, adj_t)
            if i < self.num_layers - 1:
                x = self.dropout(self.act(x))
        return x


if __name__ == "__main__":
    main()
