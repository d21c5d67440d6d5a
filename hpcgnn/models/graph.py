"""A graph task's models (``task=graph``): node embeddings by message passing over whole graphs, a readout to one row
per graph, and a linear head to the target's outputs.

- the input: categorical node features (integer columns, OGB's atom features) embedded per column and summed (OGB's
  ``AtomEncoder``, built from the columns' ranges); float ones through a linear map;
- GIN layers (``model=gin``), OGB's baseline: ``MLP((1 + eps) x + sum of messages)`` with batch norm, ReLU and
  dropout between layers; on graphs whose edges have features, GINE's message ``ReLU(x_j + e_ij)``, each layer
  embedding the edges' columns itself (OGB's ``BondEncoder`` per layer); ``model.virtual_node``: OGB's virtual node,
  a node joined to every node of its graph, updated by an MLP between layers;
- the readout (``task.readout``): mean, sum, max, or attention (PyG's ``AttentionalAggregation``, a gate MLP);
- the head: a linear map of the graph's row to the target's outputs.

``GraphModel.forward(x, edge_index, batch, edge_attr=None, num_graphs=None)`` gives the graphs' outputs;
:meth:`GraphModel.embed` their rows before the head (what predict's embeddings and export keep).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class ColumnEmbedding(nn.Module):
    """Integer feature columns, each through an embedding of its range, summed (OGB's AtomEncoder/BondEncoder)."""

    def __init__(self, vocab: tuple[int, ...], width: int):
        super().__init__()
        self.tables = nn.ModuleList(nn.Embedding(int(v), width) for v in vocab)
        for t in self.tables:
            nn.init.xavier_uniform_(t.weight.data)

    def forward(self, x: Tensor) -> Tensor:
        x = x.long()
        out = self.tables[0](x[:, 0])
        for i in range(1, len(self.tables)):
            out = out + self.tables[i](x[:, i])
        return out


def encoder(vocab: tuple[int, ...], width: int, out: int) -> nn.Module:
    """Categorical columns embedded (``vocab``: their ranges), or float ones mapped linearly."""
    return ColumnEmbedding(vocab, out) if vocab else nn.Linear(width, out)


class GINLayer(nn.Module):
    """GIN's update, ``MLP((1 + eps) x_i + sum_j m_ij)``; ``m_ij`` is ``x_j``, or with edge features GINE's
    ``ReLU(x_j + e_ij)`` (the edges embedded by this layer's own encoder)."""

    def __init__(self, hidden: int, edges: nn.Module | None):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(hidden, 2 * hidden), norm(2 * hidden), nn.ReLU(),
                                 nn.Linear(2 * hidden, hidden))
        self.eps = nn.Parameter(torch.zeros(1))
        self.edges = edges

    def forward(self, x: Tensor, edge_index: Tensor, edge_attr: Tensor | None) -> Tensor:
        msg = x.index_select(0, edge_index[0])
        if self.edges is not None:
            msg = F.relu(msg + self.edges(edge_attr).to(msg.dtype))
        agg = torch.zeros_like(x).index_add_(0, edge_index[1], msg)
        return self.mlp((1 + self.eps) * x + agg)


def norm(width: int) -> nn.Module:
    """Batch norm that takes a batch of one row too (PyG's ``BatchNorm``: its running statistics then): a step's last
    batch may hold a single graph, whose virtual node is one row."""
    from torch_geometric.nn import BatchNorm

    return BatchNorm(width, allow_single_element=True)


def graphs_in(batch: Tensor, num_graphs: int | None) -> int:
    """A batch's graph count: as given, else one past the largest graph index of its nodes."""
    if num_graphs is not None:
        return num_graphs
    return int(batch.max()) + 1 if batch.numel() else 0


def pool(h: Tensor, batch: Tensor, num_graphs: int, how: str) -> Tensor:
    """Each graph's rows of ``h`` summed, averaged or maxed (``batch``: each row's graph)."""
    from torch_geometric.utils import scatter

    return scatter(h, batch, 0, dim_size=num_graphs, reduce=how)


class GraphModel(nn.Module):
    """Node embeddings by ``num_layers`` GIN layers (OGB's GNN_node, or GNN_node_Virtualnode), a readout, a head."""

    def __init__(self, in_channels: int, hidden: int, out_channels: int, num_layers: int, *, dropout: float = 0.5,
                 readout: str = "mean", x_vocab: tuple[int, ...] = (), edge_dim: int = 0,
                 edge_vocab: tuple[int, ...] = (), virtual_node: bool = False):
        super().__init__()
        self.num_layers, self.dropout, self.readout_name = num_layers, dropout, readout
        self.hidden_channels, self.out_channels = hidden, out_channels
        self.node_encoder = encoder(x_vocab, in_channels, hidden)
        self.layers = nn.ModuleList(GINLayer(hidden, encoder(edge_vocab, edge_dim, hidden) if edge_dim else None)
                                    for _ in range(num_layers))
        self.norms = nn.ModuleList(norm(hidden) for _ in range(num_layers))
        self.virtual = None
        if virtual_node:  # OGB's: an embedding (zero at start) and an MLP between each two layers
            self.virtual = nn.Embedding(1, hidden)
            nn.init.constant_(self.virtual.weight.data, 0)
            self.virtual_mlps = nn.ModuleList(
                nn.Sequential(nn.Linear(hidden, 2 * hidden), norm(2 * hidden), nn.ReLU(),
                              nn.Linear(2 * hidden, hidden), norm(hidden), nn.ReLU())
                for _ in range(num_layers - 1))
        self.gate = None
        if readout == "attention":
            from torch_geometric.nn import AttentionalAggregation

            self.gate = AttentionalAggregation(nn.Sequential(nn.Linear(hidden, 2 * hidden), norm(2 * hidden),
                                                             nn.ReLU(), nn.Linear(2 * hidden, 1)))
        self.head = nn.Linear(hidden, out_channels)

    def nodes(self, x: Tensor, edge_index: Tensor, batch: Tensor, edge_attr: Tensor | None,
              num_graphs: int) -> Tensor:
        """Every node's embedding after the last layer."""
        h = self.node_encoder(x if not x.is_floating_point() else x.float())
        vn = None
        if self.virtual is not None:
            vn = self.virtual(torch.zeros(num_graphs, dtype=torch.long, device=h.device))
        for i, (layer, bn) in enumerate(zip(self.layers, self.norms, strict=True)):
            if vn is not None:
                h = h + vn.index_select(0, batch).to(h.dtype)
            out = bn(layer(h, edge_index, edge_attr))
            if i + 1 < self.num_layers:
                out = F.relu(out)
            out = F.dropout(out, self.dropout, self.training)
            if vn is not None and i + 1 < self.num_layers:
                vn = F.dropout(self.virtual_mlps[i](pool(h, batch, num_graphs, "sum") + vn), self.dropout,
                               self.training)
            h = out
        return h

    def embed(self, x: Tensor, edge_index: Tensor, batch: Tensor, edge_attr: Tensor | None = None,
              num_graphs: int | None = None) -> Tensor:
        """Each graph's row: its nodes' embeddings read out."""
        num_graphs = graphs_in(batch, num_graphs)
        h = self.nodes(x, edge_index, batch, edge_attr, num_graphs)
        if self.gate is not None:
            return self.gate(h, batch, dim_size=num_graphs)
        return pool(h, batch, num_graphs, self.readout_name)

    def forward(self, x: Tensor, edge_index: Tensor, batch: Tensor, edge_attr: Tensor | None = None,
                num_graphs: int | None = None) -> Tensor:
        return self.head(self.embed(x, edge_index, batch, edge_attr, num_graphs))


class CustomGraphModel(nn.Module):
    """A graph model of the user's own (``model=custom``, ``model._target_``): its class built with ``in_channels``
    (categorical node features embedded first, per column, to ``model.hidden_channels``), ``hidden_channels``,
    ``out_channels`` (the target's), ``num_layers`` (``task.layers``) and ``edge_dim`` where it takes them;
    ``forward(x, edge_index, batch[, edge_attr])`` returns one row per graph (it pools its nodes itself)."""

    def __init__(self, cfg, shape, num_layers: int):
        from hpcgnn.models.custom import _construct, arguments, model_class, reads_edge_attr

        super().__init__()
        cls = model_class(cfg)
        hidden = cfg.hidden_channels
        self.node_encoder = ColumnEmbedding(shape.x_vocab, hidden) if shape.x_vocab else None
        in_channels = hidden if shape.x_vocab else shape.num_features
        self.reads_edges = reads_edge_attr(cls, dict(cfg.kwargs)) and shape.edge_dim > 0
        self.edge_encoder = ColumnEmbedding(shape.edge_vocab, hidden) if self.reads_edges and shape.edge_vocab else None
        edge_dim = (hidden if shape.edge_vocab else shape.edge_dim) if self.reads_edges else None
        self.model = _construct(cfg, cls, arguments(cfg, cls, in_channels, shape.num_classes, num_layers, edge_dim))
        self.out_channels, self.target = shape.num_classes, cfg._target_

    def forward(self, x: Tensor, edge_index: Tensor, batch: Tensor, edge_attr: Tensor | None = None,
                num_graphs: int | None = None) -> Tensor:
        h = self.node_encoder(x) if self.node_encoder is not None else x.float()
        if self.reads_edges:
            e = self.edge_encoder(edge_attr) if self.edge_encoder is not None else edge_attr.float()
            out = self.model(h, edge_index, batch, edge_attr=e)
        else:
            out = self.model(h, edge_index, batch)
        graphs = graphs_in(batch, num_graphs)
        if not isinstance(out, Tensor) or tuple(out.shape) != (graphs, self.out_channels):
            from hpcgnn.errors import ConfigError

            got = f"shape {tuple(out.shape)}" if isinstance(out, Tensor) else type(out).__name__
            raise ConfigError(f"model._target_={self.target} returned {got} for a batch of {graphs} graphs: a graph "
                              f"task's model returns one row of {self.out_channels} floats per graph. HINT: pool its "
                              "nodes by graph in forward (torch_geometric.nn.global_mean_pool(h, batch)), then a layer "
                              "of out_channels")
        return out


def probe_custom(run_cfg) -> None:
    """At submit, on the CPU: a graph model of the user's own (``run_cfg.model``) built as the rank builds it for
    two tiny graphs of float features with edge features, and run on them in eval mode: it must return one row of
    the outputs per graph (else a ConfigError naming the fix)."""
    from hpcgnn.data.graph import GraphShape
    from hpcgnn.errors import ConfigError

    shape = GraphShape(4, 3, 2, edge_dim=2)
    model = CustomGraphModel(run_cfg.model, shape, run_cfg.task.layers).eval()
    gen = torch.Generator().manual_seed(0)
    x, edge_attr = torch.randn(5, 4, generator=gen), torch.randn(6, 2, generator=gen)
    edge_index, batch = torch.tensor([[0, 1, 1, 3, 4, 2], [1, 0, 2, 4, 3, 0]]), torch.tensor([0, 0, 0, 1, 1])
    try:
        with torch.no_grad():
            model(x, edge_index, batch, edge_attr, 2)
    except ConfigError:
        raise
    except Exception as exc:
        raise ConfigError(f"model._target_={run_cfg.model._target_} failed on a batch of 2 graphs: forward raised "
                          f"{type(exc).__name__}: {exc}. HINT: a graph task's model takes (x [nodes, in_channels], "
                          "edge_index [2, edges], batch [nodes]: each node's graph[, edge_attr]) and returns one row per "
                          "graph") from None


def task_model(cfg, readout, shape, num_layers: int, relation=None) -> torch.nn.Module:
    """A graph task's model for a graph set of ``shape`` (its outputs: the target's): training's builder and a model
    file's (``TaskSpec.model``; :func:`arguments`, what export writes too). A model of the user's own
    (``model=custom``): :class:`CustomGraphModel`."""
    if cfg.name == "custom":
        return CustomGraphModel(cfg, shape, num_layers)
    return GraphModel(**arguments(cfg, readout, shape, num_layers))


def arguments(cfg, readout, shape, num_layers: int) -> dict:
    """What :class:`GraphModel` is built with for a graph set of ``shape`` (training's, a model file's, export's)."""
    return {"in_channels": shape.num_features, "hidden": cfg.hidden_channels, "out_channels": shape.num_classes,
            "num_layers": num_layers, "dropout": cfg.dropout, "readout": readout or "mean",
            "x_vocab": tuple(shape.x_vocab), "edge_dim": shape.edge_dim, "edge_vocab": tuple(shape.edge_vocab),
            "virtual_node": cfg.virtual_node}


def graph_outputs(model: torch.nn.Module, batch, embeddings: bool = False) -> Tensor:
    """A batch's graphs' outputs (``embeddings``: their rows before the head)."""
    args = (batch.x, batch.edge_index, batch.batch, getattr(batch, "edge_attr", None), int(batch.batch_size))
    if embeddings:
        net = getattr(model, "module", model)
        if not hasattr(net, "embed"):
            from hpcgnn.errors import PredictError

            raise PredictError(f"{type(net.model).__name__} (a model of your own) has no readout hpcgnn can stop "
                               "before. HINT: predict what=predictions, or take the rows you need from "
                               "hpcgnn.load_model(RUN_DIR).model")
        return net.embed(*args)
    return model(*args)
