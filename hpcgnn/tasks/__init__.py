"""Tasks: what a batch's targets are, the loss, the metrics, and evaluation.

The trainer's loop knows none of this: it asks the task for the model, a step's loss,
and the evaluation of the splits. Node classification is the first task; a new one
(link prediction, typed graphs) arrives as a new module here and an entry in TASKS.
"""

from __future__ import annotations

from hpcgnn.errors import ConfigError
from hpcgnn.tasks.base import StepResult, Task
from hpcgnn.tasks.link import LinkPrediction
from hpcgnn.tasks.node import NodeClassification

# task.name -> class
TASKS: dict[str, type[Task]] = {
    "node": NodeClassification,
    "link": LinkPrediction,
}


def check_task_config(cfg) -> None:
    """The task's name, and what the task asks of the rest of the config."""
    if cfg.task.name not in TASKS:
        raise ConfigError(f"task.name={cfg.task.name!r} is unknown: use one of {', '.join(sorted(TASKS))}")
    TASKS[cfg.task.name].check_config(cfg)


def build_task(cfg, env, store, device) -> Task:
    return TASKS[cfg.task.name](cfg, env, store, device)


__all__ = ["TASKS", "StepResult", "Task", "build_task", "check_task_config"]
