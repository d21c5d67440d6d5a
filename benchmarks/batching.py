"""Edge-budget batching vs fixed seed counts: how much of every DDP step is spent waiting.

Simulates W ranks in one process on a heavy-tailed graph: for the first steps of an epoch,
each rank's batch is sampled and run through a GraphSAGE forward and backward. Under DDP a
step lasts as long as its slowest rank; the figures are the per-step imbalance (the
largest rank over the mean rank, summed over steps) in sampled edges and in measured busy
time, for batches of a fixed seed count and for batches cut by an edge budget that gives
the same number of steps.

    python benchmarks/batching.py [--ranks 4] [--batch-size 128] [--steps 20]
"""

from __future__ import annotations

# isort: off
import hpcgnn  # noqa: F401  (first: its process defaults, OMP_WAIT_POLICY, before torch loads OpenMP)
# isort: on
import argparse
import time

import torch
from common import benchmark_config, graph_arguments


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    graph_arguments(ap, num_nodes=200_000)
    ap.set_defaults(avg_degree=20.0, degree_exponent=2.2)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--fanouts", type=int, nargs="+", default=[15, 10])
    ap.add_argument("--steps", type=int, default=20, help="steps measured per rank")
    args = ap.parse_args()

    from hpcgnn.clock import Clock
    from hpcgnn.config import GraphConfig, ModelConfig, RunConfig, TaskConfig, TrainConfig
    from hpcgnn.env import RankEnv
    from hpcgnn.models import build_model, forward_batch
    from hpcgnn.sampling import BatchLoader
    from hpcgnn.sampling.subgraph import expected_edges
    from hpcgnn.tasks import open_store

    torch.set_num_threads(1)  # one core per simulated rank, as on a cluster node

    def stores(**train) -> list:
        cfg = RunConfig(task=TaskConfig(), dataset=benchmark_config(args), model=ModelConfig(), graph=GraphConfig(),
                        train=TrainConfig(fanouts=tuple(args.fanouts), **train))
        return [open_store(cfg, RankEnv(source="single", rank=r, local_rank=r, world_size=args.ranks,
                                             local_world_size=args.ranks, node_rank=0, num_nodes=1,
                                             hostnames=("localhost",), master_addr="127.0.0.1", master_port=0,
                                             job_id="")) for r in range(args.ranks)]

    fixed = stores(batch_size=args.batch_size)
    g = fixed[0].graph
    print(f"graph: {g.num_nodes} nodes, {g.num_edges} edges, max degree {int(g.degree().max())}; "
          f"{args.ranks} ranks, fanouts {args.fanouts}")
    model = build_model(ModelConfig(), g.num_features, g.num_classes, len(args.fanouts))

    def measure(name: str, ranks: list, budget: int = 0) -> tuple[float, float]:
        edges = [[0] * args.steps for _ in ranks]
        busy = [[0.0] * args.steps for _ in ranks]
        for r, store in enumerate(ranks):
            plan = store.train_batches(1)[: args.steps]
            loader = BatchLoader(store.features, store.sampler, plan, batch_seed=r)
            for i, data in enumerate(loader):
                t0 = time.perf_counter()
                loss = torch.nn.functional.cross_entropy(forward_batch(model, data), data.y[: data.batch_size])
                loss.backward()
                busy[r][i] = Clock.seconds(*data.sample) + Clock.seconds(*data.gather) + time.perf_counter() - t0
                edges[r][i] = data.edge_index.size(1)

        def imbalance(table) -> float:
            columns = list(zip(*table, strict=True))
            return sum(max(c) for c in columns) / sum(sum(c) / len(c) for c in columns)

        mean_edges = sum(map(sum, edges)) / (len(ranks) * args.steps)
        what = f"budget {budget} edges" if budget else f"{args.batch_size} seeds"
        print(f"{name:8s} ({what}, {ranks[0].steps} steps/epoch): mean {mean_edges:,.0f} edges/step, "
              f"largest batch {max(map(max, edges)):,}; per-step max/mean over ranks: edges "
              f"{imbalance(edges):.3f}, busy time {imbalance(busy):.3f}")
        return imbalance(edges), imbalance(busy)

    e_fixed, t_fixed = measure("fixed", fixed)
    # The budget that gives about the same number of steps: the fixed batches' mean estimated cost.
    cost = expected_edges(g.rowptr, g.col, tuple(args.fanouts))
    budget = int(float(cost[g.train_idx].double().mean()) * args.batch_size)
    e_budget, t_budget = measure("budget", stores(batch_size=args.batch_size, edge_budget=budget), budget)
    print(f"waiting per step (max/mean - 1): edges {e_fixed - 1:.1%} -> {e_budget - 1:.1%}, "
          f"busy time {t_fixed - 1:.1%} -> {t_budget - 1:.1%}")


if __name__ == "__main__":
    main()
