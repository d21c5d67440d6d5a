"""A run's trained model, kept in its run folder, and :func:`load_model`, which gives it back.

    <run_dir>/model/best.pt   the weights of the best validation epoch (the one summary.json reports)
    <run_dir>/model/last.pt   the weights at the run's last step (and at each checkpoint before it)

Each file holds the weights and what rebuilds the model: the model config, the task (and a link model's
decoder), the depth, the data's widths (features, classes; a typed graph's node types and relations), the
class, and where they came from (run id, dataset fingerprint, epoch, step, the epoch's metrics). Plain
containers and tensors only: :func:`torch.load` reads it with ``weights_only=True``. Rank 0 writes them,
atomically: ``best.pt`` once per improvement, ``last.pt`` at each checkpoint and at the end. The best weights
are also part of every checkpoint, so a resumed run keeps the right ``best.pt`` whatever happened after.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from pathlib import Path

import torch

from hpcgnn import paths, trust
from hpcgnn.errors import NotTrusted, UserError
from hpcgnn.specs import tasks

FORMAT = 1
FOLDER = "model"
WHICH = ("best", "last")


class ModelFileError(UserError):
    """A run folder without the model asked for, or a file that is not one of hpcgnn's models."""

    kind = "model error"


def model_path(run_dir: str | Path, which: str) -> Path:
    return Path(run_dir) / FOLDER / f"{which}.pt"


def describe(model: torch.nn.Module, cfg, shape, weights: dict, **origin) -> dict:
    """What a model file holds: ``weights`` (a state dict, on the CPU) and what rebuilds the model."""
    schema = shape.schema
    return {
        "format": FORMAT,
        "task": cfg.task.name,
        "decoder": tasks.SPECS[cfg.task.name].decoder(cfg.task),
        "model": dataclasses.asdict(cfg.model),
        "num_layers": tasks.SPECS[cfg.task.name].layers(cfg),
        "shape": {"num_features": shape.num_features, "num_classes": shape.num_classes, "num_nodes": shape.num_nodes,
                  "schema": schema.to_meta() if schema is not None else None},
        "target": shape.target.record() if shape.target is not None else None,  # a node task's kind and scale
        "edge_dim": shape.edge_dim,  # the width of the edge features the model reads (0: none)
        "pair_edge_dim": shape.pair_edge_dim,  # an edge model's decoder: the target edges' own features' (0: none)
        "x_vocab": list(shape.x_vocab), "edge_vocab": list(shape.edge_vocab),  # categorical features' ranges (graphs)
        "relation": list(getattr(model, "relation", None) or []) or None,  # a typed edge model's targets' relation
        "class": class_name(model),
        "source": model_source(cfg.model),  # a model of the user's own: its class, source file and the file's hash
        **origin,
        "state_dict": weights,
    }


def class_name(model: torch.nn.Module) -> str:
    """The model's class, module and name (a link model: its encoder's, the one the config chose)."""
    model = getattr(model, "encoder", model)
    built = getattr(model, "built_from", None)  # a user's model on a typed graph (models.custom.TypedCustom)
    return built or f"{type(model).__module__}.{type(model).__qualname__}"


def model_source(model_cfg) -> dict | None:
    """A model of the user's own: its class, source file and the file's SHA-256 (None: one of hpcgnn's)."""
    from hpcgnn.checks import is_custom

    if not is_custom(model_cfg):
        return None
    from hpcgnn.models.custom import source_of

    return source_of(model_cfg)


def cpu_weights(model: torch.nn.Module) -> dict:
    """A copy of ``model``'s state dict on the CPU (what a model file keeps)."""
    return {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}


def keep(run_dir: str | Path, which: str, record: dict) -> Path:
    """A run's ``model/<which>.pt`` (rank 0), whole or not at all; a full disk is a
    :class:`~hpcgnn.errors.CheckpointError` naming it."""
    from hpcgnn.errors import CheckpointError
    from hpcgnn.io import no_room

    path = model_path(run_dir, which)
    try:
        return write(path, record)
    except OSError as exc:
        if not no_room(exc):
            raise
        raise CheckpointError(f"the {which} model ({path}) does not fit: {exc.strerror}. HINT: free space there, "
                              "or move the run to a file system with room") from None


def write(path: Path, record: dict) -> Path:
    """``record`` into ``path``, whole or not at all; a disk without room raises its OSError."""
    from hpcgnn.io import save_whole

    return save_whole(path, record)


TRUSTED = ("hpcgnn.", "torch_geometric.")  # a model file naming a class elsewhere is rebuilt only when trusted


def read(path: str | Path, trusted: bool = False, how: str = "trust=true") -> dict:
    """A model file's record (refused, naming the fix, when there is none or it is not hpcgnn's). Unless
    ``trusted``, the file and its folders must be the user's own, and its class must be hpcgnn's or PyG's
    (:func:`check_source`: ``how`` is the option that says it is trusted, named in the refusal)."""
    path = Path(path)
    if not path.is_file():
        raise ModelFileError(f"no model file {path}. HINT: a run keeps model/best.pt and model/last.pt from its first "
                             "evaluated epoch on; runs made before hpcgnn kept models have none")
    if not trusted:
        hint = f"copy the run into a folder of your own, or give {how} if you trust whoever wrote it"
        paths.check_root(path.parent, "the model file's folder", hint)
        os.close(paths.open_nofollow(path, os.O_RDONLY, what="the model file", private=True))
    try:
        record = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # (a truncated or foreign file: torch's own error, its first line, says which)
        why = (str(exc).strip().splitlines() or [""])[0][:200]
        raise ModelFileError(f"{path} is not a model file hpcgnn can read ({type(exc).__name__}: {why})") from None
    if not isinstance(record, dict) or record.get("format") != FORMAT or "state_dict" not in record:
        raise ModelFileError(f"{path} is not a model file of this hpcgnn (format {record.get('format')!r}, want "
                             f"{FORMAT})" if isinstance(record, dict) else f"{path} is not a model file of hpcgnn")
    check_source(record.get("model") or {}, trusted, how, f"the model file {path}")
    decoder = record.get("decoder")
    own = record.get("task") in tasks.SPECS and tasks.SPECS[record["task"]].own("decoder") is not None
    if own and isinstance(decoder, str) and "." in decoder:  # a decoder of the user's own
        check_source({"name": "custom", "_target_": decoder}, trusted, how, f"the model file {path} (its decoder)")
    return record


def check_source(model: dict, trusted: bool, how: str, where: str) -> None:
    """Before a model's class is imported (importing runs its module's code): refused unless its module is a file of
    an installed package path that only its owner (the user, or root) can write, at every level of the package
    (:func:`hpcgnn.paths.check_tree`). A class of your own, named by a model file in a folder of your own (the
    callers check that, unless ``trusted``), then loads without ``trust=true``: trust is asked only for what it
    guards, a folder or a package another user may have written (``how`` names the option)."""
    import importlib.util

    target = model.get("_target_") if model.get("name") == "custom" else None
    if not target:
        return
    if not isinstance(target, str) or not all(part.isidentifier() for part in target.split(".")):
        raise NotTrusted(f"{where} names the class {str(target)[:80]!r}, which is no module path. HINT: give {how} "
                         "only if you trust whoever wrote it")
    top = target.split(".")[0]
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        spec = None
    origin = spec.origin if spec is not None and spec.has_location else None
    if origin is None:
        raise NotTrusted(f"{where} names the class {target}, whose package {top} is no file of an installed "
                         "package path here. HINT: install it (or put its folder on PYTHONPATH) where you load "
                         "the model")
    if target.startswith(TRUSTED):
        return
    hint = f"install {top} where only you (or root) can write" + ("" if trusted else f", or give {how} if it is a "
                                                                    "colleague's package you trust")
    origin = Path(origin)
    package = origin.parent if origin.name == "__init__.py" else origin
    with paths.others_may_own() if trusted else contextlib.nullcontext():  # (trusted: its owner may be a colleague)
        paths.check_root(package.parent, f"the folder of {top}", hint)
        paths.check_under(package.parent, package, f"the package {top}", hint)
        if package.is_dir():
            paths.check_tree(package, f"the package {top}", hint)


def rebuild(record: dict) -> torch.nn.Module:
    """The model a record describes, with its weights, in eval mode, on the CPU."""
    from hpcgnn.config import ModelConfig, frozen
    from hpcgnn.specs import load

    shape = shape_of(record)
    build = load(tasks.SPECS[record["task"]].model)  # (the task's builder, training's too)
    model = build(frozen(ModelConfig, record["model"]), record["decoder"], shape, record["num_layers"],
                  record.get("relation"))
    model.load_state_dict(record["state_dict"])
    return model.eval()


def shape_of(record: dict):
    """The :class:`~hpcgnn.data.graph.GraphShape` a model file's model was built for."""
    from hpcgnn.data.graph import GraphShape
    from hpcgnn.data.typed import TypedSchema

    s = record["shape"]
    schema = TypedSchema.from_meta(s["schema"]) if s["schema"] is not None else None
    return GraphShape(s["num_features"], s["num_classes"], s["num_nodes"], schema, target_of(record),
                      record.get("edge_dim", 0), record.get("pair_edge_dim", 0), tuple(record.get("x_vocab", ())),
                      tuple(record.get("edge_vocab", ())))


def target_of(record: dict):
    """A node model's :class:`~hpcgnn.labels.Target` (its kind, and a regression's scale); a file from before the
    kinds: classification."""
    from hpcgnn.labels import Target

    return Target.from_record(record.get("target"), record["shape"]["num_classes"])


def load_model(run_dir: str | Path, which: str = "best", trust_run: bool = False) -> torch.nn.Module:
    """The model a run trained, as a ``torch.nn.Module`` on the CPU in eval mode: ``which="best"`` (the weights of
    the epoch summary.json reports) or ``"last"``; ``run_dir`` may also be a model file itself. Needs no SLURM,
    no process group and no data: a notebook can call it. A run folder or model file another user owns or may
    write (at any depth) is loaded only with ``trust_run=True``; a model of a class of your own needs none where
    its package is one only you (or root) can write, and is refused either way where it is not (rebuilding a
    model imports its class's module, :func:`check_source`).

    >>> model = hpcgnn.load_model("outputs/2026-11-26/10-00-00")   # doctest: +SKIP
    """
    path = Path(run_dir)
    if path.is_dir():
        if which not in WHICH:
            raise ModelFileError(f"which={which!r}: a run keeps {' and '.join(WHICH)}")
        if not trust_run:
            trust.run_folder(path, "copy the run into a folder of your own, or give trust_run=True if you trust "
                                   "whoever wrote it")
        path = model_path(path, which)
    return rebuild(read(path, trust_run, "trust_run=True"))


# ------------------------------------------------------------------------------ a plain PyG model file

PLAIN = {"sage": "GraphSAGE", "gcn": "GCN", "gat": "GAT", "gin": "GIN"}  # hpcgnn's name -> PyG's own class


def plain(record: dict) -> dict:
    """What rebuilds the model without hpcgnn: ``{"class": "pkg.module.Name", "kwargs": {...}, "state_dict":
    {...}}`` (a link model: its encoder, the node embedding; ``decoder`` names how pairs were scored), and where
    it came from (``hpcgnn``). hpcgnn's sage, gcn, gat and gin are PyG's own classes with the same parameters
    (gcn with ``normalize=True``: PyG's own normalisation over the whole graph is the global-degree one it was
    trained with), mlp is PyG's ``MLP``, a model of the user's own is its class with the arguments hpcgnn gave it.
    Typed graphs' models are refused (``rgcn`` is hpcgnn's; ``to_hetero`` builds its modules at run time)."""
    from hpcgnn.config import ModelConfig, frozen

    cfg, s = frozen(ModelConfig, record["model"]), record["shape"]
    if s["schema"] is not None:
        raise ModelFileError(f"a model of a typed graph ({record['class']}) has no plain PyG form: its modules are "
                             "built from the graph's types. HINT: hpcgnn.load_model(RUN_DIR) gives it, on the CPU")
    if record["task"] == "graph" and cfg.name == "custom":
        raise ModelFileError(f"a graph model of your own ({cfg._target_}) is wrapped by hpcgnn's embeddings of its "
                             "categorical features. HINT: hpcgnn.load_model(RUN_DIR) gives it, on the CPU")
    if record["task"] == "graph":  # (hpcgnn's GraphModel, a plain torch module: its readout and head kept)
        from hpcgnn.models.graph import arguments

        kwargs = arguments(cfg, record["decoder"], shape_of(record), record["num_layers"])
        return {"class": "hpcgnn.models.graph.GraphModel", "kwargs": kwargs,
                "state_dict": record["state_dict"], "decoder": None,
                "hpcgnn": {k: record.get(k) for k in ("task", "class", "which", "epoch", "step", "metrics", "run_id",
                                                      "dataset", "source")}}
    link = tasks.SPECS[record["task"]].encoder  # (a pair model: its encoder, the node embedding)
    inp, out, layers = s["num_features"], cfg.hidden_channels if link else s["num_classes"], record["num_layers"]
    weights = {k.removeprefix("encoder."): v for k, v in record["state_dict"].items()
               if not link or k.startswith("encoder.")}
    if cfg.name == "custom":
        from hpcgnn.models.custom import CSR_CLASSES, arguments, model_class

        cls = model_class(cfg)
        kwargs = arguments(cfg, cls, inp, out, layers, record.get("edge_dim") or None)  # (as built: its edge_dim)
        name = cfg._target_
        if cls.__module__.startswith("torch_geometric.") and cls.__name__ in CSR_CLASSES:
            name = f"torch_geometric.nn.models.{cls.__name__}"
    elif cfg.name == "mlp":
        name = "torch_geometric.nn.models.MLP"
        kwargs = {"in_channels": inp, "hidden_channels": cfg.hidden_channels, "out_channels": out,
                  "num_layers": layers, "dropout": cfg.dropout, "norm": None}
        weights = {k.removeprefix("mlp."): v for k, v in weights.items()}
    else:
        if cfg.name == "gin" and cfg.edge_dim:
            raise ModelFileError("a gin reading edge features (model.edge_dim) is hpcgnn's GINE, a PyG basic GNN of "
                                 "GINEConv that PyG has no class for. HINT: hpcgnn.load_model(RUN_DIR) gives it")
        name = f"torch_geometric.nn.models.{PLAIN[cfg.name]}"
        kwargs = {"in_channels": inp, "hidden_channels": cfg.hidden_channels, "num_layers": layers,
                  "out_channels": out, "dropout": cfg.dropout, **({"heads": cfg.heads} if cfg.name == "gat" else {}),
                  **({"edge_dim": cfg.edge_dim} if cfg.edge_dim else {})}
    return {"class": name, "kwargs": kwargs, "state_dict": weights, "decoder": record["decoder"] if link else None,
            "hpcgnn": {k: record.get(k) for k in ("task", "class", "which", "epoch", "step", "metrics", "run_id",
                                                  "dataset", "source")}}


def export(run_dir: str | Path, which: str = "best", out: str | Path | None = None, trusted: bool = False) -> Path:
    """A run's model as a plain PyG file (:func:`plain`), ``RUN_DIR/model/<which>.plain.pt`` unless ``out``: load
    it with torch and the class it names, no hpcgnn (docs/after-training.md shows the four lines). ``trusted``: a
    run folder another user may have written (``hpcgnn export RUN_DIR trust=true``)."""
    if Path(run_dir).is_dir() and not trusted:
        trust.run_folder(run_dir, "copy the run into a folder of your own, or give trust=true if you trust whoever "
                                  "wrote it")
    path = model_path(run_dir, which) if Path(run_dir).is_dir() else Path(run_dir)
    target = Path(out) if out is not None else path.with_suffix(".plain.pt")
    return write(target, plain(read(path, trusted)))
