"""No silent divergence: a NaN or infinite loss or gradient stops the run, or skips its step on request.

``train.nonfinite=stop`` (the default): every micro-batch's loss and every optimizer step's gradients
are checked on the device, where they are (no wait for a GPU): the first bad step and what went bad
stay there. The host reads them where it waits anyway: every step on a CPU, on logging steps
(``metrics.every_steps``) and at the end of every epoch on a GPU, and always before a checkpoint is
written, so no checkpoint ever holds parameters a bad step touched. The ranks agree in the trainer's
per-step all-reduce, and every rank stops together with :class:`~hpcgnn.errors.Diverged` (exit code
4), naming the step, the rank and the likely cause. On a GPU the run may go on up to
``metrics.every_steps`` steps past the bad one before it stops; the step named is the first bad one.

``train.nonfinite=skip``: an optimizer step whose gradients are not finite is skipped (its gradients
dropped, the LR schedule advancing as usual) and counted in the epoch's ``nonfinite_skipped``; that
waits for the device once per optimizer step. Under DDP the gradients are the all-reduced ones, the
same on every rank, so the ranks skip alike. A micro-batch whose loss is not finite adds nothing to the
epoch's loss. Under ``train.precision=fp16`` the gradient scaler already skips steps with overflowing
gradients: only the loss is watched.
"""

from __future__ import annotations

import torch

from hpcgnn import dist
from hpcgnn.errors import Diverged

WHAT = {1: "the loss", 2: "a gradient"}


class NonFiniteGuard:
    """One rank's watch over its losses and gradients (see the module)."""

    def __init__(self, mode: str, device: torch.device, watch_grads: bool = True):
        self.mode, self.watch_grads = mode, watch_grads
        self.first = torch.zeros((), dtype=torch.long, device=device)  # the first bad step (1-based); 0: none
        self.what = torch.zeros((), dtype=torch.long, device=device)  # WHAT's key for that step

    def loss(self, step: int, loss: torch.Tensor) -> torch.Tensor:
        """Note micro-batch ``step``'s loss; returns whether it is finite (a device bool: the epoch's loss
        leaves a bad batch out, so one bad batch does not make it NaN under mode skip)."""
        finite = torch.isfinite(loss.detach())
        self._note(step, ~finite, 1)
        return finite

    def gradients_ok(self, step: int, params) -> bool:
        """Before optimizer step ``step``: note whether the gradients are finite. Mode skip: whether to step
        (a host read); mode stop: True (the host reads the note later)."""
        if not self.watch_grads:
            return True
        grads = [p.grad for p in params if p.grad is not None]
        if not grads:
            return True
        bad = ~torch.isfinite(torch.stack(torch._foreach_norm(grads))).all()
        if self.mode == "skip":  # (the trainer counts the skipped steps, in its checkpointed state)
            return not bool(bad)
        self._note(step, bad, 2)
        return True

    def _note(self, step: int, bad: torch.Tensor, what: int) -> None:
        if self.mode == "skip":
            return
        fresh = bad & (self.first == 0)
        self.first.masked_fill_(fresh, step)
        self.what.masked_fill_(fresh, what)

    def seen(self) -> int:
        """The first bad step this rank noted (0: none); reads the device."""
        return int(self.first.item())

    def stop(self, epoch: int, rank: int, lr: float, cfg) -> Diverged:
        """Collective, once some rank saw a bad step: the error every rank raises, naming the earliest."""
        mine = (self.seen(), int(self.what.item()), rank)
        # the earliest step; there, a rank's loss before the gradients it spread to every rank (the cause first)
        step, what, where = min(seen for seen in dist.all_gather_object(mine) if seen[0] > 0)
        t = cfg.train
        return Diverged(
            f"{WHAT[what]} became NaN or infinite at step {step} (epoch {epoch}) on rank {where}; the run stops "
            f"(train.nonfinite=stop) and no checkpoint after it was written. Likely cause: a learning rate too "
            f"large for this model and data (train.lr={t.lr:g}, {lr:g} after train.lr_scaling={t.lr_scaling})"
            f"{', or bf16 rounding' if t.precision == 'bf16' else ''}, or features with huge values. HINT: "
            f"lower train.lr{' or use train.precision=fp32' if t.precision == 'bf16' else ''}; "
            "train.nonfinite=skip skips such steps instead and counts them")
