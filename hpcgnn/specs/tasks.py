"""Every task, declared once (:data:`SPECS`): its name, the unit that runs it, what a step's items are, the kinds
of target it trains, the metrics it reports and their directions, and the choices of its own settings.

Who reads it: :mod:`hpcgnn.checks` (the names a config may use, each task's choices), :mod:`hpcgnn.labels` (the
kinds and the metric that selects an epoch), :mod:`hpcgnn.tuning` (what a study may optimise, and which way),
:mod:`hpcgnn.tasks` (the unit, built on the rank), docs/training.md (a test holds its table of tasks to this).

Adding a task: one :class:`TaskSpec` here, its unit in :mod:`hpcgnn.tasks` (items, batches, targets, loss,
metrics, evaluation, prediction), its yaml in conf/task/ and its page in docs/.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Literal

# Every metric a task reports (val_<name>, test_<name>): whether a higher value is better, and its name in words.
METRICS: dict[str, tuple[bool, str]] = {
    "acc": (True, "accuracy"), "rocauc": (True, "ROC-AUC"), "f1": (True, "F1"), "rmse": (False, "RMSE"),
    "mae": (False, "MAE"), "r2": (True, "R2"), "auc": (True, "AUC"), "ap": (True, "AP"), "mrr": (True, "MRR"),
    "hits@K": (True, "Hits@K")}


@dataclass(frozen=True)
class KindSpec:
    """A kind of target (``task.kind``) of a node or an edge task: its unit (loss, metrics, what predict writes),
    the metric that selects an epoch, those reported beside it, and its losses.

    Adding a kind: a spec here, its unit in :mod:`hpcgnn.tasks.node`, how labels resolve to it in
    :func:`hpcgnn.labels.resolve`, and its line in docs/node-tasks.md."""

    name: str
    unit: str  # "module:Class", (target, device): loss, correct, scores, outputs
    metric: str  # selects the epoch (train.select=val)
    metrics: tuple[str, ...]  # every metric it reports
    trains_with: str  # its loss, in words (task.loss=auto)
    losses: tuple[str, ...] = ()  # task.loss values besides auto (a regression's)


_NODE = "hpcgnn.tasks.node"
KINDS: dict[str, KindSpec] = {k.name: k for k in (
    KindSpec("classification", f"{_NODE}:Classification", "acc", ("acc",), "cross-entropy"),
    KindSpec("multilabel", f"{_NODE}:MultiLabel", "rocauc", ("rocauc", "ap", "f1"), "binary cross-entropy"),
    KindSpec("regression", f"{_NODE}:Regression", "rmse", ("rmse", "mae", "r2"), "mse",
             losses=("mse", "l1", "huber")),
    KindSpec("ordinal", f"{_NODE}:Ordinal", "mae", ("mae", "acc"), "binary cross-entropy over its thresholds"),
)}
KIND_NAMES = ("auto", *KINDS)  # task.kind
LOSSES = ("auto", *dict.fromkeys(loss for k in KINDS.values() for loss in k.losses))  # task.loss


@dataclass(frozen=True)
class PredictionSpec:
    """What ``hpcgnn predict`` gives of a task's model: ``whats`` (``predict.what`` it answers for a split, the
    default first), what it gives of the pairs of a file (``pairs``: a ``predict.what``; None: it takes none), and
    which outputs are of every node only (``whole``: split=all), and which it gives only exactly (``exact``:
    layer-wise over the whole graph, whatever ``predict.mode`` says)."""

    model: str  # how its model is named ("a node classifier")
    outputs: str  # what it gives, in words (the refusals say it)
    whats: tuple[str, ...]
    pairs: str | None = None
    whole: tuple[str, ...] = ()
    exact: tuple[str, ...] = ()


@dataclass(frozen=True)
class TaskSpec:
    """One task: what the checks, the rank, a tune and the docs need to know, in one place."""

    name: str
    says: str  # what it trains, in a few words
    unit: str  # "module:Class", built on the rank: (cfg, env, store, device)
    items: str  # what a step's items are, in words
    batches: str  # "module:Class": its items' unit (their ids, the sampler around them; a store opens it)
    model: str  # "module:function" (model_cfg, decoder, shape, num_layers, relation): its model, trained or rebuilt
    kinds: tuple[str, ...] = ()  # the kinds of target it trains (task.kind, task.loss apply)
    metrics: tuple[str, ...] = ()  # metrics it reports besides its kinds' (hits@K: one per task.hits_k)
    check: str = ""  # "module:function" (cfg): what it asks of the rest of a config (hpcgnn.checks')
    config: type = field(default=None)  # its settings' frozen class (the task group's schema): every task.<key> it
    # reads, with the choices of each declared in its annotation (Literal) and nowhere else
    typed: bool = False  # trains on typed graphs
    encoder: bool = False  # its model encodes nodes (to model.hidden_channels) and decodes pairs of them
    prediction: PredictionSpec | None = None  # what predict gives of its model
    target_check: str | None = None  # "module:function" (dataset, task) -> its Target, where its labels are readable
    # at submit (None: not yet, or a task without kinds)
    targets_prepare: str | None = None  # "module:function" (dataset): its targets prepared beside the graph (None:
    # the graph's own labels)
    tables: str | None = None  # "module:Class": its items' unit over a table of (node, time, label) entries, where a
    # dataset gives one (hpcgnn.data.tables; None: it takes none)
    head: str = "decoder"  # the setting that names what its model puts on the encoder's outputs (its decoder, a
    # graph task's readout), passed to its model's builder
    depth: str | None = None  # the setting that gives its model's depth (None: len(train.fanouts), a layer per hop)

    def own(self, key: str) -> str | None:
        """How a class of the user's own is built where ``task.<key>`` may name one (None: it may not)."""
        fields = {f.name: f for f in dataclasses.fields(self.config)}
        return fields[key].metadata.get("own") if key in fields else None

    def decoder(self, settings: TaskConfig) -> str | None:
        """The decoder its model scores pairs of embeddings with (``task.decoder``; None: its model encodes alone)."""
        return getattr(settings, self.head) if self.encoder else None

    def layers(self, cfg) -> int:
        """Its model's depth in ``cfg`` (a RunConfig): a layer per sampled hop (``train.fanouts``), or its own
        setting's (a graph task's ``task.layers``: whole graphs, no hops)."""
        return getattr(cfg.task, self.depth) if self.depth else len(cfg.train.fanouts)

    def reports(self, settings: TaskConfig | None = None) -> tuple[str, ...]:
        """Every metric it reports (hits@K: one per K of ``settings.hits_k``, its task config's; none without)."""
        names = (*(m for k in self.kinds for m in KINDS[k].metrics), *self.metrics)
        out = tuple(dict.fromkeys(n for n in names if n != "hits@K"))
        hits_k = settings.hits_k if "hits@K" in names and settings is not None else ()
        return out + tuple(f"hits@{k}" for k in hits_k)


TARGET_EDGES = ("drop", "keep")  # link, edge: a step's target edges carry no messages in its batch, or do


# ---------------------------------------------------------------- each task's settings (conf/task/<name>.yaml)
# A field's choices are its Literal's; ``own`` in its metadata: it may also name a class of the user's own
# (pkg.module.Class), built as the text says. hpcgnn.config builds and checks them (one rule for every group).


@dataclass(frozen=True)
class TaskConfig:
    """What every task's settings hold: its name (``task=NAME`` picks the group's option, and with it the class)."""

    name: str = "node"  # node | link | edge: one of SPECS; the task owns the loss, metrics and evaluation

    @classmethod
    def variant(cls, name: str | None) -> type | None:
        """The settings class of task ``name`` (None: no such task)."""
        return SPECS[name].config if name in SPECS else None

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(SPECS)

    @classmethod
    def schemas(cls) -> dict[str, type]:
        """The group's schemas (``base_task_<name>``, which conf/task/<name>.yaml names in its defaults)."""
        return {name: spec.config for name, spec in SPECS.items()}


@dataclass(frozen=True)
class NodeTaskConfig(TaskConfig):
    """task=node: targets on nodes."""

    name: str = "node"
    kind: Literal[KIND_NAMES] = "auto"  # auto (from the labels: integer [N] classes, {0,1} [N, C] multilabel, float
    # regression) or one of KINDS
    loss: Literal[LOSSES] = "auto"  # a regression's: auto (mse), mse, l1 or huber (the other kinds have one loss)


@dataclass(frozen=True)
class LinkTaskConfig(TaskConfig):
    """task=link: link prediction."""

    name: str = "link"
    decoder: Literal["dot", "mlp"] = "dot"  # dot: the inner product of the two embeddings | mlp: an MLP on their
    # Hadamard product
    negatives: Literal["uniform", "strict", "in_batch", "historical"] = "uniform"  # random targets | no existing
    # edge | the batch's other targets | a timed graph's: half destinations the source met before (TGB's)
    num_negatives: int = 1  # negatives per positive edge in a training step
    eval_negatives: int = 20  # a timed graph's: negatives each validation and test positive is ranked against (TGB's:
    # half destinations its source met before, half random; seeded by dataset.seed)
    neg_retries: int = 3  # negatives=strict: redraws of a negative that is an edge; then it is padding (weight 0)
    form: Literal["binary", "triplet"] = "binary"  # labelled pairs, BCE | each positive against its negatives, softmax
    hits_k: tuple[int, ...] = (20, 50, 100)  # the K of the Hits@K metrics reported
    target_edges: Literal[TARGET_EDGES] = "drop"  # a step's target edges carry no messages in its batch (drop) or
    # do (keep, as in a full-batch GAE)


@dataclass(frozen=True)
class EdgeTaskConfig(TaskConfig):
    """task=edge: targets on given edges."""

    name: str = "edge"
    decoder: Literal["concat", "hadamard"] = field(default="concat", metadata={
        "own": "built as Class(in_channels, out_channels), called on the two ends' embeddings"})
    target_edges: Literal[TARGET_EDGES] = "drop"  # as task=link's
    kind: Literal[KIND_NAMES] = "auto"  # as task=node's
    loss: Literal[LOSSES] = "auto"  # as task=node's

READOUTS = ("mean", "sum", "max", "attention")  # task=graph: a graph's nodes to one row
GRAPH_KINDS = ("classification", "multilabel", "regression")


@dataclass(frozen=True)
class GraphTaskConfig(TaskConfig):
    """task=graph: a target per graph, over datasets of many graphs."""

    name: str = "graph"
    kind: Literal[("auto", *GRAPH_KINDS)] = "auto"  # as task=node's (auto: the dataset's, OGB's, or its labels')
    loss: Literal[LOSSES] = "auto"  # as task=node's
    readout: Literal[READOUTS] = "mean"  # a graph's node embeddings to one row: mean, sum, max or attention (PyG's
    # AttentionalAggregation)
    layers: int = 5  # message-passing layers (whole graphs: no hops to sample)
    metric: Literal[("auto", "acc", "rocauc", "ap", "f1", "rmse", "mae", "r2")] = "auto"  # what selects the epoch:
    # auto (the dataset's own, OGB's, else the kind's), or one the kind reports
    batch_by: Literal["graphs", "nodes", "edges"] = "graphs"  # a batch is train.batch_size graphs, or graphs up to
    # about task.budget nodes (or edges): batches that weigh alike when graph sizes vary
    budget: int = 0  # batch_by=nodes|edges: nodes (edges) per batch (0: train.batch_size times the mean graph's)


SPECS: dict[str, TaskSpec] = {s.name: s for s in (
    TaskSpec("node", "targets on nodes", "hpcgnn.tasks.node:NodeTask", "nodes", "hpcgnn.tasks.items:NodeItems",
             "hpcgnn.models.node:task_model",
             tuple(KINDS), check="hpcgnn.checks:check_node", config=NodeTaskConfig, typed=True,
             prediction=PredictionSpec("a node classifier", "its predictions of a split's nodes or their embeddings",
                                       ("predictions", "embeddings"), exact=("embeddings",)),
             target_check="hpcgnn.data:check_target", tables="hpcgnn.tasks.items:TableItems"),
    TaskSpec("link", "link prediction", "hpcgnn.tasks.link:LinkPrediction", "edges to predict (with negatives)",
             "hpcgnn.tasks.items:LinkItems", "hpcgnn.models.link:task_model",
             metrics=("auc", "ap", "mrr", "hits@K"), check="hpcgnn.checks:check_link", config=LinkTaskConfig,
             encoder=True,
             prediction=PredictionSpec("a link model", "its node embeddings (what=embeddings split=all) or the scores "
                                       "of pairs (pairs=FILE)", ("embeddings",), pairs="scores",
                                       whole=("embeddings",), exact=("scores",))),
    TaskSpec("edge", "targets on given edges", "hpcgnn.tasks.edge:EdgeTask", "target edges",
             "hpcgnn.tasks.items:EdgeItems", "hpcgnn.models.edge:task_model", tuple(KINDS),
             check="hpcgnn.checks:check_edge", config=EdgeTaskConfig,
             prediction=PredictionSpec("an edge model", "its predictions (of a split's targets, or of pairs=FILE) "
                                       "or embeddings", ("predictions", "embeddings"), pairs="predictions",
                                       whole=("embeddings",)),
             typed=True, encoder=True, target_check="hpcgnn.data.edges:check_target",
             targets_prepare="hpcgnn.data.edges:prepare_targets"),
    TaskSpec("graph", "targets on whole graphs", "hpcgnn.tasks.graph:GraphTask", "graphs",
             "hpcgnn.tasks.items:GraphItems", "hpcgnn.models.graph:task_model", GRAPH_KINDS,
             check="hpcgnn.checks:check_graph", config=GraphTaskConfig, encoder=True, head="readout", depth="layers",
             prediction=PredictionSpec("a graph model", "its predictions of a split's graphs or their embeddings",
                                       ("predictions", "embeddings"))),
)}


def higher_is_better(metric: str) -> bool:
    """Whether a higher value of ``metric`` (``val_`` or not, hits@K for any K) is better."""
    name = metric.removeprefix("val_").removeprefix("test_")
    return METRICS["hits@K" if name.startswith("hits@") else name][0]


def in_words(metric: str) -> str:
    """``metric``'s name in words (accuracy, ROC-AUC, ...; hits@K: Hits@K); an unknown one as it is."""
    if metric.startswith("hits@"):
        return f"Hits@{metric.removeprefix('hits@')}"
    return METRICS[metric][1] if metric in METRICS else metric
