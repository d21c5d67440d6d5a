"""A run's summary: what it trained, where, how fast, its metrics at the selected epoch and its model files, the
same on every rank (rank 0 writes ``summary.json``, which ``hpcgnn status`` and ``predict`` read)."""

from __future__ import annotations

import hashlib
import logging
import math
import socket
import sys
import time
from pathlib import Path

import torch

from hpcgnn import dist
from hpcgnn.env import restart_count
from hpcgnn.io import write_json
from hpcgnn.models import saved
from hpcgnn.rank.metrics import peak_memory_mb
from hpcgnn.results import result_words

log = logging.getLogger("hpcgnn.rank.trainer")


def param_checksum(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def log_start(trainer) -> None:
    """What a run is about to do, in the log: the model, graph, sampler and steps; the batch, learning rate and
    precision (``trainer``: the :class:`~hpcgnn.rank.trainer.Trainer` at its start)."""
    t, env, store = trainer.cfg.train, trainer.env, trainer.store
    log.info("training %s (%s task) on %d rank(s), %s", trainer.cfg.model.name, trainer.task.name, env.world_size,
             store.epoch_in_words())
    about, per, noun = store.step_batch()
    log.info("global batch %s%d %s (%d ranks x %d micro-batches x %d), lr %.3g (train.lr %.3g, scaling %s, "
             "warmup %d steps), %s, gradient all-reduce: %s", about, env.world_size * t.accumulate * per, noun,
             env.world_size, t.accumulate, per, trainer.lr, t.lr, t.lr_scaling,
             int(t.warmup * trainer.opt_steps * t.epochs), t.precision, t.grad_compression)


def progress(trainer) -> dict:
    """What ``hpcgnn status`` reads while the run goes on (``progress.json``: the summary's first keys)."""
    s, metric = trainer.state, trainer.task.metric
    return {"epochs": trainer.cfg.train.epochs, "history": s.history, "metric": f"val_{metric}",
            "best_val": s.best.get(f"val_{metric}"), "test": s.best.get(f"test_{metric}"), "best_epoch": s.best_epoch}


def progress_bar(cfg, env) -> bool:
    """Whether this rank draws the epoch's progress bar (rank 0; metrics.progress_bar, auto: on a terminal)."""
    m = cfg.metrics
    return env.is_main and (m.progress_bar == "on" or (m.progress_bar == "auto" and sys.stdout.isatty()))


def tune_result(self) -> dict:
    """A tune's trial (nothing otherwise): the epoch the pruner stopped it after (0: none), and the study's value:
    its metric's best over the evaluated epochs, in the study's direction."""
    if not self.trial.active:
        return {}
    from hpcgnn.tuning import metric_of

    metric = self.trial.metric
    direction = metric_of(self.cfg)[1]
    lower = self.task.lower_is_better if direction == "auto" else direction == "minimize"
    values = [row[metric] for row in self.state.history if row.get(metric) is not None and not math.isnan(row[metric])]
    return {"pruned_at": self.pruned_at, "tune_metric": metric,
            "tune_value": (min(values) if lower else max(values)) if values else None}


def run_summary(self) -> dict:
    """A trainer's run summary (``self``: the :class:`~hpcgnn.rank.trainer.Trainer` at its end), the same on every rank;
    rank 0 writes ``summary.json``."""
    cfg, t, s, env, metric = self.cfg, self.cfg.train, self.state, self.env, self.task.metric
    checksums = dist.all_gather_object(param_checksum(self.model))
    hosts = dist.all_gather_object(socket.gethostname())
    out = {
        "task": self.task.name,
        "metric": f"val_{metric}",  # the evaluation metric that selects the best epoch
        "lower_is_better": self.task.lower_is_better,  # ... the lowest (RMSE), else the highest
        **({"kind": self.task.target.kind} if hasattr(self.task, "target") else {}),  # a node task's kind
        "best_val": s.best.get(f"val_{metric}"),  # its best value (None: no validation split) ...
        "test": s.best.get(f"test_{metric}"),  # ... and the test value at that epoch (None: no test split)
        "select": self.cfg.train.select,  # val: the epoch of the best validation metric; last: the last evaluated
        **s.best,  # every val_* / test_* metric at that epoch (test_acc, test_auc, test_hits@50, ...)
        "best_epoch": s.best_epoch,
        **tune_result(self),  # a tune's trial: where it was pruned, and the value the study takes
        f"final_test_{metric}": s.history[-1].get(f"test_{metric}") if s.history else None,
        "epochs": t.epochs,
        "steps_per_epoch": self.store.steps,
        "world_size": env.world_size,
        "num_nodes": env.num_nodes,
        "hostnames": sorted(set(hosts)),
        "rank_hosts": hosts,
        "master_addr": env.master_addr,
        "master_port": env.master_port,
        "launcher": env.source,
        "job_id": env.job_id,
        "backend": dist.backend(),
        "device": str(self.device),
        "dataset": cfg.dataset.name,
        "effective_lr": self.lr,
        "global_batch": env.world_size * t.accumulate * t.batch_size,
        "precision": t.precision,
        "grad_compression": t.grad_compression,
        "allreduce_bytes_per_step": (sum(self.allreduce_bytes) / len(self.allreduce_bytes)
                                     if self.allreduce_bytes else 0),
        "eval_mode": self.task.eval_mode,
        "sampler": t.sampler,
        "edge_budget": t.edge_budget,
        "graph_mode": cfg.graph.mode,
        "graph_on": self.store.graph_on,
        "resident_graph_bytes": dist.all_gather_object(self.store.resident_bytes()),
        "peak_memory_mb": dist.all_gather_object(peak_memory_mb(self.device)),  # per rank, evaluation included
        "model": cfg.model.name,
        "model_class": saved.class_name(self.model),  # (a link model's: its encoder's)
        "model_source": saved.model_source(cfg.model),  # a model of the user's own: class, file, file's hash
        "seeds_per_s": s.seeds_done / s.train_time_s if s.train_time_s > 0 else 0.0,
        "seeds_unit": self.store.seeds_unit,  # what seeds_per_s counts: seeds (nodes, edges), or graphs
        "train_time_s": s.train_time_s,
        "wall_time_s": time.perf_counter() - self.t_start,
        "resumes": s.resumes,  # times this run continued from a checkpoint
        "resume_changes": s.resume_changes,  # settings changed on a resume and applied from the step named
        "nonfinite_skipped": s.nonfinite_skipped,  # optimizer steps skipped for NaN/inf (train.nonfinite=skip)
        "requeues": restart_count(),  # times SLURM requeued the job
        "param_checksums": checksums,
        "history": s.history,
        "run_dir": cfg.run_dir,
        # the trained model (hpcgnn.load_model(run_dir, which)): the best epoch's weights, the last step's
        "model_files": {w: str(p) if (p := saved.model_path(cfg.run_dir, w)).is_file() else None
                        for w in saved.WHICH},
    }
    if metric == "acc":  # node classification also names it best_val_acc
        out["best_val_acc"] = out["best_val"]
    if env.is_main:
        path = write_json(Path(cfg.run_dir) / "summary.json", out)
        log.info("%s; summary: %s", result_words(out, short=True), path)
    return out
