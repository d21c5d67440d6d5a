"""The names a config may use and the checks made at submit time, without importing torch.

The launcher composes, checks and submits in a light process (about a tenth of a second
of imports here, where torch and PyG take four seconds). The names come from the specs
(:mod:`hpcgnn.specs`: datasets, tasks, models, samplers), declared once; the checks here are
what a combination of them asks of the rest of the config.
"""

from __future__ import annotations

from pathlib import Path

from hpcgnn.errors import ConfigError
from hpcgnn.specs import choices, datasets, load, models, samplers, tasks
from hpcgnn.specs.models import CUSTOM

# ------------------------------------------------------------------ models: from their specs (hpcgnn.specs.models)

MODEL_NAMES = models.names(plain=True)
TYPED_MODELS = models.names(typed=True)  # models for typed graphs (sage: GraphSAGE through PyG's to_hetero)
FULL_INFERENCE_MODELS = models.names(exact="plain")  # exact layer-wise inference (eval_mode=full)
TYPED_FULL_INFERENCE_MODELS = models.names(exact="typed")  # ... on a typed graph
EDGE_MODELS = models.names(edge_features=True)  # hpcgnn's models that read edge features (model.edge_dim)

# ------------------------------------------------------------------ datasets: from their specs (hpcgnn.specs.datasets)

OGB_NODE_DATASETS = datasets.names(task="node", source="ogb", typed=False)
OGB_LINK_DATASETS = datasets.names(task="link", source="ogb")
OGB_TYPED_DATASETS = datasets.names(source="ogb", typed=True)
NODE_DATASETS = datasets.names(task="node")  # (typed ones too; files: a folder laid out with nodes/ and edges/)
LINK_DATASETS = datasets.names(task="link")
TYPED_DATASETS = datasets.names(typed=True)  # erase_types serves them homogeneous
PYG_DATASETS = datasets.names(needs_target=True)  # a graph of PyG's, by dataset._target_
ON_DISK = datasets.names(on_disk=True)  # read from files that must be there before a job starts
EDGE_TARGET_DATASETS = datasets.with_edge_targets()  # task=edge: datasets whose edges can carry targets
GRAPH_DATASETS = datasets.names(task="graph")  # datasets of many graphs (task=graph)

# ------------------------------------------------------------------ tasks: from their specs (hpcgnn.specs.tasks)

EDGE_DECODERS = choices(tasks.EdgeTaskConfig, "decoder")  # task=edge: a pair of embeddings to outputs (or pkg.module.Class)


def check_registered_names(cfg) -> None:
    """Every registry's name in ``cfg`` and what the task asks of the rest (a submit-time check)."""
    check_model_config(cfg.model)
    check_dataset_config(cfg.dataset)
    check_task_config(cfg)
    check_trackers(cfg.metrics.trackers)


TRACKERS = ("wandb", "mlflow")  # metrics.trackers (hpcgnn.rank.trackers), each an optional extra


def check_trackers(trackers, environ=None) -> None:
    """Each tracker named is known and installed here: else one line naming the extra. MLflow pointed at a file
    store of the user's own (``MLFLOW_TRACKING_URI=file://...``, a path) without ``MLFLOW_ALLOW_FILE_STORE=true``,
    which MLflow refuses with a traceback on the rank: one line naming both fixes."""
    import importlib.util

    from hpcgnn import env
    from hpcgnn.errors import MissingExtra

    uri = env.read("mlflow_uri", environ)
    allowed = (env.read("mlflow_file_store", environ) or "").strip().lower() in ("1", "true", "yes")
    if "mlflow" in trackers and uri and uri.startswith(("file:", "/", ".", "~")) and not allowed:
        raise ConfigError(f"MLFLOW_TRACKING_URI={uri} is a file store, which MLflow refuses unless "
                          "MLFLOW_ALLOW_FILE_STORE=true. HINT: export MLFLOW_ALLOW_FILE_STORE=true, point "
                          "MLFLOW_TRACKING_URI at a tracking server (http://...) or a database (sqlite:///...), or "
                          "unset it (hpcgnn keeps a file store in the run's folder)")

    for name in trackers:
        if name not in TRACKERS:
            raise ConfigError(f"metrics.trackers names {name!r}: use {' and '.join(TRACKERS)} (TensorBoard and the "
                              "JSON lines are always written: metrics.tensorboard)")
        if importlib.util.find_spec(name) is None:
            raise MissingExtra(f"metrics.trackers={name} needs {name}, which is not installed here. HINT: pip "
                               f"install 'hpcgnn[{name}]'")


WIDTHS = ("in_channels", "out_channels", "hidden_channels", "num_layers", "dropout", "edge_dim")  # what hpcgnn fills in


def locate(dotted: str | None) -> tuple[object | None, str]:
    """What a dotted path (``pkg.module.Name``: a ``_target_``) names, or None; and why its module did not import
    ("" when it did)."""
    import importlib

    module_name, _, name = (dotted or "").rpartition(".")
    if not module_name:
        return None, ""
    try:
        return getattr(importlib.import_module(module_name), name, None), ""
    except Exception as exc:  # (ImportError, or the module failing as it imports)
        return None, f" ({type(exc).__name__}: {exc})"


def is_custom(model) -> bool:
    return model.name == CUSTOM


def check_model_config(model) -> None:
    if is_custom(model):
        if not model._target_ or "." not in model._target_:
            raise ConfigError(f"model=custom needs model._target_=package.module.Class (got {model._target_!r}): the "
                              "class of your model, importable where the job runs")
        return
    if model._target_:
        raise ConfigError(f"model._target_={model._target_} with model={model.name}: a class of your own is "
                          "model=custom. HINT: model=custom model._target_=...")
    if model.name not in (*MODEL_NAMES, *TYPED_MODELS):
        raise ConfigError(f"model.name={model.name!r} is unknown: use one of "
                          f"{', '.join(sorted({*MODEL_NAMES, *TYPED_MODELS, CUSTOM}))}")
    if model.edge_dim < 0 or (model.edge_dim and model.name not in EDGE_MODELS):
        raise ConfigError(f"model.edge_dim={model.edge_dim}: {' and '.join(EDGE_MODELS)} read edge features (a "
                          f"width of 1 or more); model={model.name} does not. HINT: model=gat or model=gin, or a "
                          "model of your own whose forward takes edge_attr")


def edge_reader(model) -> str:
    """How a model config reading edge features is named in messages."""
    if model.edge_dim:
        return f"model.edge_dim={model.edge_dim}"
    return f"model._target_={model._target_} (its forward takes edge features)"


def check_dataset_config(dataset) -> None:
    """The dataset serves the task it is prepared for (its own values are checked by its source's class where the
    config is built: :meth:`hpcgnn.specs.datasets.DatasetConfig.check`)."""
    if dataset.prepared_for == "graph" or dataset.name in GRAPH_DATASETS:
        if dataset.prepared_for != "graph":
            raise ConfigError(f"dataset={dataset.name} is a dataset of many graphs, and task={dataset.prepared_for} "
                              "trains on one graph. HINT: task=graph")
        if dataset.name not in GRAPH_DATASETS:
            raise ConfigError(f"dataset={dataset.name} is one graph: task=graph trains on datasets of many graphs, "
                              f"one of {', '.join(GRAPH_DATASETS)}")
        return
    if dataset.prepared_for == "link":
        if dataset.name not in LINK_DATASETS:
            raise ConfigError(f"dataset={dataset.name} has no edges to predict: task=link needs one of "
                              f"{', '.join(sorted(LINK_DATASETS))}")
    elif dataset.name not in NODE_DATASETS:
        hint = " (a link dataset: add task=link)" if dataset.name in LINK_DATASETS else ""
        raise ConfigError(f"dataset.name={dataset.name!r} is unknown{hint}: use one of "
                          f"{', '.join(sorted(NODE_DATASETS))}")


def is_graph_set(dataset) -> bool:
    """Whether the dataset is one of many graphs (a graph task's: :mod:`hpcgnn.data.graphs`)."""
    return dataset.name in GRAPH_DATASETS


def is_typed(dataset) -> bool:
    """Whether the dataset is served as a typed graph (a typed source whose types are not erased); for
    dataset=files, a folder laid out with nodes/ and edges/ (hpcgnn.data.files)."""
    if dataset.erase_types:
        return False
    if dataset.name == "files":
        return bool(dataset.path) and (Path(dataset.path).expanduser() / "edges").is_dir()
    return dataset.name in TYPED_DATASETS


def _which(dataset) -> str:
    """A dataset in a message: a files folder by its path, another by its name."""
    return f"dataset.path={dataset.path}" if dataset.name == "files" else f"dataset={dataset.name}"


def gives(folder: Path, name: str) -> bool:
    """Whether a files folder gives the array ``name`` (``name.npy`` or ``name.pt``)."""
    return any((folder / f"{name}{suffix}").is_file() for suffix in (".npy", ".pt"))


def is_timed(dataset) -> bool:
    """Whether the dataset's edges have times (a files folder with ``edge_time``, a typed folder's relations with
    theirs: :mod:`hpcgnn.data.times`)."""
    if dataset.name != "files" or not dataset.path:
        return False
    folder = Path(dataset.path).expanduser()
    if (folder / "edges").is_dir():
        return any(t.startswith("edges/") for t in typed_times(dataset))
    return gives(folder, "edge_time")


def typed_times(dataset) -> list[str]:
    """The times a typed files folder gives (``edges/<relation>/edge_time``, ``nodes/<type>/seed_time``): their
    files, relative to the folder."""
    if dataset.name != "files" or not dataset.path:
        return []
    folder = Path(dataset.path).expanduser()
    if not (folder / "edges").is_dir():
        return []
    return [f"{kind}/{d.name}/{name}" for kind, name in (("edges", "edge_time"), ("nodes", "seed_time"))
            if (folder / kind).is_dir() for d in sorted((folder / kind).iterdir()) if gives(d, name)]


def _times_given() -> str:
    """Where each source gives edge times, as the refusals name them."""
    return "; ".join(f"{k}: {v}" for k, v in datasets.TIMES.items())


def has_table(dataset) -> bool:
    """Whether the dataset gives a table of (node, time, label) entries (a homogeneous files folder's ``table_node``:
    :mod:`hpcgnn.data.tables`)."""
    if dataset.name != "files" or not dataset.path or is_typed(dataset):
        return False
    return gives(Path(dataset.path).expanduser(), "table_node")


def check_timed_config(cfg, timed: bool | None = None, seed_times: bool | None = None) -> None:
    """What a graph whose edges have times asks of the rest of the config, while sampling respects them
    (``time.respect``): what samples as of each seed's time today (a node task, link prediction in time order, an edge
    task's targets at their times; neighbour sampling on the host, replicated or partitioned; every producer), each
    other setting refused naming the way out (a link task's time.respect=false too: its message passing holds every
    edge). ``timed``, ``seed_times``: whether the graph's edges and its nodes have times, where the rank knows it (a
    PyG graph's, once prepared); None: a files folder's."""
    t, tc = cfg.train, cfg.time
    if tc.window is not None and tc.window <= 0:
        raise ConfigError(f"time.window={tc.window} must be positive (in the edge times' unit), or null for edges of "
                          "any age")
    spec, d = models.SPECS.get(cfg.model.name), cfg.dataset
    unread = d.name == "files" and not (d.path and Path(d.path).expanduser().is_dir())  # (the launcher names it)
    typed_given = [] if unread else typed_times(d)  # (a typed folder's: its relations' times, its seed times)
    if timed is None:  # (a files folder says so before it is read; a PyG graph's ranks know, once it is prepared)
        source = datasets.spec(d.name).source if d.name in datasets.SPECS else d.name
        timed = (None if unread else is_timed(d)) if source == "files" else None if source in datasets.TIMES else False
    if spec is not None and spec.times and timed is not None and not (tc.respect and timed):
        raise ConfigError(f"model={cfg.model.name} reads each sampled edge's age: it trains on a graph whose edges "
                          "have times, sampled as of each seed's time. HINT: give the edges' times ("
                          + _times_given() + ") and keep time.respect=true, "
                          "or another model")
    link = cfg.task.name == "link"
    table = cfg.task.name == "node" and not unread and has_table(d)
    if table and not (timed and tc.respect):
        raise ConfigError(f"{_which(d)} gives a table of (node, time, label) entries, each asked as of its time: its "
                          "edges need times, and time.respect=true. HINT: add edge_time.npy (one time per edge), or "
                          "drop time.respect=false")
    if link and cfg.task.negatives == "historical" and timed is False:
        raise ConfigError(f"task.negatives=historical draws destinations each source met before a link's time, but the "
                          f"edges of {_which(d)} have no times. HINT: task.negatives=uniform, or give the edges' times ("
                          + _times_given() + ")")
    if link and timed and not tc.respect:
        raise ConfigError(f"the edges of {_which(d)} have times: task=link splits them in time order and keeps every "
                          "edge in message passing, the validation and test edges too, which only sampling as of each "
                          "link's time keeps from the model. HINT: drop time.respect=false (or give the edges without "
                          "their times for a random split)")
    if not tc.respect or not timed:
        return
    if seed_times is None and d.name == "files":
        seed_times = any(t.startswith("nodes/") for t in typed_given) if typed_given else \
            gives(Path(d.path).expanduser(), "seed_time")
    if cfg.task.name == "edge" and d.name == "files" and not unread:  # (a typed folder's: its target relation's)
        folder = Path(d.path).expanduser()
        where = [r for r in sorted((folder / "edges").iterdir()) if gives(r, "edge_label")] if typed_given else [folder]
        if where and not gives(where[0], "edge_label_time"):
            raise untimed_targets(_which(d), "edge_label_time.npy" if not typed_given else
                                  f"edges/{where[0].name}/edge_label_time.npy")
    if cfg.task.name == "node" and seed_times is False and not table:
        given = ("nodes/<target type>/seed_time.npy" if typed_given else "seed_time.npy") if d.name == "files" \
            else "data.seed_time"
        raise ConfigError(f"the edges of {_which(d)} have times, but its nodes do not say when each label is asked. "
                          f"HINT: add {given} (one time per node, the edges' unit), or time.respect=false to train on "
                          "every edge")
    for ok, why in ((cfg.task.name in ("node", "link", "edge"), f"task={cfg.task.name}"),
                    (not (link and cfg.task.negatives == "strict"), "task.negatives=strict (no edge between the pair at "
                                                                     "any time, later ones too)"),
                    (t.sampler == "neighbor" and not t.edge_budget, f"train.sampler={t.sampler}"
                     + (f" with train.edge_budget={t.edge_budget}" if t.edge_budget else "")),
                    (t.eval_mode != "full", "train.eval_mode=full (exact inference would read every edge)"),
                    (t.graph_on != "device", "train.graph_on=device"),
                    (not typed_given or cfg.task.name in ("node", "edge"), f"task={cfg.task.name} on a typed graph"),
                    (not typed_given or not d.erase_types, "dataset.erase_types=true (the homogeneous view of a typed "
                                                           "graph keeps no times)")):
        if not ok:
            raise ConfigError(f"the edges of {_which(d)} have times: sampling as of each seed's time runs for "
                              "task=node, link or edge, train.sampler=neighbor, on the host (a typed graph: task=node "
                              "or edge); got "
                              f"{why}. HINT: drop that setting, or time.respect=false to train on every edge, those "
                              "after a seed's time too")


def untimed_targets(which: str, given: str) -> ConfigError:
    """The refusal of an edge task's targets without times on a graph whose edges have them (``given``: how to give
    them, the file or the attribute)."""
    return ConfigError(f"the edges of {which} have times, but its edge targets do not say when each is asked. HINT: "
                       f"add {given} (one time per target edge, the edges' unit), or time.respect=false to train on "
                       "every edge")


def check_typed_config(cfg) -> None:
    """What a typed graph asks of the rest of the config (node tasks, or an edge task on a typed folder or a
    HeteroData; neighbour sampling, on a replicated or partitioned graph)."""
    t, m = cfg.train, cfg.model
    if not is_typed(cfg.dataset):
        d = cfg.dataset
        unread = d.name == "files" and not (d.path and Path(d.path).expanduser().is_dir())
        if m.name not in (*MODEL_NAMES, CUSTOM) and not unread:  # (a folder not here yet: the launcher names it)
            raise ConfigError(f"model={m.name} needs a typed graph (e.g. dataset=synthetic_hetero); got "
                              f"dataset={d.name}. HINT: use one of {', '.join(MODEL_NAMES)} (a typed files folder "
                              "holds nodes/ and edges/)")
        return
    if m.name not in (*TYPED_MODELS, CUSTOM):
        raise ConfigError(f"dataset={cfg.dataset.name} is a typed graph: model={m.name} reads one node and edge type. "
                          f"HINT: use model=rgcn (or sage, mlp, custom), or dataset.erase_types=true for the "
                          "homogeneous view")
    edge_ok = cfg.task.name == "edge" and cfg.dataset.name in EDGE_TARGET_DATASETS
    for ok, why in ((cfg.task.name == "node" or edge_ok, f"task={cfg.task.name}"),
                    (t.sampler in samplers.names(graph="typed") and not t.edge_budget, f"train.sampler={t.sampler}"
                     + (f" with train.edge_budget={t.edge_budget}" if t.edge_budget else ""))):
        if not ok:
            raise ConfigError(f"typed graphs (dataset={cfg.dataset.name}) train with task=node (task=edge: a typed "
                              f"files folder or a HeteroData), train.sampler=neighbor; got {why}. HINT: drop that "
                              "setting, or dataset.erase_types=true for the homogeneous view")


def check_task_config(cfg) -> None:
    """What the task asks of the rest of the config (its own settings' choices are checked as the config is built,
    from its settings class: :mod:`hpcgnn.specs.tasks`)."""
    spec = tasks.SPECS[cfg.task.name]
    if spec.kinds:
        _check_loss(cfg.task)
    check_typed_config(cfg)
    check_timed_config(cfg)
    load(spec.check)(cfg)


def _a(word: str) -> str:
    """``word`` with its indefinite article: "an edge", "a regression"."""
    return f"{'an' if word[0] in 'aeiou' else 'a'} {word}"


def _check_loss(k) -> None:
    """``task.loss`` is one of the kind's (``task.kind``: a node or an edge task's targets)."""
    kind = tasks.KINDS.get(k.kind)
    if k.loss != "auto" and kind is not None and k.loss not in kind.losses:
        owner = next(n for n, spec in tasks.KINDS.items() if k.loss in spec.losses)
        raise ConfigError(f"task.loss={k.loss} is {_a(owner)}'s loss; task.kind="
                          f"{k.kind} trains with {kind.trains_with}. HINT: drop task.loss, or task.kind={owner}")


def check_node(cfg) -> None:
    t = cfg.train
    typed = is_typed(cfg.dataset)
    models = TYPED_FULL_INFERENCE_MODELS if typed else (*FULL_INFERENCE_MODELS, CUSTOM)  # (custom: a BasicGNN's)
    if t.eval_mode == "full" and cfg.model.name not in models:
        raise ConfigError(f"train.eval_mode=full needs model {', '.join(models)}"
                          + (" on a typed graph" if typed else "")
                          + f"; got model={cfg.model.name}. HINT: train.eval_mode=sampled")


def check_edge(cfg) -> None:
    """task=edge: targets on given edges of a homogeneous graph or of one relation of a typed graph (exact
    evaluation: R-GCN on a replicated one), replicated or partitioned, neighbour sampling around both ends."""
    t, d = cfg.train, cfg.dataset
    typed = is_typed(d)
    why = (f"dataset={d.name} (its edges carry no targets)" if d.name not in EDGE_TARGET_DATASETS else
           f"train.sampler={t.sampler}" if t.sampler not in samplers.names(task="edge") else
           f"train.edge_budget={t.edge_budget}" if t.edge_budget else
           f"train.eval_mode=full on a typed graph with model={cfg.model.name} graph={cfg.graph.mode} (exact: "
           "model=rgcn, replicated)" if typed and t.eval_mode == "full" and
           (cfg.model.name != "rgcn" or cfg.graph.mode == "partitioned") else
           "model=mlp on a typed graph (it reads the labelled type alone)" if typed and cfg.model.name == "mlp" else
           None)
    if why is not None:
        raise ConfigError(f"task=edge trains on a graph of dataset {', '.join(EDGE_TARGET_DATASETS)} with "
                          f"train.sampler=neighbor so far, not with {why}. HINT: change that")
    if t.eval_mode == "full" and not typed and cfg.model.name not in (*FULL_INFERENCE_MODELS, CUSTOM):
        raise ConfigError(f"train.eval_mode=full needs model {', '.join(FULL_INFERENCE_MODELS)}; got "
                          f"model={cfg.model.name}. HINT: train.eval_mode=sampled (or auto)")


def check_graph(cfg) -> None:
    """task=graph: whole graphs of a dataset of many, mapped by every node (no partitions), batched in the rank or its
    sampler processes, by hpcgnn's graph models."""
    t, k = cfg.train, cfg.task
    why = ("graph.mode=partitioned (a dataset of many graphs is mapped whole, once per node)"
           if cfg.graph.mode == "partitioned" else
           f"train.sampler={t.sampler} (whole graphs are batched, nothing sampled)" if t.sampler != "neighbor" else
           "train.eval_mode=full (every graph is evaluated whole already)" if t.eval_mode == "full" else
           f"model={cfg.model.name} (graph models: gin, or custom: a model of your own)"
           if cfg.model.name not in GRAPH_MODELS else None)
    if why is not None:
        raise ConfigError(f"task=graph does not take {why}. HINT: drop that setting")
    if k.layers < 1 or k.budget < 0:
        raise ConfigError(f"task.layers={k.layers} must be at least 1 and task.budget={k.budget} at least 0")


GRAPH_MODELS = ("gin", CUSTOM)  # task=graph: GIN, GINE on edge features, OGB's virtual node (model.virtual_node);
# a model of the user's own whose forward takes (x, edge_index, batch[, edge_attr]) and pools its graphs itself


def eval_mode(cfg, timed: bool | None = None) -> str:
    """``train.eval_mode`` decided: ``auto`` is exact (full) where every rank holds the graph whole (replicated:
    exact inference's layer tables are each the graph's size, and fit where it does) and the model is one of
    hpcgnn's that exact inference serves on such a graph (a typed edge task's: rgcn); else sampled. A model of the
    user's own is sampled unless full is asked (whether it runs layer by layer is known once it is built). A graph
    whose edges have times (``timed``: where a rank knows it; None: a files folder's say) is sampled, each target as
    of its own time, while ``time.respect``. A dataset of many graphs: ``whole``, every graph whole."""
    if is_graph_set(cfg.dataset):  # (many graphs: each evaluated whole, nothing sampled; check_graph refuses full)
        return "whole"
    mode = cfg.train.eval_mode
    if mode != "auto":
        return mode
    timed = is_timed(cfg.dataset) if timed is None else timed
    if cfg.graph.mode != "replicated" or is_custom(cfg.model) or (cfg.time.respect and timed):
        return "sampled"  # (a timed graph's: each target's neighbourhood as of its own time)
    typed = is_typed(cfg.dataset)
    spec = models.SPECS.get(cfg.model.name)
    exact = spec is not None and ("typed" if typed else "plain") in spec.exact
    if typed and cfg.task.name == "edge":
        exact = cfg.model.name == "rgcn"
    return "full" if exact else "sampled"


def check_link(cfg) -> None:
    k, t = cfg.task, cfg.train
    if k.num_negatives < 1 or k.eval_negatives < 1 or k.neg_retries < 0 or any(x < 1 for x in k.hits_k):
        raise ConfigError("task.num_negatives, task.eval_negatives and every task.hits_k must be at least 1, "
                          "task.neg_retries 0 or more")
    if k.negatives == "in_batch" and k.num_negatives >= t.batch_size:
        raise ConfigError(f"task.negatives=in_batch takes the other targets of a batch: task.num_negatives="
                          f"{k.num_negatives} needs train.batch_size above it (got {t.batch_size})")
    if t.sampler not in samplers.names(task="link") or t.edge_budget:
        raise ConfigError(f"task=link samples the neighbourhoods of its edges' endpoints: use train.sampler=neighbor "
                          f"without train.edge_budget (got train.sampler={t.sampler}, train.edge_budget={t.edge_budget})")
    if eval_mode(cfg) == "full" and cfg.model.name not in (*FULL_INFERENCE_MODELS, CUSTOM):
        raise ConfigError(f"train.eval_mode=full needs model {', '.join(FULL_INFERENCE_MODELS)}; got "
                          f"model={cfg.model.name}. HINT: train.eval_mode=sampled (or auto)")


# ------------------------------------------------------------------ thread budgets (train.sampler_procs)


def split_threads(budget: int, procs: int, per_sampler: int = 0) -> tuple[int, int]:
    """(the rank's threads, each sampler process's) out of ``budget`` cores, so that together they never exceed
    it. ``per_sampler`` 0: about an equal share each, at least one, the rank keeping the rest."""
    if procs == 0:
        return budget, 0
    each = per_sampler or max(1, (budget - 1) // (procs + 1))
    if procs * each >= budget:
        raise ConfigError(f"train.sampler_procs={procs} with {each} thread(s) each leaves the rank no core of the "
                          f"{budget} it has. HINT: lower train.sampler_procs (or train.sampler_threads), ask for more "
                          "cores per rank (cluster.cpus_per_task), or set train.num_threads to the cores a rank may "
                          "use with its sampler processes")
    return budget - procs * each, each


def check_thread_budget(cfg, local_cores: int) -> None:
    """At submit time: the rank's cores (``train.num_threads``, else ``cluster.cpus_per_task`` on a cluster,
    else this machine's cores / ``launch.procs``) must leave each rank a core beside its sampler processes."""
    t = cfg.train
    if not t.sampler_procs:
        return
    c = cfg.cluster
    budget = t.num_threads or (c.cpus_per_task if c is not None and c.executor == "slurm"
                               else max(1, local_cores // (c.tasks_per_node if c is not None else cfg.launch.procs)))
    split_threads(budget, t.sampler_procs, t.sampler_threads)


# ------------------------------------------------------------------ memory the batch slots take

SLOT_BYTES = 64 * 2**20  # a batch slot's first size (sampler processes' shared slots, a trainer's slots per server)
SLOTS_SHARE = 0.5  # the batch slots may take at most this share of a node's memory (the graph and model need room)


def sampler_servers(cfg) -> int:
    """Sampler servers of the run: the local launcher's (``launch.sampler_servers``), or the cluster file's group."""
    c = cfg.cluster
    if c is None:
        return cfg.launch.sampler_servers
    return c.samplers.nodes * c.samplers.tasks_per_node if c.samplers.nodes else 0


def slot_bytes(cfg) -> tuple[int, int]:
    """(shared-memory bytes, other bytes) a rank's batch slots take at the start: sampler processes share
    ``sampler_procs + prefetch - 1`` slots with the rank (in /dev/shm); a trainer of sampler servers keeps
    ``prefetch`` slots per server it reads from (one server on a partitioned graph)."""
    t, servers = cfg.train, sampler_servers(cfg)
    if servers:
        links = 1 if cfg.graph.mode == "partitioned" else servers
        return 0, max(1, t.prefetch) * links * SLOT_BYTES
    if t.sampler_procs:
        return (t.sampler_procs + max(1, t.prefetch - 1)) * SLOT_BYTES, 0
    return 0, 0


def check_slots(cfg, ranks_here: int, shm_free: int | None, memory: int | None, where: str) -> None:
    """The batch slots of ``ranks_here`` ranks fit in ``shm_free`` bytes of /dev/shm and their share of ``memory``
    bytes of the node (None: unknown there); refused with the numbers otherwise, before any is taken."""
    shared, other = slot_bytes(cfg)
    if not shared and not other:
        return
    t, gib = cfg.train, 2**30
    need = (shared + other) * ranks_here
    what = (f"train.prefetch={t.prefetch} with train.sampler_procs={t.sampler_procs}: "
            f"{shared // SLOT_BYTES} shared-memory slots" if shared else
            f"train.prefetch={t.prefetch} with {sampler_servers(cfg)} sampler server(s): "
            f"{other // SLOT_BYTES} batch slots")
    head = (f"{what} of {SLOT_BYTES // 2**20} MiB per rank take {need / gib:.1f} GiB for {ranks_here} "
            f"rank(s) on {where}")
    hint = "HINT: lower train.prefetch (2 to 4 batches ahead keep a training loop fed)"
    if shared and shm_free is not None and need > shm_free:
        raise ConfigError(f"{head}, but /dev/shm has {shm_free / gib:.1f} GiB free. {hint}, or run where /dev/shm "
                          "is larger")
    if memory is not None and need > SLOTS_SHARE * memory:
        raise ConfigError(f"{head}, more than {SLOTS_SHARE:.0%} of its {memory / gib:.1f} GiB of memory (the graph and "
                          f"the model need the rest). {hint}")


def shm_free(path: str = "/dev/shm") -> int | None:
    """Bytes free in /dev/shm here (None: no such file system)."""
    import os

    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize
