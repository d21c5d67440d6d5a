"""Sorted-CSR aggregation (hpcgnn.models.aggregation): the same logits and gradients as PyG's own path."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import DATA_ROOT

from hpcgnn.config import ModelConfig, dataset_config
from hpcgnn.data import open_graph, prepare
from hpcgnn.models import aggregation, batch_transform, build_model, forward_batch
from hpcgnn.sampling import BatchLoader, CSRNeighborSampler

SMALL = dataset_config(num_nodes=3000, avg_degree=10, root=str(DATA_ROOT))


@pytest.fixture(scope="module")
def graph():
    prepare(SMALL)
    return open_graph(SMALL)


@pytest.fixture
def csr_calls(monkeypatch) -> list:
    """Counts the batches that took the CSR path."""
    calls, real = [], aggregation.forward_csr

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(aggregation, "forward_csr", counted)
    return calls


def assert_same_logits_and_gradients(ours, pyg, forward, data) -> None:
    """The seeds' logits and every parameter's gradient of a random linear loss, equal to fp32 tolerance."""
    results, weight = [], None
    for model in (ours, pyg):
        model.zero_grad()
        logits = forward(model, data)
        if weight is None:
            weight = torch.randn(logits.shape, generator=torch.Generator().manual_seed(len(results)))
        (logits * weight).sum().backward()
        results.append((logits.detach(), [p.grad.clone() for p in model.parameters()]))
    (a, ga), (b, gb) = results
    assert torch.allclose(a, b, atol=1e-5, rtol=1e-4), (a - b).abs().max()
    for x, y in zip(ga, gb, strict=True):
        assert torch.allclose(x, y, atol=1e-5, rtol=1e-4), (x - y).abs().max()


@pytest.mark.parametrize("name", ["sage", "gcn", "gin", "gat"])
@pytest.mark.parametrize("fanouts", [(5, 3), (4, 3, 2)])
def test_csr_path_gives_pygs_logits_and_gradients(graph, csr_calls, name, fanouts):
    """Random sampled batches (hubs whole and subsets drawn, GCN's weights and self-loops), three layers or two:
    logits and every parameter's gradient equal PyG's trimmed forward and backward to fp32 tolerance."""
    torch.manual_seed(0)
    cfg = ModelConfig(name=name, hidden_channels=32, dropout=0.0)
    ours = build_model(cfg, graph.num_features, graph.num_classes, len(fanouts))
    pyg = copy.deepcopy(ours)
    pyg.aggregation = "pyg"
    assert ours.aggregation == "csr" and ours.state_dict().keys() == pyg.state_dict().keys()
    loader = BatchLoader(graph, CSRNeighborSampler(graph.rowptr, graph.col, fanouts), graph.train_idx[:600], 150,
                         batch_seed=3, transform=batch_transform(cfg, graph.degree()))
    for data in loader:
        assert aggregation.sorted_by_target(data.edge_index)
        assert_same_logits_and_gradients(ours, pyg, forward_batch, data)
    assert len(csr_calls) == len(loader)  # every batch took the CSR path (and only ours)


def test_unsorted_or_unlayered_batches_take_pygs_path(graph, csr_calls):
    torch.manual_seed(0)
    model = build_model(ModelConfig(name="sage", hidden_channels=16), graph.num_features, graph.num_classes, 2).eval()
    data = next(iter(BatchLoader(graph, CSRNeighborSampler(graph.rowptr, graph.col, (5, 3)), graph.train_idx[:64], 64,
                                 batch_seed=1)))
    want = forward_batch(model, data)
    shuffled = data.clone()  # the same edges in the same hop groups, no longer grouped by target inside them
    start = torch.tensor([0, *data.num_sampled_edges]).cumsum(0).tolist()
    order = torch.cat([a + torch.randperm(b - a) for a, b in zip(start, start[1:], strict=False)])
    shuffled.edge_index = data.edge_index[:, order]
    assert not aggregation.sorted_by_target(shuffled.edge_index)
    assert torch.allclose(forward_batch(model, shuffled), want, atol=1e-5)
    assert model(data.x, data.edge_index).shape[0] == data.num_nodes  # no per-hop counts: PyG's full forward
    assert len(csr_calls) == 1


def test_gcn_self_loops_sit_at_the_end_of_their_rows():
    from hpcgnn.sampling.transforms import with_row_loops

    ei = torch.tensor([[7, 8, 9, 7], [2, 2, 4, 5]])  # targets 2..5, row 3 empty
    out = with_row_loops(ei, 2, 6)
    assert out.tolist() == [[7, 8, 2, 3, 9, 4, 7, 5], [2, 2, 2, 3, 4, 4, 5, 5]]


def test_bf16_csr_path_runs_the_bf16_kernels(graph):
    """Under bf16 autocast the CSR products run in bf16 after the first layer, forward and backward."""
    from hpcgnn.rank.techniques import autocast

    torch.manual_seed(0)
    model = build_model(ModelConfig(name="gin", hidden_channels=16), graph.num_features, graph.num_classes, 3)
    data = next(iter(BatchLoader(graph, CSRNeighborSampler(graph.rowptr, graph.col, (5, 3, 2)),
                                 graph.train_idx[:64], 64, batch_seed=1)))
    with autocast("bf16", torch.device("cpu")):
        out = forward_batch(model, data)
    assert out.dtype == torch.bfloat16
    out.float().sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


def test_rgcn_csr_path_gives_pygs_hetero_logits_and_gradients(monkeypatch):
    """Typed batches: each relation's mean as one CSR product equals PyG's HeteroConv with hetero trim_to_layer."""
    from hpcgnn.data.synthetic import make_synthetic_typed
    from hpcgnn.models import build_typed_model, forward_typed_batch
    from hpcgnn.sampling.typed import TypedNeighborSampler

    graph = make_synthetic_typed(dataset_config(num_nodes=3000, avg_degree=10, homophily=0.8, seed=5))
    torch.manual_seed(0)
    ours = build_typed_model(ModelConfig(name="rgcn", hidden_channels=16, dropout=0.0), graph.node_types,
                             graph.relations, graph.target, graph.num_features, graph.num_classes, 2)
    pyg = copy.deepcopy(ours)
    pyg.aggregation = "pyg"
    seen, calls, real = 0, [], type(ours)._forward_csr

    def counted(self, *args):
        calls.append(1)
        return real(self, *args)

    monkeypatch.setattr(type(ours), "_forward_csr", counted)
    loader = BatchLoader(graph, TypedNeighborSampler(graph, (4, 3)), graph.train_idx[:400], 100, batch_seed=2)
    for data in loader:
        assert_same_logits_and_gradients(ours, pyg, forward_typed_batch, data)
        seen += 1
    assert seen == 4 and len(calls) == 4  # ours took the CSR path every time, PyG's copy never
