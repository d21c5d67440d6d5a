"""No silent or invalid result: empty splits, a single class, and every JSON hpcgnn writes.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import numpy as np
import pytest
from conftest import DATA_ROOT, train_here

from hpcgnn.errors import ConfigError, DatasetError


def _strict_json(path: Path) -> dict:
    """``path`` read as JSON that every reader takes: NaN or Infinity refused."""
    def refuse(name):
        raise ValueError(f"{path} holds {name}, which is not JSON")

    return json.loads(path.read_text(), parse_constant=refuse)


def _files(tmp_path, **override) -> str:
    from test_datasets import _write_files

    _write_files(tmp_path / "g", n=300, **{"edge_index": np.random.default_rng(2).integers(0, 300, (2, 3000)),
                                           "x": np.random.default_rng(3).normal(size=(300, 4)).astype(np.float32),
                                           "y": np.random.default_rng(4).integers(0, 3, 300),
                                           "train_idx": np.arange(0, 150), "val_idx": np.arange(150, 200),
                                           "test_idx": np.arange(200, 300), **override})
    return f"dataset.path={tmp_path / 'g'}"


SMALL_FILES = ["dataset=files", f"dataset.root={DATA_ROOT}", "train.batch_size=64", "train.epochs=3",
               "model.hidden_channels=16", "metrics.tensorboard=false"]


def test_an_empty_validation_split_is_refused_unless_the_last_epoch_is_asked_for(tmp_path):
    from conftest import make_config

    with pytest.raises(ConfigError, match=r"dataset.val_fraction=0 leaves the validation split of dataset synthetic "
                                          r"empty: no epoch can be chosen by a validation metric. HINT: give the "
                                          r"dataset a validation split, or set train.select=last"):
        make_config("dataset.val_fraction=0")
    path = _files(tmp_path, val_idx=np.array([], dtype=np.int64))
    with pytest.raises(DatasetError, match=r"the validation split of dataset files is empty: no epoch can be chosen "
                                           r"by a validation metric. HINT: .* or set train.select=last"):
        train_here(*SMALL_FILES, path, run_dir=tmp_path / "refused")
    summary = train_here(*SMALL_FILES, path, "train.select=last", run_dir=tmp_path / "last")
    last = summary["history"][-1]
    assert summary["best_epoch"] == 3 and summary["test"] == last["test_acc"] and summary["best_val"] is None
    assert "val_acc" not in last and _strict_json(tmp_path / "last" / "summary.json")["select"] == "last"
    from hpcgnn.results import result_words

    assert re.match(r"test accuracy \d\.\d{4} \(last epoch, 3, exact evaluation\)$", result_words(summary)), \
        result_words(summary)


def test_an_empty_test_split_is_reported_absent_never_nan(tmp_path, caplog):
    from hpcgnn.results import result_words

    path = _files(tmp_path, test_idx=np.array([], dtype=np.int64))
    with caplog.at_level(logging.WARNING, logger="hpcgnn"):
        logging.getLogger("hpcgnn").propagate = True
        summary = train_here(*SMALL_FILES, path, run_dir=tmp_path / "run")
    assert "the test split of dataset files is empty: the summary reports no test metric" in caplog.text
    written = _strict_json(tmp_path / "run" / "summary.json")
    assert written["test"] is None and summary["test"] is None and "test_acc" not in written["history"][-1]
    assert written["best_val"] == max(row["val_acc"] for row in written["history"])
    assert re.match(r"no test accuracy \(the test split is empty\) \(best val \d\.\d{4} at epoch \d, exact "
                    r"evaluation\)$",
                    result_words(summary)), result_words(summary)


def test_a_single_class_is_refused(tmp_path):
    from conftest import make_config

    with pytest.raises(ConfigError, match=r"dataset.num_classes=1: node classification with a single class predicts it "
                                          r"for every node, and scores accuracy 1.0 whatever the model learned. HINT: "):
        make_config("dataset.num_classes=1")
    make_config("dataset.num_classes=1", "task=link")  # link prediction has no classes to predict
    path = _files(tmp_path, y=np.zeros(300, dtype=np.int64))
    with pytest.raises(DatasetError, match=r"dataset files has 1 class: node classification with a single class"):
        train_here(*SMALL_FILES, path, run_dir=tmp_path / "run")


def test_what_hpcgnn_writes_as_json_is_always_json(tmp_path):
    from hpcgnn.io import write_json

    write_json(tmp_path / "s.json", {"loss": float("nan"), "rows": [1.0, float("inf"), (2.0, -float("inf"))]})
    assert _strict_json(tmp_path / "s.json") == {"loss": None, "rows": [1.0, None, [2.0, None]]}
