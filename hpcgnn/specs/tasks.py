"""Every task, declared once (:data:`SPECS`): its name, the unit that runs it, what a step's items are, the kinds
of target it trains, the metrics it reports and their directions, and the choices of its own settings.

Who reads it: :mod:`hpcgnn.checks` (the names a config may use, each task's choices), :mod:`hpcgnn.labels` (the
kinds and the metric that selects an epoch), :mod:`hpcgnn.tuning` (what a study may optimise, and which way),
:mod:`hpcgnn.tasks` (the unit, built on the rank), docs/training.md (a test holds its table of tasks to this).

Adding a task: one :class:`TaskSpec` here, its unit in :mod:`hpcgnn.tasks` (items, batches, targets, loss,
metrics, evaluation, prediction), its yaml in conf/task/ and its page in docs/.
"""

from __future__ import annotations

from dataclasses import dataclass, field

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
    KindSpec("multilabel", f"{_NODE}:MultiLabel", "rocauc", ("rocauc", "f1"), "binary cross-entropy"),
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
    choices: dict[str, tuple[str, ...]] = field(default_factory=dict)  # task.<key>: its allowed values
    own: dict[str, str] = field(default_factory=dict)  # task.<key> that may name a class of the user's own: how built
    typed: bool = False  # trains on typed graphs
    encoder: bool = False  # its model encodes nodes (to model.hidden_channels) and decodes pairs of them
    prediction: PredictionSpec | None = None  # what predict gives of its model
    target_check: str | None = None  # "module:function" (dataset, task) -> its Target, where its labels are readable
    # at submit (None: not yet, or a task without kinds)
    targets_prepare: str | None = None  # "module:function" (dataset): its targets prepared beside the graph (None:
    # the graph's own labels)

    def reports(self, hits_k: tuple[int, ...] = ()) -> tuple[str, ...]:
        """Every metric it reports (``hits_k``: the K of hits@K)."""
        names = (*(m for k in self.kinds for m in KINDS[k].metrics), *self.metrics)
        out = tuple(dict.fromkeys(n for n in names if n != "hits@K"))
        return out + (tuple(f"hits@{k}" for k in hits_k) if "hits@K" in names else ())


TARGET_EDGES = ("drop", "keep")  # link, edge: a step's target edges carry no messages in its batch, or do

SPECS: dict[str, TaskSpec] = {s.name: s for s in (
    TaskSpec("node", "targets on nodes", "hpcgnn.tasks.node:NodeTask", "nodes", "hpcgnn.tasks.items:NodeItems",
             "hpcgnn.models.node:task_model",
             tuple(KINDS), typed=True,
             prediction=PredictionSpec("a node classifier", "its predictions of a split's nodes or their embeddings",
                                       ("predictions", "embeddings"), exact=("embeddings",)),
             target_check="hpcgnn.data:check_target"),
    TaskSpec("link", "link prediction", "hpcgnn.tasks.link:LinkPrediction", "edges to predict (with negatives)",
             "hpcgnn.tasks.items:LinkItems", "hpcgnn.models.link:task_model",
             metrics=("auc", "ap", "mrr", "hits@K"),
             choices={"decoder": ("dot", "mlp"), "negatives": ("uniform", "strict", "in_batch"),
                      "form": ("binary", "triplet"), "target_edges": TARGET_EDGES}, encoder=True,
             prediction=PredictionSpec("a link model", "its node embeddings (what=embeddings split=all) or the scores "
                                       "of pairs (pairs=FILE)", ("embeddings",), pairs="scores",
                                       whole=("embeddings",), exact=("scores",))),
    TaskSpec("edge", "targets on given edges", "hpcgnn.tasks.edge:EdgeTask", "target edges",
             "hpcgnn.tasks.items:EdgeItems", "hpcgnn.models.edge:task_model", tuple(KINDS),
             choices={"decoder": ("concat", "hadamard"), "target_edges": TARGET_EDGES},
             own={"decoder": "built as Class(in_channels, out_channels), called on the two ends' embeddings"},
             prediction=PredictionSpec("an edge model", "its predictions (of a split's targets, or of pairs=FILE) "
                                       "or embeddings", ("predictions", "embeddings"), pairs="predictions",
                                       whole=("embeddings",)),
             typed=True, encoder=True, target_check="hpcgnn.data.edges:check_target",
             targets_prepare="hpcgnn.data.edges:prepare_targets"),
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
