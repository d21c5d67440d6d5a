"""Every list of choices hpcgnn has, declared once, without torch: the rest derives from these.

- :mod:`~hpcgnn.specs.datasets`: each dataset, its tasks, builders and cache key;
- :mod:`~hpcgnn.specs.tasks`: each task (its unit, items, kinds, metrics and their directions, its own settings);
- :mod:`~hpcgnn.specs.models`: each built-in model family and what it supports (graphs, exact inference, edge
  features);
- :mod:`~hpcgnn.specs.samplers`: each training sampler, the graphs and tasks it serves, and its one builder.

Who reads them: :mod:`hpcgnn.checks` and :mod:`hpcgnn.config` (what a config may say, and the hint when it says
something else), the registries that build (``hpcgnn.tasks``, ``hpcgnn.models``, the stores), and the docs' tables
(tests hold each table to its spec). A spec names its builder by ``"module:function"``, imported when first used,
so that the launcher, which checks a config before anything runs, imports no torch.
"""

from __future__ import annotations

import importlib


def load(dotted: str):
    """The object a spec names by ``"module:name"``, imported now."""
    module, name = dotted.split(":")
    return getattr(importlib.import_module(module), name)


def choices(cls: type, key: str) -> tuple:
    """The choices a config class declares for its field ``key``: the one list that validation, the messages and
    the code that branches on them read."""
    import typing

    return declared(typing.get_type_hints(cls)[key])


def declared(annotation) -> tuple:
    """The choices an annotation declares: its ``Literal``'s values (() where it is no Literal)."""
    import typing

    return typing.get_args(annotation) if typing.get_origin(annotation) is typing.Literal else ()
