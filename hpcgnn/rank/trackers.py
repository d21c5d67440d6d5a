"""The experiment trackers labs use, beside TensorBoard and the JSON lines (``metrics.trackers=[wandb,mlflow]``):
what rank 0 logs to each, and where.

- **Weights & Biases**: offline unless ``WANDB_MODE`` says otherwise (compute nodes often have no internet), its
  files in the run folder (``<run>/wandb/offline-run-*``: ``wandb sync`` them from a login node); the run's id
  follows its folder, so a requeued run goes on in the same W&B run.
- **MLflow**: to ``MLFLOW_TRACKING_URI``, or else a file store in the sweep's (or the run's) folder
  (``mlruns/``); the MLflow run's id is kept in the run folder, so a requeued run goes on in it.
- A sweep's or a tune's members are grouped (``metrics.group``: its folder, set by its launcher): a W&B group, and
  an MLflow parent run, made once per group under a lock in that folder.

Logged: the resolved config (W&B's config; MLflow's params, flattened as ``train.lr``), every epoch's numbers
(losses, metrics, throughput, phase times), the summary's numbers at the end, and the model files as artifacts.
Each tracker is an optional extra (``pip install 'hpcgnn[wandb]'``); a missing one is refused at submit
(:func:`hpcgnn.checks.check_trackers`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import logging
import math
import os
from pathlib import Path

from hpcgnn import env, paths
from hpcgnn.checks import check_trackers
from hpcgnn.io import write_json

log = logging.getLogger(__name__)

MLFLOW_RUN = "mlflow-run.json"  # in the run's metrics/: the MLflow run a requeued run goes on in
MLFLOW_PARENT = "mlflow-parent.json"  # in a group's folder: its parent run


def numbers(row: dict, prefix: str = "") -> dict[str, float]:
    """The finite numbers of ``row`` (nested dicts flattened as ``a/b``), for a tracker's metrics."""
    out = {}
    for key, value in row.items():
        if isinstance(value, dict):
            out.update(numbers(value, f"{prefix}{key}/"))
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            out[f"{prefix}{key}"] = float(value)
    return out


def flat(data: dict, prefix: str = "") -> dict[str, str]:
    """A nested config as ``{"train.lr": "0.003", ...}`` (MLflow's params)."""
    out = {}
    for key, value in data.items():
        if isinstance(value, dict) and value:
            out.update(flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = str(value)[:500]
    return out


class Trackers:
    """Rank 0's trackers of a run (inert elsewhere, and where none is named)."""

    def __init__(self, cfg, main: bool):
        self.cfg, self.names = cfg, tuple(cfg.metrics.trackers) if main else ()
        self.run_dir = Path(cfg.run_dir)
        self.wandb = self.mlflow = None

    def start(self) -> None:
        if not self.names:
            return
        check_trackers(self.names)
        if self.cfg.metrics.group:  # (the sweep's folder, or one the user named: it and all in it must be theirs)
            paths.check_tree(self.cfg.metrics.group, "the metrics group's folder (metrics.group)",
                             "use a folder only you can write for metrics.group")
        config = dataclasses.asdict(self.cfg)
        if "wandb" in self.names:
            self.wandb = self._start_wandb(config)
        if "mlflow" in self.names:
            self.mlflow = self._start_mlflow(config)

    def _start_wandb(self, config: dict):
        import wandb

        m = self.cfg.metrics
        group = Path(m.group).name if m.group else None
        run_id = hashlib.sha256(str(self.run_dir.resolve()).encode()).hexdigest()[:16]
        run = wandb.init(project=m.project, dir=str(self.run_dir), mode=os.environ.get("WANDB_MODE", "offline"),
                         group=group, name=self.run_dir.name if group else None, id=run_id, resume="allow",
                         config=config, settings=wandb.Settings(silent=True))
        log.info("W&B: run %s (%s mode) in %s%s", run_id, run.settings.mode, run.dir.rsplit("/files", 1)[0],
                 "; upload it from a node with internet: wandb sync " + run.dir.rsplit("/files", 1)[0]
                 if run.settings.mode == "offline" else "")
        return run

    def _start_mlflow(self, config: dict):
        import mlflow

        m = self.cfg.metrics
        uri = env.read("mlflow_uri") or _file_store(Path(m.group) if m.group else self.run_dir)
        client = mlflow.MlflowClient(uri)
        experiment = client.get_experiment_by_name(m.project)
        experiment_id = experiment.experiment_id if experiment is not None else client.create_experiment(m.project)
        kept = self.run_dir / "metrics" / MLFLOW_RUN
        if kept.is_file():  # a requeued run: the same MLflow run
            run_id = json.loads(kept.read_text())["run_id"]
        else:
            tags = {"hpcgnn.run_dir": str(self.run_dir)}
            if m.group:
                tags["mlflow.parentRunId"] = _parent(client, experiment_id, Path(m.group))
            run_id = client.create_run(experiment_id, run_name=self.run_dir.name, tags=tags).info.run_id
            write_json(kept, {"run_id": run_id, "tracking_uri": uri})
            params = sorted(flat(config).items())
            for i in range(0, len(params), 100):  # (MLflow takes 100 params a call)
                client.log_batch(run_id, params=[mlflow.entities.Param(k, v) for k, v in params[i:i + 100]])
        return client, run_id

    def epoch(self, row: dict) -> None:
        values = numbers({k: v for k, v in row.items() if k != "epoch"})
        step = int(row["epoch"])
        if self.wandb is not None:
            self.wandb.log(values, step=step)
        if self.mlflow is not None:
            import mlflow

            client, run_id = self.mlflow
            items = sorted(values.items())
            for i in range(0, len(items), 500):
                client.log_batch(run_id, metrics=[mlflow.entities.Metric(k.replace("@", "_at_"), v, 0, step)
                                                  for k, v in items[i:i + 500]])

    def finish(self, summary: dict) -> None:
        """The summary's numbers and the model files; the trackers closed."""
        scalars = numbers({k: v for k, v in summary.items() if k not in ("history",)})
        files = [Path(p) for p in (summary.get("model_files") or {}).values() if p]
        if self.wandb is not None:
            import wandb

            self.wandb.summary.update(scalars)
            if files:  # (one artifact, a version per run)
                artifact = wandb.Artifact(f"model-{self.wandb.id}", type="model",
                                          metadata={"epoch": summary.get("best_epoch"), "metric": summary.get("metric")})
                for path in files:
                    artifact.add_file(str(path), name=path.name)
                self.wandb.log_artifact(artifact)
            self.wandb.finish()
            self.wandb = None
        if self.mlflow is not None:
            client, run_id = self.mlflow
            for key, value in scalars.items():
                client.set_tag(run_id, f"summary.{key}", value)
            for path in files:
                client.log_artifact(run_id, str(path), "model")
            client.set_terminated(run_id)
            log.info("MLflow: run %s in %s", run_id, client.tracking_uri)
            self.mlflow = None

    def close(self, preempted: bool = False) -> None:
        """On a failure: the trackers told the run failed, nothing more; on a preemption, left to go on (the
        requeued run resumes the same W&B and MLflow runs)."""
        if self.wandb is not None:
            with contextlib.suppress(Exception):
                self.wandb.finish(exit_code=3 if preempted else 1)
        if self.mlflow is not None and not preempted:
            with contextlib.suppress(Exception):
                client, run_id = self.mlflow
                client.set_terminated(run_id, "FAILED")
        self.wandb = self.mlflow = None


def _file_store(folder: Path) -> str:
    """MLflow's file store in ``folder/mlruns`` (MLflow keeps it in maintenance, behind an opt-out that hpcgnn gives:
    a shared file system has no database server)."""
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    return (folder / "mlruns").resolve().as_uri()


def _parent(client, experiment_id: str, group: Path) -> str:
    """The group's parent run, made by the first member that gets here (a lock in the group's folder)."""
    paths.make_dirs(group)
    with paths.open_append(group / ".mlflow-parent.lock", "the group's lock") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        path = group / MLFLOW_PARENT
        if path.is_file():
            return json.loads(paths.read_own(path, "the group's MLflow parent run"))["run_id"]
        run_id = client.create_run(experiment_id, run_name=group.name, tags={"hpcgnn.group": str(group)}).info.run_id
        write_json(path, {"run_id": run_id})
        return run_id
