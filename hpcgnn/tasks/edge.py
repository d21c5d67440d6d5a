"""Edge tasks (``task=edge``): a batch's targets are given edges, classified or regressed from their two ends.

The targets and their splits come with the dataset (:mod:`hpcgnn.data.edges`); their labels are of the node
task's kinds (:mod:`hpcgnn.labels`: classes, several binary labels, values) with the same losses and metrics
(:mod:`hpcgnn.tasks.node`). A batch samples around both ends of its targets, leaving the targets themselves out
of its message passing (``task.target_edges=drop``); the model encodes the batch and decodes each pair
(:mod:`hpcgnn.models.edge`). Evaluation scores each split's targets from sampled batches around them, or
(``train.eval_mode=full``) from every node's exact embedding.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

import torch

from hpcgnn.errors import DatasetError
from hpcgnn.models import forward_pairs, gcn_norm
from hpcgnn.tasks.base import StepResult, Task
from hpcgnn.tasks.node import take_target

log = logging.getLogger(__name__)


class EdgeTask(Task):
    """Targets on given edges, of the kind their labels are."""

    name = "edge"

    def __init__(self, cfg, env, store, device: torch.device):
        self.target = store.shape.target
        if self.target.kind == "classification" and self.target.width < 2:
            raise DatasetError(f"the edge labels of dataset={cfg.dataset.name} hold {self.target.width} class: nothing "
                               "to tell apart. HINT: labels with two classes or more, or task.kind=regression")
        super().__init__(cfg, env, store, device)
        take_target(self, self.target, cfg, store, device)
        if env.is_main:
            log.info("%s; decoder %s", self.target.describe("edge task", "edge_label"), cfg.task.decoder)


    def adopt(self, target) -> None:
        take_target(self, target, self.cfg, self.store, self.device)

    @property
    def transform(self) -> Callable | None:
        return self._transform

    def step(self, model: torch.nn.Module, batch) -> StepResult:
        out = forward_pairs(model, batch, batch.edge_label_index)
        y, n = batch.edge_label, batch.positives
        if n == 0:  # a padding batch: forward and backward still run, so DDP hears from this rank
            return StepResult(out.float().sum() * 0.0, out.new_zeros(()), 0)
        return StepResult(self.kind.mean_loss(out, y), self.kind.correct(out, y).sum(), n)

    @torch.no_grad()
    def predict_rows(self, model: torch.nn.Module, mode: str, what: str, split: str):
        """Every node's embedding (its encoder's), or its predictions of a split's targets: (outputs, their target
        ids, their labels), decoded from every node's exact embedding or from the evaluation's sampled batches
        around them."""
        from hpcgnn.tasks.prediction import exact_logged, node_rows, walk

        if what == "embeddings":
            return node_rows(self, model, mode, split, encoder=True)
        if mode == "full":  # (evaluation's exact decoding, in the order of this rank's targets)
            items = self.store.items
            mine = items.eval_ids(split)
            outs = [out.float().cpu() for out, _ in self._exact(model, exact_logged(self, model.encoder), split)]
            return torch.cat(outs) if outs else torch.empty(0, 0), mine, items.targets.label.index_select(0, mine)
        return walk(self.store.eval_loader(split, transform=self._transform),
                    lambda b: (forward_pairs(model, b, b.edge_label_index), b.edge_label) if b.positives else None)

    def evaluate(self, model: torch.nn.Module) -> dict[str, float]:
        """The kind's metrics on val and test: from sampled batches around each split's targets, or from every
        node's exact embedding (``train.eval_mode=full``); combined over ranks."""
        model.eval()
        exact = None
        if self.eval_mode == "full":
            exact = self.store.exact(model.encoder, gcn_norm(self.cfg.model))
        out = {}
        for split in self.splits:
            pairs = self._exact(model, exact, split) if exact is not None else self._sampled(model, split)
            out.update({f"{split}_{k}": v for k, v in self.kind.scores(pairs).items()})
        return out

    def _sampled(self, model: torch.nn.Module, split: str):
        """(outputs, labels) of this rank's share of ``split``, batch by batch."""
        for batch in self.store.eval_loader(split, transform=self._transform):
            if batch.positives:
                yield forward_pairs(model, batch, batch.edge_label_index), batch.edge_label

    def _exact(self, model: torch.nn.Module, exact, split: str):
        """(outputs, labels) of this rank's share of ``split``, decoded from the ends' exact embeddings."""
        items = self.store.items
        ids = items.eval_ids(split)
        for out, part in exact_scores(model, exact, items, ids, self.cfg.train.eval_batch_size, self.device):
            yield out, items.targets.label.index_select(0, part).to(self.device)


def exact_scores(model: torch.nn.Module, exact, items, ids: torch.Tensor, chunk: int, device: torch.device):
    """(outputs, target ids) of targets ``ids`` (of ``items``, :class:`hpcgnn.tasks.items.EdgeItems`), decoded from
    their ends' exact embeddings (``exact``: the store's exact outputs of the encoder) and, for a decoder that reads
    them, the targets' own edge features, a chunk of
    ``chunk`` targets at a time; every rank takes as many chunks as the busiest (the rows of nodes, and the edges,
    another rank holds come from it: collectives)."""
    from hpcgnn import dist

    targets, chunk = items.targets, max(1, chunk)
    rounds = int(dist.all_reduce_max(torch.tensor([math.ceil(ids.numel() / chunk)])).item())
    for r in range(rounds):
        part = ids[r * chunk:(r + 1) * chunk]
        pairs = targets.index[:, part]
        k = part.numel()
        if targets.relation is not None:  # a typed graph's: each end's rows of its own type
            both = torch.cat([exact.typed_rows(targets.relation[0], pairs[0]),
                              exact.typed_rows(targets.relation[2], pairs[1])]).to(device)
        else:
            both = exact.rows(torch.cat([pairs[0], pairs[1]])).to(device)
        attr = items.pair_features(part).to(device) if model.reads_pair_features else None
        if k:
            yield model.score(both[:k], both[k:], attr), part
