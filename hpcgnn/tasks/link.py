"""Link prediction: a batch's targets are positive edges and their negatives; the model scores node pairs.

Training (``task.form``): ``binary``, binary cross-entropy over the positives (label 1) and their
negatives (label 0), padded negatives weighing nothing; ``triplet``, each positive against its own
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

from hpcgnn.checks import link_eval_mode
from hpcgnn.models import batch_transform, build_link_model, forward_pairs
from hpcgnn.sampling.link import share
from hpcgnn.tasks import link_metrics as metrics
from hpcgnn.tasks.base import StepResult, Task
from hpcgnn.techniques import autocast, layerwise_inference


class LinkPrediction(Task):
    name = "link"

    def __init__(self, cfg, env, store, device: torch.device):
        super().__init__(cfg, env, store, device)
        self.data = store.link
        self.metric = self.data.metric
        self._transform = batch_transform(cfg.model, store.degree)

    def build_model(self) -> torch.nn.Module:
        return build_link_model(self.cfg.model, self.cfg.task.decoder, self.store.num_features,
                                len(self.cfg.train.fanouts))

    @property
    def transform(self) -> Callable | None:
        return self._transform

    @property
    def eval_mode(self) -> str:
        return link_eval_mode(self.cfg)

    def step(self, model: torch.nn.Module, batch) -> StepResult:
        if self.cfg.task.form == "triplet":
            return self._triplet_step(model, batch)
        index, label, weight = batch.edge_label_index, batch.edge_label, batch.edge_label_weight
        scores = forward_pairs(model, batch, index).float()
        loss = (F.binary_cross_entropy_with_logits(scores, label, reduction="none") * weight).sum() / \
            weight.sum().clamp(min=1.0)
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

    @torch.no_grad()
    def evaluate(self, model: torch.nn.Module) -> dict[str, float]:
        model.eval()
        full = self.eval_mode == "full"
        emb = self._embeddings(model) if full else None
        out = {}
        for split in ("val", "test"):
            s = self.data.split(split)
            pos, neg = self._scores_full(model, emb, split) if full else self._scores_sampled(model, split)
            ks = tuple(self.cfg.task.hits_k)
            if s.neg_kind == "targets":
                values = metrics.per_positive_metrics(pos, neg, ks)
            else:
                values = metrics.shared_negative_metrics(pos, neg, ks, paired=s.neg.size(1) == s.pos.size(1))
            out.update({f"{split}_{name}": value for name, value in values.items()})
        return out

    def _embeddings(self, model: torch.nn.Module) -> Tensor:
        """Every node's embedding with full neighbourhoods, layer by layer (exact), shared by all ranks."""
        t = self.cfg.train
        with autocast(t.precision, self.device):
            return layerwise_inference(model.encoder, self.store.graph, self.device, t.eval_chunk, self.env.rank,
                                       self.env.world_size, transform=self._transform)

    def _scores_full(self, model, emb: Tensor, split: str) -> tuple[Tensor, Tensor]:
        """This rank's share of the split's positives and negatives, scored from the embeddings."""
        s, rank, world = self.data.split(split), self.env.rank, self.env.world_size
        lo, hi = share(s.pos.size(1), rank, world)
        chunk = max(1, self.cfg.train.eval_batch_size)

        def score(pairs: Tensor) -> Tensor:
            return torch.cat([model.score(emb[pairs[0, a:a + chunk]].to(self.device),
                                          emb[pairs[1, a:a + chunk]].to(self.device)).float().cpu()
                              for a in range(0, pairs.size(1), chunk)] or [torch.empty(0)])

        pos = score(s.pos[:, lo:hi])
        if s.neg_kind == "targets":  # [E, K]: this rank's positives' candidates, a few positives at a time
            k = s.neg.size(1)
            rows = max(1, chunk // k)
            parts = [model.score(emb[s.pos[0, a:min(a + rows, hi)]].unsqueeze(1).to(self.device),
                                 emb[s.neg[a:min(a + rows, hi)]].to(self.device)).float().cpu()
                     for a in range(lo, hi, rows)]
            return pos, torch.cat(parts) if parts else torch.empty(0, k)
        nlo, nhi = share(s.neg.size(1), rank, world)
        return pos, score(s.neg[:, nlo:nhi])

    def _scores_sampled(self, model, split: str) -> tuple[Tensor, Tensor]:
        """Scores of this rank's share of the split's items, from sampled batches around the endpoints."""
        s = self.data.split(split)
        scores = []
        for batch in self.store.eval_loader(split, transform=self._transform):
            if batch.batch_size == 0:  # padding: this rank only serves the others' exchanges
                continue
            with autocast(self.cfg.train.precision, self.device):
                scores.append(forward_pairs(model, batch, batch.edge_label_index).float().cpu())
        flat = torch.cat(scores) if scores else torch.empty(0)
        if s.neg_kind == "targets":
            per = flat.reshape(-1, 1 + s.neg.size(1))
            return per[:, 0], per[:, 1:]
        items = self.store.eval_items(split)  # in the order the loader walked them
        p = s.pos.size(1)
        return flat[items < p], flat[items >= p]


def common_neighbour_scores(graph, pairs: Tensor) -> Tensor:
    """The common-neighbours heuristic for ``pairs`` [2, P]: in-neighbours ``u`` and ``v`` share (a baseline
    a GNN must beat; vectorised over the pairs)."""
    from hpcgnn.sampling.neighbor import sample_neighbors
    from hpcgnn.sampling.subgraph import ALL

    n = graph.num_nodes
    row_u, nbr_u = sample_neighbors(graph.rowptr, graph.col, pairs[0], ALL)
    row_v, nbr_v = sample_neighbors(graph.rowptr, graph.col, pairs[1], ALL)
    shared = torch.isin(row_u * n + nbr_u, row_v * n + nbr_v)
    return torch.bincount(row_u[shared], minlength=pairs.size(1)).float()
