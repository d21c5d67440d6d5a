"""A model of the user's own (``model=custom model._target_=pkg.module.Class``): built, checked and fed as hpcgnn's.

The contract, for a class that needs no hpcgnn import:

- ``__init__`` takes its own keyword arguments (``model.kwargs``); hpcgnn fills in the widths it knows,
  ``in_channels`` (features), ``out_channels`` (classes; a link model's embedding: ``model.hidden_channels``),
  ``hidden_channels``, ``num_layers`` (``len(train.fanouts)``: one layer per sampled hop) and ``dropout``,
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
"""

from __future__ import annotations

import functools
import hashlib
import inspect
from pathlib import Path

import torch

from hpcgnn.checks import WIDTHS, locate
from hpcgnn.errors import ConfigError

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


def arguments(cfg, cls: type, in_channels: int, out_channels: int, num_layers: int) -> dict:
    """``model.kwargs`` and the widths the class takes, by its own names."""
    named, _ = _parameters(cls.__init__)
    values = {"in_channels": in_channels, "out_channels": out_channels, "hidden_channels": cfg.hidden_channels,
              "num_layers": num_layers, "dropout": cfg.dropout}
    kwargs = dict(cfg.kwargs)
    for width in WIDTHS:
        mapped = getattr(cfg.widths, width)
        name = mapped or width
        if name in named and name not in kwargs:
            kwargs[name] = values[width]
        elif mapped and name not in named:
            raise ConfigError(f"model.widths.{width}={name}: {cfg._target_} takes no argument {name!r} (it takes "
                              f"{', '.join(sorted(named - {'self'})) or 'none'})")
    return kwargs


def build_custom(cfg, in_channels: int, out_channels: int, num_layers: int) -> torch.nn.Module:
    cls = model_class(cfg)
    if cfg.aggregation == "csr" and cls.__module__.startswith("torch_geometric.") and cls.__name__ in CSR_CLASSES:
        import torch_geometric.nn

        if getattr(torch_geometric.nn, cls.__name__, None) is cls:  # PyG's own, not a subclass: the same, in CSR
            from hpcgnn.models.aggregation import csr_model

            cls = csr_model(cls.__name__)
    kwargs = arguments(cfg, cls, in_channels, out_channels, num_layers)
    try:
        model = cls(**kwargs)
    except Exception as exc:
        raise ConfigError(f"model._target_={cfg._target_} refused its arguments {kwargs} ({type(exc).__name__}: "
                          f"{exc}). HINT: set its own in model.kwargs (e.g. '+model.kwargs.heads=2'); hpcgnn fills in "
                          f"{', '.join(WIDTHS)} where the class takes them (model.widths maps other names)") from None
    if hasattr(model, "aggregation"):
        model.aggregation = cfg.aggregation
    return model


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


def check_custom(cfg, in_channels: int = 16, out_channels: int = 3) -> None:
    """At submit, on the CPU: the class imports, takes its arguments, and returns one row of ``out_channels`` floats
    per node of a tiny graph (a link model: of ``model.hidden_channels``); ``train.eval_mode=full`` needs a
    layer-wise model. Each failure is a :class:`~hpcgnn.errors.ConfigError` naming the fix."""
    out = cfg.model.hidden_channels if cfg.task.name == "link" else out_channels
    model = build_custom(cfg.model, in_channels, out, len(cfg.train.fanouts)).eval()
    n = 6
    x = torch.randn(n, in_channels, generator=torch.Generator().manual_seed(0))
    edge_index = torch.tensor([[1, 2, 3, 4, 5, 0], [0, 0, 1, 2, 3, 4]])
    kwargs = {"edge_weight": torch.ones(edge_index.size(1))} if cfg.model.gcn_norm and takes(model, "edge_weight") \
        else {}
    try:
        with torch.no_grad():
            y = model(x, edge_index, **kwargs)
    except Exception as exc:
        raise ConfigError(f"model._target_={cfg.model._target_} failed on a 6-node graph: forward(x, edge_index) "
                          f"raised {type(exc).__name__}: {exc}. HINT: a model's forward takes (x [nodes, "
                          "in_channels], edge_index [2, edges]) and returns one row per node") from None
    if not isinstance(y, torch.Tensor) or tuple(y.shape) != (n, out) or not y.is_floating_point():
        got = f"shape {tuple(y.shape)}, {y.dtype}" if isinstance(y, torch.Tensor) else type(y).__name__
        raise ConfigError(f"model._target_={cfg.model._target_} returned {got} for {n} nodes: a model returns one row "
                          f"of {out} floats per node ({'model.hidden_channels, the embedding' if cfg.task.name == 'link' else 'out_channels, the classes'}). "
                          "HINT: take out_channels in __init__ (hpcgnn fills it in) and end on a layer of that width")
    from hpcgnn.checks import link_eval_mode

    full = (link_eval_mode(cfg) if cfg.task.name == "link" else cfg.train.eval_mode) == "full"
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
