"""A run's result in the words every command prints it (the rank's last log line, the launcher's result line).
"""

from __future__ import annotations

from hpcgnn.specs import tasks


def result_words(summary: dict, short: bool = False) -> str:
    """What a run's summary says of its result: "test accuracy 0.9263 (best val 0.9301 at epoch 7)" (``short``:
    the metric's own name, "test acc ..."), or with no test split or no validation split, what there is. A
    prediction job's (``hpcgnn predict``): :func:`predict_words`."""
    if summary.get("kind") == "predict":
        return predict_words(summary)
    name = metric_words(summary.get("metric", "val_acc").removeprefix("val_"), short)
    test, val, epoch = summary.get("test"), summary.get("best_val"), summary.get("best_epoch")
    head = f"test {name} {test:.4f}" if test is not None else f"no test {name} (the test split is empty)"
    how = EVALUATION.get(summary.get("eval_mode"), "")  # (which evaluation gave the numbers: sampled understates some)
    how = f", {how}" if how else ""
    if summary.get("select") == "last":
        return f"{head} (last epoch, {epoch}{f'; val {val:.4f}' if val is not None else ''}{how})"
    return f"{head} (best val {val:.4f} at epoch {epoch}{how})"


EVALUATION = {"full": "exact evaluation", "sampled": "sampled evaluation"}  # summary.json's eval_mode, in words


def metric_words(metric: str, short: bool = False) -> str:
    return metric if short else tasks.in_words(metric)


def predict_words(summary: dict) -> str:
    """A prediction job's result: "test accuracy 0.9263 over 12000 nodes (the run's: 0.9263, epoch 7, best.pt)", or
    what it wrote."""
    of = summary.get("of", "nodes")  # (an edge model's predictions: of target edges, or of a file's pairs)
    what = f"{summary['what']} of {summary['rows']} {of} ({summary['split']})" if of != "pairs" else \
        f"{summary['what']} of {summary['rows']} pair(s)"
    mode = f"{summary['mode']} inference" + (f" as of {summary['at']:g}" if summary.get("at") is not None else "")
    if summary.get("value") is None:
        return f"{what}, {mode}"
    run = summary.get("run_value")
    same = f"the run's: {run:.4f}" if run is not None else "the run reported none"
    metric = (summary.get("metric") or "_acc").split("_", 1)[1]
    return (f"{summary['split']} {metric_words(metric)} {summary['value']:.4f} over {summary['rows']} {of} ({same}; epoch "
            f"{summary.get('epoch')}, {summary.get('which')}.pt, {mode})")
