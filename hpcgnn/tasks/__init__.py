"""Tasks: what a batch's targets are, the loss, the metrics, and evaluation.

The trainer's loop knows none of this: it asks the task for the model, a step's loss,
and the evaluation of the splits. Node classification is the first task; a new one
(link prediction, typed graphs) arrives as a new module here, an entry in TASKS, and its
submit-time checks in hpcgnn.checks. Task modules are imported when a task is built, so
that checking a config (the launcher) imports no torch.
"""

from __future__ import annotations

import importlib

from hpcgnn.checks import check_task_config

# task.name -> "module:class" (the same names as hpcgnn.checks.TASK_NAMES: tests/test_config.py holds them equal)
TASKS: dict[str, str] = {
    "node": "hpcgnn.tasks.node:NodeTask",
    "link": "hpcgnn.tasks.link:LinkPrediction",
    "edge": "hpcgnn.tasks.edge:EdgeTask",
}


def task_class(name: str):
    module, cls = TASKS[name].split(":")
    return getattr(importlib.import_module(module), cls)


def build_task(cfg, env, store, device):
    return task_class(cfg.task.name)(cfg, env, store, device)


__all__ = ["TASKS", "build_task", "check_task_config", "task_class"]
