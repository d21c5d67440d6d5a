"""A run's result in the words every command prints it (the rank's last log line, the launcher's result line).
"""

from __future__ import annotations


def result_words(summary: dict, short: bool = False) -> str:
    """What a run's summary says of its result: "test accuracy 0.9263 (best val 0.9301 at epoch 7)" (``short``:
    the metric's own name, "test acc ..."), or with no test split or no validation split, what there is."""
    metric = summary.get("metric", "val_acc").removeprefix("val_")
    name = "accuracy" if metric == "acc" and not short else metric
    test, val, epoch = summary.get("test"), summary.get("best_val"), summary.get("best_epoch")
    head = f"test {name} {test:.4f}" if test is not None else f"no test {name} (the test split is empty)"
    if summary.get("select") == "last":
        return f"{head} (last epoch, {epoch}{f'; val {val:.4f}' if val is not None else ''})"
    return f"{head} (best val {val:.4f} at epoch {epoch})"
