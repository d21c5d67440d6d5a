"""Every training sampler, declared once (:data:`SPECS`): its name, the graphs and tasks it serves, how its steps'
losses are weighed, and its two functions: ``prepare`` (what the ranks decide together before the first batch:
its items, steps per epoch and the arrays it is built from) and ``build`` (the sampler, from those arrays).

The rank, its sampler processes and its sampler servers build a sampler through the same ``build``, from the same
inputs (the graph, and the arrays the rank's :class:`~hpcgnn.sampling.shipping.SamplerState` carries): there is no
second path. Evaluation always samples neighbours (``neighbor``) or computes exactly.

Who reads it: :mod:`hpcgnn.config` and :mod:`hpcgnn.checks` (the names, and what each serves), the stores
(:mod:`hpcgnn.stores.samplers`: prepare and build), docs/training.md's table of samplers (a test holds it to this).

Adding a sampler of a whole graph: one :class:`SamplerSpec` here, its class in :mod:`hpcgnn.sampling`, its
``prepare`` and ``build`` in :mod:`hpcgnn.stores.samplers`, its line in docs/training.md.
"""

from __future__ import annotations

from dataclasses import dataclass

GRAPHS = ("whole", "typed", "parts")  # a homogeneous graph every rank holds, a typed one, a rank's parts


@dataclass(frozen=True)
class SamplerSpec:
    """One training sampler: what the checks, the stores and the docs need to know, in one place."""

    name: str
    says: str  # what a step is, in a few words (hints)
    graphs: tuple[str, ...]  # the graphs it samples (GRAPHS)
    tasks: tuple[str, ...]  # the tasks whose items it samples around
    prepare: str  # "module:function" (cfg, env, graph) -> Prepared: collective, a rank's
    build: str  # "module:function" (cfg, graph, node_sampler, arrays) -> the sampler: the rank's and its servers'
    subgraph: bool = False  # a step is a subgraph, a whole estimate of the mean loss: steps weighed alike
    edge_budget: bool = False  # train.edge_budget may cut its seeds by their sampling cost


_S = "hpcgnn.stores.samplers"
SPECS: dict[str, SamplerSpec] = {s.name: s for s in (
    SamplerSpec("neighbor", "batch_size seeds with fanouts neighbours per hop", ("whole", "typed", "parts"),
                ("node", "link", "edge"), f"{_S}:prepare_seeds", f"{_S}:build_neighbor", edge_budget=True),
    SamplerSpec("ladies", "layer-wise importance sampling (LADIES)", ("whole",), ("node",), f"{_S}:prepare_seeds",
                f"{_S}:build_ladies"),
    SamplerSpec("saint_node", "GraphSAINT's subgraph of node draws", ("whole",), ("node",), f"{_S}:prepare_draws",
                f"{_S}:build_saint_node", subgraph=True),
    SamplerSpec("saint_edge", "GraphSAINT's subgraph of edge draws", ("whole",), ("node",), f"{_S}:prepare_draws",
                f"{_S}:build_saint_edge", subgraph=True),
    SamplerSpec("saint_rw", "GraphSAINT's subgraph of random walks", ("whole",), ("node",), f"{_S}:prepare_walks",
                f"{_S}:build_saint_rw", subgraph=True),
    SamplerSpec("cluster", "Cluster-GCN's subgraph of METIS clusters", ("whole",), ("node",), f"{_S}:prepare_clusters",
                f"{_S}:build_cluster", subgraph=True),
)}


def names(*, graph: str | None = None, task: str | None = None) -> tuple[str, ...]:
    """The samplers that sample ``graph`` for ``task`` (None: any), in declaration order."""
    return tuple(s.name for s in SPECS.values()
                 if (graph is None or graph in s.graphs) and (task is None or task in s.tasks))
