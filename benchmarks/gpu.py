"""On a GPU: the sampler with the graph in GPU memory vs on the host, and a GraphSAGE epoch's loader wait.

    python benchmarks/gpu.py [--num-nodes 2000000] [--avg-degree 50] [--batches 40] [--steps 100]

Needs a CUDA device (benchmarks/gpu_setup.sh prepares a machine without a package registry).
(1) Sampler: batches/s and sampled edges/s of hpcgnn's neighbour sampler, fanouts [15, 10, 5], 1024
seeds, with the CSR on the host (torch's CPU threads, every core) and in GPU memory.
(2) Training: GraphSAGE 3x256 (trim_to_layer) with hpcgnn's loaders: host sampling with prefetch
(pinned buffers, non-blocking copies on a side stream) and GPU sampling (the graph and features in
GPU memory, the prefetch thread sampling on its own stream). Seeds/s over ``--steps`` steps of an
epoch, and the share of the step lost to the loader: 1 - (compute alone) / (pipeline), where compute
alone runs the same number of steps on batches made beforehand; also the host's wait in ``next()``.
Prints one line each, then one comparison line with the bars docs/gpus.md names.
"""

from __future__ import annotations

# isort: off
import hpcgnn  # noqa: F401  (first: its process defaults, OMP_WAIT_POLICY, before torch loads OpenMP)
# isort: on
import argparse
import time

import torch
import torch.nn.functional as F
from common import BATCH, FANOUTS, benchmark_graph, graph_arguments

from hpcgnn.sampling import BatchLoader, CSRNeighborSampler, PrefetchLoader


def sync() -> None:
    torch.cuda.synchronize()


def seed_batches(graph, count: int, seed: int = 0) -> list[torch.Tensor]:
    perm = graph.train_idx[torch.randperm(graph.train_idx.numel(), generator=torch.Generator().manual_seed(seed))]
    return list(perm[: count * BATCH].split(BATCH))


def sampler_rate(rowptr, col, batches, device, method=None) -> tuple[float, float]:
    """(batches/s, sampled edges/s) of the sampler over ``batches`` (after 3 warm-up batches)."""
    sampler = CSRNeighborSampler(rowptr, col, FANOUTS, method=method)
    gen = torch.Generator(device=device).manual_seed(0)
    for seeds in batches[:3]:
        sampler.sample(seeds, gen)
    sync()
    edges, t0 = 0, time.perf_counter()
    for seeds in batches[3:]:
        edges += sampler.sample(seeds, gen).edge_index.size(1)
    sync()
    dt = time.perf_counter() - t0
    return (len(batches) - 3) / dt, edges / dt


def make_model(graph, device):
    from torch_geometric.nn import GraphSAGE

    torch.manual_seed(0)
    return GraphSAGE(graph.num_features, 256, 3, graph.num_classes).to(device)


def step(model, opt, data) -> torch.Tensor:
    opt.zero_grad(set_to_none=True)
    out = model(data.x, data.edge_index, num_sampled_nodes_per_hop=data.num_sampled_nodes,
                num_sampled_edges_per_hop=data.num_sampled_edges)[: data.batch_size]
    loss = F.cross_entropy(out, data.y[: data.batch_size])
    loss.backward()
    opt.step()
    return loss.detach()


def pipeline(name: str, loader, graph, device, steps: int) -> dict:
    """Seeds/s over ``steps`` steps (after 3 warm-up steps), the loader's share, the host's wait."""
    model = make_model(graph, device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    it = iter(loader)
    for _ in range(3):
        step(model, opt, next(it))
    sync()
    wait, seeds, t0 = 0.0, 0, time.perf_counter()
    kept = []
    for i in range(steps):
        t = time.perf_counter()
        data = next(it)
        wait += time.perf_counter() - t
        step(model, opt, data)
        seeds += data.batch_size
        if i < 8:
            kept.append(data)
    sync()
    total = time.perf_counter() - t0
    it.close()  # joins the prefetch thread
    # Compute alone: the same number of steps on batches already made (cycled), no loader at all.
    sync()
    t1 = time.perf_counter()
    for i in range(steps):
        step(model, opt, kept[i % len(kept)])
    sync()
    compute = time.perf_counter() - t1
    share = max(0.0, 1.0 - compute / total)
    print(f"{name}: {seeds / total:.0f} seeds/s | {total / steps * 1e3:.1f} ms/step, compute alone "
          f"{compute / steps * 1e3:.1f} ms/step: loader {share:.1%} of the step | host wait in next() "
          f"{wait / total:.1%}")
    return {"seeds_per_s": seeds / total, "share": share}


def profile(on_gpu, graph, batches, device) -> None:
    """Where the GPU's time goes: the sampler alone, then training steps alone (torch.profiler tables)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    sampler = CSRNeighborSampler(on_gpu.rowptr, on_gpu.col, FANOUTS)
    gen = torch.Generator(device=device).manual_seed(0)
    loader = BatchLoader(on_gpu, sampler, torch.cat(batches[:12]), BATCH, batch_seed=0, device=device)
    made = list(loader)
    model = make_model(graph, device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for data in made[:2]:
        step(model, opt, data)
    sync()
    for name, fn in (("sampler", lambda: [sampler.sample(b, gen) for b in batches[:10]]),
                     ("training steps", lambda: [step(model, opt, d) for d in made[2:12]])):
        with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            fn()
            sync()
        print(f"--- {name}, 10 batches")
        print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=14, max_name_column_width=50))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    graph_arguments(ap, num_nodes=2_000_000)
    ap.add_argument("--batches", type=int, default=40, help="sampler batches timed (plus 3 warm-up)")
    ap.add_argument("--steps", type=int, default=100, help="training steps timed per pipeline (plus 3 warm-up)")
    ap.add_argument("--switch-intervals", type=float, nargs="*", default=[],
                    help="also time GPU sampling + prefetch with these sys.setswitchinterval values (seconds)")
    ap.add_argument("--profile", action="store_true", help="print torch.profiler tables of the GPU sampler and "
                    "of training steps, then stop")
    ap.add_argument("--host-batches", type=int, default=0, help="batches for the host sampler (0: --batches)")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks/gpu.py needs a CUDA device")
    device = torch.device("cuda", 0)
    props = torch.cuda.get_device_properties(device)
    print(f"GPU: {props.name}, {props.total_memory / 2**30:.0f} GiB, torch {torch.__version__}, "
          f"CUDA {torch.version.cuda}, {torch.get_num_threads()} CPU threads")

    graph = benchmark_graph(args)
    t0 = time.perf_counter()
    on_gpu = graph.to(device)
    sync()
    print(f"graph copied to the GPU in {time.perf_counter() - t0:.1f} s "
          f"({torch.cuda.memory_allocated(device) / 2**30:.2f} GiB)")

    # (1) The sampler alone.
    batches = seed_batches(graph, args.batches + 3)
    host_b, host_e = sampler_rate(graph.rowptr, graph.col, batches[: (args.host_batches or args.batches) + 3],
                                  torch.device("cpu"))
    print(f"sampler, graph on the host: {host_b:.1f} batches/s, {host_e / 1e6:.1f} M sampled edges/s")
    gpu_b, gpu_e = sampler_rate(on_gpu.rowptr, on_gpu.col, batches, device)
    print(f"sampler, graph on the GPU: {gpu_b:.1f} batches/s, {gpu_e / 1e6:.1f} M sampled edges/s")
    for method in ("floyd", "keys"):
        b, e = sampler_rate(on_gpu.rowptr, on_gpu.col, batches, device, method=method)
        print(f"sampler, graph on the GPU, {method} at every hop: {b:.1f} batches/s, {e / 1e6:.1f} M sampled edges/s")

    if args.profile:
        profile(on_gpu, graph, batches, device)
        return

    # (2) Training steps through hpcgnn's loaders.
    seeds = torch.cat(seed_batches(graph, args.steps + 3, seed=1))

    def loader(g, prefetch: int = 2):
        plain = BatchLoader(g, CSRNeighborSampler(g.rowptr, g.col, FANOUTS), seeds, BATCH, batch_seed=0,
                            device=device, pin_memory=not g.x.is_cuda)
        return PrefetchLoader(plain, prefetch) if prefetch else plain

    host = pipeline("GraphSAGE 3x256, host sampling + prefetch", loader(graph), graph, device, args.steps)
    gpu = pipeline("GraphSAGE 3x256, GPU sampling + prefetch", loader(on_gpu), graph, device, args.steps)
    pipeline("GraphSAGE 3x256, GPU sampling inline (no prefetch thread)", loader(on_gpu, 0), graph, device,
             args.steps)
    import sys

    default = sys.getswitchinterval()
    for interval in args.switch_intervals:
        sys.setswitchinterval(interval)
        pipeline(f"GraphSAGE 3x256, GPU sampling + prefetch, GIL switch interval {interval * 1e3:g} ms",
                 loader(on_gpu), graph, device, args.steps)
    sys.setswitchinterval(default)
    print(f"peak GPU memory {torch.cuda.max_memory_allocated(device) / 2**30:.2f} GiB")
    print(f"gpu: sampler GPU / host = {gpu_b / host_b:.1f}x batches/s (target >= 10x) | training GPU sampling "
          f"{gpu['seeds_per_s']:.0f} seeds/s vs host {host['seeds_per_s']:.0f} = "
          f"{gpu['seeds_per_s'] / host['seeds_per_s']:.1f}x | loader share of a step: GPU sampling "
          f"{gpu['share']:.1%} (target < 10%), host sampling {host['share']:.1%}")


if __name__ == "__main__":
    main()
