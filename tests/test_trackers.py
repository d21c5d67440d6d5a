"""The trackers labs use (metrics.trackers=[wandb,mlflow]): W&B offline, its files in the run folder, read back
record by record; MLflow's file store, read back through MLflow's own client; a sweep's members grouped; a
missing extra refused with one line."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
from conftest import DATA_ROOT, make_config, train_here

from hpcgnn.errors import MissingExtra

TINY = ["dataset.num_nodes=2000", "train.epochs=3", "train.batch_size=256", "model.hidden_channels=16",
        "train.precision=fp32", "metrics.tensorboard=false", f"dataset.root={DATA_ROOT}"]


def wandb_records(path: Path) -> list:
    """The records of a W&B run file (``run-<id>.wandb``), read with W&B's own protobuf messages: a 7-byte header
    (``:W&B``, magic, version), then LevelDB's log format (32 KiB blocks; each record's checksum, length and type,
    a record split across blocks as first, middle and last pieces)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B", data[:7]
    out, pos, block, piece = [], 7, 32768, b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # (a block's tail too short for a header is padding)
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0 and length == 0:
            break
        piece += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # full, or the last piece
            record = pb.Record()
            record.ParseFromString(piece)
            out.append(record)
            piece = b""
    return out


def items(entries) -> dict:
    """A W&B record's items as a dict (a key is ``key``, or its ``nested_key`` parts)."""
    return {(i.key or ".".join(i.nested_key)): json.loads(i.value_json) for i in entries}


@pytest.mark.slow
def test_wandb_offline_and_an_mlflow_file_store_get_the_config_epochs_summary_and_model(tmp_path):
    pytest.importorskip("wandb")
    mlflow = pytest.importorskip("mlflow")
    run = tmp_path / "run"
    summary = train_here(*TINY, "metrics.trackers=[wandb,mlflow]", "metrics.project=tests", run_dir=run)

    files = list((run / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(files) == 1, list((run / "wandb").iterdir())
    records = wandb_records(files[0])
    history = [(r.history.step.num, items(r.history.item)) for r in records if r.WhichOneof("record_type") == "history"]
    assert [step for step, _ in history] == [1, 2, 3]
    history = [h for _, h in history]
    assert [h["loss"] for h in history] == pytest.approx([row["loss"] for row in summary["history"]])
    assert history[-1]["val_acc"] == pytest.approx(summary["history"][-1]["val_acc"])
    assert history[-1]["phases_s/forward_s"] > 0 and "phases_s/sample_s" in history[-1]  # (the epoch's phase times)
    config = {k: v for r in records if r.WhichOneof("record_type") in ("run", "config")
              for k, v in items(r.run.config.update if r.HasField("run") else r.config.update).items()}
    assert config["train"]["lr"] == summary["effective_lr"] and config["dataset"]["num_nodes"] == 2000
    ended = {k: v for r in records if r.WhichOneof("record_type") == "summary"
             for k, v in items(r.summary.update).items()}
    assert ended["test"] == pytest.approx(summary["test"]) and ended["best_epoch"] == summary["best_epoch"]
    (artifact,) = [r.artifact for r in records if r.WhichOneof("record_type") == "artifact"]
    assert artifact.type == "model" and sorted(e.path for e in artifact.manifest.contents) == ["best.pt", "last.pt"]

    kept = json.loads((run / "metrics" / "mlflow-run.json").read_text())
    assert kept["tracking_uri"] == (run / "mlruns").resolve().as_uri()
    client = mlflow.MlflowClient(kept["tracking_uri"])
    got = client.get_run(kept["run_id"])
    assert got.info.status == "FINISHED" and got.data.params["train.lr"] == str(summary["effective_lr"])
    assert [m.value for m in client.get_metric_history(kept["run_id"], "loss")] == \
        pytest.approx([row["loss"] for row in summary["history"]])
    assert float(got.data.tags["summary.test"]) == pytest.approx(summary["test"])
    assert sorted(a.path for a in client.list_artifacts(kept["run_id"], "model")) == ["model/best.pt", "model/last.pt"]


@pytest.mark.slow
def test_a_sweeps_members_share_an_mlflow_parent_run_in_the_sweep_folder(tmp_path):
    mlflow = pytest.importorskip("mlflow")
    sweep = tmp_path / "sweep"
    for k in (0, 1):
        train_here(*TINY, "train.epochs=1", "metrics.trackers=[mlflow]", f"metrics.group={sweep}", f"train.lr=0.00{k + 1}",
                   run_dir=sweep / str(k))
    parent = json.loads((sweep / "mlflow-parent.json").read_text())["run_id"]
    client = mlflow.MlflowClient((sweep / "mlruns").resolve().as_uri())
    runs = [client.get_run(json.loads((sweep / str(k) / "metrics" / "mlflow-run.json").read_text())["run_id"])
            for k in (0, 1)]
    assert [r.data.tags["mlflow.parentRunId"] for r in runs] == [parent, parent]
    assert {r.data.params["train.lr"] for r in runs} == {"0.001", "0.002"}


def test_an_unknown_or_missing_tracker_is_refused_with_one_line(monkeypatch):
    import importlib.util

    from hpcgnn.errors import ConfigError

    with pytest.raises(ConfigError, match=r"metrics.trackers names 'neptune': use wandb and mlflow"):
        make_config("metrics.trackers=[neptune]")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(MissingExtra, match=r"^metrics.trackers=wandb needs wandb, which is not installed here. HINT: "
                                           r"pip install 'hpcgnn\[wandb\]'$"):
        make_config("metrics.trackers=[wandb]")
