"""Training techniques at scale: LR scaling and warmup, accumulation, mixed precision, gradient
compression (exact full-neighbourhood inference is the stores', :mod:`hpcgnn.stores.exact`).

Each is a ``train.*`` option; the trainer calls these helpers and records what they did
(effective LR and batch, bytes per all-reduce) in ``summary.json``.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time

import torch

from hpcgnn.errors import ConfigError

log = logging.getLogger(__name__)

# --------------------------------------------------------------------------- LR and its schedule


def effective_lr(lr: float, scaling: str, world_size: int, accumulate: int = 1) -> float:
    """``lr`` is for one rank and one micro-batch; the global batch grows with ranks x accumulation."""
    k = world_size * accumulate
    if scaling == "linear":
        return lr * k
    if scaling == "sqrt":
        return lr * math.sqrt(k)
    return lr


def lr_multiplier(step: int, total: int, warmup: int, schedule: str) -> float:
    """Linear warmup over ``warmup`` optimizer steps, then constant or cosine down to 0 at ``total``."""
    if warmup and step < warmup:
        return (step + 1) / warmup
    if schedule == "cosine":
        done = (step - warmup) / max(total - warmup, 1)
        return 0.5 * (1.0 + math.cos(math.pi * min(done, 1.0)))
    return 1.0


def make_scheduler(opt: torch.optim.Optimizer, schedule: str, total_steps: int, warmup_fraction: float):
    """A LambdaLR (its state is plain numbers: checkpoints load it with weights_only)."""
    warmup = int(warmup_fraction * total_steps)
    return torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_multiplier(s, total_steps, warmup, schedule))


# --------------------------------------------------------------------------- mixed precision


BF16_CPU_FLAGS = ("amx_bf16", "avx512_bf16")  # CPUs whose matrix units or vector units compute in bf16


def resolve_precision(precision: str, device: torch.device, cpu_flags: frozenset[str] | None = None
                      ) -> tuple[str, str]:
    """``train.precision`` with ``auto`` decided: (precision, why). ``auto`` is bf16 autocast where the
    hardware computes bf16 natively (a GPU that supports it; a CPU with AMX or AVX512-BF16: 4x fp32's matrix
    throughput with AMX), fp32 elsewhere. Master weights, optimizer state and the loss stay fp32."""
    if precision != "auto":
        return precision, "train.precision"
    if device.type == "cuda":
        if torch.cuda.is_bf16_supported():
            return "bf16", f"{torch.cuda.get_device_name(device)} computes bf16"
        return "fp32", f"{torch.cuda.get_device_name(device)} has no bf16"
    from hpcgnn import env

    flags = env.cpu_flags() if cpu_flags is None else cpu_flags
    have = [f for f in BF16_CPU_FLAGS if f in flags]
    if have:
        return "bf16", f"the CPU has {', '.join(have)}"
    return "fp32", "the CPU has neither AMX nor AVX512-BF16"


def autocast(precision: str, device: torch.device):
    """bf16 autocast on CPU or GPU, fp16 on GPU; fp32: nothing."""
    if precision == "fp32":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(device_type=device.type, dtype=dtype)


def grad_scaler(precision: str, device: torch.device):
    """fp16 needs loss scaling against underflow; bf16 has fp32's range and does not."""
    if precision != "fp16":
        return None
    if device.type != "cuda":
        raise ConfigError("train.precision=fp16 needs a GPU, and this rank runs on the CPU. HINT: "
                          "train.precision=bf16 (or auto) on CPUs")
    return torch.amp.GradScaler("cuda")


# --------------------------------------------------------------------------- gradient all-reduce


class CommHook:
    """DDP's gradient all-reduce, optionally compressed, with its time span and bytes counted.

    ``none``: the default all-reduce; ``fp16``/``bf16``: buckets cast for the wire and back;
    ``powersgd``: low-rank PowerSGD with error feedback (``powersgd_rank``). ``bytes`` is
    what one rank contributes per all-reduce (PowerSGD: its P and Q factors plus the
    uncompressed vectors, an estimate of what goes on the wire).
    """

    def __init__(self, compression: str = "none", powersgd_rank: int = 2, process_group=None):
        self.compression = compression
        self.lock = threading.Lock()
        self.first: float | None = None
        self.last: float | None = None
        self.sent = 0
        self.state = None
        if compression == "powersgd":
            from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

            self.state = powerSGD_hook.PowerSGDState(process_group=process_group, matrix_approximation_rank=powersgd_rank,
                                                     start_powerSGD_iter=2, use_error_feedback=True, warm_start=True)
            self.rank = powersgd_rank

    def take(self) -> tuple[float, int]:
        """(seconds from the first bucket's launch to the last one's completion, bytes) since the last call."""
        with self.lock:
            span = (self.last - self.first) if self.first is not None and self.last is not None else 0.0
            sent, self.first, self.last, self.sent = self.sent, None, None, 0
        return span, sent

    def _bytes(self, bucket) -> int:
        if self.compression in ("fp16", "bf16"):
            return bucket.buffer().numel() * 2
        if self.compression == "powersgd":
            total = 0
            for g in bucket.gradients():
                if g.dim() > 1:
                    n, m = g.shape[0], g[0].numel()
                    total += (n + m) * min(self.rank, n, m) * g.element_size()
                else:
                    total += g.numel() * g.element_size()
            return total
        return bucket.buffer().numel() * bucket.buffer().element_size()

    def hook(self, state, bucket):
        """The function DDP calls per bucket (register it with ``ddp.register_comm_hook(self.state, self.hook)``)."""
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

        with self.lock:
            if self.first is None:
                self.first = time.perf_counter()
            self.sent += self._bytes(bucket)
        if self.compression == "fp16":
            fut = default_hooks.fp16_compress_hook(None, bucket)
        elif self.compression == "bf16":
            fut = default_hooks.bf16_compress_hook(None, bucket)
        elif self.compression == "powersgd":
            fut = powerSGD_hook.powerSGD_hook(self.state, bucket)
        else:
            fut = default_hooks.allreduce_hook(None, bucket)

        def done(f):
            with self.lock:
                self.last = time.perf_counter()
            value = f.value()
            return value[0] if isinstance(value, list) else value

        return fut.then(done)


# --------------------------------------------------------------------------- accumulation


def step_weights(sizes: list[list[int]], rank: int, accumulate: int) -> list[float]:
    """Loss weight of each of this rank's micro-batches, from every rank's batch sizes.

    ``sizes[r][i]``: seeds (or, for subgraph samplers, 1 per batch) of rank r's batch i.
    Micro-batches are taken ``accumulate`` at a time into optimizer steps. DDP averages
    the ranks' gradients, so weight ``world x size / (all ranks' sizes in the step)`` makes
    each step's gradient the mean over every seed in it, also when ranks' batches differ
    (edge budgets) or a step is short (the last one).
    """
    world, mine = len(sizes), sizes[rank]
    totals = [sum(sum(s[g:g + accumulate]) for s in sizes) for g in range(0, len(mine), accumulate)]
    return [world * n / totals[i // accumulate] if totals[i // accumulate] else 0.0 for i, n in enumerate(mine)]
