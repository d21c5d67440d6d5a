"""Training techniques: each shown to do what it claims, not only to run."""

from __future__ import annotations

import json
import math

import pytest
import torch
from conftest import DATA_ROOT, TINY, make_config, run_cli, summary_of
from torch_geometric.data import Data

from hpcgnn.config import ModelConfig, dataset_config
from hpcgnn.data import open_graph, prepare
from hpcgnn.env import RankEnv
from hpcgnn.errors import ConfigError
from hpcgnn.models import batch_transform, build_model, forward_batch, gcn_norm
from hpcgnn.rank.techniques import (
    autocast,
    effective_lr,
    lr_multiplier,
    make_scheduler,
    step_weights,
)
from hpcgnn.rank.trainer import optimizer_step
from hpcgnn.sampling import BatchLoader, CSRNeighborSampler
from hpcgnn.stores.exact import WholeGraphPieces, exact_outputs
from hpcgnn.tasks import build_task, open_store

SMALL = dataset_config(num_nodes=3000, avg_degree=10, root=str(DATA_ROOT))


@pytest.fixture(scope="module")
def graph():
    prepare(SMALL)
    return open_graph(SMALL)


def _batches(graph, n: int, size: int):
    loader = BatchLoader(graph, CSRNeighborSampler(graph.rowptr, graph.col, (5, 3)), graph.train_idx[: n * size], size,
                        batch_seed=7)
    return list(loader)


def _merged(batches) -> Data:
    """One batch equal to the disjoint union of ``batches``, all their seeds first."""
    edges, seeds_first = [], []
    total_seeds = sum(b.batch_size for b in batches)
    seed_pos, other_pos = 0, total_seeds
    for b in batches:
        n, bs = b.num_nodes, b.batch_size
        new = torch.empty(n, dtype=torch.long)
        new[:bs] = torch.arange(seed_pos, seed_pos + bs)
        new[bs:] = torch.arange(other_pos, other_pos + n - bs)
        seed_pos, other_pos = seed_pos + bs, other_pos + n - bs
        seeds_first.append((new, b))
    x = torch.empty(other_pos, batches[0].x.size(1))
    y = torch.empty(other_pos, dtype=torch.long)
    for new, b in seeds_first:
        x[new], y[new[: b.batch_size]] = b.x, b.y[: b.batch_size]
        edges.append(new[b.edge_index])
    return Data(x=x, y=y, edge_index=torch.cat(edges, 1), batch_size=total_seeds)


def test_accumulated_micro_batches_give_the_update_of_one_big_batch(graph):
    batches = _batches(graph, 3, 64)
    cfg = ModelConfig(name="sage", hidden_channels=16, dropout=0.0)
    models = []
    for _ in range(2):
        torch.manual_seed(0)
        models.append(build_model(cfg, graph.num_features, graph.num_classes, 2))
    a, b = models
    before = [p.detach().clone() for p in a.parameters()]
    opt_a, opt_b = torch.optim.SGD(a.parameters(), lr=0.5), torch.optim.SGD(b.parameters(), lr=0.5)
    sched_a = make_scheduler(opt_a, "constant", 10, 0.0)
    total = sum(x.batch_size for x in batches)
    # The node classification task's own loss, as the trainer's step uses it.
    run = make_config("dataset.num_nodes=3000", "dataset.avg_degree=10", f"dataset.root={DATA_ROOT}")
    single = RankEnv.from_environ({})
    task = build_task(run, single, open_store(run, single), torch.device("cpu"))
    for data in batches:  # 3 micro-batches, one optimizer step
        (task.step(a, data).loss * (data.batch_size / total)).backward()
    optimizer_step(opt_a, sched_a, None)
    merged = _merged(batches)
    loss = torch.nn.functional.cross_entropy(forward_batch(b, merged), merged.y[:total])
    loss.backward()
    opt_b.step()
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.allclose(pa, pb, atol=1e-6), (pa - pb).abs().max()
    assert any(not torch.equal(p0, p) for p0, p in zip(before, a.parameters(), strict=True))  # a real update



def test_step_weights_make_each_step_the_mean_over_all_its_seeds():
    # One rank, 600 seeds in batches of 256, 2 micro-batches per step: the short last step weighs fully.
    assert step_weights([[256, 256, 88]], 0, 2) == [0.5, 0.5, 1.0]
    assert step_weights([[256, 256, 88, 0]], 0, 2) == [0.5, 0.5, 1.0, 0.0]  # a padding batch adds no seeds
    # Two ranks with unequal batches (edge budgets): DDP averages ranks, so rank r's batch weighs
    # world x size / step total; the averaged gradient is the mean over the step's 400 seeds.
    sizes = [[100, 50], [300, 150]]
    w0, w1 = step_weights(sizes, 0, 1), step_weights(sizes, 1, 1)
    assert w0 == [0.5, 0.5] and w1 == [1.5, 1.5]
    assert (w0[0] / 100 * 100 + w1[0] / 300 * 300) / 2 == 1.0


def test_lr_scaling_and_warmup():
    assert effective_lr(1e-3, "linear", 4, 2) == pytest.approx(8e-3)
    assert effective_lr(1e-3, "sqrt", 4, 4) == pytest.approx(4e-3)
    assert effective_lr(1e-3, "none", 8) == 1e-3
    ramp = [lr_multiplier(s, 100, 10, "cosine") for s in range(100)]
    assert ramp[:10] == pytest.approx([(s + 1) / 10 for s in range(10)])
    assert ramp[10] == pytest.approx(1.0) and ramp[55] == pytest.approx(0.5) and ramp[-1] < 0.01
    assert all(x >= y for x, y in zip(ramp[10:], ramp[11:], strict=False))


def test_bf16_autocast_computes_in_bf16(graph):
    data = _batches(graph, 1, 64)[0]
    model = build_model(ModelConfig(name="sage", hidden_channels=16), graph.num_features, graph.num_classes, 2)
    with autocast("bf16", torch.device("cpu")):
        assert forward_batch(model, data).dtype == torch.bfloat16
    assert forward_batch(model, data).dtype == torch.float32


def test_precision_auto_is_bf16_where_the_cpu_computes_it(tmp_path):
    """The decision from the CPU's flags (recorded /proc/cpuinfo lines), and this machine's own."""
    from hpcgnn.env import cpu_flags
    from hpcgnn.rank.techniques import resolve_precision

    cpu = torch.device("cpu")
    sapphire = tmp_path / "cpuinfo-amx"
    sapphire.write_text("processor\t: 0\nflags\t\t: fpu sse avx2 avx512f avx512_bf16 amx_bf16 amx_tile amx_int8\n")
    older = tmp_path / "cpuinfo-avx2"
    older.write_text("processor\t: 0\nflags\t\t: fpu sse avx avx2 fma\n")
    assert resolve_precision("auto", cpu, cpu_flags(str(sapphire))) == \
        ("bf16", "the CPU has amx_bf16, avx512_bf16")
    assert resolve_precision("auto", cpu, cpu_flags(str(older))) == \
        ("fp32", "the CPU has neither AMX nor AVX512-BF16")
    assert resolve_precision("auto", cpu, cpu_flags(str(tmp_path / "absent")))[0] == "fp32"
    assert resolve_precision("fp32", cpu, cpu_flags(str(sapphire))) == ("fp32", "train.precision")
    here = cpu_flags()
    assert resolve_precision("auto", cpu)[0] == ("bf16" if {"amx_bf16", "avx512_bf16"} & here else "fp32")
    # HPCGNN_CPU_FLAGS stands in for the CPU's flags (the suite runs as if on the other kind of CPU through it)
    assert cpu_flags(environ={"HPCGNN_CPU_FLAGS": "avx2 fma"}) == {"avx2", "fma"}
    assert cpu_flags(environ={"HPCGNN_CPU_FLAGS": "avx2 avx512_bf16"}) == {"avx2", "avx512_bf16"}
    assert cpu_flags(str(older), {"HPCGNN_CPU_FLAGS": "avx2 avx512_bf16"}) == {"fpu", "sse", "avx", "avx2", "fma"}


def test_the_cpu_kind_fixture_decides_auto_as_on_that_cpu(cpu_kind):
    """`cpu_kind` (conftest) makes this process and its children decide as on each kind of CPU."""
    from hpcgnn.rank.techniques import resolve_precision

    assert resolve_precision("auto", torch.device("cpu"))[0] == cpu_kind


@pytest.mark.parametrize("name", ["sage", "gcn", "gin", "gat", "mlp"])
def test_layerwise_inference_is_exact(graph, name):
    """Chunked, full-neighbourhood inference equals the model run on the whole graph at once
    (for GCN: PyG's own full-batch GCN, normalised by PyG from the whole graph)."""
    torch.manual_seed(0)
    cfg = ModelConfig(name=name, hidden_channels=16, heads=2)
    model = build_model(cfg, graph.num_features, graph.num_classes, 2).eval()
    whole = _full_batch_twin(model, name)(graph.x, graph.edge_index())
    chunked = exact_outputs(model, WholeGraphPieces(graph, torch.device("cpu"), 700, 0, 1,
                                                    gcn_degree=graph.degree() if gcn_norm(cfg) else None))
    assert torch.allclose(chunked, whole, atol=1e-5), (chunked - whole).abs().max()


def _full_batch_twin(model: torch.nn.Module, name: str) -> torch.nn.Module:
    """The model as PyG runs it on a whole graph: for GCN, PyG's GCN with its own normalisation."""
    if name != "gcn":
        return model
    from torch_geometric.nn import GCN

    twin = GCN(model.in_channels, model.hidden_channels, model.num_layers, model.out_channels)  # normalize=True
    twin.load_state_dict(model.state_dict())
    return twin.eval()


@pytest.mark.parametrize("trim", [True, False], ids=["trimmed", "untrimmed"])
def test_sampled_gcn_with_full_fanouts_gives_the_full_batch_logits(graph, trim):
    """Fanouts above every degree put every neighbour in the batch; with the whole graph's degrees
    carried into the batch (GCNNorm), the seeds' logits are those of PyG's full-batch GCN."""
    cfg = ModelConfig(name="gcn", hidden_channels=16, dropout=0.0)
    torch.manual_seed(0)
    model = build_model(cfg, graph.num_features, graph.num_classes, 3).eval()
    whole = _full_batch_twin(model, "gcn")(graph.x, graph.edge_index())
    big = int(graph.degree().max()) + 1
    seeds = graph.train_idx[:300]
    loader = BatchLoader(graph, CSRNeighborSampler(graph.rowptr, graph.col, (big, big, big)), seeds, 100,
                         batch_seed=1, transform=batch_transform(cfg, graph.degree()))
    for i, data in enumerate(loader):
        if not trim:
            del data.num_sampled_nodes, data.num_sampled_edges
        logits = forward_batch(model, data)
        assert torch.allclose(logits, whole[seeds[i * 100:(i + 1) * 100]], atol=1e-5), (logits - whole[data.n_id[:100]]).abs().max()
    # Normalised on the batch instead (what GCNConv(normalize=True) on a sampled batch does), the
    # outer hop sees the wrong degrees: the logits differ.
    data = next(iter(BatchLoader(graph, CSRNeighborSampler(graph.rowptr, graph.col, (big, big, big)), seeds, 100,
                                 batch_seed=1)))
    on_batch = _full_batch_twin(model, "gcn")(data.x, data.edge_index)[:100]
    assert not torch.allclose(on_batch, whole[seeds[:100]], atol=1e-3)


def test_unsupported_combinations_are_config_errors():
    assert make_config("graph=partitioned", "train.eval_mode=full").train.eval_mode == "full"  # exact, per rank
    typed = make_config("dataset=synthetic_hetero", "model=rgcn", "graph=partitioned", "train.eval_mode=full")
    assert typed.train.eval_mode == "full"  # exact on typed parts too
    with pytest.raises(ConfigError, match="train.eval_mode=full needs model mlp, rgcn on a typed graph; got "
                                          "model=sage"):
        make_config("dataset=synthetic_hetero", "model=sage", "graph=partitioned", "train.eval_mode=full")
    with pytest.raises(ConfigError, match="train.grad_compression='int8' is unknown"):
        make_config("train.grad_compression=int8")


@pytest.mark.slow
def test_accumulation_all_reduces_once_per_step_and_scaling_is_recorded(tmp_path):
    res = run_cli(*TINY, "train.epochs=3", "train.accumulate=2", "train.lr_scaling=linear", "train.warmup=0.9",
                  "metrics.every_steps=1", cwd=tmp_path, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    s = summary_of(tmp_path)
    assert s["effective_lr"] == pytest.approx(3e-3 * 2 * 2) and s["global_batch"] == 2 * 2 * 256
    records = [json.loads(x) for x in (tmp_path / "run" / "metrics" / "rank-0.jsonl").read_text().splitlines()]
    # 3 micro-batches per epoch, steps of 2: the all-reduce runs with micro-batches 2 and 3 only.
    assert [r["allreduce_s"] > 0 for r in records[:3]] == [False, True, True]
    # 6 optimizer steps, 5 of warmup: 3/5 of the LR after epoch 1, all of it from epoch 2 on.
    assert [r["lr"] for r in s["history"]] == pytest.approx([0.6 * s["effective_lr"], s["effective_lr"], s["effective_lr"]])


@pytest.mark.slow
def test_gradient_compression_sends_fewer_bytes_and_still_learns(tmp_path, tiny_run):
    sent, acc = {}, {}
    for method in ("none", "bf16", "powersgd"):
        folder = tiny_run  # TINY for 3 epochs without compression: the shared run
        if method != "none":
            folder = tmp_path / method
            res = run_cli(*TINY, "train.epochs=3", f"train.grad_compression={method}", cwd=folder, timeout=300)
            assert res.returncode == 0, res.stdout + res.stderr
        s = summary_of(folder)
        sent[method], acc[method] = s["allreduce_bytes_per_step"], s["test_acc"]
        assert s["grad_compression"] == method and len(set(s["param_checksums"])) == 1  # ranks stay in step
    params = sum(p.numel() for p in build_model(ModelConfig(hidden_channels=32), 32, 8, 2).parameters())
    assert sent["none"] == 4 * params and sent["bf16"] == 2 * params
    assert sent["powersgd"] < sent["bf16"]
    # Compression costs little accuracy here (3 epochs, 8 classes: chance is 0.125).
    assert abs(acc["bf16"] - acc["none"]) < 0.02 and acc["powersgd"] > acc["none"] - 0.1, acc


@pytest.mark.slow
def test_full_inference_is_close_to_sampled_and_exact(tmp_path, tiny_run):
    """Exact evaluation (the default on a replicated graph: tiny_run's) and sampled evaluation of the same training."""
    res = run_cli(*TINY, "train.epochs=3", "train.eval_mode=sampled", cwd=tmp_path / "sampled", timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    sampled, full = summary_of(tmp_path / "sampled"), summary_of(tiny_run)
    assert sampled["eval_mode"] == "sampled" and full["eval_mode"] == "full"
    assert full["param_checksums"] == sampled["param_checksums"]  # evaluation changes no training
    assert math.isclose(full["test_acc"], sampled["test_acc"], abs_tol=0.04), (full["test_acc"], sampled["test_acc"])
