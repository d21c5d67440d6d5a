"""Exact inference straight from the CSR (hpcgnn/models/layerwise.py, the C kernels' aggregate_rows): every model
kind it takes gives PyG's inference_per_layer outputs, with a linear map first or not, from float32 or 16-bit rows,
in one chunk or many; the models it does not take keep PyG's path and say so."""

from __future__ import annotations

import logging

import pytest
import torch

from hpcgnn.config import ModelConfig, dataset_config
from hpcgnn.data import Graph, build_graph
from hpcgnn.models import build_model, gcn_norm, layerwise
from hpcgnn.stores.exact import WholeGraphPieces, exact_outputs

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def graph() -> Graph:
    """A small graph with a hub (a long row), rows without in-edges and edges from a node to itself (which GAT's
    attention leaves out, and GCN's and GIN's sums keep)."""
    base = build_graph(dataset_config(num_nodes=2500, avg_degree=7, num_features=24, seed=4))
    spokes, loops = torch.arange(3, 700), torch.arange(10, 40)
    ei = torch.cat([base.edge_index(), torch.stack([spokes, torch.zeros_like(spokes)]), torch.stack([loops, loops])], 1)
    keep = ei[1] % 97 != 5  # some nodes with no in-edge at all
    return Graph.from_edge_index(ei[:, keep], base.num_nodes, base.x, base.y, base.train_idx, base.val_idx,
                                 base.test_idx, base.num_classes)


def outputs(graph: Graph, name: str, hidden: int, aggregation: str, chunk: int, layers: int = 2) -> torch.Tensor:
    cfg = ModelConfig(name=name, hidden_channels=hidden, aggregation=aggregation, heads=2)
    torch.manual_seed(0)
    model = build_model(cfg, graph.num_features, graph.num_classes, layers).eval()
    return exact_outputs(model, WholeGraphPieces(graph, CPU, chunk, 0, 1, graph.degree() if gcn_norm(cfg) else None))


@pytest.mark.parametrize("name,hidden", [("sage", 8), ("sage", 64), ("gcn", 16), ("gin", 16), ("gat", 16)],
                         ids=["sage-linear-first", "sage-aggregate-first", "gcn", "gin", "gat"])
def test_the_csr_path_gives_pygs_layerwise_outputs(graph, name, hidden, caplog):
    """sage narrowing (its neighbour weight before the mean) and widening (after), gcn (weights from the global
    degrees, self-loops), gin (a sum, then its MLP), gat (2 heads: the softmax over each row's in-edges and
    self-loop, heads joined, then averaged in the last layer): PyG's path's outputs to 1e-5 relative, over 3
    layers, in one chunk or many (the same floats either way)."""
    with caplog.at_level(logging.INFO, logger="hpcgnn.models.layerwise"):
        layerwise._said.clear()
        fast = outputs(graph, name, hidden, "csr", 333, layers=3)
    assert "aggregated straight from the CSR" in caplog.text
    pyg = outputs(graph, name, hidden, "pyg", 333, layers=3)
    scale = pyg.abs().max()
    assert (fast - pyg).abs().max() <= 1e-5 * scale, ((fast - pyg).abs().max(), scale)
    assert torch.equal(outputs(graph, name, hidden, "csr", 5000, layers=3), fast)


def test_rows_stored_in_16_bits_are_widened_as_pygs_path_widens_them(graph):
    """Features kept as bfloat16 or float16 (dataset.feature_dtype): the kernel widens each row as it reads it,
    as PyG's path upcasts the chunk; the same outputs."""
    for dtype in (torch.bfloat16, torch.float16):
        narrow = Graph(graph.rowptr, graph.col, graph.x.to(dtype), graph.y, graph.train_idx, graph.val_idx,
                       graph.test_idx, graph.num_classes)
        fast, pyg = (outputs(narrow, "sage", 8, how, 400) for how in ("csr", "pyg"))
        assert (fast - pyg).abs().max() <= 1e-5 * pyg.abs().max(), dtype


def test_under_bf16_autocast_the_tables_between_layers_are_bf16_and_close_to_fp32(graph):
    """In bf16 a layer's table is kept as the bf16 it was computed in (half the bytes through the next layer's
    edges); the outputs stay within bf16's rounding of the fp32 ones."""
    from hpcgnn.rank.techniques import autocast

    fp32 = outputs(graph, "sage", 64, "csr", 400)
    with autocast("bf16", CPU):
        bf16 = outputs(graph, "sage", 64, "csr", 400)
    assert bf16.dtype == torch.float32
    assert (bf16 - fp32).abs().max() <= 0.05 * fp32.abs().max()


def test_models_the_csr_path_does_not_take_keep_pygs_path_and_say_why(graph, caplog):
    """PyG's own aggregation and a model on a GPU: PyG's inference_per_layer, named in the log."""
    cases = {"pyg": (ModelConfig(name="sage", aggregation="pyg"), CPU, "model.aggregation=csr"),
             "gpu": (ModelConfig(name="sage"), torch.device("cuda", 0), "on cuda:0: PyG's inference_per_layer")}
    for cfg, device, said in cases.values():
        torch.manual_seed(0)
        model = build_model(cfg, graph.num_features, graph.num_classes, 2)
        kind, why = layerwise.plan(model, device, gcn_norm=True)
        assert kind is None and said in why, why


def _two_ranks(rank: int, world: int, port: int, graph: Graph, folder: str) -> None:
    """One of 2 gloo ranks on this host: every model kind's outputs, fp32 and bf16, with the layer tables in one
    node-shared copy and all-gathered."""
    from conftest import local_rank_env

    from hpcgnn.config import DistConfig
    from hpcgnn.dist import NodeTables, process_group
    from hpcgnn.rank.techniques import autocast

    torch.set_num_threads(1)
    env, out = local_rank_env(rank, world, port), {}
    with process_group(env, DistConfig(backend="gloo"), CPU):
        tables = NodeTables()  # (one pool for every pass, as a store keeps it)
        for name, hidden in (("sage", 8), ("sage", 64), ("gcn", 16), ("gin", 16), ("gat", 16)):
            cfg = ModelConfig(name=name, hidden_channels=hidden, heads=2)
            torch.manual_seed(0)
            model = build_model(cfg, graph.num_features, graph.num_classes, 3).eval()
            for precision in ("fp32", "bf16"):
                for one_node in (True, False):
                    with autocast(precision, CPU):
                        out[name, hidden, precision, one_node] = exact_outputs(model, WholeGraphPieces(
                            graph, CPU, 333, rank, world, graph.degree() if gcn_norm(cfg) else None,
                            tables if one_node else None))
        made = tables.made  # a pass again: only its outputs, which its caller keeps, are a table made anew
        with autocast("bf16", CPU):
            exact_outputs(model, WholeGraphPieces(graph, CPU, 333, rank, world, tables=tables))
        out["made again"] = tables.made - made
    torch.save(out, f"{folder}/rank{rank}.pt")


@pytest.mark.alone  # (nothing new in /dev/shm: no other test may write there meanwhile)
@pytest.mark.slow
def test_two_ranks_give_one_ranks_outputs_bit_for_bit_sharing_their_tables_or_gathering_them(graph, tmp_path):
    """Ranks split the rows at chunk boundaries (the same chunks on any number of ranks): 2 ranks' outputs equal
    1 rank's bit for bit, in fp32 and bf16, whether the ranks of one node write one shared table or all-gather;
    the shared table leaves nothing in /dev/shm."""
    import os

    import torch.multiprocessing as mp

    from hpcgnn.rank.techniques import autocast
    from hpcgnn.submit.local import free_port

    before = set(os.listdir("/dev/shm"))
    mp.start_processes(_two_ranks, args=(2, free_port(24000 + os.getpid() % 5000, 20000, 32767), graph,
                                         str(tmp_path)), nprocs=2, start_method="spawn")
    assert not {f for f in os.listdir("/dev/shm") if f.startswith("hpcgnn-table-")} - before
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2)]
    torch.set_num_threads(2)
    assert ranks[0].pop("made again") <= 1 and ranks[1].pop("made again") <= 1
    for (name, hidden, precision, one_node), got in ranks[0].items():
        cfg = ModelConfig(name=name, hidden_channels=hidden, heads=2)
        torch.manual_seed(0)
        model = build_model(cfg, graph.num_features, graph.num_classes, 3).eval()
        with autocast(precision, CPU):
            alone = exact_outputs(model, WholeGraphPieces(graph, CPU, 333, 0, 1, graph.degree() if gcn_norm(cfg) else None))
        assert torch.equal(got, alone) and torch.equal(ranks[1][name, hidden, precision, one_node], alone), \
            (name, hidden, precision, one_node)


def test_rgcn_on_a_typed_graph_gives_pygs_outputs_from_each_relations_csr():
    """R-GCN: each relation's mean straight from its CSR (rows of the relation's source type; in both layers, each
    relation's linear map first: 32 -> 16 -> 8), the same outputs as PyG's message passing per relation
    (model.aggregation=pyg)."""
    from hpcgnn.data.synthetic import make_synthetic_typed
    from hpcgnn.models import build_typed_model
    from hpcgnn.stores.exact import WholeTypedPieces

    typed = make_synthetic_typed(dataset_config(num_nodes=3000, avg_degree=6, seed=2))
    runs = {}
    for how in ("csr", "pyg"):
        torch.manual_seed(0)
        model = build_typed_model(ModelConfig(name="rgcn", hidden_channels=16, aggregation=how), typed.node_types,
                                  typed.relations, typed.target, typed.num_features, typed.num_classes, 2).eval()
        runs[how] = exact_outputs(model, WholeTypedPieces(typed, CPU, 500, 0, 1))
        assert [len(model.maps_first(i, CPU)) for i in range(2)] == ([5, 3] if how == "csr" else [0, 0])
    assert (runs["csr"] - runs["pyg"]).abs().max() <= 1e-5 * runs["pyg"].abs().max()


@pytest.mark.parametrize("name", ["gat", "gin"])
def test_a_model_reading_edge_features_is_given_every_edges_features_in_each_layer(graph, name, caplog):
    """gat(edge_dim) (attention over edge features; its self-loops' features the mean of each row's) and gin(edge_dim)
    (GINEConv) layer by layer, each chunk's edges with their features: the whole graph's forward pass with every
    edge's features, to 1e-5, in one chunk or many; a gat run without them gives other outputs."""
    g = Graph.from_edge_index(graph.edge_index(), graph.num_nodes, graph.x, graph.y, graph.train_idx, graph.val_idx,
                              graph.test_idx, graph.num_classes,
                              edge_attr=torch.randn(graph.num_edges, 3, generator=torch.Generator().manual_seed(2)))
    torch.manual_seed(0)
    model = build_model(ModelConfig(name=name, hidden_channels=16, heads=2, edge_dim=3), g.num_features, g.num_classes,
                        3, edge_dim=3).eval()
    with caplog.at_level(logging.INFO, logger="hpcgnn.models.layerwise"):
        layerwise._said.clear()
        exact = exact_outputs(model, WholeGraphPieces(g, CPU, 333, 0, 1, edge_features=True))
    assert "reads edge features: PyG's layers, over each chunk's edges with their features" in caplog.text
    with torch.no_grad():
        whole = model(g.x, g.edge_index(), edge_attr=g.edge_attr)
    assert (exact - whole).abs().max() <= 1e-5 * whole.abs().max(), (exact - whole).abs().max()
    assert torch.equal(exact_outputs(model, WholeGraphPieces(g, CPU, 5000, 0, 1, edge_features=True)), exact)
    if name == "gat":
        without = exact_outputs(model, WholeGraphPieces(g, CPU, 333, 0, 1))
        assert (without - whole).abs().max() > 1e-3 * whole.abs().max()
