"""A dataset of many graphs, mapped whole by every rank of a node (one copy per node, in the page cache): a graph
task's store.

Its items are graph ids (:class:`hpcgnn.tasks.items.GraphItems`). An epoch is a seeded permutation of the training
graphs, padded to a multiple of the ranks and dealt so that every rank runs the same number of steps and each step's
batches weigh alike on every rank: each step's graphs (``train.batch_size`` per rank) sorted by size and dealt round
the ranks; with a budget (``task.batch_by=nodes|edges``), each rank's share cut into the run's one step count, each
batch of about equal nodes (edges). A batch is assembled from the graphs' offsets in one pass of C
(:func:`hpcgnn.kernels.ops.assemble_graphs`) into PyG's form. Evaluation cuts each split into batches of
``train.eval_batch_size`` graphs in order and deals consecutive batches to the ranks: every graph is scored once,
whole, in the same batch whatever the number of ranks (so its outputs are the same floats).
"""

from __future__ import annotations

import logging
import math

import torch
from torch import Tensor
from torch_geometric.data import Data

from hpcgnn.config import RunConfig
from hpcgnn.data.graphs import GraphSet, describe, open_graphs
from hpcgnn.env import RankEnv
from hpcgnn.errors import ConfigError
from hpcgnn.kernels import ops
from hpcgnn.rng import derive_seed, generator
from hpcgnn.sampling import BatchLoader
from hpcgnn.sampling import subgraph as sub
from hpcgnn.sampling.loader import shuffled_to
from hpcgnn.sampling.producers import GraphSide
from hpcgnn.sampling.shipping import SamplerState
from hpcgnn.stores.base import GraphViews, Store, on_local_rank0, require_training_items
from hpcgnn.stores.exact import Exact

log = logging.getLogger(__name__)


class GraphBatcher:
    """Whole graphs of a graph set into one batch (a sampler of the loader's: ``sample(ids, generator)``, nothing
    drawn): ``x``, ``edge_index``, ``edge_attr``, ``batch``, ``ptr``, the graphs' labels ``y``, and ``batch_size`` (its
    graphs)."""

    device = torch.device("cpu")

    def __init__(self, graphs: GraphSet, pin_memory: bool = False):
        self.graphs, self.pin_memory = graphs, pin_memory

    def sample(self, ids: Tensor, generator: torch.Generator | None = None) -> Data:
        gs = self.graphs
        ids = ids.long()
        x, edge_index, edge_attr, batch, ptr = ops.assemble_graphs(gs.x, gs.edges, gs.edge_attr, gs.node_ptr,
                                                                   gs.edge_ptr, ids, self.pin_memory)
        data = Data(x=x, edge_index=edge_index, batch=batch, ptr=ptr, y=gs.y.index_select(0, ids),
                    batch_size=ids.numel(), num_nodes=x.size(0))
        if edge_attr is not None:
            data.edge_attr = edge_attr
        return data


class GraphSetStore(Store):
    """Every rank maps the whole graph set; its training graphs are dealt to the ranks each epoch (see the module)."""

    exchange = None
    seeds_unit = "graphs"

    def __init__(self, cfg: RunConfig, env: RankEnv, device: torch.device | None = None, items=None):
        from hpcgnn.data import cache_folder, prepare

        super().__init__(cfg, env, device or torch.device("cpu"))
        on_local_rank0(env, f"prepare {cfg.dataset.name}", lambda: prepare(cfg.dataset))
        self.graphs = gs = open_graphs(cache_folder(cfg.dataset))
        self.features = gs
        views = GraphViews(gs.num_features, 0, gs.num_graphs, gs.labels, None, gs.edge_dim, whole=True, graph_set=gs)
        self.open_items(items, views)
        ids = self.items.train_ids()
        require_training_items(cfg, ids.numel(), "graphs")
        self.draws = ids
        self.sampler = self.train_sampler = GraphBatcher(gs, pin_memory=self.device.type == "cuda")  # (pinned: a
        # batch's copy to the GPU overlaps the step before it)
        self.per_rank = math.ceil(ids.numel() / env.world_size)
        # each graph's cost by id where batches are cut by a budget (None: by count), and the budget
        self.cost, self.budget = self.items.batching()
        if self.cost is None:
            self.steps = math.ceil(self.per_rank / self.budget)
        else:
            total = float(self.cost.index_select(0, ids).sum())
            self.steps = sub.batches_for_budget(total, env.world_size, self.budget, self.per_rank)
        if env.is_main:  # (its batches: epoch_in_words, in the trainer's start)
            log.info("graphs: %s; %d/%d/%d train/val/test; %s", describe(gs), gs.train_idx.numel(),
                     gs.val_idx.numel(), gs.test_idx.numel(), self.items.describe(self.shape))

    def epoch_in_words(self) -> str:
        about, per, noun = self.step_batch()
        return f"whole graphs mapped once per node: {self.steps} steps/epoch of {about}{per} {noun} per rank"

    def step_batch(self) -> tuple[str, int, str]:
        return ("", self.budget, self.seeds_unit) if self.cost is None else ("~", self.budget, self.items.batch_noun())

    def sampler_state(self) -> SamplerState:
        """What a sampler server builds this rank's batch maker from: the graph set it opens, nothing more."""
        return SamplerState("graphs", self.env.rank, self.env.world_size, {})

    @staticmethod
    def server_side(graphs: GraphSet) -> GraphSide:
        """The rank's batch maker built on a sampler server over the graph set it opened (the rank's own builder)."""
        return GraphSide(graphs, GraphBatcher(graphs))

    def train_batches(self, epoch: int) -> list[Tensor]:
        """This rank's batches of ``epoch``: the seeded permutation padded to a multiple of the ranks (its first
        graphs again), each step's graphs sorted by size and dealt round the ranks (or, with a budget, the rank's
        share cut into the run's steps of about equal cost)."""
        env, t = self.env, self.cfg.train
        world = env.world_size
        order = shuffled_to(self.draws, self.per_rank * world, generator(t.seed, "epoch", epoch))
        size = self.graphs.sizes("nodes").index_select(0, order)
        step = world * (self.budget if self.cost is None else max(1, self.per_rank // self.steps))
        mine = []
        for lo in range(0, order.numel(), step):  # a step's graphs by size, dealt: each rank's batch alike
            window = order[lo:lo + step]
            by_size = torch.argsort(size[lo:lo + step], stable=True)
            mine.append(window.index_select(0, by_size)[env.rank::world])
        share = torch.cat(mine)
        if self.cost is None:
            return list(share.split(self.budget))
        # a budget: the share in a seeded order again (not by size), cut into the steps by cost
        share = share[torch.randperm(share.numel(), generator=generator(t.seed, "deal", epoch, env.rank))]
        return sub.split_by_cost(share, self.cost.index_select(0, share), self.steps)

    # ------------------------------------------------------------------ evaluation: whole graphs, dealt in batches

    def eval_batches(self, split: str, batch_size: int | None = None) -> list[Tensor]:
        """This rank's batches of ``split``: the split cut in order into batches of ``train.eval_batch_size``
        graphs, consecutive batches to each rank (the same batches whatever the number of ranks)."""
        ids = self.items.eval_ids(split)
        batches = list(ids.split(batch_size or self.cfg.train.eval_batch_size)) if ids.numel() else []
        per = math.ceil(len(batches) / self.env.world_size) if batches else 0
        return batches[self.env.rank * per:(self.env.rank + 1) * per]

    def eval_loader(self, split: str, transform=None) -> BatchLoader:
        t = self.cfg.train
        return BatchLoader(self.features, self.sampler, self.eval_batches(split),
                           batch_seed=derive_seed(t.seed, "eval", split, self.env.rank), device=self.device,
                           pin_memory=False, transform=transform)

    def eval_seeds(self, split: str) -> tuple[Tensor, int | None]:
        batches = self.eval_batches(split)
        return (torch.cat(batches) if batches else torch.empty(0, dtype=torch.long)), None

    def node_share(self, split: str) -> tuple[Tensor, int | None]:
        return self.eval_seeds(split)

    def exact(self, model: torch.nn.Module, gcn_norm: bool = False, layers: int | None = None,
              on_layer=None) -> Exact:
        raise ConfigError("a graph task evaluates and predicts every graph whole already: there is no layer-wise "
                          "pass over one graph to run. HINT: drop train.eval_mode and predict.mode")

    def resident_bytes(self) -> int:
        return self.graphs.resident_bytes()
