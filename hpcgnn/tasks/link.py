"""Link prediction: a batch's targets are positive edges and their negatives; the model scores node pairs.

Training (``task.form``): ``binary``, binary cross-entropy of the positives (label 1) plus that of their
negatives (label 0), each a mean (a GAE's reconstruction loss), padded negatives weighing nothing; ``triplet``, each positive against its own
negatives, a softmax cross-entropy over ``[positive, negatives]``. Evaluation: every split's
metrics (:mod:`hpcgnn.tasks.link_metrics`), from exact full-neighbourhood embeddings
(``train.eval_mode=full``, the default on replicated graphs) or from sampled batches around the
pairs' endpoints; the dataset's metric (AUC, Hits@50 or MRR) selects the best epoch.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from hpcgnn.models import batch_transform, forward_pairs, gcn_norm
from hpcgnn.sampling.link import share
from hpcgnn.stores import Exact
from hpcgnn.tasks import link_metrics as metrics
from hpcgnn.tasks.base import StepResult, Task


class LinkPrediction(Task):
    name = "link"

    def __init__(self, cfg, env, store, device: torch.device):
        super().__init__(cfg, env, store, device)
        self.data = store.items.data  # (its splits: hpcgnn.tasks.items.LinkItems)
        self.metric = self.data.metric
        self._transform = batch_transform(cfg.model, store.degree)

    @property
    def transform(self) -> Callable | None:
        return self._transform

    def step(self, model: torch.nn.Module, batch) -> StepResult:
        if self.cfg.task.form == "triplet":
            return self._triplet_step(model, batch)
        index, label, weight = batch.edge_label_index, batch.edge_label, batch.edge_label_weight
        scores = forward_pairs(model, batch, index).float()
        loss = balanced_bce(scores, label, weight)
        correct = (((scores > 0) == (label > 0.5)) & (weight > 0)).sum()
        return StepResult(loss, correct, label.numel() - batch.padded, seeds=batch.positives)

    def _triplet_step(self, model: torch.nn.Module, batch) -> StepResult:
        src, pos, neg, w = batch.src_index, batch.dst_pos_index, batch.dst_neg_index, batch.neg_weight
        b, k = neg.shape
        pairs = torch.stack([torch.cat([src, src.repeat_interleave(k)]), torch.cat([pos, neg.reshape(-1)])])
        scores = forward_pairs(model, batch, pairs).float()
        logits = torch.cat([scores[:b].unsqueeze(1), scores[b:].reshape(b, k).masked_fill(w == 0, -math.inf)], 1)
        target = torch.zeros(b, dtype=torch.long, device=logits.device)
        loss = F.cross_entropy(logits, target) if b else logits.sum() * 0.0
        correct = (logits.argmax(1) == 0).sum()
        return StepResult(loss, correct, b, seeds=b)

    # ------------------------------------------------------------------ evaluation

    def split_sizes(self) -> dict[str, int]:
        """Positive pairs of the val and test splits (every rank holds the splits whole)."""
        return {s: int(self.data.split(s).pos.size(1)) for s in ("val", "test")}

    @torch.no_grad()
    def predict_rows(self, model: torch.nn.Module, mode: str, what: str, split: str):
        """Every node's embedding (its encoder's output), the one output a link model gives for a split."""
        from hpcgnn.tasks.prediction import node_rows

        return node_rows(self, model, mode, split, encoder=True)

    def evaluate(self, model: torch.nn.Module) -> dict[str, float]:
        model.eval()
        full = self.eval_mode == "full"
        emb = self._embeddings(model) if full else None
        out = {}
        for split in self.splits:
            s = self.data.split(split)
            pos, neg = self._scores_full(model, emb, split) if full else self._scores_sampled(model, split)
            ks = tuple(self.cfg.task.hits_k)
            if s.neg_kind == "targets":
                values = metrics.per_positive_metrics(pos, neg, ks)
            else:
                values = metrics.shared_negative_metrics(pos, neg, ks, paired=s.neg.size(1) == s.pos.size(1))
            out.update({f"{split}_{name}": value for name, value in values.items()})
        return out

    def _embeddings(self, model: torch.nn.Module) -> Exact:
        """Every node's embedding with its full neighbourhood, layer by layer (exact), from the store."""
        return self.store.exact(model.encoder, gcn_norm(self.cfg.model))

    def _scores_full(self, model, emb: Exact, split: str) -> tuple[Tensor, Tensor]:
        """This rank's share of the split's positives and negatives, scored from the embeddings, ``chunk``
        pairs (or positives with their candidates) a round; every rank takes as many rounds as the busiest
        (the embeddings of nodes another rank computed come from it: a collective)."""
        s, rank, world = self.data.split(split), self.env.rank, self.env.world_size
        chunk, rows = max(1, self.cfg.train.eval_batch_size), emb.rows

        def scored(total: int, per: int, ends) -> list[Tensor]:
            """Scores of items [a, b) of this rank's share, per round: ``ends(a, b)`` = (sources [B],
            targets [B] or [B, K]); the source's embedding is scored against each of its targets'."""
            lo, hi = share(total, rank, world)
            busiest = max(b - a for a, b in (share(total, r, world) for r in range(world)))
            out = []
            for a in range(lo, lo + math.ceil(busiest / per) * per, per):
                u, v = ends(min(a, hi), min(a + per, hi))
                both = rows(torch.cat([u, v.reshape(-1)])).to(self.device)
                eu, ev = both[:u.numel()], both[u.numel():].view(*v.shape, both.size(-1))
                if u.numel():
                    out.append(model.score(eu.unsqueeze(1) if v.dim() == 2 else eu, ev).float().cpu())
            return out

        pos = torch.cat(scored(s.pos.size(1), chunk, lambda a, b: (s.pos[0, a:b], s.pos[1, a:b]))
                        or [torch.empty(0)])
        if s.neg_kind == "targets":  # [E, K]: this rank's positives' candidates, a few positives at a time
            k = s.neg.size(1)
            neg = scored(s.pos.size(1), max(1, chunk // k), lambda a, b: (s.pos[0, a:b], s.neg[a:b]))
            return pos, torch.cat(neg) if neg else torch.empty(0, k)
        neg = scored(s.neg.size(1), chunk, lambda a, b: (s.neg[0, a:b], s.neg[1, a:b]))
        return pos, torch.cat(neg) if neg else torch.empty(0)

    def _scores_sampled(self, model, split: str) -> tuple[Tensor, Tensor]:
        """Scores of this rank's share of the split's items, from sampled batches around the endpoints."""
        s = self.data.split(split)
        scores = []
        for batch in self.store.eval_loader(split, transform=self._transform):
            if batch.batch_size == 0:  # padding: this rank only serves the others' exchanges
                continue
            scores.append(forward_pairs(model, batch, batch.edge_label_index).float().cpu())
        flat = torch.cat(scores) if scores else torch.empty(0)
        if s.neg_kind == "targets":
            per = flat.reshape(-1, 1 + s.neg.size(1))
            return per[:, 0], per[:, 1:]
        items = self.store.items.eval_ids(split)  # in the order the loader walked them
        p = s.pos.size(1)
        return flat[items < p], flat[items >= p]


def balanced_bce(scores: Tensor, label: Tensor, weight: Tensor) -> Tensor:
    """The (weighted) mean loss of the positives plus that of the negatives: a GAE's reconstruction loss
    (PyG's ``GAE.recon_loss``), whatever the negatives per positive. (One mean over every pair would give the
    positives 1/(1 + k) of the loss with k negatives each.) Masks, not indexing: no wait for the device."""
    loss = F.binary_cross_entropy_with_logits(scores, label, reduction="none") * weight
    pos = (label > 0.5).to(loss.dtype)
    return (loss * pos).sum() / (weight * pos).sum().clamp(min=1.0) + \
        (loss * (1 - pos)).sum() / (weight * (1 - pos)).sum().clamp(min=1.0)
