"""Tasks: what a batch's targets are, the loss, the metrics, and evaluation.

The trainer's loop knows none of this: it asks the task for the model, a step's loss,
and the evaluation of the splits. Each task is declared in :mod:`hpcgnn.specs.tasks` (its
unit here by ``module:Class``, its kinds, metrics and settings); a new one arrives as a
spec there and a module here. Task modules are imported when a task is built, so that
checking a config (the launcher) imports no torch.
"""

from __future__ import annotations

from hpcgnn.checks import check_task_config
from hpcgnn.specs import load, tasks


def task_class(name: str):
    """The unit of task ``name``, as its spec names it."""
    return load(tasks.SPECS[name].unit)


def task_items(cfg):
    """The unit of ``cfg``'s task's items (:mod:`hpcgnn.tasks.items`): what a store opens over its graph; over a
    table of (node, time, label) entries where the dataset gives one and the task takes it (its spec's ``tables``)."""
    from hpcgnn.checks import has_table

    spec = tasks.SPECS[cfg.task.name]
    return load(spec.tables if spec.tables and has_table(cfg.dataset) else spec.batches)


def open_store(cfg, env, device=None):
    """The store of ``cfg``'s graph mode, with its task's items over it (:func:`hpcgnn.stores.open_store`)."""
    from hpcgnn import stores

    return stores.open_store(cfg, env, device, task_items(cfg))


def build_task(cfg, env, store, device):
    return task_class(cfg.task.name)(cfg, env, store, device)


__all__ = ["build_task", "check_task_config", "open_store", "task_class", "task_items"]
