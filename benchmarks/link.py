"""hpcgnn's link loader vs PyG's LinkNeighborLoader: batches/s on the same graph and training edges.

    python benchmarks/link.py [--num-nodes 500000] [--avg-degree 50] [--batches 30] [--repeat 3] [--contended]

The synthetic graph prepared for link prediction (its edges split 85/5/10). A batch is 1024
positive training edges with one uniform negative each, the neighbourhood of every endpoint
sampled with fanouts [15, 10, 5], the step's targets left out of message passing (hpcgnn;
PyG keeps them), and the features of every node gathered: what a training step consumes.
hpcgnn is measured plainly and with its prefetching thread; PyG when pyg-lib or
torch-sparse is importable (else it says so; benchmarks/pyglib_venv.sh makes a python with
pyg-lib); ``--contended``: hpcgnn also with a busy process beside it taking one core. Medians of
``--repeat`` interleaved runs. Prints one comparison line.
"""

from __future__ import annotations

# isort: off
import hpcgnn  # noqa: F401  (first: its process defaults, OMP_WAIT_POLICY, before torch loads OpenMP)
# isort: on
import argparse
import dataclasses
import time

import torch
from common import (
    BATCH,
    FANOUTS,
    benchmark_config,
    graph_arguments,
    interleaved_medians,
    loader_part,
    loader_sides,
    pyg_backend,
)
from sampler import batches_per_s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    graph_arguments(ap)
    ap.add_argument("--batches", type=int, default=30)
    ap.add_argument("--repeat", type=int, default=3, help="runs; the line prints medians")
    ap.add_argument("--contended", action="store_true", help="also hpcgnn with one core taken by a busy process")
    args = ap.parse_args()

    from hpcgnn.data import open_link, prepare
    from hpcgnn.data.graph import csr_has_edge
    from hpcgnn.process import keep_freed_memory
    from hpcgnn.sampling import BatchLoader, CSRNeighborSampler, PrefetchLoader
    from hpcgnn.sampling.link import LinkSampler

    keep_freed_memory()
    cfg = dataclasses.replace(benchmark_config(args), prepared_for="link")
    t0 = time.perf_counter()
    prepare(cfg)
    data = open_link(cfg)
    g = data.graph
    print(f"graph: {g.num_nodes} nodes, {g.num_edges} message-passing edges, {data.train.pos.size(1)} training "
          f"edges, {g.num_features} features (ready in {time.perf_counter() - t0:.0f} s)")
    order = torch.randperm(data.train.pos.size(1), generator=torch.Generator().manual_seed(0))

    def hpcgnn_loader(prefetch: int):
        sampler = LinkSampler(CSRNeighborSampler(g.rowptr, g.col, FANOUTS), data.train.pos, g.num_nodes, "uniform", 1,
                              has_edge=csr_has_edge(g.rowptr, g.col))
        loader = BatchLoader(g, sampler, order, BATCH, batch_seed=0)
        return PrefetchLoader(loader, prefetch) if prefetch else loader

    sides = loader_sides(lambda: batches_per_s(hpcgnn_loader(0), args.batches),
                         lambda: batches_per_s(hpcgnn_loader(2), args.batches), args.contended)
    loader, name = pyg_link_loader(g, data.train.pos[:, order], args)
    if loader is not None:
        sides["pyg"] = lambda: batches_per_s(pyg_link_loader(g, data.train.pos[:, order], args)[0], args.batches)
    med = interleaved_medians(sides, args.repeat)
    plain, ahead = med["plain"], med["ahead"]
    line = (f"link loader ({torch.get_num_threads()} threads, fanouts {list(FANOUTS)}, {BATCH} positive edges + 1 "
            f"negative each, median of {args.repeat}): {loader_part(med, args.contended)}")
    if loader is None:
        line += f" | {name}"
    else:
        line += f" | {name} {med['pyg']:.2f} batches/s, hpcgnn/PyG = {max(plain, ahead) / med['pyg']:.2f}x (target >= 3x)"
    print(line)


def pyg_link_loader(graph, edges: torch.Tensor, args):
    """PyG's LinkNeighborLoader on the same graph and edges, or None with the reason when it cannot run here."""
    backend, why = pyg_backend("LinkNeighborLoader")
    if backend is None:
        return None, why
    from torch_geometric.data import Data
    from torch_geometric.loader import LinkNeighborLoader
    from torch_geometric.sampler import NegativeSampling

    data = Data(x=graph.x, edge_index=graph.edge_index(), num_nodes=graph.num_nodes)
    loader = LinkNeighborLoader(data, num_neighbors=list(FANOUTS), edge_label_index=edges, batch_size=BATCH,
                                neg_sampling=NegativeSampling("binary", 1), shuffle=False)
    return loader, f"PyG LinkNeighborLoader ({backend})"


if __name__ == "__main__":
    main()
