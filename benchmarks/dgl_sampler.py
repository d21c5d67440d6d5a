"""DGL's neighbour sampler on hpcgnn's prepared graph, run in the DGL reference environment (benchmarks/dgl_venv.sh).

    <dgl venv>/bin/python benchmarks/dgl_sampler.py FOLDER [--batches 30] [--workers 0,2] [--threads 2]

Imports neither hpcgnn nor the project's torch: it reads the prepared arrays (FOLDER/*.npy: the CSR of in-edges,
features, training ids) with numpy, builds the same graph (CSC: each node's in-neighbours), and walks DGL's
NeighborSampler (fanouts [15, 10, 5] from the seeds, 1024 seeds per batch, features gathered as a training
step reads them) with DGL's DataLoader, then GraphBolt's NeighborSampler with 0 workers where it runs.
Prints one JSON line: batches/s per worker count (GraphBolt's: its figures, or why it did not run).
"""

from __future__ import annotations

import itertools
import json
import time

from reference_graph import BATCH, FANOUTS, arguments, load


def main() -> None:
    args = arguments(__doc__)

    import dgl
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    arrays = load(args.folder)
    rowptr, col = torch.from_numpy(arrays["rowptr"]), torch.from_numpy(arrays["col"])
    feats = torch.from_numpy(arrays["x"])
    if arrays["feature_dtype"] == "bfloat16":
        feats = feats.view(torch.bfloat16)
    train = torch.from_numpy(arrays["train"]).long()
    g = dgl.graph(("csc", (rowptr.long(), col.long(), torch.tensor([], dtype=torch.long))),
                  num_nodes=arrays["num_nodes"])
    g.ndata["feat"] = feats
    out = {"dgl": dgl.__version__, "torch": torch.__version__, "threads": torch.get_num_threads()}
    for workers in (int(w) for w in args.workers.split(",")):
        # DGL's fanouts run from the input layer to the output: the reverse of hops from the seeds
        sampler = dgl.dataloading.NeighborSampler(list(reversed(FANOUTS)), prefetch_node_feats=["feat"])
        loader = dgl.dataloading.DataLoader(g, train, sampler, batch_size=BATCH, shuffle=True, drop_last=False,
                                            num_workers=workers)
        it = iter(loader)
        next(it)  # warm-up (and the workers' start)
        t0, edges = time.perf_counter(), 0
        for _input_nodes, _seeds, blocks in itertools.islice(it, args.batches):
            assert blocks[0].srcdata["feat"].shape[0] == _input_nodes.numel()
            edges += sum(b.num_edges() for b in blocks)
        elapsed = time.perf_counter() - t0
        out[f"workers_{workers}"] = {"batches_per_s": args.batches / elapsed, "edges_per_batch": edges / args.batches}
    try:  # GraphBolt, DGL's newer sampling stack, where it runs (it needs torchdata 0.7)
        out["graphbolt_0"] = graphbolt(rowptr, col, feats, train, args.batches)
    except Exception as exc:  # noqa: BLE001 (the reason is the reference's answer)
        out["graphbolt_0"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else ''}"
    print(json.dumps(out))


def graphbolt(rowptr, col, feats, train, batches: int) -> dict:
    """GraphBolt's uniform NeighborSampler over the same CSC, features fetched, 0 workers."""
    import torch
    from dgl import graphbolt as gb

    graph = gb.fused_csc_sampling_graph(rowptr.long(), col.long())
    features = gb.BasicFeatureStore({("node", None, "feat"): gb.TorchBasedFeature(feats)})
    pipe = gb.ItemSampler(gb.ItemSet(train, names="seed_nodes"), batch_size=BATCH, shuffle=True)
    pipe = pipe.sample_neighbor(graph, [torch.LongTensor([f]) for f in reversed(FANOUTS)])
    pipe = pipe.fetch_feature(features, node_feature_keys=["feat"])
    it = iter(gb.DataLoader(pipe, num_workers=0))
    next(it)  # warm-up
    t0, edges = time.perf_counter(), 0
    for mb in itertools.islice(it, batches):
        assert mb.node_features["feat"].shape[0] == mb.input_nodes.numel()
        edges += sum(int(b.num_edges()) for b in mb.blocks)
    return {"batches_per_s": batches / (time.perf_counter() - t0), "edges_per_batch": edges / batches}


if __name__ == "__main__":
    main()
