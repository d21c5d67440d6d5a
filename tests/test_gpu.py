"""The CUDA paths, run for real on a GPU (marker ``gpu``; skipped where torch sees no CUDA device).

On a GPU machine: ``python -m pytest -m gpu tests/test_gpu.py`` (benchmarks/gpu_setup.sh prepares a
machine that has a CUDA torch but no package registry). Everything here also has a CPU twin in the
other modules; these check that the same code holds on the GPU: device choice, the sampler with the
graph in GPU memory, pinned buffers and non-blocking copies on a side stream, bf16/fp16 with the
gradient scaler, CUDA-event timings and the CUDA allocator's peak, exact resume, gloo with CUDA tensors
for ranks that share a GPU, and NCCL's init path.
"""

from __future__ import annotations

import json
import math
import socket

import pytest
import torch
from conftest import ACCURACY_BAR, DATA_ROOT, TINY, make_config, run_cli, summary_of
from test_sampling import FANOUTS, check_batch

from hpcgnn.config import dataset_config
from hpcgnn.data import Graph, build_graph
from hpcgnn.sampling import BatchLoader, CSRNeighborSampler, PrefetchLoader

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

CUDA = torch.device("cuda", 0)


@pytest.fixture(scope="module")
def graph() -> Graph:
    """A small graph with two hubs (both of the sampler's paths: whole rows and Floyd subsets)."""
    base = build_graph(dataset_config(num_nodes=3000, avg_degree=8, seed=3))
    ei = base.edge_index()
    spokes = torch.arange(2, 600)
    extra = torch.cat([torch.stack([spokes, torch.zeros_like(spokes)]), torch.stack([spokes, torch.ones_like(spokes)])], 1)
    ei = torch.cat([ei, extra, extra.flip(0)], 1)
    return Graph.from_edge_index(ei, base.num_nodes, base.x, base.y, base.train_idx, base.val_idx, base.test_idx,
                                 base.num_classes)


def on_host(data):
    return data.clone().to("cpu")  # Data.to moves in place


def test_gpu_sampler_batches_keep_every_invariant(graph):
    """The graph in GPU memory: every edge exists, fanouts hold, no duplicates, seeds first, hops grouped;
    batches are made on the GPU (n_id, edges, features) and the same seed gives the same batch."""
    g = graph.to(CUDA)
    sampler = CSRNeighborSampler(g.rowptr, g.col, FANOUTS)
    seeds = torch.cat([torch.tensor([0, 1]), graph.train_idx[graph.train_idx > 1]])
    loader = BatchLoader(g, sampler, seeds, 97, batch_seed=5, device=CUDA)
    batches = list(loader)
    assert len(batches) == math.ceil(seeds.numel() / 97)
    for data in batches:
        assert data.n_id.is_cuda and data.edge_index.is_cuda and data.x.is_cuda
    again = list(BatchLoader(g, sampler, seeds, 97, batch_seed=5, device=CUDA))
    assert all(torch.equal(a.n_id, b.n_id) and torch.equal(a.edge_index, b.edge_index)
               for a, b in zip(batches, again, strict=True))
    for data, chunk in zip(batches, seeds.split(97), strict=True):
        check_batch(graph, on_host(data), chunk)


@pytest.mark.parametrize("graph_on", ["host", "device"])
def test_prefetch_on_a_side_stream_yields_the_plain_loaders_batches(graph, graph_on):
    """Host graph: gathered into pinned buffers, copied non-blocking by the prefetch thread on its own
    stream. Device graph: sampled by that thread on its stream. Either way the same batches as the
    plain loader, on the GPU, and the thread ends when the consumer leaves early."""
    import threading

    g = graph if graph_on == "host" else graph.to(CUDA)

    def loader():
        return BatchLoader(g, CSRNeighborSampler(g.rowptr, g.col, FANOUTS), graph.train_idx, 64, batch_seed=9,
                           device=CUDA, pin_memory=graph_on == "host")

    plain = [on_host(b) for b in loader()]
    for depth in (1, 3):
        ahead = []
        for b in PrefetchLoader(loader(), depth):
            assert b.x.is_cuda and b.edge_index.is_cuda
            ahead.append(on_host(b))
        assert len(ahead) == len(plain) == math.ceil(graph.train_idx.numel() / 64)
        for a, b in zip(ahead, plain, strict=True):
            assert torch.equal(a.n_id, b.n_id) and torch.equal(a.edge_index, b.edge_index)
            assert torch.equal(a.x, b.x) and torch.equal(a.y, b.y) and a.num_sampled_nodes == b.num_sampled_nodes
    for i, _ in enumerate(PrefetchLoader(loader(), 2)):
        if i == 2:
            break
    assert not any(t.name == "hpcgnn-prefetch" for t in threading.enumerate())


def test_pinned_gather_is_page_locked_and_exact(graph):
    from hpcgnn.sampling.loader import gather_rows

    idx = torch.randperm(graph.num_nodes)[:500]
    out = gather_rows(graph.x, idx, pin_memory=True)
    assert out.is_pinned() and torch.equal(out, graph.x[idx])


def single_rank(*overrides: str, run_dir) -> tuple[dict, object]:
    """The trainer in this process, one rank on the GPU, its config recorded as the launcher records it (hpcgnn
    predict composes from it); returns (summary, trainer)."""
    from hpcgnn.env import RankEnv
    from hpcgnn.rank.trainer import Trainer
    from hpcgnn.submit.launch import record_config

    full = [*overrides, f"dataset.root={DATA_ROOT}", "metrics.tensorboard=false", "train.device=cuda"]
    cfg = make_config(*full, run_dir=str(run_dir))
    record_config(cfg, full)
    trainer = Trainer(cfg, RankEnv.from_environ({}), CUDA)
    torch.cuda.reset_peak_memory_stats(CUDA)
    return trainer.train(), trainer


@pytest.mark.parametrize("graph_on,precision", [("device", "fp32"), ("host", "fp32"), ("device", "bf16"),
                                                ("device", "fp16")])
def test_single_rank_on_the_gpu_reaches_the_cpu_bar(tmp_path, graph_on, precision):
    """The default job's graph and schedule, one rank on the GPU: the same accuracy bar as on the CPU,
    with the graph sampled on the GPU or on the host (prefetch, pinned buffers), in fp32, bf16 autocast
    and fp16 with the gradient scaler; timings from CUDA events and the CUDA allocator's peak."""
    s, trainer = single_rank(f"train.graph_on={graph_on}", f"train.precision={precision}", run_dir=tmp_path / "run")
    assert s["device"] == "cuda:0" and s["graph_on"] == graph_on and s["precision"] == precision
    assert s["test_acc"] > ACCURACY_BAR, s["test_acc"]
    if precision == "fp16":
        assert trainer.scaler is not None and math.isfinite(trainer.scaler.get_scale())
    last = s["history"][-1]
    # The CUDA allocator's peak beside the host's: both recorded, the GPU's the allocator's own figure.
    assert 0 < last["peak_mem_mb"] <= torch.cuda.max_memory_allocated(CUDA) / 2**20 + 1
    assert last["host_peak_mb"] > 0
    steps = [json.loads(line) for line in (tmp_path / "run" / "metrics" / "rank-0.jsonl").read_text().splitlines()]
    assert steps and all(r["forward_s"] > 0 and r["backward_s"] > 0 and r["sample_s"] > 0 and r["h2d_s"] >= 0
                         for r in steps)


def test_resume_on_the_gpu_matches_the_whole_run(tmp_path):
    """Preempted mid-epoch and resumed on the GPU: the batches are re-made exactly (the sampler's
    generators live on the GPU), so the run ends where the uninterrupted one does, up to the
    nondeterministic order of the GPU's atomic scatter sums (measured: see docs/gpus.md)."""
    from hpcgnn.env import RankEnv
    from hpcgnn.rank.checkpoint import Preempted
    from hpcgnn.rank.trainer import Trainer

    # fp32: bf16 (auto's choice on an H100) carries the atomics' order further (measured: docs/gpus.md)
    over = [*TINY, "train.epochs=3", f"dataset.root={DATA_ROOT}", "metrics.tensorboard=false", "train.device=cuda",
            "train.precision=fp32"]
    whole = Trainer(make_config(*over, run_dir=str(tmp_path / "whole")), RankEnv.from_environ({}), CUDA)
    a = whole.train()
    cut = make_config(*over, "debug.signal_rank=0", "debug.signal_step=8", run_dir=str(tmp_path / "cut"))
    with pytest.raises(Preempted, match="preempted: checkpoint of step 8 saved in"):
        Trainer(cut, RankEnv.from_environ({}), CUDA).train()
    again = Trainer(cut, RankEnv.from_environ({}), CUDA)
    b = again.train()
    assert b["resumes"] == 1 and b["graph_on"] == "device"
    diff = max((p - q).abs().max().item() for p, q in zip(whole.model.parameters(), again.model.parameters(),
                                                          strict=True))
    scale = max(p.abs().max().item() for p in whole.model.parameters())
    loss_diff = max(abs(x["loss"] - y["loss"]) for x, y in zip(a["history"], b["history"], strict=True))
    print(f"resume on GPU: max |param diff| {diff:.3g} (max |param| {scale:.3g}), max epoch-loss diff {loss_diff:.3g}")
    assert diff <= 1e-4 * max(scale, 1.0) and loss_diff <= 1e-4


@pytest.mark.slow
@pytest.mark.parametrize("graph", [["train.eval_mode=full"], ["graph=partitioned", "graph.cache_mb=0.1"]],
                         ids=["replicated", "partitioned"])
def test_two_ranks_share_one_gpu_over_gloo(tmp_path, graph):
    """Two local ranks on the one GPU: NCCL refuses that, so auto picks gloo, which all-reduces DDP's CUDA
    gradients; partitioned ranks exchange through the host and train on CUDA batches. The replicated run
    evaluates exactly: each rank's rows, computed on the GPU, into the table the two share on the host."""
    if torch.cuda.device_count() != 1:
        pytest.skip("needs exactly one visible GPU")
    res = run_cli(*TINY, *graph, "train.epochs=5", "train.lr=0.01", "train.device=cuda", cwd=tmp_path, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    s = summary_of(tmp_path)
    assert s["world_size"] == 2 and s["backend"] == "gloo" and s["device"] == "cuda:0"
    assert len(set(s["param_checksums"])) == 1  # DDP kept the two replicas equal
    assert s["test_acc"] > 0.6  # 0.81 on the CPU with this graph and schedule (8 classes: chance is 0.125)
    assert "gloo carries the gradients" in res.stdout + res.stderr


@pytest.mark.slow
def test_batches_made_off_the_rank_train_on_the_gpu_as_the_ranks_own(tmp_path):
    """2 sampler processes, or 1 sampler server: batches land in page-locked slots and are copied to the GPU
    while the next one is made there; the run ends where the rank's own host sampling does, up to the GPU's
    summation order (fp32, the resume test's bound). A slot reused before its copy finished would not."""
    over = [*TINY, "launch.procs=1", "train.epochs=3", "train.device=cuda", "train.precision=fp32",
            "metrics.tensorboard=false"]
    producers = {"rank": (["train.graph_on=host", "train.num_threads=1"], "graph: "),
                 "procs": (["train.sampler_procs=2", "train.num_threads=3"], "2 sampler process(es) started"),
                 "servers": (["launch.sampler_servers=1", "train.num_threads=1"], "1 sampler server(s) ready")}
    runs = {}
    for name, (extra, said) in producers.items():
        res = run_cli(*over, *extra, cwd=tmp_path / name, timeout=300)
        assert res.returncode == 0, res.stdout + res.stderr
        assert said in res.stdout + res.stderr, name
        assert "could not be pinned" not in res.stdout + res.stderr
        weights = torch.load(tmp_path / name / "run" / "model" / "last.pt", weights_only=True)["state_dict"]
        runs[name] = summary_of(tmp_path / name), weights
    ref, ref_w = runs["rank"]
    scale = max(w.abs().max().item() for w in ref_w.values() if w.is_floating_point())
    for name in ("procs", "servers"):
        s, w = runs[name]
        assert s["device"] == "cuda:0" and s["graph_on"] == "host", name
        diff = max((w[k].float() - ref_w[k].float()).abs().max().item() for k in ref_w)
        loss_diff = max(abs(x["loss"] - y["loss"]) for x, y in zip(ref["history"], s["history"], strict=True))
        print(f"{name} on GPU vs the rank's own batches: max |param diff| {diff:.3g} (max |param| {scale:.3g}), "
              f"max epoch-loss diff {loss_diff:.3g}")
        assert diff <= 1e-4 * max(scale, 1.0) and loss_diff <= 1e-4, name


def test_link_prediction_on_the_gpu(tmp_path):
    """Link prediction, one rank on the GPU: positive edges and their negatives sampled on the host, the pairs
    scored there, exact layer-wise evaluation on the GPU (the default for a replicated link run); the CPU's bar."""
    s, _ = single_rank("task=link", "dataset.num_nodes=10000", run_dir=tmp_path / "run")
    assert s["device"] == "cuda:0" and s["task"] == "link" and s["eval_mode"] == "full"
    assert s["test_auc"] >= 0.82, s["test_auc"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_nccl_init_path_with_one_rank():
    """The NCCL path the trainer takes on GPU nodes, with one rank: rendezvous, device-bound init, the
    gloo control group for host values, tensor and object collectives, DDP, timeouts, teardown."""
    from torch.nn.parallel import DistributedDataParallel

    from hpcgnn import dist
    from hpcgnn.config import DistConfig
    from hpcgnn.env import RankEnv

    env = RankEnv.from_environ({"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
                                "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())})
    with dist.process_group(env, DistConfig(backend="auto", init_timeout_s=60), CUDA, always=True):
        assert dist.backend() == "nccl" and dist.comm_device() == CUDA
        assert dist.all_reduce_sum(torch.tensor([2.0])).item() == 2.0  # host value: the gloo control group
        assert dist.all_reduce_max(torch.tensor([3.0], device=CUDA)).item() == 3.0
        assert dist.all_gather_object({"a": 1}) == [{"a": 1}]
        rows = torch.arange(6.0).view(3, 2)
        assert torch.equal(dist.all_gather_rows(rows, [3]), rows)
        model = DistributedDataParallel(torch.nn.Linear(4, 2).to(CUDA), device_ids=[CUDA])
        model(torch.randn(8, 4, device=CUDA)).sum().backward()
        assert all(p.grad is not None for p in model.parameters())
        dist.shorten_timeouts(30)
        del model
    assert not dist.initialized() and dist.backend() == "none"


# ----------------------------------------------------------------------------- typed graphs on the GPU


def test_typed_batches_made_on_the_gpu_keep_every_invariant():
    """A typed graph in GPU memory: each relation sampled there, features gathered there; every batch checked
    edge by edge, type by type, against the whole graph; the prefetch thread's batches are the plain loop's."""
    from test_typed import check_typed_batch

    from hpcgnn.data.synthetic import make_synthetic_typed
    from hpcgnn.sampling.typed import TypedNeighborSampler

    graph = make_synthetic_typed(dataset_config(num_nodes=3000, avg_degree=10, homophily=0.8, seed=5))
    g = graph.to(CUDA)

    def loader():
        return BatchLoader(g, TypedNeighborSampler(g, (4, 3)), graph.train_idx, 97, batch_seed=3, device=CUDA)

    plain = list(loader())
    for data, seeds in zip(plain, graph.train_idx.split(97), strict=True):
        assert data["paper"].x.is_cuda and data["author", "writes", "paper"].edge_index.is_cuda
        check_typed_batch(graph, data.clone().to("cpu"), seeds, (4, 3))
    ahead = list(PrefetchLoader(loader(), 2))
    for a, b in zip(ahead, plain, strict=True):
        assert all(torch.equal(a[t].n_id, b[t].n_id) and torch.equal(a[t].x, b[t].x) for t in graph.node_types)
        assert all(torch.equal(a[r].edge_index, b[r].edge_index) for r in graph.relations)


@pytest.mark.parametrize("graph_on", ["device", "host"])
def test_typed_training_on_the_gpu(tmp_path, graph_on):
    """R-GCN on the typed default (smaller), one rank on the GPU, the graph sampled there or on the host;
    exact layer-wise evaluation on the GPU as well."""
    s, _ = single_rank("dataset=synthetic_hetero", "dataset.num_nodes=6000", "model=rgcn", "train.epochs=3",
                       f"train.graph_on={graph_on}", "train.eval_mode=full", "train.batch_size=256",
                       run_dir=tmp_path / "run")
    assert s["device"] == "cuda:0" and s["graph_on"] == graph_on and s["eval_mode"] == "full"
    assert s["test_acc"] >= 0.85, s["test_acc"]


@pytest.mark.parametrize("where", [["train.graph_on=device", "train.epochs=20"],
                                   ["train.graph_on=host", "train.eval_mode=full", "train.epochs=20"],
                                   ["graph=partitioned", "graph.cache_mb=0.1", "train.eval_mode=full", "train.epochs=40"]],
                         ids=["device", "host-exact", "partitioned-exact"])
def test_edge_features_reach_a_model_on_the_gpu(tmp_path, where):
    """A GAT reading edge features (model.edge_dim) on the GPU, the graph there (its edge features too: the torch
    twin's edge positions) or on the host, or partitioned between two ranks that share the GPU (a remote edge's
    features fetched with it; each rank takes half the steps of an epoch, so twice the epochs): learns the marked
    neighbour's sign as on the CPU (test_edge_features), evaluated exactly (every edge's features in each layer, on
    the GPU) where asked."""
    from test_edge_features import write_marked

    write_marked(tmp_path / "graph")
    procs = [] if "graph=partitioned" in where else ["launch.procs=1"]
    res = run_cli("dataset=files", f"dataset.path={tmp_path / 'graph'}", "model=gat", "model.edge_dim=4", *procs,
                  "train.lr=0.01", "train.batch_size=256", "model.hidden_channels=64", "train.device=cuda", *where,
                  cwd=tmp_path / "run")
    assert res.returncode == 0, res.stdout + res.stderr
    s = summary_of(tmp_path / "run")
    assert s["device"] == "cuda:0" and s["test"] >= 0.9, s["test"]


# ----------------------------------------------------------------------------- every task kind on the GPU


@pytest.mark.parametrize("kind", ["ml", "reg"])
def test_node_kinds_train_and_predict_on_the_gpu(tmp_path, kind):
    """Multi-label (BCE over the known labels, ROC-AUC) and regression (standardised targets, RMSE in the labels'
    units) on the GPU in train.precision=auto (bf16 where the GPU computes it), the graph there, evaluated exactly;
    predict on the GPU scores the run's metric and writes probabilities or values in the labels' units."""
    import numpy as np
    from conftest import predict_here
    from test_node_kinds import write_folder

    folder = write_folder(tmp_path / "graph", kind)
    s, _ = single_rank("dataset=files", f"dataset.path={folder}", "train.epochs=30", "train.eval_mode=full",
                       "train.eval_every=5", "train.batch_size=256", "model.hidden_channels=32", "train.lr=0.01",
                       "train.graph_on=device", run_dir=tmp_path / "run")
    assert s["device"] == "cuda:0" and s["graph_on"] == "device" and s["eval_mode"] == "full"
    metric = {"ml": "val_rocauc", "reg": "val_rmse"}[kind]
    print(f"{kind} on the GPU ({s['precision']}): test {s['test']:.4f}")
    p = predict_here(tmp_path / "run", "mode=full", device="cuda")
    assert s["metric"] == metric and p["value"] == pytest.approx(s["test"], abs=2e-3)
    out = next((tmp_path / "run" / "predict").iterdir())
    ids, y = np.load(out / "ids.npy"), np.load(folder / "y.npy")
    if kind == "ml":
        assert s["test"] >= 0.85, s["test"]
        probs = np.load(out / "probs.npy")
        assert probs.shape == (ids.size, 5) and 0 <= probs.min() and probs.max() <= 1
    else:
        spread = float(np.sqrt(((y[ids] - y[ids].mean(0)) ** 2).mean()))
        assert s["test"] < 0.3 * spread, (s["test"], spread)
        values = np.load(out / "values.npy")
        assert values.shape == (ids.size, 2) and abs(values[:, 0].mean() - 10) < 2  # (the labels' own units)


def test_an_edge_task_on_the_gpu(tmp_path):
    """Same-class pairs: a batch samples around both ends of its target edges with the targets left out, on the host
    (graph_on=auto's choice for an edge task; device is refused at compose time, test_config); the batches train on
    the GPU, the concat decoder scores them there; exact evaluation (every node's embedding) on the GPU."""
    from test_edge_tasks import write_edge_task

    write_edge_task(tmp_path / "g")
    s, _ = single_rank("dataset=files", f"dataset.path={tmp_path / 'g'}", "task=edge", "train.batch_size=256",
                       "model.hidden_channels=32", "train.epochs=8", "train.eval_mode=full", run_dir=tmp_path / "run")
    assert s["device"] == "cuda:0" and s["graph_on"] == "host" and s["task"] == "edge"
    print(f"edge task on the GPU ({s['precision']}): test {s['test']:.4f}")
    assert s["test"] >= 0.9, s["test"]


@pytest.mark.parametrize("readout", ["mean", "attention"])
def test_a_graph_task_trains_and_predicts_on_the_gpu(tmp_path, readout):
    """A dataset of many graphs on the GPU (precision auto: bf16 where the GPU computes it): each batch assembled
    from offsets on the host in pinned memory and copied to the GPU, categorical columns embedded there, GINE
    with the virtual node, the readout and head; every validation and test graph scored whole; predict on the GPU
    scores the run's metric and writes a row per graph."""
    import numpy as np
    from conftest import predict_here

    s, _ = single_rank("task=graph", "train.epochs=3", "model.hidden_channels=64", f"task.readout={readout}",
                       "model.virtual_node=true", run_dir=tmp_path / "run")
    assert s["device"] == "cuda:0" and s["task"] == "graph" and s["eval_mode"] == "whole"
    print(f"graph task on the GPU ({s['precision']}, {readout}): test {s['test']:.4f}")
    assert s["test_acc"] > 0.7, s["test_acc"]
    p = predict_here(tmp_path / "run", device="cuda")
    assert p["value"] == pytest.approx(s["test"], abs=2e-3)
    out = next((tmp_path / "run" / "predict").iterdir())
    assert np.load(out / "ids.npy").size == 400 and np.load(out / "probs.npy").shape == (400, 2)  # (the test split)
