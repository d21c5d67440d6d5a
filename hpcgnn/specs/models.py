"""Every built-in model family, declared once (:data:`SPECS`): its name, the graphs it trains on, where exact
(layer-wise) inference serves it, whether it reads edge features, and its builders.

Who reads it: :mod:`hpcgnn.checks` (the names a config may use and what each supports), :mod:`hpcgnn.models`
(the builders, the batch transform), docs/training.md's table of models (a test holds it to this). A model of the
user's own is ``model=custom`` with ``model._target_``: not a spec, it says what it supports by its ``forward``.

Adding a model family: one :class:`ModelSpec` here, its builders in :mod:`hpcgnn.models` (``fn(cfg, in_channels,
out_channels, num_layers)`` on a homogeneous graph; ``fn(cfg, node_types, relations, target, in_channels,
out_channels, num_layers, outputs)`` on a typed one), its yaml and its line in docs/training.md.
"""

from __future__ import annotations

from dataclasses import dataclass

CUSTOM = "custom"  # model.name of a model of the user's own (model._target_)


@dataclass(frozen=True)
class ModelSpec:
    """One model family: what the checks, the builders and the docs need to know, in one place."""

    name: str
    says: str  # what it is, in a few words (docs, hints)
    build: str | None = None  # builder on a homogeneous graph, "module:function" (None: typed graphs only)
    typed_build: str | None = None  # builder on a typed graph, "module:function" (None: homogeneous graphs only)
    exact: tuple[str, ...] = ()  # graphs exact inference (train.eval_mode=full) serves it on: "plain", "typed"
    edge_features: bool = False  # reads edge features (model.edge_dim)
    uses_edges: bool = True  # False: its batches need no sampled neighbours
    global_gcn_norm: bool = False  # batches carry GCN weights from the whole graph's degrees, and self-loops
    times: bool = False  # reads each sampled edge's age: a graph whose edges have times, sampled as of each seed's time

    @property
    def plain(self) -> bool:
        """Whether it trains on a homogeneous graph."""
        return self.build is not None

    @property
    def typed(self) -> bool:
        """Whether it trains on a typed graph."""
        return self.typed_build is not None


SPECS: dict[str, ModelSpec] = {s.name: s for s in (
    ModelSpec("sage", "GraphSAGE (mean); on a typed graph, per relation through PyG's to_hetero",
              build="hpcgnn.models.gnn:build_sage", typed_build="hpcgnn.models.typed:build_sage", exact=("plain",)),
    ModelSpec("gcn", "GCN, normalised by the whole graph's degrees", build="hpcgnn.models.gnn:build_gcn",
              exact=("plain",), global_gcn_norm=True),
    ModelSpec("gat", "GAT; with model.edge_dim its attention reads edge features", build="hpcgnn.models.gnn:build_gat",
              exact=("plain",), edge_features=True),
    ModelSpec("gin", "GIN; GINE with model.edge_dim", build="hpcgnn.models.gnn:build_gin", exact=("plain",),
              edge_features=True),
    ModelSpec("mlp", "an MLP on the node's own features: the baseline", build="hpcgnn.models.gnn:build_mlp",
              typed_build="hpcgnn.models.typed:build_mlp", exact=("plain", "typed"), uses_edges=False),
    ModelSpec("tgat", "TGAT: attention over sampled neighbours, each edge read with its age encoded (timed graphs)",
              build="hpcgnn.models.temporal:build_tgat", times=True),
    ModelSpec("rgcn", "R-GCN: one weight per relation", typed_build="hpcgnn.models.typed:build_rgcn",
              exact=("typed",)),
)}


def names(*, plain: bool | None = None, typed: bool | None = None, exact: str | None = None,
          edge_features: bool | None = None) -> tuple[str, ...]:
    """The names of the model families with the given properties (None: any), in declaration order."""
    return tuple(s.name for s in SPECS.values()
                 if (plain is None or s.plain == plain) and (typed is None or s.typed == typed)
                 and (exact is None or exact in s.exact)
                 and (edge_features is None or s.edge_features == edge_features))
