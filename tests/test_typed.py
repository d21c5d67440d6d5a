"""Typed (heterogeneous) graphs: the store, the feature rule, the homogeneous view, and typed batches
checked edge by edge, type by type, against the whole graph."""

from __future__ import annotations

import json
import os

import pytest
import torch

from hpcgnn.config import dataset_config
from hpcgnn.data.synthetic import make_synthetic_typed
from hpcgnn.data.typed import TypedGraph
from hpcgnn.sampling.typed import TypedNeighborSampler, relation_fanouts, to_hetero_data

FANOUTS = (4, 3)


@pytest.fixture(scope="module")
def graph() -> TypedGraph:
    return make_synthetic_typed(dataset_config(num_nodes=3000, avg_degree=10, homophily=0.8, seed=5))


def test_the_typed_benchmarks_reference_process_reads_the_same_graph(graph, tmp_path):
    """benchmarks/hetero.py hands PyG's process (benchmarks/pyg_hetero.py) the graph through files: what that
    process builds is the HeteroData hpcgnn's graph converts to, every tensor equal."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    try:
        from pyg_hetero import load_hetero, save_typed
    finally:
        sys.path.pop(0)
    save_typed(graph, tmp_path)
    data, target, train = load_hetero(tmp_path)
    expect = graph.to_hetero_data()
    assert target == graph.target and torch.equal(train, graph.train_idx)
    assert set(data.node_types) == set(expect.node_types) and set(data.edge_types) == set(expect.edge_types)
    for t in expect.node_types:
        assert torch.equal(data[t].x, expect[t].x) and data[t].num_nodes == expect[t].num_nodes
    assert torch.equal(data[target].y, expect[target].y)
    for rel in expect.edge_types:
        assert torch.equal(data[rel].edge_index, expect[rel].edge_index)


def test_relations_are_reversed_and_features_follow_the_rule(graph):
    rels = set(graph.relations)
    assert ("author", "writes", "paper") in rels and ("paper", "rev_writes", "author") in rels
    assert ("paper", "cites", "paper") in rels and not any(r[1] == "rev_cites" for r in rels)  # made undirected
    cites = graph.edge_index(("paper", "cites", "paper"))
    pairs = set(map(tuple, cites.t().tolist()))
    assert all((d, s) in pairs for s, d in list(pairs)[:500])
    w, rw = graph.edge_index(("author", "writes", "paper")), graph.edge_index(("paper", "rev_writes", "author"))
    assert set(map(tuple, w.t().tolist())) == set(map(tuple, rw.flip(0).t().tolist()))
    # An author's features: the mean of the papers it wrote.
    a = int(rw[1, 0])
    papers = rw[0, rw[1] == a]
    assert torch.allclose(graph.x["author"][a], graph.x["paper"][papers].mean(0), atol=1e-6)
    assert graph.feature_rule == {"paper": "given", "author": "mean over paper__rev_writes__author",
                                  "field": "mean over paper__has_topic__field"}


def test_the_homogeneous_view_holds_every_edge_once(graph):
    h, off = graph.homogeneous(), graph.offsets()
    assert h.num_nodes == sum(graph.num_nodes.values()) and h.num_edges == graph.num_edges()
    rel = ("author", "writes", "paper")
    ei = graph.edge_index(rel)[:, :50]
    whole = set(map(tuple, h.edge_index().t().tolist()))
    assert all((s + off["author"], d + off["paper"]) in whole for s, d in ei.t().tolist())
    t0 = off["paper"]
    assert torch.equal(h.y[t0 + graph.train_idx], graph.y[graph.train_idx]) and bool((h.y[: t0] == -1).all())


def check_typed_batch(graph: TypedGraph, data, seeds: torch.Tensor, fanouts=FANOUTS) -> None:
    """Every invariant of a typed batch, against the whole graph."""
    t = graph.target
    assert data[t].batch_size == seeds.numel() and torch.equal(data[t].n_id[: seeds.numel()], seeds)
    for nt in graph.node_types:
        ids = data[nt].n_id
        assert torch.unique(ids).numel() == ids.numel()  # each node once per type
        assert sum(data.num_sampled_nodes_dict[nt]) == ids.numel()
        assert torch.equal(data[nt].x, graph.x[nt][ids])
    assert torch.equal(data[t].y, graph.y[seeds])  # the seeds' labels
    node_start = {nt: torch.cumsum(torch.tensor([0, *data.num_sampled_nodes_dict[nt]]), 0)
                  for nt in graph.node_types}
    for rel in graph.relations:
        s, _, d = rel
        ei = data[rel].edge_index
        assert sum(data.num_sampled_edges_dict[rel]) == ei.size(1)
        # Every edge exists in this relation of the whole graph.
        real = set(map(tuple, graph.edge_index(rel).t().tolist()))
        got = torch.stack([data[s].n_id[ei[0]], data[d].n_id[ei[1]]])
        assert set(map(tuple, got.t().tolist())) <= real, rel
        edge_start = torch.cumsum(torch.tensor([0, *data.num_sampled_edges_dict[rel]]), 0)
        deg = graph.degree(rel)
        for hop, fanout in enumerate(fanouts):
            e = ei[:, edge_start[hop]:edge_start[hop + 1]]
            lo, hi = node_start[d][hop], node_start[d][hop + 1]
            assert bool(((e[1] >= lo) & (e[1] < hi)).all())  # targets: the nodes new at the hop before
            counts = torch.bincount(e[1] - lo, minlength=int(hi - lo))
            assert torch.equal(counts, deg[data[d].n_id[lo:hi]].clamp(max=fanout)), (rel, hop)
            assert bool((e[0] < node_start[s][hop + 2]).all())  # sources known by the next hop
            pairs = e[0] * (data[d].n_id.numel() + 1) + e[1]
            assert torch.unique(pairs).numel() == pairs.numel()  # no neighbour twice per target


def test_typed_batches_are_valid_subgraphs_type_by_type(graph):
    sampler = TypedNeighborSampler(graph, FANOUTS)
    gen = torch.Generator().manual_seed(0)
    for seeds in graph.train_idx[torch.randperm(graph.train_idx.numel(), generator=gen)].split(97)[:6]:
        check_typed_batch(graph, to_hetero_data(graph, sampler.sample(seeds, gen)), seeds)


def test_typed_sampling_is_deterministic_and_leaves_no_state(graph):
    sampler = TypedNeighborSampler(graph, FANOUTS)
    seeds = graph.train_idx[:64]
    a = sampler.sample(seeds, torch.Generator().manual_seed(3))
    b = sampler.sample(seeds, torch.Generator().manual_seed(3))
    assert all(torch.equal(a.n_id[t], b.n_id[t]) for t in graph.node_types)
    assert all(torch.equal(a.edge_index[r], b.edge_index[r]) for r in graph.relations)
    assert all(bool((m.get(torch.arange(graph.num_nodes[t])) == -1).all()) for t, m in sampler._local.items())
    lean = TypedNeighborSampler(graph, FANOUTS, id_map="batch")  # a partitioned rank's maps: the batch's size
    c = lean.sample(seeds, torch.Generator().manual_seed(3))
    assert all(torch.equal(a.n_id[t], c.n_id[t]) for t in graph.node_types)
    assert all(torch.equal(a.edge_index[r], c.edge_index[r]) for r in graph.relations)
    assert all(len(m) == 0 for m in lean._local.values())
    with pytest.raises(ValueError, match="seeds must be distinct"):
        sampler.sample(torch.tensor([1, 1]))


def test_typed_batches_ahead_are_the_plain_loaders(graph):
    """PrefetchLoader samples a typed host graph in one thread and gathers in another: the same batches."""
    from hpcgnn.sampling import BatchLoader, PrefetchLoader

    def loader():
        return BatchLoader(graph, TypedNeighborSampler(graph, FANOUTS), graph.train_idx, 97, batch_seed=5)

    assert loader().two_stage
    plain, ahead = list(loader()), list(PrefetchLoader(loader(), 2))
    assert len(plain) == len(ahead) > 2
    for a, b in zip(ahead, plain, strict=True):
        assert all(torch.equal(a[t].n_id, b[t].n_id) and torch.equal(a[t].x, b[t].x) for t in graph.node_types)
        assert all(torch.equal(a[r].edge_index, b[r].edge_index) for r in graph.relations)
        assert torch.equal(a[graph.target].y, b[graph.target].y)


def test_fanouts_per_relation():
    rels = [("a", "r", "b"), ("b", "s", "a")]
    assert relation_fanouts(rels, [5, 3]) == {rels[0]: (5, 3), rels[1]: (5, 3)}
    assert relation_fanouts(rels, {"a__r__b": [5, 3], rels[1]: [0, 2]})[rels[1]] == (0, 2)
    with pytest.raises(ValueError, match="no fanouts for relation b__s__a"):
        relation_fanouts(rels, {"a__r__b": [5, 3]})
    with pytest.raises(ValueError, match="same number of hops"):
        relation_fanouts(rels, {"a__r__b": [5, 3], "b__s__a": [1]})


def test_a_relation_with_fanout_zero_is_not_sampled(graph):
    fan = {r: ([0, 0] if r[1] == "cites" else [4, 3]) for r in graph.relations}
    out = TypedNeighborSampler(graph, fan).sample(graph.train_idx[:50], torch.Generator().manual_seed(1))
    assert out.edge_index[("paper", "cites", "paper")].size(1) == 0
    assert out.edge_index[("author", "writes", "paper")].size(1) > 0


# ----------------------------------------------------------------------------- training on the typed default

TYPED = ["dataset=synthetic_hetero", "train.epochs=3", "metrics.tensorboard=false"]


@pytest.fixture(scope="module")
def typed_runs(tmp_path_factory) -> dict:
    """The relational model under DDP (2 ranks, the CLI), and its baselines in this process (one rank, the
    same global batch): an MLP on the papers' features and GraphSAGE on the graph with types erased."""
    from conftest import DATA_ROOT, make_config, run_cli, summary_of

    from hpcgnn.env import RankEnv
    from hpcgnn.rank.trainer import Trainer

    runs = {}
    for name, over in (("rgcn", []), ("rgcn_partitioned", ["graph=partitioned", "graph.cache_mb=0.5"])):
        folder = tmp_path_factory.mktemp(f"typed-{name}")
        res = run_cli(*TYPED, "model=rgcn", "metrics.every_steps=1", *over, cwd=folder, timeout=600)
        assert res.returncode == 0, res.stdout + res.stderr
        runs[name], runs[f"{name}_folder"] = summary_of(folder), folder
    batch = runs["rgcn"]["global_batch"]
    for name, over in (("mlp", ["model=mlp"]), ("erased", ["model=sage", "dataset.erase_types=true"])):
        cfg = make_config(*TYPED, *over, f"train.batch_size={batch}", f"dataset.root={DATA_ROOT}",
                          run_dir=str(tmp_path_factory.mktemp(f"typed-{name}") / "run"))
        runs[name] = Trainer(cfg, RankEnv.from_environ({}), torch.device("cpu")).train()
    return runs


@pytest.mark.slow
def test_the_relational_model_beats_an_mlp_and_types_erased(typed_runs):
    """Measured (3 epochs): R-GCN 0.979 (2 ranks), MLP 0.61, GraphSAGE with types erased 0.65; bars below."""
    rgcn, mlp, erased = typed_runs["rgcn"], typed_runs["mlp"], typed_runs["erased"]
    assert rgcn["world_size"] == 2 and len(set(rgcn["param_checksums"])) == 1 and rgcn["model"] == "rgcn"
    steps = [len((typed_runs["rgcn_folder"] / "run" / "metrics" / f"rank-{r}.jsonl").read_text().splitlines())
             for r in range(2)]
    assert steps[0] == steps[1] == rgcn["steps_per_epoch"] * rgcn["epochs"]
    rec = json.loads((typed_runs["rgcn_folder"] / "run" / "metrics" / "rank-0.jsonl").read_text().splitlines()[0])
    assert set(rec["nodes_by_type"]) == {"paper", "author", "field"} and rec["nodes_by_type"]["paper"] >= rec["seeds"]
    assert sum(rec["nodes_by_type"].values()) == rec["nodes"] and sum(rec["edges_by_relation"].values()) == rec["edges"]
    assert rgcn["test_acc"] >= 0.9, rgcn["test_acc"]
    assert rgcn["test_acc"] - mlp["test_acc"] >= 0.2, (rgcn["test_acc"], mlp["test_acc"])
    assert rgcn["test_acc"] - erased["test_acc"] >= 0.2, (rgcn["test_acc"], erased["test_acc"])


@pytest.mark.parametrize("name", ["rgcn", "mlp"])
def test_typed_layerwise_inference_is_the_full_graph_forward(graph, name):
    """Exact evaluation (train.eval_mode=full): layer by layer, in chunks, every type the next layer reads;
    equal to one forward over the whole graph."""
    from hpcgnn.config import ModelConfig
    from hpcgnn.models import build_typed_model
    from hpcgnn.stores.exact import WholeTypedPieces, exact_outputs

    torch.manual_seed(0)
    model = build_typed_model(ModelConfig(name=name, hidden_channels=16), graph.node_types, graph.relations,
                              graph.target, graph.num_features, graph.num_classes, 2).eval()
    whole = graph.to_hetero_data()
    with torch.no_grad():
        want = model(whole.x_dict, whole.edge_index_dict)
    got = exact_outputs(model, WholeTypedPieces(graph, torch.device("cpu"), 700, 0, 1))  # chunks of 700 nodes
    assert got.shape == (graph.num_nodes["paper"], graph.num_classes)
    assert torch.allclose(got, want, atol=1e-5), (got - want).abs().max()


# ----------------------------------------------------------------------------- partitioned typed graphs


def _typed_dataset(num_nodes: int = 3000):
    from conftest import DATA_ROOT

    return dataset_config(name="synthetic_hetero", num_nodes=num_nodes, avg_degree=20, homophily=0.8,
                         root=str(DATA_ROOT))


@pytest.mark.parametrize("method, num_parts", [("metis", 2), ("metis", 4), ("lp", 2), ("random", 3)])
def test_typed_parts_balance_every_type_and_hold_each_relation(method, num_parts):
    """The homogeneous view partitioned with each node type balanced (and the training papers); each part
    holds, per relation, its own nodes' in-edges; ranks holding several parts see them concatenated."""
    from hpcgnn.config import GraphConfig
    from hpcgnn.data import open_typed, prepare
    from hpcgnn.partition import ensure_parts, format_report, open_parts

    ds = _typed_dataset()
    prepare(ds)
    graph = open_typed(ds)
    folder, meta, _ = ensure_parts(ds, GraphConfig(mode="partitioned", method=method), num_parts)
    report = meta["report"]
    assert meta["typed"]["target"] == "paper" and set(report["nodes_by_type"]) == {"paper", "author", "field"}
    for t, counts in [*report["nodes_by_type"].items(), ("train", report["train_nodes"])]:
        # 3% over the mean at most (+1 per group: training papers and the others): METIS alone was 14% over
        assert max(counts) <= 1.03 * sum(counts) / num_parts + 2, (t, counts)
    assert all(sum(report["nodes_by_type"][t]) == n for t, n in graph.num_nodes.items())
    if method == "metis":
        assert report["edge_cut_fraction"] < 0.45 if num_parts == 2 else 0.65  # random: 1/2 and 3/4
    assert "balance max/mean by node type: paper" in format_report(meta)
    off = graph.offsets()
    owned = list(range(num_parts))[-2:]  # the last two parts on one rank: concatenated CSRs
    parts = open_parts(ds, GraphConfig(mode="partitioned", method=method), num_parts, owned)
    typed = parts.typed
    for rel in graph.relations:
        t = rel[2]
        ids = parts.nodes[(parts.nodes >= off[t]) & (parts.nodes < off[t] + graph.num_nodes[t])]
        rows = typed.type_base[t][parts.node_part[ids].long()] + parts.node_local[ids].long()
        assert torch.equal(rows, torch.arange(ids.numel()))  # rows part by part, in id order
        local = ids - off[t]
        deg = graph.degree(rel)[local]
        assert torch.equal(typed.rowptr[rel][1:] - typed.rowptr[rel][:-1], deg), rel
        whole = torch.cat([graph.col[rel][graph.rowptr[rel][v]:graph.rowptr[rel][v + 1]] for v in local[:200].tolist()])
        assert torch.equal(typed.col[rel][: whole.numel()], whole), rel


def _typed_sample_worker(rank: int, world: int, port: int, cfg, folder: str) -> None:
    from conftest import local_rank_env, train_batches

    from hpcgnn.dist import process_group
    from hpcgnn.tasks import open_store

    torch.set_num_threads(1)
    env = local_rank_env(rank, world, port)
    with process_group(env, cfg.dist, torch.device("cpu")):
        store = open_store(cfg, env)
        before = store.counters()
        batches = list(train_batches(store, 1))  # every rank walks the same steps (the exchanges are collective)
        stats = (store.counters() - before).per_batch()
        torch.save({"batches": batches[:3] + batches[-1:], "stats": stats, "owned": store.parts.nodes,
                    "steps": len(batches), "kind": type(store).__name__, "cached": store.cache.cache_ids},
                   f"{folder}/rank{rank}.pt")


@pytest.mark.slow
def test_partitioned_typed_batches_are_the_whole_graphs_edges_type_by_type(tmp_path):
    """Two gloo ranks holding two METIS parts each (frequency cache): every batch checked edge by edge, type by
    type, against the whole typed graph; features and labels equal the whole graph's; seeds owned."""
    import torch.multiprocessing as mp
    from conftest import DATA_ROOT, make_config

    from hpcgnn.data import open_typed
    from hpcgnn.partition import ensure_parts
    from hpcgnn.submit.local import free_port

    cfg = make_config("dataset=synthetic_hetero", "dataset.num_nodes=3000", "model=rgcn", "graph=partitioned",
                      "graph.num_parts=4", "graph.cache_mb=0.5", "graph.cache_policy=frequency",
                      "train.fanouts=[4,3]", "train.batch_size=128", f"dataset.root={DATA_ROOT}")
    ensure_parts(cfg.dataset, cfg.graph, 4)
    graph = open_typed(cfg.dataset)
    port = free_port(23000 + os.getpid() % 5000, 20000, 32767)
    mp.start_processes(_typed_sample_worker, args=(2, port, cfg, str(tmp_path)), nprocs=2, start_method="spawn")
    results = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2)]
    assert results[0]["steps"] == results[1]["steps"] and results[0]["kind"] == "PartitionedStore"
    off = graph.offsets()["paper"]
    for res in results:
        owned = set(res["owned"].tolist())
        for data in res["batches"]:
            seeds = data["paper"].n_id[: data["paper"].batch_size]
            assert set((seeds + off).tolist()) <= owned  # seeds come from the rank's own parts
            check_typed_batch(graph, data, seeds, (4, 3))
            remote = data.remote_rows_by_type
            assert set(remote) == {"paper", "author", "field"} and remote["paper"] > 0
        stats = res["stats"]
        assert stats["remote_rows_per_batch"] > 0 and stats["sample_requests_per_batch"] > 0
        assert 0 < stats["cache_hit_rate"] < 1 and res["cached"].numel() > 0


@pytest.mark.slow
def test_exact_partitioned_typed_inference_equals_the_whole_graphs(tmp_path):
    """train.eval_mode=full on typed parts: 2 gloo ranks holding 2 parts each compute their own nodes of every
    type layer by layer, fetching each type's halo; the target type's logits equal layer-wise inference on
    the whole typed graph, and the task's accuracies the whole graph's."""
    import torch.multiprocessing as mp
    from conftest import DATA_ROOT, check_exact_inference, exact_inference_worker, make_config

    from hpcgnn.config import ModelConfig
    from hpcgnn.data import open_typed
    from hpcgnn.models import build_typed_model
    from hpcgnn.partition import ensure_parts
    from hpcgnn.stores.exact import WholeTypedPieces, exact_outputs
    from hpcgnn.submit.local import free_port

    cfg = make_config("dataset=synthetic_hetero", "dataset.num_nodes=3000", "model=rgcn", "graph=partitioned",
                      "graph.num_parts=4", "train.eval_mode=full", "train.fanouts=[4,3]", f"dataset.root={DATA_ROOT}")
    ensure_parts(cfg.dataset, cfg.graph, 4)
    graph = open_typed(cfg.dataset)
    port = free_port(23000 + os.getpid() % 5000, 20000, 32767)
    mp.start_processes(exact_inference_worker, args=(2, port, cfg, str(tmp_path), ("rgcn", "mlp")), nprocs=2,
                       start_method="spawn")
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(2)]
    assert sorted(torch.cat([r["nodes"] for r in ranks]).tolist()) == list(range(graph.num_nodes["paper"]))
    for name in ("rgcn", "mlp"):
        torch.manual_seed(0)
        model = build_typed_model(ModelConfig(name=name, hidden_channels=16), graph.node_types, graph.relations,
                                  graph.target, graph.num_features, graph.num_classes, 2)
        whole = exact_outputs(model, WholeTypedPieces(graph, torch.device("cpu"), 1000, 0, 1))
        check_exact_inference(ranks, name, whole, graph.y, {"val": graph.val_idx, "test": graph.test_idx})


@pytest.mark.slow
def test_partitioned_typed_training_is_within_a_point_of_replicated(typed_runs):
    """Two METIS parts (one per rank, every type balanced), the same seed and settings as the replicated run."""
    part, rep = typed_runs["rgcn_partitioned"], typed_runs["rgcn"]
    assert part["graph_mode"] == "partitioned" and rep["graph_mode"] == "replicated"
    assert abs(part["test_acc"] - rep["test_acc"]) <= 0.01, (part["test_acc"], rep["test_acc"])
    assert len(set(part["param_checksums"])) == 1 and part["steps_per_epoch"] > 0
    last = part["history"][-1]
    assert last["remote_rows_per_batch"] > 0 and 0 < last["cache_hit_rate"] < 1
    assert max(part["resident_graph_bytes"]) < rep["resident_graph_bytes"][0]
    rec = json.loads((typed_runs["rgcn_partitioned_folder"] / "run" / "metrics" / "rank-0.jsonl").read_text()
                     .splitlines()[0])
    assert set(rec["remote_rows_by_type"]) == {"paper", "author", "field"} and rec["remote_rows_by_type"]["paper"] > 0


@pytest.mark.slow
def test_typed_training_resumes_bitwise(tmp_path, cpu_kind):
    """One rank in this process, GraphSAGE through to_hetero, preempted mid-epoch and resumed."""
    from conftest import DATA_ROOT, make_config

    from hpcgnn.env import RankEnv
    from hpcgnn.rank.checkpoint import Preempted
    from hpcgnn.rank.trainer import Trainer

    over = ["dataset=synthetic_hetero", "dataset.num_nodes=3000", "train.epochs=2", "train.batch_size=256",
            "model=sage", "model.hidden_channels=32", f"dataset.root={DATA_ROOT}", "metrics.tensorboard=false"]
    single, cpu = RankEnv.from_environ({}), torch.device("cpu")
    whole = Trainer(make_config(*over, run_dir=str(tmp_path / "whole")), single, cpu).train()
    cut = make_config(*over, "debug.signal_rank=0", f"debug.signal_step={whole['steps_per_epoch'] + 1}",
                      run_dir=str(tmp_path / "cut"))
    with pytest.raises(Preempted):
        Trainer(cut, single, cpu).train()
    again = Trainer(cut, single, cpu).train()
    assert again["resumes"] == 1 and again["param_checksums"] == whole["param_checksums"]
    assert again["precision"] == cpu_kind


@pytest.mark.slow
def test_typed_training_with_exact_evaluation(tmp_path):
    from conftest import DATA_ROOT, make_config

    from hpcgnn.env import RankEnv
    from hpcgnn.rank.trainer import Trainer

    cfg = make_config("dataset=synthetic_hetero", "dataset.num_nodes=3000", "train.epochs=3", "train.batch_size=256",
                      "model=rgcn", "train.eval_mode=full", f"dataset.root={DATA_ROOT}", "metrics.tensorboard=false",
                      run_dir=str(tmp_path / "run"))
    out = Trainer(cfg, RankEnv.from_environ({}), torch.device("cpu")).train()
    assert out["eval_mode"] == "full" and out["test_acc"] >= 0.8, out["test_acc"]


def test_prepared_typed_graph_maps_back_the_same(tmp_path):
    """Prepared once into the cache (the homogeneous view plus each relation's CSR), mapped back equal."""
    from hpcgnn.data import open_typed, prepare

    cfg = dataset_config(name="synthetic_hetero", num_nodes=1500, avg_degree=8, homophily=0.8, root=str(tmp_path))
    prepare(cfg)
    a, b = make_synthetic_typed(cfg), open_typed(cfg)
    assert a.num_nodes == b.num_nodes and a.relations == b.relations and a.feature_rule == b.feature_rule
    assert all(torch.equal(a.rowptr[r], b.rowptr[r]) and torch.equal(a.col[r], b.col[r]) for r in a.relations)
    assert all(torch.equal(a.x[t], b.x[t]) for t in a.node_types)
    assert torch.equal(a.y, b.y) and torch.equal(a.train_idx, b.train_idx) and torch.equal(a.test_idx, b.test_idx)


@pytest.mark.parametrize("overrides, message", [
    (["dataset=synthetic_hetero", "model=gcn"], r"dataset=synthetic_hetero is a typed graph: model=gcn reads one node "
                                                 r"and edge type\. HINT: use model=rgcn"),
    (["dataset=synthetic_hetero", "model=sage", "train.eval_mode=full"], r"train.eval_mode=full needs "
                                                                         r"model mlp, rgcn on a typed graph; got model=sage"),
    (["model=rgcn"], r"model=rgcn needs a typed graph \(e.g. dataset=synthetic_hetero\)"),
    (["dataset=synthetic_hetero", "dataset.erase_types=true", "model=rgcn"], r"model=rgcn needs a typed graph"),
])
def test_typed_settings_are_checked_at_submit_time(overrides, message):
    from conftest import make_config

    from hpcgnn.errors import ConfigError

    with pytest.raises(ConfigError, match=message):
        make_config(*overrides)


def test_relation_fanouts_override_train_fanouts_per_relation():
    from conftest import DATA_ROOT, make_config, train_batches

    from hpcgnn.env import RankEnv
    from hpcgnn.errors import ConfigError
    from hpcgnn.tasks import open_store

    base = ["dataset=synthetic_hetero", "dataset.num_nodes=1500", "model=rgcn", f"dataset.root={DATA_ROOT}"]
    store = open_store(make_config(*base, "+train.relation_fanouts.paper__cites__paper=[0,0]"), RankEnv.from_environ({}))
    assert store.sampler.fanouts[("paper", "cites", "paper")] == (0, 0)
    assert store.sampler.fanouts[("author", "writes", "paper")] == (10, 5)  # train.fanouts
    batch = next(iter(train_batches(store, 1)))
    assert batch["paper", "cites", "paper"].edge_index.size(1) == 0 and batch["author", "writes", "paper"].num_edges
    with pytest.raises(ConfigError, match=r"train.relation_fanouts names paper__quotes__paper, not a relation of "
                                          r"synthetic_hetero\. HINT: use paper__cites__paper"):
        open_store(make_config(*base, "+train.relation_fanouts.paper__quotes__paper=[1,1]"), RankEnv.from_environ({}))


def write_mini_mag(root) -> dict:
    """A miniature of ogbn-mag in OGB's raw heterogeneous layout (what the download unpacks), written
    here: ogb.io's readers and the official split files, never a download."""
    import gzip

    import numpy as np

    folder = root / "ogb" / "ogbn_mag"
    raw, split = folder / "raw", folder / "split" / "time" / "paper"

    def csv(path, rows, header=None):
        path.parent.mkdir(parents=True, exist_ok=True)
        with gzip.open(path, "wt") as f:
            if header:
                f.write(",".join(header) + "\n")
            for row in rows:
                f.write(",".join(str(v) for v in (row if isinstance(row, (list, tuple, np.ndarray)) else [row])) + "\n")

    rng = np.random.default_rng(0)
    n = {"author": 40, "field_of_study": 6, "institution": 3, "paper": 60}
    rels = {("author", "affiliated_with", "institution"): (rng.integers(0, 40, 50), rng.integers(0, 3, 50)),
            ("author", "writes", "paper"): (rng.integers(0, 40, 120), rng.integers(0, 60, 120)),
            ("paper", "cites", "paper"): (rng.integers(0, 60, 150), rng.integers(0, 60, 150)),
            ("paper", "has_topic", "field_of_study"): (rng.integers(0, 60, 90), rng.integers(0, 6, 90))}
    csv(raw / "num-node-dict.csv.gz", [[n[t] for t in n]], header=list(n))
    csv(raw / "triplet-type-list.csv.gz", [list(r) for r in rels])
    for rel, (s, d) in rels.items():
        sub = raw / "relations" / "___".join(rel)
        csv(sub / "edge.csv.gz", np.stack([s, d], 1))
        csv(sub / "num-edge-list.csv.gz", [len(s)])
    x = rng.normal(size=(60, 8)).round(4)
    y = rng.integers(0, 349, 60)
    csv(raw / "node-feat" / "paper" / "node-feat.csv.gz", x)
    csv(raw / "node-label" / "paper" / "node-label.csv.gz", y)
    csv(raw / "nodetype-has-label.csv.gz", [[t == "paper" for t in n]], header=list(n))
    csv(folder / "split" / "time" / "nodetype-has-split.csv.gz", [[t == "paper" for t in n]], header=list(n))
    for part, ids in (("train", range(0, 40)), ("valid", range(40, 50)), ("test", range(50, 60))):
        csv(split / f"{part}.csv.gz", list(ids))
    return {"n": n, "rels": rels, "x": x, "y": y}


def test_ogbn_mag_is_read_by_ogbs_own_readers(tmp_path):
    """A miniature in OGB's raw layout, read through ogb.io: types, relations (with reverses), the
    feature rule for the three featureless types, labels and the official split; prepared and mapped."""
    from hpcgnn.data import open_typed, prepare

    mini = write_mini_mag(tmp_path)
    cfg = dataset_config(name="ogbn-mag", root=str(tmp_path))
    prepare(cfg)
    g = open_typed(cfg)
    assert g.num_nodes == mini["n"] and g.target == "paper" and g.num_classes == 349
    assert torch.equal(g.x["paper"], torch.tensor(mini["x"], dtype=torch.float32))
    assert torch.equal(g.y, torch.from_numpy(mini["y"])) and torch.equal(g.train_idx, torch.arange(40))
    assert torch.equal(g.test_idx, torch.arange(50, 60))
    s, d = mini["rels"][("author", "writes", "paper")]
    want = set(zip(s.tolist(), d.tolist(), strict=True))
    assert set(map(tuple, g.edge_index(("author", "writes", "paper")).t().tolist())) == want
    assert set(map(tuple, g.edge_index(("paper", "rev_writes", "author")).flip(0).t().tolist())) == want
    assert g.feature_rule["institution"] == "mean over author__affiliated_with__institution"
    # An author's features: the mean of its papers'; an institution's: the mean of its authors'.
    a = int(s[0])
    papers = sorted({p for u, p in want if u == a})
    assert torch.allclose(g.x["author"][a], torch.tensor(mini["x"][papers].mean(0), dtype=torch.float32), atol=1e-5)
    si, di = mini["rels"][("author", "affiliated_with", "institution")]
    inst = int(di[0])
    members = sorted({u for u, i in zip(si.tolist(), di.tolist(), strict=True) if i == inst})
    assert torch.allclose(g.x["institution"][inst], g.x["author"][members].mean(0), atol=1e-5)
    batch = TypedNeighborSampler(g, (3, 2)).sample(g.train_idx[:8], torch.Generator().manual_seed(0))
    check_typed_batch(g, to_hetero_data(g, batch), g.train_idx[:8], (3, 2))


# ----------------------------------------------------------------------------- a typed graph from files


def write_typed_folder(folder, graph: TypedGraph) -> None:
    """``graph``'s given relations (no reverses) and the papers' features in the typed files layout;
    authors and fields without features (one with num_nodes.npy, one as a .pt tensor)."""
    import numpy as np

    for t, n in graph.num_nodes.items():
        (folder / "nodes" / t).mkdir(parents=True)
        if t == graph.target:
            np.save(folder / "nodes" / t / "x.npy", graph.x[t].numpy())
            for name in ("y", "train_idx", "val_idx", "test_idx"):
                np.save(folder / "nodes" / t / f"{name}.npy", getattr(graph, name).numpy())
        elif t == "author":
            np.save(folder / "nodes" / t / "num_nodes.npy", np.array(n))
        else:
            torch.save(torch.tensor([n]), folder / "nodes" / t / "num_nodes.pt")
    for rel in graph.relations:
        if rel[1].startswith("rev_") or (rel[0] == rel[2] and rel[1] == "cites"):
            continue
        (folder / "edges" / "__".join(rel)).mkdir(parents=True)
        np.save(folder / "edges" / "__".join(rel) / "edge_index.npy", graph.edge_index(rel).numpy())
    cites = graph.edge_index(("paper", "cites", "paper"))
    (folder / "edges" / "paper__cites__paper").mkdir(parents=True)
    np.save(folder / "edges" / "paper__cites__paper" / "edge_index.npy", cites[:, cites[0] < cites[1]].numpy())


def test_a_typed_folder_reads_back_as_the_same_graph(tmp_path, graph):
    """Relations given once are reversed; featureless types take the mean along the relation with the most
    edges into them from a featured type; prepared, mapped, and served as typed (or erased) by config."""
    from conftest import make_config, train_batches

    from hpcgnn.checks import is_typed
    from hpcgnn.data import open_typed, prepare
    from hpcgnn.data.files import load_typed_files

    write_typed_folder(tmp_path / "g", graph)
    cfg = dataset_config(name="files", path=str(tmp_path / "g"), root=str(tmp_path / "root"))
    assert is_typed(cfg)
    got = load_typed_files(cfg)
    assert got.num_nodes == {t: graph.num_nodes[t] for t in sorted(graph.num_nodes)} and got.target == "paper"
    assert set(got.relations) == set(graph.relations)
    for rel in graph.relations:
        assert torch.equal(got.rowptr[rel], graph.rowptr[rel]) and torch.equal(got.col[rel], graph.col[rel]), rel
    assert got.feature_rule == graph.feature_rule  # the same relations the generator named
    assert all(torch.allclose(got.x[t], graph.x[t], atol=1e-6) for t in graph.node_types)
    prepare(cfg)
    mapped = open_typed(cfg)
    assert torch.equal(mapped.y, graph.y) and torch.equal(mapped.train_idx, graph.train_idx)
    store_cfg = make_config("dataset=files", f"dataset.path={tmp_path / 'g'}", "model=rgcn",
                            f"dataset.root={tmp_path / 'root'}")
    from hpcgnn.env import RankEnv
    from hpcgnn.tasks import open_store

    store = open_store(store_cfg, RankEnv.from_environ({}))
    batch = next(iter(train_batches(store, 1)))
    check_typed_batch(mapped, batch, batch["paper"].n_id[: batch["paper"].batch_size], (10, 5))
    erased = make_config("dataset=files", f"dataset.path={tmp_path / 'g'}", "dataset.erase_types=true",
                         f"dataset.root={tmp_path / 'root'}")
    from hpcgnn.data import build_graph

    h = build_graph(erased.dataset)
    assert h.num_nodes == sum(graph.num_nodes.values()) and h.num_edges == graph.num_edges()


@pytest.mark.parametrize("damage, message", [
    (lambda f: (f / "nodes" / "author" / "num_nodes.npy").unlink(), r"nodes/author: x.npy \(features\) or "
                                                                     r"num_nodes.npy .* is missing"),
    (lambda f: (f / "edges" / "author__writes__paper").rename(f / "edges" / "writer__writes__paper"),
     r"edges/writer__writes__paper: a relation's folder is named <source type>__<name>__<target type>"),
    (lambda f: __import__("numpy").save(f / "edges" / "author__writes__paper" / "edge_index.npy",
                                        __import__("numpy").array([[0, 10**6], [0, 1]])),
     r"author__writes__paper/edge_index.npy: source ids must lie in \[0, \d+\) \(the author and paper counts\)"),
    (lambda f: __import__("numpy").save(f / "nodes" / "field" / "y.npy", __import__("numpy").zeros(3, dtype=int)),
     r"exactly one node type has labels .* found \['field', 'paper'\]"),
])
def test_typed_folder_errors_name_the_file(tmp_path, graph, damage, message):
    from hpcgnn.data.files import DatasetFileError, load_typed_files

    write_typed_folder(tmp_path / "g", graph)
    damage(tmp_path / "g")
    with pytest.raises(DatasetFileError, match=message):
        load_typed_files(dataset_config(name="files", path=str(tmp_path / "g")))


@pytest.mark.parametrize("source", ["synthetic_hetero", "ogbn-mag", "files", "pyg_hetero"])
@pytest.mark.parametrize("erase_types", [False, True])
def test_typed_graph_is_prepared_out_of_core_into_the_graph_built_in_memory(tmp_path, monkeypatch, graph, source,
                                                                            erase_types):
    """Drawn in several chunks of papers (ogbn-mag's raw csv files, a typed folder's mapped arrays: read in
    several chunks of rows), every relation (and the homogeneous view) bucketed on disk in several buckets,
    the rule types' features averaged a chunk of rows at a time (ogbn-mag's institutions from the authors'
    computed ones): the typed graph and its view are the ones built in memory, array for array (types
    erased: the view alone is kept). A PyG HeteroData (pyg_hetero) takes the same path."""
    from hpcgnn.data import (
        TYPED_LOADERS,
        build_graph,
        cache_folder,
        files,
        ogb,
        ooc,
        open_graph,
        open_typed,
        prepare,
        synthetic,
    )

    monkeypatch.setattr(synthetic, "SOURCE_CHUNK", 700)
    monkeypatch.setattr(ogb, "STREAM_ROWS", 37)
    monkeypatch.setattr(files, "STREAM_VALUES", 1000)
    monkeypatch.setattr(ooc, "MIN_BUCKET_EDGES", 30 if source == "ogbn-mag" else 300)
    if source == "ogbn-mag":
        write_mini_mag(tmp_path)
    elif source == "files":
        write_typed_folder(tmp_path / "g", graph)
    pyg = {"_target_": "torch_geometric.datasets.FakeHeteroDataset", "to_undirected": True} if source == "pyg_hetero" \
        else {}  # (PyG's: three types of different feature widths, padded to one; six relations and their reverses)
    cfg = dataset_config(name=source, num_nodes=2000, root=str(tmp_path), prepare_mem_gb=1e-5 if source == "ogbn-mag"
                        else 1e-4, erase_types=erase_types, path=str(tmp_path / "g") if source == "files" else None,
                        **pyg)
    buckets, write_csr = [], ooc.EdgeBuckets.write_csr
    monkeypatch.setattr(ooc.EdgeBuckets, "write_csr", lambda self, folder: buckets.append(self.num_buckets) or
                        write_csr(self, folder))
    prepare(cfg)
    assert max(buckets) > 1  # several buckets of one relation (or the view), sorted one at a time
    view = open_graph(cfg)
    ref = TYPED_LOADERS[source](cfg, False)
    ref_view = build_graph(cfg) if erase_types else ref.homogeneous()
    for name in ("rowptr", "col", "x", "y", "train_idx", "val_idx", "test_idx"):
        assert torch.equal(getattr(view, name).long() if name == "col" else getattr(view, name),
                           getattr(ref_view, name)), name
    files = {p.name for p in cache_folder(cfg).iterdir()}
    assert any(f.startswith(("rowptr__", "col__")) for f in files) is not erase_types
    assert not any(f.endswith(".part") for f in files) and "scratch" not in files
    if not erase_types:
        got = open_typed(cfg)
        assert got.relations == ref.relations and got.feature_rule == ref.feature_rule
        for rel in ref.relations:
            assert got.col[rel].dtype == torch.int32
            assert torch.equal(got.rowptr[rel], ref.rowptr[rel]) and torch.equal(got.col[rel].long(), ref.col[rel]), rel
        for t in ref.node_types:
            assert torch.equal(got.x[t], ref.x[t]), t


def test_a_typed_folders_link_dataset_is_prepared_out_of_core_into_the_split_made_in_memory(tmp_path, monkeypatch,
                                                                                             graph):
    """task=link on a typed folder (types erased): the homogeneous view streamed to disk, then split a few
    rows at a time, as the homogeneous sources are: the dataset the in-memory split of the view makes."""
    from hpcgnn.data import build_link, cache_folder, link, ooc, open_link, prepare

    monkeypatch.setattr(link, "SPLIT_CHUNK_EDGES", 300)
    monkeypatch.setattr(ooc, "MIN_BUCKET_EDGES", 300)
    write_typed_folder(tmp_path / "g", graph)
    cfg = dataset_config(name="files", path=str(tmp_path / "g"), root=str(tmp_path / "root"), erase_types=True,
                        prepared_for="link", prepare_mem_gb=1e-5)
    import hpcgnn.data.prepared

    in_memory = []  # (the split of the whole view in memory is the reference below, not the path)
    monkeypatch.setattr(hpcgnn.data.prepared, "build_link", lambda *a: in_memory.append(a) or build_link(*a))
    prepare(cfg)
    assert not in_memory
    got, ref = open_link(cfg), build_link(cfg)
    assert got.graph.num_nodes == sum(graph.num_nodes.values())
    for array in ("rowptr", "col", "x"):
        assert torch.equal(getattr(got.graph, array).long() if array == "col" else getattr(got.graph, array),
                           getattr(ref.graph, array)), array
    for split in ("train", "val", "test"):
        a, b = got.split(split), ref.split(split)
        assert a.pos.numel() > 0 and torch.equal(a.pos, b.pos) and a.neg_kind == b.neg_kind, split
        assert (a.neg is None and b.neg is None) or torch.equal(a.neg, b.neg), split
    assert sorted(p.name for p in cache_folder(cfg).iterdir() if not p.name.endswith(".npy")) == ["meta.json"]
