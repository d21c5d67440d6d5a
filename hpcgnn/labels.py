"""What a node task's labels are: classes, several binary labels, or values (no torch: the launcher checks them).

A prepared graph keeps its labels as the source gives them, in one of two forms (:func:`stored`):

- ``int64 [N]``: one class per node, ``-1`` where a node has none;
- ``float32 [N]`` or ``[N, C]``: several labels or values per node, ``NaN`` where one is unknown (integer
  multi-label files mark it ``-1``, turned into ``NaN`` here);
- ``int64 [N, C]``: integer columns with values other than -1, 0 and 1, kept as they are (every entry known):
  values, for ``task.kind=regression`` alone.

Beside them, meta.json records a *profile* of the labels (:func:`profile`): their form, whether every known value
is 0 or 1 or a whole number, the known entries in each split, and the training split's mean and standard deviation
per column. The task's kind follows from the profile and ``task.kind`` (:func:`resolve`), on the launcher where the
data is on disk and in every rank, as a :class:`Target`: what the model outputs, its loss, its metric, and the scale
that standardises regression targets (kept in the model file, so predictions come back in the labels' units).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from hpcgnn.errors import DatasetError
from hpcgnn.specs import tasks
from hpcgnn.specs.tasks import KIND_NAMES as KINDS  # task.kind

SPLITS = ("train", "val", "test")


@dataclass(frozen=True)
class Target:
    """A node task's target: ``kind``, the model's output ``width`` (classes, labels or values), whether the labels
    are one column (``[N]``: a regression's output is squeezed), the loss, and a regression's scale (``mean`` and
    ``std`` per column of the training split)."""

    kind: str = "classification"
    width: int = 0
    column: bool = True
    loss: str = "ce"
    mean: tuple[float, ...] = ()
    std: tuple[float, ...] = ()
    inferred: bool = False  # the kind came from the labels (task.kind=auto)
    reasons: tuple[str, ...] = field(default=(), compare=False)  # why: said in the log
    select: str = ""  # the metric that selects the epoch where not the kind's (a dataset's own, OGB's; task.metric)

    @property
    def metric(self) -> str:
        return self.select or tasks.KINDS[self.kind].metric

    @property
    def lower_is_better(self) -> bool:
        return not tasks.higher_is_better(self.metric)

    def record(self) -> dict:
        """What the model file keeps (JSON: :meth:`from_record` reads it back)."""
        d = asdict(self)
        d.pop("reasons")
        return d

    @classmethod
    def from_record(cls, d: dict | None, num_classes: int) -> Target:
        if not d:  # a model file from before the task kinds: node classification
            return cls("classification", num_classes)
        return cls(d["kind"], int(d["width"]), bool(d["column"]), d["loss"], tuple(d["mean"]), tuple(d["std"]),
                   bool(d.get("inferred", False)), select=d.get("select", ""))

    def outputs(self) -> str:
        """What the model outputs per node: "7 classes", "112 binary labels", "1 value"."""
        return {"classification": f"{self.width} classes", "multilabel": f"{self.width} binary labels",
                "regression": f"{self.width} value{'s' if self.width > 1 else ''}",
                "ordinal": f"{self.width + 1} ordered levels"}[self.kind]

    def describe(self, task: str = "node task", labels: str = "y") -> str:
        what = self.outputs()
        how = f"inferred from {labels}" if self.inferred else "task.kind"
        return (f"{task}: {self.kind} ({what}, {how}{': ' + '; '.join(self.reasons) if self.reasons else ''}); "
                f"loss {self.loss}, metric {self.metric} ({'lower' if self.lower_is_better else 'higher'} is better)")


def stored(y, where: str):
    """Labels in their stored form: one integer column as int64 [N]; anything else float32, an integer multi-label's
    ``-1`` as ``NaN``. ``where`` names the file or source in errors."""
    import numpy as np  # (not at import: the launcher's checks import this module)

    y = np.asarray(y)
    if y.ndim == 2 and y.shape[1] == 1 and np.issubdtype(y.dtype, np.integer):
        y = y.reshape(-1)
    if y.ndim not in (1, 2) or y.shape[0] == 0 and y.ndim != 1:
        raise DatasetError(f"{where}: labels must have shape [num_nodes] or [num_nodes, labels], got {tuple(y.shape)}")
    if np.issubdtype(y.dtype, np.bool_):
        y = y.astype(np.int64)
    if not (np.issubdtype(y.dtype, np.integer) or np.issubdtype(y.dtype, np.floating)):
        raise DatasetError(f"{where}: labels must be integers or floats, got {y.dtype}")
    if y.ndim == 1 and np.issubdtype(y.dtype, np.integer):
        return y.astype(np.int64, copy=False)
    if np.issubdtype(y.dtype, np.integer):  # integer columns: binary labels (-1 unknown: NaN), or values as they are
        if y.size and (y.min() < -1 or y.max() > 1):
            return y.astype(np.int64, copy=False)
        out = y.astype(np.float32)
        out[y == -1] = np.nan
        return out
    if np.isinf(y).any():
        raise DatasetError(f"{where}: labels contain inf (NaN marks an unknown value; inf is none)")
    return y.astype(np.float32, copy=False)


def profile(y, splits: dict) -> dict:
    """What :func:`resolve` needs to know of stored labels ``y`` (JSON): their form, the kind of their known values,
    the known entries per split, and the training split's mean and std per column (a regression's scale)."""
    import numpy as np

    integer = np.issubdtype(y.dtype, np.integer)
    known = ((y >= 0) if y.ndim == 1 else np.ones(y.shape, bool)) if integer else ~np.isnan(y)
    values = y[known]
    train = np.asarray(splits["train"], dtype=np.int64)
    out = {"dtype": "int" if integer else "float", "columns": 0 if y.ndim == 1 else int(y.shape[1]),
           "binary": bool(values.size == 0 or np.isin(values, (0, 1)).all()),
           "integral": bool(integer or values.size == 0 or (np.floor(values) == values).all()),
           "split_sizes": {s: int(len(splits[s])) for s in SPLITS},
           "known": {s: int(known[np.asarray(splits[s], dtype=np.int64)].sum()) for s in SPLITS}}
    if integer:
        out["top"] = int(values.max()) + 1 if values.size else 0
    if integer and y.ndim == 1:  # (class ids, -1 for none: what else the column holds says whether they are)
        out["min"] = int(y.min()) if y.size else 0
        out["zero"] = bool((y == 0).any())
    width = 1 if y.ndim == 1 else y.shape[1]  # (reshape cannot infer a width from no rows)
    rows = y[train].astype(np.float64).reshape(len(train), width)
    ok = known[train].reshape(len(train), width)
    count = ok.sum(axis=0)
    total = np.where(ok, rows, 0.0).sum(axis=0)
    mean = np.divide(total, count, out=np.zeros_like(total), where=count > 0)
    var = np.divide(np.where(ok, (rows - mean) ** 2, 0.0).sum(axis=0), count, out=np.zeros_like(total),
                    where=count > 0)
    out["train_count"] = count.astype(int).tolist()
    out["train_mean"] = mean.tolist()
    out["train_std"] = np.sqrt(var).tolist()
    return out


def _infer(p: dict) -> tuple[str, str]:
    """(kind, why) from a profile, or a DatasetError naming ``task.kind`` where the labels do not say."""
    if p["dtype"] == "int" and p["columns"] == 0:
        return "classification", "one integer column"
    if p["dtype"] == "float" and p["columns"] == 0:
        return "regression", "one float column"
    if p["binary"] and p["columns"] > 1:
        return "multilabel", f"{p['columns']} columns of 0 and 1"
    if p["dtype"] == "float":
        return "regression", f"{p['columns']} float columns"
    raise DatasetError("{where}: labels of " + f"{p['columns']} integer columns other than 0, 1 and -1 are neither "
                       "classes nor binary labels. HINT: task.kind=regression to predict them as values")


def resolve(p: dict | None, kind: str, loss: str, num_classes: int, where: str) -> Target:
    """The node task's :class:`Target` from labels' profile ``p`` (None: a graph prepared before profiles, one
    class per node) and ``task.kind``/``task.loss``; a DatasetError naming the option or the file when they are at
    odds."""
    if p is None:
        p = {"dtype": "int", "columns": 0, "binary": False, "integral": True, "known": {}, "top": num_classes}
    inferred = kind == "auto"
    reasons: tuple[str, ...] = ()
    if inferred:
        try:
            kind, why = _infer(p)
        except DatasetError as exc:
            raise DatasetError(str(exc).replace("{where}", where)) from None
        reasons = (why,)
    columns = max(p["columns"], 1)
    if kind == "classification":
        if p["dtype"] != "int" or p["columns"] > 1:
            raise DatasetError(f"{where}: task.kind=classification takes one integer class per node; these labels are "
                               f"{_form(p)}. HINT: task.kind=" + ("multilabel" if p["binary"] else "regression")
                               + " (or auto)")
        _check_ids(p, where)
        _check_known(p, where, "labelled node")
        width = num_classes or p.get("top", 0)
        return Target("classification", width, True, "ce", inferred=inferred, reasons=reasons)
    if kind == "ordinal":  # (never inferred: integer classes are classes unless task.kind says they are ordered)
        if p["dtype"] != "int" or p["columns"] > 1:
            raise DatasetError(f"{where}: task.kind=ordinal takes one integer level per node (0..K-1 in order, -1: "
                               f"none); these labels are {_form(p)}. HINT: task.kind=regression for values")
        _check_ids(p, where)
        _check_known(p, where, "labelled node")
        levels = num_classes or p.get("top", 0)
        if levels < 2:
            raise DatasetError(f"{where}: task.kind=ordinal needs at least 2 levels; the labels hold {levels}")
        return Target("ordinal", levels - 1, True, "bce", inferred=inferred, reasons=reasons)
    if kind == "multilabel":
        if not p["binary"]:
            raise DatasetError(f"{where}: task.kind=multilabel takes labels of 0 and 1 (unknown: NaN, or -1 in "
                               f"integer labels); these are {_form(p)} with other values. HINT: task.kind=regression "
                               "for values, classification for class ids")
        if p["dtype"] == "int" and p["columns"] == 0:
            raise DatasetError(f"{where}: task.kind=multilabel takes labels of shape [N, C]; these are one integer "
                               "column (class ids). HINT: task.kind=classification (or auto)")
        _check_known(p, where, "known label")
        return Target("multilabel", columns, p["columns"] == 0, "bce", inferred=inferred, reasons=reasons)
    if kind == "regression":
        if p["dtype"] == "int" and p["columns"] == 0 and p.get("min", 0) < 0:
            raise DatasetError(f"{where}: task.kind=regression on one integer column holding negative values "
                               f"(down to {p['min']}): integers of one column are class ids, -1 for none, so these "
                               "would be dropped. HINT: store the labels as floats (y.float(), a float32 .npy file)")
        _check_known(p, where, "known value")
        count = p.get("train_count", [])
        if any(c == 0 for c in count):
            col = count.index(0)
            raise DatasetError(f"{where}: column {col} of the labels has no known value in the training split "
                               "(all NaN): nothing to learn it from. HINT: drop the column, or give it values")
        std = tuple(s if s > 0 and math.isfinite(s) else 1.0 for s in p.get("train_std", [1.0] * columns))
        mean = tuple(p.get("train_mean", [0.0] * columns))
        chosen = "mse" if loss == "auto" else loss
        return Target("regression", columns, p["columns"] == 0, chosen, mean, std, inferred, reasons)
    raise DatasetError(f"task.kind={kind!r} is unknown: use one of {', '.join(KINDS)}")


def where_labels(dataset) -> str:
    """Where a dataset config's labels are, as errors name them: a folder's y, or the dataset's."""
    if dataset.name == "files" and dataset.path:
        return f"{dataset.path.rstrip('/')}/y"
    return f"the labels (y) of dataset={dataset.name}"


def _check_ids(p: dict, where: str) -> None:
    """One integer column as classes must hold class ids 0..K-1, -1 for none: a column with values below -1
    (ratings -10..10), or with -1 and no 0 (signs -1/+1: every -1 would be dropped as 'no class'), is refused."""
    low, top = p.get("min", 0), p.get("top", 0)
    if low < -1:
        found = f"integers from {low} to {top - 1}"
    elif low == -1 and not p.get("zero", True) and top > 1:
        found = (f"-1 and {top - 1}, no 0 (signs?)" if top == 2 else f"-1 and 1..{top - 1}, no 0") + \
            ": -1 marks a target without a class, so every -1 would be dropped"
    else:
        return
    raise DatasetError(f"{where}: one integer column of labels holds {found}; classes are ids 0..K-1 (-1: none). "
                       "HINT: remap them to 0..K-1 (signs -1/+1 as 0/1), or store them as floats and give "
                       "task.kind=regression to predict them as values")


def _form(p: dict) -> str:
    shape = "[N]" if p["columns"] == 0 else f"[N, {p['columns']}]"
    return f"{p['dtype']} {shape}"


def _check_known(p: dict, where: str, what: str) -> None:
    """Every split the task scores needs known targets: training always; a regression's val and test too when
    they have nodes (an all-NaN split would score NaN)."""
    known = p.get("known") or {}
    if known.get("train", 1) == 0:
        raise DatasetError(f"{where}: the training split has no {what} (every target unknown). HINT: give the "
                           "training nodes labels, or choose other training nodes")
    for split in ("val", "test"):
        if split in known and known[split] == 0 and p.get("split_sizes", {}).get(split, 0) > 0:
            raise DatasetError(f"{where}: the {split} split has no {what} (every target unknown: NaN): it cannot be "
                               "scored. HINT: give those nodes values, or choose other nodes for the split")
