"""What each task gives ``hpcgnn predict`` (:meth:`hpcgnn.tasks.base.Task.predict_rows`): a rank's rows of a split,
exact (every node's full neighbourhood, layer by layer) or from the evaluation's sampled batches (the same seeds,
so the same outputs on the same ranks), with their ids and labels."""

from __future__ import annotations

import logging
import time

import torch
from torch import Tensor

from hpcgnn.logs import Progress
from hpcgnn.models import batch_transform, forward_batch, gcn_norm, node_logits_and_labels

log = logging.getLogger(__name__)
EMPTY = torch.empty(0, dtype=torch.long)


def exact_logged(task, net: torch.nn.Module, layers: int | None = None):
    """The store's exact outputs of ``net`` (after ``layers`` layers; None: all), each layer logged as it ends."""
    t0 = time.perf_counter()
    return task.store.exact(net, gcn_norm(task.cfg.model), layers,
                            lambda i, of: log.info("exact inference: layer %d of %d done in %.1f s", i, of,
                                                   time.perf_counter() - t0))


def node_rows(task, model: torch.nn.Module, mode: str, split: str, embeddings: bool = False,
              encoder: bool = False) -> tuple[Tensor, Tensor, Tensor | None]:
    """This rank's rows of a node split: a node model's outputs with their labels, or (``embeddings``) its last
    hidden layer's; (``encoder``) a pair model's encoder's outputs, the embeddings its decoder reads."""
    net = model.encoder if encoder else model
    layers = net.num_layers - 1 if embeddings and not encoder else None
    labelled = not (embeddings or encoder)
    if mode == "full":
        exact = exact_logged(task, net, layers)
        rows, labels = exact.split(split)
        return rows, exact.share(split), labels if labelled else None
    loader = task.store.node_loader(split, transform=batch_transform(task.cfg.model, task.store.degree))
    if labelled:
        return walk(loader, lambda b: node_logits_and_labels(net, b) if b.batch_size else None)
    return walk(loader, lambda b: (forward_batch(net, b), None) if b.batch_size else None)[:2] + (None,)


def walk(loader, row) -> tuple[Tensor, Tensor, Tensor]:
    """A loader's batches for predict: ``row(batch)`` gives a batch's (outputs, labels or None), or None for a
    padding batch (this rank only serves the others' exchanges); (the outputs as float32 on the host, their items:
    the batches' seeds, their labels), the progress logged."""
    outs, ids, labels = [], [], []
    progress = Progress("predict", len(loader), "batches")
    for k, batch in enumerate(loader):
        got = row(batch)
        if got is not None:
            outs.append(got[0].float().cpu())
            if got[1] is not None:
                labels.append(got[1].cpu())
            ids.append(loader.plan.seeds(k))
        progress.advance(1)
    progress.finish()
    return (torch.cat(outs) if outs else torch.empty(0, 0), torch.cat(ids) if ids else EMPTY,
            torch.cat(labels) if labels else EMPTY)
