"""GraphSAINT, Cluster-GCN, LADIES and edge-budget batching: each checked for what it claims."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import ACCURACY_BAR, DATA_ROOT, make_config, run_cli, summary_of, train_batches

from hpcgnn.config import ModelConfig, dataset_config
from hpcgnn.data import Graph, open_graph, prepare
from hpcgnn.env import RankEnv
from hpcgnn.errors import ConfigError
from hpcgnn.models import build_model, forward_batch
from hpcgnn.partition import compute_parts
from hpcgnn.sampling import BatchLoader, CSRNeighborSampler
from hpcgnn.sampling import subgraph as sub
from hpcgnn.tasks import open_store

# Heavy-tailed, so that sampling biases and batch imbalance show.
SMALL = dataset_config(num_nodes=3000, avg_degree=10, degree_exponent=2.5, root=str(DATA_ROOT))


@pytest.fixture(scope="module")
def graph() -> Graph:
    prepare(SMALL)
    return open_graph(SMALL)


def _edge_set(g: Graph) -> set[tuple[int, int]]:
    return set(map(tuple, g.edge_index().t().tolist()))


def test_induced_subgraph_is_exactly_the_edges_among_the_nodes(graph):
    nodes = torch.randperm(graph.num_nodes, generator=torch.Generator().manual_seed(0))[:700]
    local = torch.full((graph.num_nodes,), -1, dtype=torch.long)
    ei, none = sub.induced_subgraph(graph.rowptr, graph.col, nodes, local)
    got = {(int(nodes[s]), int(nodes[t])) for s, t in ei.t().tolist()}
    members = set(nodes.tolist())
    want = {(s, t) for s, t in _edge_set(graph) if s in members and t in members}
    assert got == want and len(want) > 0 and none is None
    assert bool((local == -1).all())  # the scratch map is left clean
    again, e_id = sub.induced_subgraph(graph.rowptr, graph.col, nodes, local, eid=True)  # each edge's CSR place too
    assert torch.equal(again, ei) and torch.equal(graph.col.index_select(0, e_id), nodes.index_select(0, ei[0]))


# ----------------------------------------------------------------------------- GraphSAINT


def _samplers(graph: Graph) -> dict:
    rw = sub.SaintWalkSampler(graph.rowptr, graph.col, graph.train_idx, walk_length=2)
    steps = 3000
    rw.inclusion = rw.count_inclusion(100, steps, torch.Generator().manual_seed(5)) / steps
    return {"node": sub.SaintNodeSampler(graph.rowptr, graph.col, graph.train_idx, draws=400),
            "edge": sub.SaintEdgeSampler(graph.rowptr, graph.col, graph.train_idx, draws=200), "rw": rw}


@pytest.mark.parametrize("kind", ["node", "edge", "rw"])
def test_saint_loss_normalisation_is_unbiased(graph, kind):
    """Averaged over subgraphs, the normalised sum over a subgraph's training nodes equals the
    mean over all training nodes, for a per-node 'loss' the sampler is biased towards (degree):
    within 2%, where the plain mean over the subgraph is off by more than 25%."""
    sampler = _samplers(graph)[kind]
    loss = graph.degree().double()
    truth = loss[graph.train_idx].mean().item()
    gen = torch.Generator().manual_seed(1)
    normalised, plain = [], []
    for _ in range(400):
        roots = graph.train_idx[torch.randperm(graph.train_idx.numel(), generator=gen)[:100]]
        out = sampler.sample(roots, gen)
        targets = out.n_id[: out.batch_size]
        assert bool(torch.isin(targets, graph.train_idx).all())  # training nodes first ...
        assert not bool(torch.isin(out.n_id[out.batch_size:], graph.train_idx).any())  # ... and only there
        normalised.append((out.node_weight.double() * loss[targets]).sum().item())
        plain.append(loss[targets].mean().item())
    assert sum(normalised) / len(normalised) == pytest.approx(truth, rel=0.02)
    assert abs(sum(plain) / len(plain) / truth - 1) > 0.25


def test_saint_edge_sampler_draws_edges_in_proportion_to_inverse_degrees():
    # A star (hub 0 with 30 leaves, both directions) plus a separate 2-cycle (nodes 31, 32).
    n = 33
    pairs = [(0, i) for i in range(1, 31)] + [(31, 32)]
    ei = torch.tensor(pairs + [(b, a) for a, b in pairs]).t()
    g = Graph.from_edge_index(ei, n, torch.zeros(n, 1), torch.zeros(n, dtype=torch.long), torch.arange(n),
                              torch.arange(0), torch.arange(0), 1)
    s = sub.SaintEdgeSampler(g.rowptr, g.col, g.train_idx, draws=1)
    gen = torch.Generator().manual_seed(0)
    hits = sum(int(31 in s.nodes(None, gen).tolist()) for _ in range(4000)) / 4000
    # Weights: star edges 1/30 + 1 each (60 of them), cycle edges 1 + 1 (2 of them).
    assert hits == pytest.approx(4 / (60 * (1 + 1 / 30) + 4), abs=0.015)


# ----------------------------------------------------------------------------- Cluster-GCN and LADIES


def test_cluster_batches_are_the_subgraphs_of_their_clusters(graph):
    cluster = compute_parts(graph, 12, "metis", 0)
    s = sub.ClusterSampler(graph.rowptr, graph.col, graph.train_idx, cluster)
    seen = []
    for items in torch.arange(12).split(3):
        out = s.sample(items)
        assert out.node_weight is None  # Cluster-GCN: a plain mean over the subgraph's training nodes
        members = torch.isin(cluster[out.n_id].long(), items)
        assert bool(members.all())
        seen.append(out.n_id)
        want = {(a, b) for a, b in _edge_set(graph) if int(cluster[a]) in items and int(cluster[b]) in items}
        assert {(int(out.n_id[a]), int(out.n_id[b])) for a, b in out.edge_index.t().tolist()} == want
    assert torch.equal(torch.sort(torch.cat(seen)).values, torch.arange(graph.num_nodes))  # every node once


def test_ladies_draws_layers_among_the_neighbours_with_at_most_fanout_x_seeds_nodes(graph):
    sampler = sub.LadiesSampler(graph.rowptr, graph.col, (4, 2))
    seeds = graph.train_idx[:50]
    out = sampler.sample(seeds, torch.Generator().manual_seed(3))
    edges = _edge_set(graph)
    assert torch.equal(out.n_id[:50], seeds)
    for s, t in out.edge_index.t().tolist():
        assert (int(out.n_id[s]), int(out.n_id[t])) in edges
    layers = out.edge_index.split(list(out.num_sampled_edges), dim=1)
    drawn = [int(torch.unique(layer[0]).numel()) for layer in layers]  # distinct sources per layer
    assert drawn[0] <= 4 * 50 and drawn[1] == 2 * 50  # the second layer: 100 of many more candidates
    candidates = torch.unique(graph.col[torch.cat([torch.arange(graph.rowptr[v], graph.rowptr[v + 1])
                                                   for v in out.n_id[50:50 + out.num_sampled_nodes[1]]])])
    assert candidates.numel() > 300
    # Edges are grouped by layer like neighbour sampling's, so PyG's trim_to_layer gives the same logits.
    model = build_model(ModelConfig(name="sage", hidden_channels=8, dropout=0.0), graph.num_features,
                        graph.num_classes, 2)
    model.eval()
    data = next(iter(BatchLoader(graph, sampler, seeds, 50, generator=torch.Generator().manual_seed(3))))
    trimmed = forward_batch(model, data)
    full = model(data.x, data.edge_index)[:50]
    assert torch.allclose(trimmed, full, atol=1e-5)


# ----------------------------------------------------------------------------- edge budgets


def test_expected_edges_matches_sampling_on_a_tree():
    """Without repeated nodes the estimate is exact in expectation: a random tree, 2 hops."""
    gen = torch.Generator().manual_seed(0)
    n = 4000
    parent = (torch.rand(n, generator=gen) * torch.arange(n)).long()  # node i > 0 hangs under a lower id
    ei = torch.stack([torch.arange(1, n), parent[1:]])  # child -> parent: a node's in-neighbours are its children
    g = Graph.from_edge_index(ei, n, torch.zeros(n, 1), torch.zeros(n, dtype=torch.long), torch.arange(n),
                              torch.arange(0), torch.arange(0), 1)
    cost = sub.expected_edges(g.rowptr, g.col, (3, 2))
    sampler = CSRNeighborSampler(g.rowptr, g.col, (3, 2))
    seeds = torch.arange(40)
    drawn = torch.zeros(40, dtype=torch.float64)
    for _ in range(100):
        for i in range(40):
            drawn[i] += sampler.sample(seeds[i:i + 1], gen).edge_index.size(1)
    assert torch.allclose(drawn / 100, cost[:40].double(), rtol=0.1, atol=0.2)


def test_split_by_cost_cuts_equal_cost_non_empty_batches():
    gen = torch.Generator().manual_seed(0)
    cost = torch.rand(1000, generator=gen) ** 4 * 50 + 1  # heavy-ish tail
    seeds = torch.arange(1000)
    batches = sub.split_by_cost(seeds, cost, 16)
    assert len(batches) == 16 and torch.equal(torch.cat(batches), seeds) and min(b.numel() for b in batches) >= 1
    sums = torch.stack([cost[b].sum() for b in batches])
    assert float(sums.max()) <= float(cost.sum()) / 16 + float(cost.max())
    assert len(sub.split_by_cost(seeds[:5], cost[:5], 5)) == 5
    with pytest.raises(ValueError, match="cannot cut 5 seeds into 6 non-empty batches"):
        sub.split_by_cost(seeds[:5], cost[:5], 6)


def test_partitioned_cost_estimate_equals_the_whole_graph_one_for_two_hops(graph):
    from hpcgnn.config import GraphConfig
    from hpcgnn.partition import ensure_parts, open_parts

    gcfg = GraphConfig(mode="partitioned")
    ensure_parts(SMALL, gcfg, 2)
    whole = sub.expected_edges(graph.rowptr, graph.col, (6, 4))
    deeper = sub.expected_edges(graph.rowptr, graph.col, (6, 4, 3))
    for part in range(2):
        p = open_parts(SMALL, gcfg, 2, [part])
        assert torch.allclose(sub.expected_edges_of_rows(p.rowptr, p.col, p.degree, (6, 4)), whole[p.nodes])
        # Beyond two hops the rank uses degree-weighted means: close on the whole, not node by node.
        approx = sub.expected_edges_of_rows(p.rowptr, p.col, p.degree, (6, 4, 3))
        assert float(approx.sum()) == pytest.approx(float(deeper[p.nodes].sum()), rel=0.2)


def _rank_env(rank: int, world: int) -> RankEnv:
    return RankEnv(source="single", rank=rank, local_rank=rank, world_size=world, local_world_size=world, node_rank=0,
                   num_nodes=1, hostnames=("localhost",), master_addr="127.0.0.1", master_port=0, job_id="")


def _step_edges(store, seed: int) -> list[int]:
    batches = store.train_batches(seed)
    assert len(batches) == store.steps
    gen = torch.Generator().manual_seed(seed)
    return [store.sampler.sample(b, gen).edge_index.size(1) for b in batches]


def test_edge_budget_balances_the_ranks_step_by_step():
    """Two ranks' batches (in-process): with an edge budget, each step's largest rank draws
    fewer edges over the mean rank than with fixed seed counts, at the same number of steps."""
    over = ["dataset.num_nodes=6000", "dataset.degree_exponent=2.2", "train.fanouts=[15,10]"]
    fixed = [open_store(make_config(*over, "train.batch_size=24"), _rank_env(r, 2)) for r in range(2)]
    steps = fixed[0].steps
    mean_edges = sum(_step_edges(fixed[0], 1)) / steps
    budget = make_config(*over, f"train.edge_budget={int(mean_edges * 1.2)}")
    capped = [open_store(budget, _rank_env(r, 2)) for r in range(2)]
    assert abs(capped[0].steps - steps) <= steps * 0.2 and capped[0].steps == capped[1].steps

    def imbalance(stores) -> float:
        per_rank = [_step_edges(s, 1) for s in stores]
        return sum(max(c) for c in zip(*per_rank, strict=True)) / sum(sum(c) / 2 for c in zip(*per_rank, strict=True))

    fixed_ratio, capped_ratio = imbalance(fixed), imbalance(capped)
    assert capped_ratio < 1 + (fixed_ratio - 1) * 0.6, (fixed_ratio, capped_ratio)


@pytest.mark.parametrize("overrides, message", [
    (["train.sampler=graphsaint"], r"train.sampler='graphsaint' is unknown: use one of neighbor, ladies"),
    (["train.sampler=cluster", "graph=partitioned"], r"train.sampler=cluster needs graph=replicated.*HINT"),
    (["train.edge_budget=1000", "train.sampler=saint_rw"], r"train.edge_budget=1000 applies to train.sampler=neighbor"),
    (["train.num_clusters=2", "train.clusters_per_batch=4"], r"train.num_clusters=2 is below"),
    (["train.saint_coverage=0"], r"train.saint_coverage=0.0 must be positive"),
])
def test_sampler_settings_are_checked_at_submit_time(overrides, message):
    with pytest.raises(ConfigError, match=message):
        make_config(*overrides)


# ----------------------------------------------------------------------------- training

ACCURACY = ["dataset.num_nodes=20000", "train.eval_mode=full", "metrics.tensorboard=false", "metrics.every_steps=1",
            f"dataset.root={DATA_ROOT}"]
# Subgraph samplers want subgraphs that keep a good share of the edges: larger steps, more epochs.
RUNS = {
    "neighbor": ["train.epochs=10", "train.batch_size=512"],
    "ladies": ["train.epochs=10", "train.batch_size=512"],
    "cluster": ["train.epochs=10", "train.batch_size=512"],
    "saint_node": ["train.epochs=20", "train.batch_size=2048"],
    "saint_edge": ["train.epochs=20", "train.batch_size=2048"],
    "saint_rw": ["train.epochs=20", "train.batch_size=2048"],
}
TOLERANCE = 0.05  # test accuracy (exact, layer-wise inference) within 5 points of neighbour sampling


def _train_here(tmp_path_factory, sampler: str) -> dict:
    """One rank in this process (the trainer itself); the per-rank batch of RUNS."""
    from hpcgnn.rank.trainer import Trainer

    folder = tmp_path_factory.mktemp(sampler)
    cfg = make_config(*ACCURACY, f"train.sampler={sampler}", *RUNS[sampler], run_dir=str(folder / "run"))
    return Trainer(cfg, _rank_env(0, 1), torch.device("cpu")).train()


@pytest.fixture(scope="module")
def neighbor_run(tmp_path_factory):
    return _train_here(tmp_path_factory, "neighbor")


@pytest.mark.slow
@pytest.mark.parametrize("sampler", ["ladies", "cluster", "saint_node", "saint_edge", "saint_rw"])
def test_sampler_trains_within_a_few_points_of_neighbour_sampling(tmp_path_factory, neighbor_run, sampler):
    summary = _train_here(tmp_path_factory, sampler)
    print(f"{sampler}: test accuracy {summary['test_acc']:.4f} (neighbor {neighbor_run['test_acc']:.4f}), "
          f"training {summary['train_time_s']:.1f} s")
    assert summary["sampler"] == sampler
    assert summary["test_acc"] >= neighbor_run["test_acc"] - TOLERANCE, (summary["test_acc"], neighbor_run["test_acc"])


@pytest.mark.parametrize("sampler", ["neighbor", "ladies", "cluster", "saint_node", "saint_edge", "saint_rw"])
def test_every_sampler_gives_every_rank_the_same_steps(sampler):
    """Two ranks' stores (in-process) agree on the step count, and each rank's loader yields exactly that
    many batches every epoch (a rank with one step more would hang DDP's all-reduce)."""
    cfg = make_config("dataset.num_nodes=3000", "dataset.degree_exponent=2.5", f"dataset.root={DATA_ROOT}",
                      f"train.sampler={sampler}", "train.batch_size=200", "train.prefetch=0")
    stores = [open_store(cfg, _rank_env(r, 2)) for r in range(2)]
    assert stores[0].steps == stores[1].steps > 1
    for epoch in (1, 2):
        counts = [sum(1 for _ in train_batches(s, epoch)) for s in stores]
        assert counts == [stores[0].steps] * 2, (epoch, counts)


@pytest.mark.slow
def test_a_subgraph_sampler_trains_under_ddp_with_equal_steps(tmp_path):
    """GraphSAINT's random walks under DDP: the ranks count inclusion together (a collective at setup),
    take equal steps, end with equal parameters and clear the default job's bar (measured 0.878)."""
    res = run_cli(*ACCURACY[:-1], "train.sampler=saint_rw", "train.epochs=20", "train.batch_size=1024",
                  cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    summary = summary_of(tmp_path)
    assert summary["sampler"] == "saint_rw" and summary["world_size"] == 2
    assert len(set(summary["param_checksums"])) == 1
    steps = [len((tmp_path / "run" / "metrics" / f"rank-{r}.jsonl").read_text().splitlines()) for r in range(2)]
    assert steps[0] == steps[1] == summary["steps_per_epoch"] * summary["epochs"]
    assert summary["test_acc"] >= ACCURACY_BAR, summary["test_acc"]


@pytest.mark.slow
@pytest.mark.parametrize("graph", [[], ["graph=partitioned"]], ids=["replicated", "partitioned"])
def test_edge_budget_trains_under_ddp_with_equal_steps(tmp_path, graph):
    res = run_cli("dataset.num_nodes=4000", "dataset.degree_exponent=2.5", "train.epochs=2", *graph,
                  "train.edge_budget=3000", "metrics.tensorboard=false", "metrics.every_steps=1", cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    summary = summary_of(tmp_path)
    assert "steps/epoch of ~3000 sampled edges per rank" in res.stdout + res.stderr
    assert summary["edge_budget"] == 3000 and summary["test_acc"] > 0.5
    records = [[json.loads(line) for line in (tmp_path / "run" / "metrics" / f"rank-{r}.jsonl").read_text().splitlines()]
               for r in range(2)]
    assert len(records[0]) == len(records[1]) == 2 * summary["steps_per_epoch"]
    assert 0 < summary["history"][-1]["balance"]["step_edges_max_over_mean"] < 1.2


@pytest.mark.parametrize("over", [["train.sampler=neighbor"], ["train.sampler=ladies"], ["train.sampler=saint_node"],
                                  ["train.sampler=saint_edge"], ["train.sampler=saint_rw"], ["train.sampler=cluster"],
                                  ["task=link"], ["dataset=synthetic_hetero", "model=rgcn"]])
def test_every_sampler_kind_is_the_samplers_protocol(over):
    """Every kind declares what the loader, the sampler processes and the servers rely on (a sampler's device, its
    sample), not probed (hpcgnn.sampling.protocol): its training sampler and its evaluation sampler alike."""
    from hpcgnn.sampling.protocol import Sampler
    from hpcgnn.tasks import open_store

    cfg = make_config(*over, "dataset.num_nodes=2000", "train.batch_size=64", f"dataset.root={DATA_ROOT}")
    store = open_store(cfg, RankEnv.from_environ({}), torch.device("cpu"))
    loader = store.eval_loader("val")
    for sampler in (store.train_sampler, loader.sampler):
        assert isinstance(sampler, Sampler) and sampler.device == torch.device("cpu"), type(sampler)


@pytest.mark.parametrize(("over", "environ", "kind"), [
    ([], {}, "InRank"), (["train.prefetch=0"], {}, "InRank"), (["train.sampler_procs=2"], {}, "SamplerPool"),
    ([], {"HPCGNN_SAMPLER_SERVERS": "127.0.0.1:29999"}, "RemotePool")], ids=["prefetch", "plain", "procs", "servers"])
def test_one_producer_is_chosen_in_sampling_from_its_settings_and_every_kind_is_the_protocol(over, environ, kind,
                                                                                           tmp_path):
    """One seam: which of the three producers makes a rank's training batches is decided in sampling/ (producers),
    from declared settings and the store's graph side, each the BatchSource protocol (start, epoch, close), the two
    outside the rank Pools too; the rank's own source walks the store's plan of an epoch (nothing is started here:
    constructing a pool spawns and connects nothing)."""
    from hpcgnn.sampling import producers
    from hpcgnn.sampling.protocol import BatchSource, Pool
    from hpcgnn.tasks import open_store

    cfg = make_config(*over, "dataset.num_nodes=2000", "train.batch_size=64", f"dataset.root={DATA_ROOT}",
                      f"run_dir={tmp_path}")
    env = RankEnv.from_environ(environ)
    store = open_store(cfg, env, torch.device("cpu"))
    settings = producers.ProducerSettings.of(cfg, env)
    source = producers.choose(settings, store.graph_side(), None, torch.device("cpu"))
    assert isinstance(source, BatchSource) and type(source).__name__ == kind
    assert isinstance(source, Pool) == (kind != "InRank")
    if kind == "InRank":
        walk = source.epoch(store.train_plan(1))
        assert type(walk).__name__ == ("PrefetchLoader" if cfg.train.prefetch else "BatchLoader")
        assert len(walk) == store.steps == len(list(walk))
