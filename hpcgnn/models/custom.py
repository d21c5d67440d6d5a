"""A model of the user's own (``model=custom model._target_=pkg.module.Class``): built, checked and fed as hpcgnn's.

The contract, for a class that needs no hpcgnn import:

- ``__init__`` takes its own keyword arguments (``model.kwargs``); hpcgnn fills in the widths it knows,
  ``in_channels`` (features), ``out_channels`` (classes; a link model's embedding: ``model.hidden_channels``),
  ``hidden_channels``, ``num_layers`` (``len(train.fanouts)``: one layer per sampled hop), ``dropout`` and, on a
  homogeneous graph where ``forward`` takes ``edge_attr``, ``edge_dim`` (the width of the graph's edge features),
  each where the class takes an argument of that name (or of the name ``model.widths`` maps it to) and
  ``model.kwargs`` does not set it;
- ``forward(x, edge_index, ...)`` returns one row per input node (the batch's seeds come first, and their
  rows are the ones scored); it is handed, by name and only where it takes them: ``edge_weight`` (GCN's
  weights from the whole graph's degrees, with ``model.gcn_norm=true``), ``num_sampled_nodes_per_hop`` and
  ``num_sampled_edges_per_hop`` (PyG's ``trim_to_layer``: a ``BasicGNN`` computes the seeds only at its
  last layer).

A model built on PyG's ``BasicGNN`` (a subclass of yours, or PyG's own ``GraphSAGE``, ``GIN``...) has
``inference_per_layer``: exact layer-wise evaluation (``train.eval_mode=full``) works for it. PyG's own
``GraphSAGE``, ``GIN`` and ``GAT`` get hpcgnn's CSR aggregation (``model.aggregation=csr``), the same
parameters. Other models are evaluated on sampled batches; ``eval_mode=full`` is refused for them at submit.

On a typed graph (``synthetic_hetero``, ogbn-mag, a typed folder, ``pyg_hetero``) the model is relational:

- a class whose ``__init__`` takes ``metadata`` gets PyG's ``(node_types, edge_types)`` and is the model itself
  (per-relation layers: ``HeteroConv``, ``HGTConv``...); its ``forward(x_dict, edge_index_dict)`` returns the
  labelled type's rows, or a dict of every type's (the labelled type's are taken);
- any other class is built as on a homogeneous graph and made relational by PyG's ``to_hetero`` (one copy of
  each layer per relation, summed per type).

Every type's features have the same width (``in_channels``). Layers with lazy widths (``-1``) are sized by one
forward on a tiny graph when the model is built, on every rank alike (what DDP and the optimiser need).
"""

from __future__ import annotations

import functools
import hashlib
import inspect
from pathlib import Path

import torch

from hpcgnn.checks import WIDTHS, locate
from hpcgnn.errors import ConfigError, DatasetError
from hpcgnn.specs import tasks

CSR_CLASSES = ("GraphSAGE", "GIN", "GAT")  # PyG's own classes that hpcgnn's CSR aggregation replaces alike


def model_class(cfg) -> type:
    """The class ``model._target_`` names (refused, naming the fix, when it cannot be imported)."""
    cls, why = locate(cfg._target_)
    if cls is None:
        module_name, _, class_name = cfg._target_.rpartition(".")
        raise ConfigError(f"model._target_={cfg._target_} cannot be imported{why or f': {module_name} has no {class_name}'}"
                          f". HINT: the job imports it too: install its package in the job's environment, or put "
                          f"its folder on PYTHONPATH (a submitted job inherits it)")
    if not (isinstance(cls, type) and issubclass(cls, torch.nn.Module)):
        raise ConfigError(f"model._target_={cfg._target_} is not a torch.nn.Module class")
    return cls


def _parameters(fn) -> tuple[set[str], bool]:
    """The named parameters of ``fn`` and whether it takes ``**kwargs``."""
    params = inspect.signature(fn).parameters.values()
    return ({p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)},
            any(p.kind == p.VAR_KEYWORD for p in params))


def arguments(cfg, cls: type, in_channels: int, out_channels: int, num_layers: int,
              edge_dim: int | None = None) -> dict:
    """``model.kwargs`` and the widths the class takes, by its own names (``edge_dim``: the edges' features', where
    the model reads them; None: not filled in)."""
    named, _ = _parameters(cls.__init__)
    values = {"in_channels": in_channels, "out_channels": out_channels, "hidden_channels": cfg.hidden_channels,
              "num_layers": num_layers, "dropout": cfg.dropout, "edge_dim": edge_dim}
    kwargs = dict(cfg.kwargs)
    for width in WIDTHS:
        mapped = getattr(cfg.widths, width)
        name = mapped or width
        if values[width] is None:
            continue
        if name in named and name not in kwargs:
            kwargs[name] = values[width]
        elif mapped and name not in named:
            raise ConfigError(f"model.widths.{width}={name}: {cfg._target_} takes no argument {name!r} (it takes "
                              f"{', '.join(sorted(named - {'self'})) or 'none'})")
    return kwargs


def _construct(cfg, cls: type, kwargs: dict) -> torch.nn.Module:
    try:
        return cls(**kwargs)
    except Exception as exc:
        shown = {k: v for k, v in kwargs.items() if k not in ("metadata", "edge_dims")}
        raise ConfigError(f"model._target_={cfg._target_} refused its arguments {shown} ({type(exc).__name__}: "
                          f"{exc}). HINT: set its own in model.kwargs (e.g. '+model.kwargs.heads=2'); hpcgnn fills in "
                          f"{', '.join(WIDTHS)} where the class takes them (model.widths maps other names)") from None


def reads_edge_attr(cls: type, kwargs: dict) -> bool:
    """Whether a model class reads edge features: its forward takes ``edge_attr`` (a PyG basic GNN: its
    convolutions read them, ``supports_edge_attr``, and it is given an ``edge_dim``), or a typed model's
    ``edge_attr_dict``."""
    named, _ = forward_takes(cls)
    if "edge_attr_dict" in named:
        return True
    if "edge_attr" not in named:
        return False
    from torch_geometric.nn.models.basic_gnn import BasicGNN

    if issubclass(cls, BasicGNN):
        return bool(getattr(cls, "supports_edge_attr", False)) and bool(kwargs.get("edge_dim"))
    return True


def declared_edge_dim(cfg) -> tuple[str, int | None]:
    """The name under which a model of the user's own takes its edge features' width (``edge_dim``, or the name
    ``model.widths.edge_dim`` maps it to), and the width ``model.kwargs`` gives it there (None: none)."""
    key = cfg.widths.edge_dim or "edge_dim"
    given = cfg.kwargs.get(key)
    return key, None if given is None else int(given)


def takes_edge_dim(cfg) -> bool:
    """Whether a model's ``__init__`` takes its edge features' width by name (``edge_dim``, or the name
    ``model.widths.edge_dim`` maps it to): hpcgnn fills it in, unless ``model.kwargs`` sets it."""
    return declared_edge_dim(cfg)[0] in _parameters(model_class(cfg).__init__)[0]


PROBE_EDGE_DIM = 3  # the width of the tiny graph's edge features where the graph's is not known yet (at submit)


def build_custom(cfg, in_channels: int, out_channels: int, num_layers: int, edge_dim: int | None = 0) -> torch.nn.Module:
    """The user's model for a homogeneous graph, probed on a tiny graph (:func:`probe`). Where it reads edge
    features, it is given their width (``edge_dim``: the graph's; None: not known yet, at submit before the graph
    is prepared) where its ``__init__`` takes it (:func:`takes_edge_dim`), and the tiny graph's edges have that
    many. A model that fixes its own width is probed where the graph's is known (on the rank, at the latest)."""
    cls = model_class(cfg)
    if cfg.aggregation == "csr" and cls.__module__.startswith("torch_geometric.") and cls.__name__ in CSR_CLASSES:
        import torch_geometric.nn

        if getattr(torch_geometric.nn, cls.__name__, None) is cls:  # PyG's own, not a subclass: the same, in CSR
            from hpcgnn.models.aggregation import csr_model

            cls = csr_model(cls.__name__)
    reads = reads_edge_attr(cls, dict(cfg.kwargs))
    width = None
    if reads:  # the graph's width; else the one model.kwargs gives, or any where hpcgnn fills it in
        given = declared_edge_dim(cfg)[1] or cfg.kwargs.get("edge_dim")
        width = edge_dim or (int(given) if given else PROBE_EDGE_DIM if takes_edge_dim(cfg) else None)
    model = _construct(cfg, cls, arguments(cfg, cls, in_channels, out_channels, num_layers, width))
    if hasattr(model, "aggregation"):
        model.aggregation = cfg.aggregation
    x = torch.randn(6, in_channels, generator=torch.Generator().manual_seed(0))
    edge_index = torch.tensor([[1, 2, 3, 4, 5, 0], [0, 0, 1, 2, 3, 4]])
    kwargs = {"edge_weight": torch.ones(edge_index.size(1))} if cfg.gcn_norm and takes(model, "edge_weight") else {}
    if reads:
        kwargs["edge_attr"] = torch.randn(edge_index.size(1), width or 1, generator=torch.Generator().manual_seed(1))
    if reads and width is None:  # its own width, the graph's not known yet: whatever it is, the rank probes it
        return model
    probe(cfg, model, (x, edge_index), kwargs, 6, out_channels)
    return model


class TypedCustom(torch.nn.Module):
    """A model of the user's own on a typed graph: ``forward(x_dict, edge_index_dict)`` gives the labelled type's
    rows (taken from a dict of every type's where the model returns one). A relational model's last layer computes
    types the loss never reads: DDP looks for the parameters a step did not use. ``edge_keyword``: the keyword
    under which the model takes the relations' edge features (``edge_attr_dict``; ``edge_attr`` for a model made
    relational by ``to_hetero``), None where it reads none."""

    unused_parameters = True

    def __init__(self, target: str, model: torch.nn.Module, built_from: str, edge_keyword: str | None = None,
                 outputs: tuple[str, ...] | None = None):
        super().__init__()
        self.target, self.model, self.built_from = target, model, built_from  # (built_from: what summary.json names)
        self.edge_keyword, self.outputs = edge_keyword, outputs  # (outputs: the types returned by type, if any)
        self.supports_trim = takes(model, "num_sampled_nodes_dict") and takes(model, "num_sampled_edges_dict")

    def forward(self, x_dict: dict, edge_index_dict: dict, edge_attr_dict: dict | None = None,
                **kwargs) -> torch.Tensor:
        if self.edge_keyword is not None:
            kwargs[self.edge_keyword] = edge_attr_dict
        out = self.model(x_dict, edge_index_dict, **kwargs)
        if self.outputs:  # an edge task's ends: each type's rows
            if not isinstance(out, dict):
                raise ConfigError(f"{self.built_from} returned one tensor: an edge task on a typed graph needs each "
                                  f"type's rows ({', '.join(self.outputs)}). HINT: return a dict, node type -> rows")
            return {t: out[t] for t in self.outputs}
        return out[self.target] if isinstance(out, dict) else out


def build_custom_typed(cfg, node_types, relations, target: str, in_channels: int, out_channels: int,
                       num_layers: int, edge_dims: dict[str, int] | None = None,
                       outputs: tuple[str, ...] | None = None) -> TypedCustom:
    """The user's model for a typed graph: given ``metadata`` (and ``edge_dims``, relation -> the width of its edges'
    features, 0 for none) where it takes them, else made relational by ``to_hetero``; probed on a tiny graph of the
    same types and relations (:func:`probe`), with edge features of each relation's width (``edge_dims``: relation
    key -> width) where the model reads them."""
    cls = model_class(cfg)
    metadata = (list(node_types), [tuple(r) for r in relations])
    kwargs = arguments(cfg, cls, in_channels, out_channels, num_layers)
    built_from = f"{cls.__module__}.{cls.__qualname__}"
    edge_keyword = None
    if reads_edge_attr(cls, dict(cfg.kwargs)):
        edge_keyword = "edge_attr_dict" if "edge_attr_dict" in forward_takes(cls)[0] else "edge_attr"
        if not edge_dims:
            raise DatasetError(f"model._target_={cfg._target_} reads edge features ({edge_keyword}), but no relation "
                               "of the typed graph has any. HINT: give them (files: edges/<relation>/edge_attr.npy, "
                               "a row per edge; PyG: data[relation].edge_attr), or a model that reads none")
    if "metadata" in _parameters(cls.__init__)[0]:
        if "edge_dims" in _parameters(cls.__init__)[0]:  # relation -> the width of its edges' features (if any)
            kwargs["edge_dims"] = {tuple(r): (edge_dims or {}).get("__".join(r), 0) for r in relations}
        model = _construct(cfg, cls, {"metadata": metadata, **kwargs})
    else:
        built_from += " (relational by to_hetero)"
        from torch_geometric.nn import to_hetero

        try:
            model = to_hetero(_construct(cfg, cls, kwargs), metadata, aggr="sum")
        except ConfigError:
            raise
        except Exception as exc:
            raise ConfigError(f"model._target_={cfg._target_} could not be made relational by PyG's to_hetero "
                              f"({type(exc).__name__}: {exc}). HINT: take metadata in __init__ (PyG's (node_types, "
                              "edge_types)) and build a layer per relation (HeteroConv)") from None
    model = TypedCustom(target, model, built_from, edge_keyword)
    n = 3
    gen = torch.Generator().manual_seed(0)
    x_dict = {t: torch.randn(n, in_channels, generator=gen) for t in node_types}
    ring = torch.tensor([[0, 1, 2], [1, 2, 0]])
    edges = {}
    if edge_keyword is not None:  # (each relation with features: its width)
        edges["edge_attr_dict"] = {tuple(r): torch.randn(n, edge_dims["__".join(r)], generator=gen) for r in relations
                                   if edge_dims.get("__".join(r))}
    inputs = (x_dict, {tuple(r): ring for r in relations})
    probe(cfg, model, inputs, edges, n, out_channels)
    if outputs:  # an edge task's two ends: their rows by type (refused, naming the fix, where it gives one tensor)
        model.outputs = tuple(outputs)
        with torch.no_grad():
            model.eval()(*inputs, **edges)
        model.train()
    return model


def probe(cfg, model: torch.nn.Module, inputs: tuple, kwargs: dict, n: int, out_channels: int) -> None:
    """One forward on a tiny graph of ``n`` nodes (per type) in eval mode, without gradients: lazy widths (``-1``) get
    their sizes, and a model that fails or returns anything but ``n`` rows of ``out_channels`` floats is refused
    (:class:`~hpcgnn.errors.ConfigError`, naming the fix; at submit and on the rank)."""
    was = model.training
    model.eval()
    try:
        with torch.no_grad():
            y = model(*inputs, **kwargs)
            again = model(*inputs, **kwargs) if isinstance(y, torch.Tensor) else y
    except ConfigError:
        raise
    except Exception as exc:
        what = "forward(x_dict, edge_index_dict)" if isinstance(model, TypedCustom) else "forward(x, edge_index)"
        takes_ = ("(x_dict {type: [nodes, in_channels]}, edge_index_dict {relation: [2, edges]}) and returns the "
                  "labelled type's rows" if isinstance(model, TypedCustom) else
                  "(x [nodes, in_channels], edge_index [2, edges]) and returns one row per node")
        raise ConfigError(f"model._target_={cfg._target_} failed on a {n}-node graph: {what} raised "
                          f"{type(exc).__name__}: {exc}. HINT: a model's forward takes {takes_}") from None
    finally:
        model.train(was)
    if not isinstance(y, torch.Tensor) or tuple(y.shape) != (n, out_channels) or not y.is_floating_point():
        got = f"shape {tuple(y.shape)}, {y.dtype}" if isinstance(y, torch.Tensor) else type(y).__name__
        raise ConfigError(f"model._target_={cfg._target_} returned {got} for {n} nodes: a model returns one row of "
                          f"{out_channels} floats per node (out_channels: the classes; a link task's encoder: its embedding, "
                          "model.hidden_channels). HINT: take out_channels in __init__ "
                          "(hpcgnn fills it in) and end on a layer of that width")
    if not torch.equal(y, again):  # (PyG's to_hetero traces F.dropout(x, p, self.training) as always on)
        raise ConfigError(f"model._target_={cfg._target_} gives different outputs for the same input in eval mode: "
                          "its evaluation would be random. HINT: drop out with torch.nn.Dropout modules (a functional "
                          "dropout that to_hetero traced stays on in eval mode), or make forward deterministic")


@functools.lru_cache(maxsize=64)
def forward_takes(cls: type) -> tuple[frozenset[str], bool]:
    """What a model class's ``forward`` takes by name, and whether it takes ``**kwargs``."""
    named, var = _parameters(cls.forward)
    return frozenset(named), var


def takes(model: torch.nn.Module, name: str) -> bool:
    """Whether ``model.forward`` takes the keyword ``name`` (hpcgnn's own models take every batch keyword)."""
    named, var = forward_takes(type(model))
    return name in named or var


def is_layerwise(model: torch.nn.Module) -> bool:
    """Whether exact layer-wise inference can run the model (PyG's BasicGNN interface)."""
    return callable(getattr(model, "inference_per_layer", None)) and isinstance(getattr(model, "num_layers", None), int)


def check_custom(cfg, in_channels: int = 16, out_channels: int = 3, schema=None, edge_dim: int | None = None) -> None:
    """At submit, on the CPU: the class imports, takes its arguments, and returns one row of ``out_channels`` floats
    per node of a tiny graph (a link model: of ``model.hidden_channels``; ``schema``: a typed graph's types and
    relations; ``edge_dim``: the width of the graph's edge features, None where it is not known yet);
    ``train.eval_mode=full`` needs a layer-wise model. Each failure is a :class:`~hpcgnn.errors.ConfigError` naming
    the fix."""
    from hpcgnn.checks import eval_mode

    layers = len(cfg.train.fanouts)
    if schema is not None:
        build_custom_typed(cfg.model, schema.node_types, schema.relations, schema.target, in_channels, out_channels,
                           layers, schema.edge_dims)
        return  # (eval_mode=full on a typed graph: refused for custom models by the config's checks)
    out = cfg.model.hidden_channels if tasks.SPECS[cfg.task.name].encoder else out_channels  # (an encoder's)
    model = build_custom(cfg.model, in_channels, out, layers, edge_dim)
    full = eval_mode(cfg) == "full"
    if full and not is_layerwise(model):
        raise ConfigError(f"train.eval_mode=full runs a model layer by layer (PyG's BasicGNN interface: num_layers, "
                          f"inference_per_layer); {cfg.model._target_} has none. HINT: train.eval_mode=sampled, or "
                          "build the model on torch_geometric.nn.models.basic_gnn.BasicGNN")


def source_of(cfg) -> dict:
    """What was trained: the class, its source file and that file's SHA-256 (the run folder keeps it)."""
    cls = model_class(cfg)
    try:
        path = Path(inspect.getfile(cls)).resolve()
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
    except (TypeError, OSError):
        path, digest = None, None
    return {"class": cfg._target_, "file": str(path) if path else None, "sha256": digest}
